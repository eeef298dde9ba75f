//! One agent credential, one link: a second link with the same credential
//! replaces the first, and the replacement is audited.

use proxynet_tests::client::curl;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::Stack;
use std::time::Duration;

/// One live link per exit per superproxy: a second hello with the same
/// credential takes over, and the takeover is audited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_link_with_one_credential_replaces_the_first_and_is_audited() {
    let stack = Stack::start().await;
    let agent = &stack.agents[0];
    let state = stack
        .dir
        .path()
        .join(format!("agent-{}.json", agent.egress_ip));
    let twin_state = stack.dir.path().join("twin.json");
    std::fs::copy(&state, &twin_state).unwrap();
    let args = stack.agent_args(agent.egress_ip, &twin_state);
    let (_twin, _) =
        proxynet_tests::process::spawn_ready::<serde_json::Value>("exit-agent", &args, &[]).await;
    let db = sqlx::PgPool::connect(&stack.stores.database_url)
        .await
        .unwrap();
    eventually(
        "the takeover in the audit log",
        Duration::from_secs(15),
        || async {
            let (n,): (i64,) = sqlx::query_as(
            "SELECT count(*) FROM audit_log WHERE action = 'exit.link_replaced' AND subject = $1",
        )
        .bind(agent.addrs.exit_id.to_string())
        .fetch_one(&db)
        .await
        .ok()?;
            (n >= 1).then_some(())
        },
    )
    .await;
    let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
}
