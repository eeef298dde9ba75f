//! Enrollment: one-time tokens, clear refusals.

use proxynet_tests::process::run_to_exit;
use proxynet_tests::stack::{Stack, StackOptions};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_and_reused_enrollment_tokens_are_refused_clearly() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![],
        ..Default::default()
    })
    .await;

    let state = stack.dir.path().join("bad.json");
    let mut args = stack.agent_args("127.0.0.4".parse().unwrap(), &state);
    args.extend(["--enroll-token".into(), "pnenroll_not-a-real-token".into()]);
    let (status, stderr) = run_to_exit("exit-agent", &args, &[], Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(
        stderr.contains("enrollment refused") && stderr.contains("not valid"),
        "{stderr}"
    );
    assert!(!state.exists(), "no state file for a refused enrollment");

    // First use succeeds (the agent runs), second use of the same token is refused.
    let token = stack.enrollment_token("once").await;
    let first_state = stack.dir.path().join("first.json");
    let mut first_args = stack.agent_args("127.0.0.4".parse().unwrap(), &first_state);
    first_args.extend(["--enroll-token".into(), token.clone()]);
    let (first, _) =
        proxynet_tests::process::spawn_ready::<serde_json::Value>("exit-agent", &first_args, &[])
            .await;
    assert!(first_state.exists());

    let second_state = stack.dir.path().join("second.json");
    let mut second_args = stack.agent_args("127.0.0.5".parse().unwrap(), &second_state);
    second_args.extend(["--enroll-token".into(), token]);
    let (status, stderr) =
        run_to_exit("exit-agent", &second_args, &[], Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(stderr.contains("already used"), "{stderr}");
    drop(first);

    // No token and no state: told what is missing.
    let (status, stderr) = run_to_exit(
        "exit-agent",
        &stack.agent_args(
            "127.0.0.6".parse().unwrap(),
            &stack.dir.path().join("none.json"),
        ),
        &[],
        Duration::from_secs(30),
    )
    .await;
    assert!(!status.success());
    assert!(stderr.contains("not enrolled"), "{stderr}");
}
