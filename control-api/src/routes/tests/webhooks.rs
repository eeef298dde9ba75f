//! Webhook events from account changes, the delivery claim's fairness, and
//! when failures disable a webhook.

use super::*;
use crate::webhooks::{Deliverer, DeliveryRules};

/// A webhook row for `owner` (None: the operator's) subscribed to `event`,
/// written as the webhook routes would (their URL check resolves names).
async fn webhook_row(state: &crate::AppState, owner: Option<Uuid>, event: &str) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO webhooks (id, account_id, url, events, secret)
         VALUES ($1, $2, 'https://hooks.example.test/', ARRAY[$3::text], 'pnwhsec_t')",
    )
    .bind(id)
    .bind(owner)
    .bind(event)
    .execute(&state.db)
    .await
    .unwrap();
    id
}

/// One due `key.revoked` delivery for `hook`.
async fn pending_delivery(state: &crate::AppState, hook: Uuid) {
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, body)
         VALUES (gen_random_uuid(), $1, gen_random_uuid(), 'key.revoked', '{}')",
    )
    .bind(hook)
    .execute(&state.db)
    .await
    .unwrap();
}

/// The delivery worker on this test's database, under `rules`.
fn worker(state: &crate::AppState, rules: DeliveryRules) -> Deliverer {
    Deliverer::new(
        state.db.clone(),
        crate::webhooks::target::policy(true, &state.protected),
    )
    .with_rules(rules)
}

/// A due delivery of `event` for `hook` about `source` (None: the fleet's
/// own), due since `age_secs` ago.
async fn due_row(
    state: &crate::AppState,
    hook: Uuid,
    event: &str,
    source: Option<Uuid>,
    age_secs: f64,
) -> Uuid {
    let id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, body, source_account, next_attempt_at)
         VALUES ($1, $2, gen_random_uuid(), $3, '{}', $4, now() - make_interval(secs => $5))",
    )
    .bind(id)
    .bind(hook)
    .bind(event)
    .bind(source)
    .bind(age_secs)
    .execute(&state.db)
    .await
    .unwrap();
    id
}

/// The bodies queued for `hook`, parsed.
async fn bodies_for(state: &crate::AppState, hook: Uuid) -> Vec<serde_json::Value> {
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT body FROM webhook_deliveries WHERE webhook_id = $1")
            .bind(hook)
            .fetch_all(&state.db)
            .await
            .unwrap();
    rows.into_iter()
        .map(|(b,)| serde_json::from_str(&b).unwrap())
        .collect()
}

#[tokio::test]
async fn deleting_an_account_tells_the_operators_webhooks_once_of_every_key_it_revoked() {
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "leaving").await;
    let (status, _, _) = call(
        &app,
        Method::POST,
        &format!("/v1/accounts/{account}/api-keys"),
        Some(ADMIN),
        Some(r#"{"name": "second"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let operator_hook = webhook_row(&state, None, "key.revoked").await;
    webhook_row(&state, Some(account), "key.revoked").await;
    let (status, _, _) = call(
        &app,
        Method::DELETE,
        &format!("/v1/accounts/{account}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let bodies: Vec<(Uuid, String)> = sqlx::query_as(
        "SELECT webhook_id, body FROM webhook_deliveries WHERE event = 'key.revoked'",
    )
    .fetch_all(&state.db)
    .await
    .unwrap();
    assert_eq!(bodies.len(), 1, "one event for both keys: {bodies:?}");
    let (hook, body) = &bodies[0];
    assert_eq!(*hook, operator_hook, "a deleted account hears nothing more");
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(body["data"]["account_id"], account.to_string(), "{body}");
    assert_eq!(body["data"]["cause"], "account_deleted");
    assert_eq!(body["data"]["revoked_by"], "operator");
    assert!(body["data"]["cascade_from"].is_null());
    let ids = body["data"]["revoked_key_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 2, "{body}");
    assert_eq!(body["data"]["key_id"], ids[0], "the oldest key heads it");
}

#[tokio::test]
async fn an_operator_keys_cascade_tells_each_account_of_its_own_keys_only() {
    let (app, state) = app_and_state().await;
    let (a, _) = account(&app, "cascade-a").await;
    let (b, _) = account(&app, "cascade-b").await;
    let (status, _, operator_key) = call(
        &app,
        Method::POST,
        "/v1/api-keys",
        Some(ADMIN),
        Some(r#"{"name": "ops"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{operator_key}");
    let operator_key_id = operator_key["id"].as_str().unwrap().to_owned();
    let secret = operator_key["key"].as_str().unwrap().to_owned();
    let mut minted = Vec::new();
    for account in [a, b] {
        let (status, _, key) = call(
            &app,
            Method::POST,
            &format!("/v1/accounts/{account}/api-keys"),
            Some(&secret),
            Some(r#"{"name": "minted-by-ops"}"#),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{key}");
        minted.push(key["id"].as_str().unwrap().to_owned());
    }
    let operator_hook = webhook_row(&state, None, "key.revoked").await;
    let hook_a = webhook_row(&state, Some(a), "key.revoked").await;
    let hook_b = webhook_row(&state, Some(b), "key.revoked").await;
    let (status, _, _) = call(
        &app,
        Method::DELETE,
        &format!("/v1/api-keys/{operator_key_id}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    let operator = bodies_for(&state, operator_hook).await;
    assert_eq!(operator.len(), 1, "{operator:?}");
    let data = &operator[0]["data"];
    assert_eq!(data["key_id"], operator_key_id.as_str());
    assert_eq!(data["cause"], "revoked");
    assert_eq!(
        data["revoked_key_ids"].as_array().unwrap().len(),
        3,
        "{data}"
    );
    for (hook, own) in [(hook_a, &minted[0]), (hook_b, &minted[1])] {
        let bodies = bodies_for(&state, hook).await;
        assert_eq!(bodies.len(), 1, "{bodies:?}");
        let data = &bodies[0]["data"];
        assert_eq!(data["key_id"], own.as_str(), "{data}");
        assert_eq!(data["cause"], "cascade");
        assert_eq!(data["cascade_from"], operator_key_id.as_str());
        assert_eq!(
            data["revoked_key_ids"],
            json!([own]),
            "its own keys only: {data}"
        );
    }
}

#[tokio::test]
async fn an_account_whose_webhooks_hold_the_cap_gets_no_more_queued() {
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "backlogged").await;
    let hook = webhook_row(&state, Some(account), "key.revoked").await;
    let operator_hook = webhook_row(&state, None, "key.revoked").await;
    let cap = crate::webhooks::max_pending_per_account();
    assert!(cap > 0);
    sqlx::query(
        "INSERT INTO webhook_deliveries (id, webhook_id, event_id, event, body)
         SELECT gen_random_uuid(), $1, gen_random_uuid(), 'key.revoked', '{}'
           FROM generate_series(1, $2::bigint)",
    )
    .bind(hook)
    .bind(i64::try_from(cap).unwrap())
    .execute(&state.db)
    .await
    .unwrap();
    let (status, _, key) = call(
        &app,
        Method::POST,
        &format!("/v1/accounts/{account}/api-keys"),
        Some(ADMIN),
        Some(r#"{"name": "doomed"}"#),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, _, _) = call(
        &app,
        Method::DELETE,
        &format!("/v1/api-keys/{}", key["id"].as_str().unwrap()),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "the revocation itself goes on"
    );
    let count = |hook: Uuid| {
        let db = state.db.clone();
        async move {
            sqlx::query_as::<_, (i64,)>(
                "SELECT count(*) FROM webhook_deliveries WHERE webhook_id = $1",
            )
            .bind(hook)
            .fetch_one(&db)
            .await
            .unwrap()
            .0
        }
    };
    assert_eq!(
        count(hook).await,
        i64::try_from(cap).unwrap(),
        "nothing more queued"
    );
    assert_eq!(
        count(operator_hook).await,
        1,
        "operator webhooks are not capped"
    );
}

#[tokio::test]
async fn an_operators_pause_binds_the_account_key_and_an_owners_does_not() {
    let (app, state) = app_and_state().await;
    let (account, key) = account(&app, "paused").await;
    let hook = webhook_row(&state, Some(account), "key.revoked").await;
    let path = format!("/v1/accounts/{account}/webhooks/{hook}");
    let patch = |token: String, enabled: bool| {
        let (app, path) = (app.clone(), path.clone());
        async move {
            call(
                &app,
                Method::PATCH,
                &path,
                Some(&token),
                Some(&json!({ "enabled": enabled }).to_string()),
            )
            .await
        }
    };

    let (status, _, info) = patch(ADMIN.to_owned(), false).await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(info["disabled_by"], "operator");
    let (status, _, problem) = patch(key.clone(), true).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{problem}");
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("enabled: the operator paused"),
        "{detail}"
    );
    // Pausing it again changes nothing, and still binds.
    let (status, _, info) = patch(key.clone(), false).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["disabled_by"], "operator", "{info}");
    let (status, _, info) = patch(ADMIN.to_owned(), true).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["enabled"], true);
    assert!(info["disabled_by"].is_null(), "{info}");

    // The owner's own pause it may lift; an operator's on top of it binds.
    let (_, _, info) = patch(key.clone(), false).await;
    assert_eq!(info["disabled_by"], "owner", "{info}");
    let (status, _, info) = patch(key.clone(), true).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(info["enabled"], true);
    patch(key.clone(), false).await;
    let (_, _, info) = patch(ADMIN.to_owned(), false).await;
    assert_eq!(info["disabled_by"], "operator", "{info}");
    assert_eq!(info["disabled_reason"], "disabled by operator");
    let (status, _, _) = patch(key.clone(), true).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn operator_webhooks_have_slots_of_their_own_and_take_fleet_events_first() {
    use crate::webhooks::delivery::{CUSTOMER_SLOTS, PER_ACCOUNT};
    let (app, state) = app_and_state().await;
    // Four accounts, eight webhooks each, one due row each: 32 rows every
    // account's cap allows, enough to fill every slot.
    let mut accounts = Vec::new();
    for i in 0..4 {
        let (account, _) = account(&app, &format!("busy-{i}")).await;
        for _ in 0..PER_ACCOUNT {
            let hook = webhook_row(&state, Some(account), "key.revoked").await;
            due_row(&state, hook, "key.revoked", Some(account), 30.0).await;
        }
        accounts.push(account);
    }
    // The operator's webhook: five older events of one account's loop, then
    // an exit withdrawn.
    let operator_hook = webhook_row(&state, None, "exit.withdrawn").await;
    for _ in 0..5 {
        due_row(
            &state,
            operator_hook,
            "key.revoked",
            Some(accounts[0]),
            60.0,
        )
        .await;
    }
    let withdrawn = due_row(&state, operator_hook, "exit.withdrawn", None, 1.0).await;

    let deliverer = worker(&state, DeliveryRules::default());
    let claimed = deliverer.claim(32, &[], &[], CUSTOMER_SLOTS).await.unwrap();
    let operator: Vec<_> = claimed.iter().filter(|c| c.account_id.is_none()).collect();
    assert_eq!(operator.len(), 2, "two rows of the operator's webhook");
    let customers = claimed.len() - operator.len();
    assert_eq!(
        customers as i64, CUSTOMER_SLOTS,
        "customers leave the operator's slots"
    );
    let (withdrawn_claimed,): (i32,) =
        sqlx::query_as("SELECT attempts FROM webhook_deliveries WHERE id = $1")
            .bind(withdrawn)
            .fetch_one(&state.db)
            .await
            .unwrap();
    assert_eq!(withdrawn_claimed, 1, "the fleet's event went first");

    // With the customers' slots all taken, only operator rows are claimed
    // (the operator's webhook is free again here; the customers' are busy).
    let busy: Vec<Uuid> = claimed
        .iter()
        .filter(|c| c.account_id.is_some())
        .map(|c| c.webhook_id)
        .collect();
    let again = deliverer.claim(32, &busy, &[], 0).await.unwrap();
    assert_eq!(again.len(), 2, "the operator's next two");
    assert!(again.iter().all(|c| c.account_id.is_none()));
}

#[tokio::test]
async fn a_claim_takes_each_webhooks_first_row_first_and_caps_an_account() {
    use crate::webhooks::delivery::{CUSTOMER_SLOTS, PER_ACCOUNT};
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "ten-hooks").await;
    let mut hooks = Vec::new();
    // Ten webhooks of one account and one of the operator's, three due
    // deliveries each.
    for owner in std::iter::repeat_n(Some(account), 10).chain([None]) {
        let hook = webhook_row(&state, owner, "key.revoked").await;
        for _ in 0..3 {
            pending_delivery(&state, hook).await;
        }
        hooks.push(hook);
    }
    let deliverer = worker(&state, DeliveryRules::default());
    let claimed = deliverer.claim(32, &[], &[], CUSTOMER_SLOTS).await.unwrap();
    let of_account: Vec<_> = claimed
        .iter()
        .filter(|c| c.account_id == Some(account))
        .collect();
    assert_eq!(of_account.len() as i64, PER_ACCOUNT, "the account's cap");
    let distinct: std::collections::HashSet<Uuid> =
        of_account.iter().map(|c| c.webhook_id).collect();
    assert_eq!(
        distinct.len() as i64,
        PER_ACCOUNT,
        "first rows before second ones"
    );
    let operator = claimed.iter().filter(|c| c.account_id.is_none()).count();
    assert_eq!(
        operator, 2,
        "two per webhook; operator webhooks are not capped"
    );

    // With those in flight: nothing more of the busy webhooks, and of the
    // account only what room it has left.
    let busy: Vec<Uuid> = claimed.iter().map(|c| c.webhook_id).collect();
    let again = deliverer
        .claim(32, &busy, &[(account, 0)], CUSTOMER_SLOTS)
        .await
        .unwrap();
    assert!(again.is_empty(), "{} more", again.len());
    let room = deliverer
        .claim(32, &busy, &[(account, 1)], CUSTOMER_SLOTS)
        .await
        .unwrap();
    assert_eq!(room.len(), 1);
    assert!(!busy.contains(&room[0].webhook_id));
}

#[tokio::test]
async fn a_run_of_failures_disables_a_webhook_only_once_it_is_long_and_old_enough() {
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "failing").await;
    let hook = webhook_row(&state, Some(account), "key.revoked").await;
    // A delivery still pending when the webhook is disabled is given up.
    pending_delivery(&state, hook).await;
    let deliverer = worker(
        &state,
        DeliveryRules {
            max_attempts: 1,
            disable_after_failures: 3,
            disable_after: std::time::Duration::from_secs(3600),
        },
    );
    let webhook = || async {
        sqlx::query_as::<_, (Option<chrono::DateTime<chrono::Utc>>, i32)>(
            "SELECT disabled_at, failed_in_row FROM webhooks WHERE id = $1",
        )
        .bind(hook)
        .fetch_one(&state.db)
        .await
        .unwrap()
    };
    for n in 1..=5 {
        deliverer
            .failed_delivery(hook, Some(account), "the receiver answered 500")
            .await
            .unwrap();
        let (disabled, failed) = webhook().await;
        assert_eq!(failed, n);
        assert!(
            disabled.is_none(),
            "a run younger than an hour: {n} failures"
        );
    }
    // A failure after a quiet gap starts a new run, however old the last.
    sqlx::query(
        "UPDATE webhooks SET failing_since = now() - interval '5 days',
                             last_failed_at = now() - interval '4 days' WHERE id = $1",
    )
    .bind(hook)
    .execute(&state.db)
    .await
    .unwrap();
    for n in 1..=2 {
        deliverer
            .failed_delivery(hook, Some(account), "the receiver answered 500")
            .await
            .unwrap();
        let (disabled, failed) = webhook().await;
        assert_eq!(failed, n, "a new run");
        assert!(disabled.is_none());
    }
    // The run began more than an hour ago: the next failure disables it.
    sqlx::query("UPDATE webhooks SET failing_since = now() - interval '61 minutes' WHERE id = $1")
        .bind(hook)
        .execute(&state.db)
        .await
        .unwrap();
    deliverer
        .failed_delivery(hook, Some(account), "the receiver answered 500")
        .await
        .unwrap();
    let (disabled, failed) = webhook().await;
    assert!(disabled.is_some());
    assert_eq!(failed, 3);
    let statuses: Vec<(String, Option<String>)> =
        sqlx::query_as("SELECT status, last_error FROM webhook_deliveries WHERE webhook_id = $1")
            .bind(hook)
            .fetch_all(&state.db)
            .await
            .unwrap();
    assert_eq!(
        statuses,
        vec![(
            "failed".to_owned(),
            Some("the webhook was disabled".to_owned())
        )]
    );
    let audit: (String, serde_json::Value) = sqlx::query_as(
        "SELECT actor, detail FROM audit_log WHERE action = 'webhook.disable' AND subject = $1",
    )
    .bind(hook.to_string())
    .fetch_one(&state.db)
    .await
    .unwrap();
    assert_eq!(audit.0, "control-api");
    assert_eq!(audit.1["cause"], "failures");
    assert_eq!(audit.1["given_up"], 1);
    // Disabled already: further failures count nothing.
    deliverer
        .failed_delivery(hook, Some(account), "the receiver answered 500")
        .await
        .unwrap();
    assert_eq!(webhook().await.1, 3);
}

#[tokio::test]
async fn an_expired_consent_is_announced_once_and_only_while_it_is_the_latest() {
    let (app, state) = app_and_state().await;
    let (exit, _) = enrolled_exit(&app, "198.51.100.9").await;
    let hook = webhook_row(&state, None, "exit.withdrawn").await;
    // The source requires consent. Version 1 expired a minute ago, but
    // version 2, recorded after it, runs a day more: only the latest record
    // counts, so nothing is announced.
    sqlx::query("UPDATE sources SET consent_required = true")
        .execute(&state.db)
        .await
        .unwrap();
    sqlx::query("INSERT INTO consent_notices (version, body, sha256) VALUES ('n1', 'b', 'h')")
        .execute(&state.db)
        .await
        .unwrap();
    let record = |version: i32, expires: &'static str| {
        let db = state.db.clone();
        async move {
            sqlx::query(&format!(
                "INSERT INTO consent_records (exit_id, version, state, granted_at, method, notice_version,
                                              notice_sha256, evidence_ref, opt_out, expires_at, recorded_by)
                 VALUES ($1, $2, 'granted', now() - interval '1 day', 'signed_contract', 'n1', 'h',
                         'e', 'o', {expires}, 'operator')"
            ))
            .bind(exit)
            .bind(version)
            .execute(&db)
            .await
            .unwrap();
        }
    };
    let announced = || async {
        sqlx::query_as::<_, (String,)>(
            "SELECT body FROM webhook_deliveries WHERE webhook_id = $1 AND event = 'exit.withdrawn'",
        )
        .bind(hook)
        .fetch_all(&state.db)
        .await
        .unwrap()
    };
    record(1, "now() - interval '1 minute'").await;
    record(2, "now() + interval '1 day'").await;
    assert_eq!(
        crate::webhooks::consent::announce_expired(&state.db)
            .await
            .unwrap(),
        0
    );
    // A third record that has expired: announced, once.
    record(3, "now() - interval '1 second'").await;
    assert_eq!(
        crate::webhooks::consent::announce_expired(&state.db)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        crate::webhooks::consent::announce_expired(&state.db)
            .await
            .unwrap(),
        0
    );
    let bodies = announced().await;
    assert_eq!(bodies.len(), 1);
    let body: serde_json::Value = serde_json::from_str(&bodies[0].0).unwrap();
    assert_eq!(body["data"]["exit_id"], exit.to_string());
    assert_eq!(body["data"]["cause"], "consent_expired");
    assert!(body["data"]["reason"]
        .as_str()
        .unwrap()
        .starts_with("consent version 3 expired at "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_recorded_at_once_by_several_workers_are_all_counted() {
    let (app, state) = app_and_state().await;
    let (account, _) = account(&app, "busy-failing").await;
    let hook = webhook_row(&state, Some(account), "key.revoked").await;
    let deliverer = worker(
        &state,
        DeliveryRules {
            max_attempts: 1,
            disable_after_failures: 100,
            disable_after: std::time::Duration::ZERO,
        },
    );
    // The first failure of a run, sixteen times at once: each counts.
    let failures = (0..16).map(|_| {
        let deliverer = deliverer.clone();
        tokio::spawn(async move {
            deliverer
                .failed_delivery(hook, Some(account), "the receiver answered 500")
                .await
        })
    });
    for failure in futures_util::future::join_all(failures).await {
        failure.unwrap().unwrap();
    }
    let (failed,): (i32,) = sqlx::query_as("SELECT failed_in_row FROM webhooks WHERE id = $1")
        .bind(hook)
        .fetch_one(&state.db)
        .await
        .unwrap();
    assert_eq!(failed, 16);
}
