//! Usage by domain: how long the hourly listings are kept.

use super::*;

#[tokio::test]
async fn domain_listings_are_kept_for_two_days_and_late_usage_is_other() {
    use crate::usage_domains::{bounded, prune, LISTED_HOURS, OTHER};
    let (_, state) = app_and_state().await;
    let account = Uuid::new_v4();
    let now = chrono::Utc::now().timestamp();
    let row = |minute: i64, domain: &str| proxynet_store::UsageRow {
        account_id: account,
        user_id: Uuid::new_v4(),
        exit_id: Uuid::new_v4(),
        minute: minute - minute.rem_euclid(60),
        bytes_up: 1,
        bytes_down: 1,
        source_type: None,
        domain: Some(domain.to_owned()),
        billable: true,
    };
    let fresh = row(now, "fresh.example");
    let late = row(now - (LISTED_HOURS + 1) * 3600, "late.example");
    let mut tx = state.db.begin().await.unwrap();
    let kept = bounded(&mut tx, &[fresh.clone(), late.clone()])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(kept.name(&fresh).as_deref(), Some("fresh.example"));
    assert_eq!(
        kept.name(&late).as_deref(),
        Some(OTHER),
        "its hour's listing may be gone"
    );
    // A listing past the window (and its hour of margin) goes; the current
    // hour's stays.
    sqlx::query(
        "INSERT INTO usage_domains_hourly (account_id, hour, domain)
         VALUES ($1, date_trunc('hour', now()) - make_interval(hours => $2), 'old.example')",
    )
    .bind(account)
    .bind((LISTED_HOURS + 1) as i32)
    .execute(&state.db)
    .await
    .unwrap();
    assert_eq!(prune(&state.db).await.unwrap(), 1);
    let left: Vec<(String,)> =
        sqlx::query_as("SELECT domain FROM usage_domains_hourly WHERE account_id = $1")
            .bind(account)
            .fetch_all(&state.db)
            .await
            .unwrap();
    assert_eq!(left, [("fresh.example".to_owned(),)]);
}
