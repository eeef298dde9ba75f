//! Tests of how Redis targets are read from their URLs.

use super::*;

#[test]
fn one_url_without_cluster_several_with() {
    assert!(RedisTarget::new("redis://127.0.0.1:1/", false).is_ok());
    // Without --redis-cluster the URL is one URL, commas and all (a
    // password may hold one); the client then refuses it if it is a list.
    assert_eq!(
        RedisTarget::new("redis://:pa,ss@a:1/", false)
            .unwrap()
            .urls()
            .count(),
        1
    );
    let target = RedisTarget::new("redis://a:1/, redis://b:2/", true).unwrap();
    assert_eq!(target.urls().count(), 2);
    assert!(RedisTarget::new(" , ", true).is_err());
}

#[test]
fn cluster_refuses_a_database_number_and_hides_passwords() {
    let err = RedisTarget::new("redis://:hunter2@a:1/3", true).unwrap_err();
    assert!(err.to_string().contains("database 3"), "{err}");
    assert!(!err.to_string().contains("hunter2"), "{err}");
    let target = RedisTarget::new("redis://:hunter2@a:1/", true).unwrap();
    assert!(!target.describe().contains("hunter2"));
    assert!(!format!("{target:?}").contains("hunter2"));
}
