//! Ban rules on users, accounts and the operator's policy: validated and
//! normalised on write, projected into the user's record, and the
//! operator's hold on an account's policy left as it was.

use super::*;
use proxynet_store::UserEntry;
use redis::AsyncCommands;

/// The user record Redis holds for `username`.
async fn projected(state: &crate::AppState, username: &str) -> proxynet_store::UserRecord {
    let mut redis = state.redis.clone();
    let json: Option<String> = redis
        .get(state.projector.keys().user(username))
        .await
        .unwrap();
    match UserEntry::parse(json.as_deref()) {
        UserEntry::Present(record) => *record,
        other => panic!("no live record for {username}: {other:?}"),
    }
}

#[tokio::test]
async fn retry_rules_are_validated_stored_and_projected() {
    let (app, state) = app_and_state().await;
    let (account_id, key) = account(&app, "rules").await;
    let (status, _, user) = call(
        &app,
        Method::POST,
        &format!("/v1/accounts/{account_id}/users"),
        Some(&key),
        Some(r#"{"username": "ruled", "password": "ruled-password-1"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{user}");
    assert_eq!(user["retry_rules"], json!([]), "{user}");
    let user_path = format!("/v1/users/{}", user["id"].as_str().unwrap());
    let rules = json!({"retry_rules": [{"sites": ["*.Example.COM"], "statuses": [403, 429],
                                        "header": "CF-Mitigated", "retry": 2, "cool": true}]});
    let (status, _, user) = call(
        &app,
        Method::PATCH,
        &user_path,
        Some(&key),
        Some(&rules.to_string()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{user}");
    assert_eq!(
        user["retry_rules"],
        json!([{"sites": ["example.com"], "statuses": [403, 429], "header": "cf-mitigated",
                "retry": 2, "cool": true}])
    );
    // Refused whole, and nothing changes.
    for bad in [
        json!({"retry_rules": [{"statuses": [403], "retry": 4}]}),
        json!({"retry_rules": [{"statuses": [403], "retires": 1}]}),
        json!({"retry_rules": [{"statuses": [99]}]}),
        json!({"retry_rules": [{"retry": 1}]}),
        json!({"retry_rules": {"statuses": [403]}}),
    ] {
        let (status, _, problem) = call(
            &app,
            Method::PATCH,
            &user_path,
            Some(&key),
            Some(&bad.to_string()),
        )
        .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {problem}");
        assert!(
            problem["detail"].as_str().unwrap().contains("retry_rules"),
            "{problem}"
        );
    }
    let (_, _, user) = call(&app, Method::GET, &user_path, Some(&key), None).await;
    assert_eq!(user["retry_rules"][0]["retry"], 2, "{user}");

    // The account's rules, next to the user's in the record.
    let account_path = format!("/v1/accounts/{account_id}");
    let (status, _, account) = call(
        &app,
        Method::PATCH,
        &account_path,
        Some(&key),
        Some(r#"{"retry_rules": [{"statuses": [429], "retry": 1}]}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{account}");
    assert_eq!(account["retry_rules"][0]["statuses"], json!([429]));
    let record = projected(&state, "ruled").await;
    assert_eq!(record.retry_rules.len(), 1);
    assert_eq!(record.retry_rules[0].sites, ["example.com"]);
    assert_eq!(record.account_retry_rules.len(), 1);
    assert_eq!(record.account_retry_rules[0].retry, 1);

    // An operator's policy on the account still binds the account's key for
    // the policy, not for the rules.
    let (status, _, account) = call(
        &app,
        Method::PATCH,
        &account_path,
        Some(ADMIN),
        Some(r#"{"policy": {"denied_domains": ["blocked.test"]}}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{account}");
    assert_eq!(
        account["retry_rules"][0]["statuses"],
        json!([429]),
        "a policy alone leaves the rules"
    );
    let (status, _, problem) = call(
        &app,
        Method::PATCH,
        &account_path,
        Some(&key),
        Some(r#"{"policy": {}, "retry_rules": []}"#),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    let (status, _, account) = call(
        &app,
        Method::PATCH,
        &account_path,
        Some(&key),
        Some(r#"{"retry_rules": []}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{account}");
    assert_eq!(account["retry_rules"], json!([]));
    assert_eq!(
        account["policy"]["denied_domains"],
        json!(["blocked.test"]),
        "the operator's policy stays"
    );
    assert!(projected(&state, "ruled")
        .await
        .account_retry_rules
        .is_empty());
}

#[tokio::test]
async fn the_operators_retry_rules_are_part_of_its_policy() {
    let app = app().await;
    let (status, _, policy) = call(
        &app,
        Method::PUT,
        "/v1/policy",
        Some(ADMIN),
        Some(r#"{"retry_rules": [{"sites": ["Shop.Test"], "statuses": [403], "header": "cf-mitigated", "cool": true}]}"#),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{policy}");
    assert_eq!(policy["retry_rules"][0]["sites"], json!(["shop.test"]));
    let (_, _, read) = call(&app, Method::GET, "/v1/policy", Some(ADMIN), None).await;
    assert_eq!(read["retry_rules"], policy["retry_rules"], "{read}");
    let (status, _, problem) = call(
        &app,
        Method::PUT,
        "/v1/policy",
        Some(ADMIN),
        Some(r#"{"retry_rules": [{"statuses": [403], "retry": 9}]}"#),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{problem}");
}
