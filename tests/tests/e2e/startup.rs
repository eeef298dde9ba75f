//! Missing stores at start-up give a clear error naming what is missing.

use proxynet_tests::process::run_to_exit;
use std::time::Duration;

/// A superproxy's listeners, all on free loopback ports.
fn superproxy_on_free_ports() -> Vec<String> {
    ["--listen", "--admin-listen", "--link-listen"]
        .iter()
        .flat_map(|flag| [flag.to_string(), "127.0.0.1:0".to_string()])
        .collect()
}

/// A loopback port with nothing listening on it.
fn dead_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[tokio::test]
async fn control_api_names_an_unreachable_postgres() {
    let redis = std::env::var("PROXYNET_TEST_REDIS_URL").unwrap();
    let envs = [
        (
            "PROXYNET_DATABASE_URL",
            format!("postgres://u:secret-pw@127.0.0.1:{}/db", dead_port()),
        ),
        ("PROXYNET_REDIS_URL", redis),
        ("PROXYNET_ADMIN_TOKEN", "x".repeat(32)),
        ("PROXYNET_API_LISTEN", "127.0.0.1:0".into()),
    ];
    let (status, stderr) = run_to_exit("control-api", &[], &envs, Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("Postgres is not reachable"), "{stderr}");
    assert!(
        !stderr.contains("secret-pw"),
        "the password leaked: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test]
async fn control_api_names_an_unreachable_redis() {
    let pg = std::env::var("PROXYNET_TEST_DATABASE_URL").unwrap();
    let envs = [
        ("PROXYNET_DATABASE_URL", pg),
        (
            "PROXYNET_REDIS_URL",
            format!("redis://127.0.0.1:{}/", dead_port()),
        ),
        ("PROXYNET_ADMIN_TOKEN", "x".repeat(32)),
        ("PROXYNET_API_LISTEN", "127.0.0.1:0".into()),
    ];
    let (status, stderr) = run_to_exit("control-api", &[], &envs, Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("Redis is not reachable"), "{stderr}");
}

#[tokio::test]
async fn control_api_without_admin_token_says_how_to_set_one() {
    let envs = [
        (
            "PROXYNET_DATABASE_URL",
            "postgres://127.0.0.1:1/db".to_owned(),
        ),
        ("PROXYNET_REDIS_URL", "redis://127.0.0.1:1/".to_owned()),
    ];
    let (status, stderr) = run_to_exit("control-api", &[], &envs, Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("PROXYNET_ADMIN_TOKEN"), "{stderr}");
}

#[tokio::test]
async fn superproxy_names_an_unreachable_redis() {
    let envs = [(
        "PROXYNET_REDIS_URL",
        format!("redis://127.0.0.1:{}/", dead_port()),
    )];
    let args = superproxy_on_free_ports();
    let (status, stderr) = run_to_exit("superproxy", &args, &envs, Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("Redis is not reachable"), "{stderr}");
}

#[tokio::test]
async fn exit_agent_names_an_unreachable_control_api() {
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = vec![
        "--control-api".into(),
        format!("http://127.0.0.1:{}", dead_port()),
        "--state-file".into(),
        dir.path().join("s.json").display().to_string(),
        "--egress-ip".into(),
        "127.0.0.2".into(),
        "--admin-listen".into(),
        "127.0.0.1:0".into(),
        "--enroll-token".into(),
        "pnenroll_x".into(),
    ];
    // A plain-http control-api is refused unless explicitly allowed.
    let (status, stderr) = run_to_exit("exit-agent", &args, &[], Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("is not https"), "{stderr}");

    let mut args = args;
    args.push("--allow-insecure-control-api".into());
    let (status, stderr) = run_to_exit("exit-agent", &args, &[], Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("control-api unreachable"), "{stderr}");
}

/// A Redis Cluster node without `--redis-cluster`, or a single Redis with it,
/// is refused at start with what to change (the suite runs once against each
/// kind, so both directions are exercised).
#[tokio::test]
async fn superproxy_refuses_the_wrong_kind_of_redis() {
    let stores = proxynet_tests::stores::TestStores::create().await;
    let first_node = stores.redis_url.split(',').next().unwrap().to_owned();
    let envs = [
        ("PROXYNET_REDIS_URL", first_node),
        (
            "PROXYNET_REDIS_CLUSTER",
            (!stores.redis_cluster).to_string(),
        ),
    ];
    let args = superproxy_on_free_ports();
    let (status, stderr) = run_to_exit("superproxy", &args, &envs, Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("Redis is not reachable"), "{stderr}");
    if stores.redis_cluster {
        assert!(
            stderr.contains("is a Redis Cluster node: start with --redis-cluster"),
            "{stderr}"
        );
    } else {
        assert!(stderr.contains("cannot join Redis Cluster"), "{stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_without_aof_is_refused_when_aof_is_required() {
    let stores = proxynet_tests::stores::TestStores::create().await;
    // The test Redis runs with `appendonly no`.
    let mut envs: Vec<(&str, String)> = stores.redis_env().to_vec();
    envs.push(("PROXYNET_REDIS_REQUIRE_AOF", "true".into()));
    let args = superproxy_on_free_ports();
    let (status, stderr) = run_to_exit("superproxy", &args, &envs, Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("set `appendonly yes`"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
