//! Sticky sessions keep their egress IP, and the IP's family matches the
//! target's.

use proxynet_tests::client::curl;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::whoami::Seen;

/// A session keeps its egress IP on a multi-IP exit; a dual-stack exit
/// picks the target's family.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_keep_their_egress_ip_and_families_match() {
    let mut stack = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    stack
        .add_agent_with_ips(&["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()])
        .await;
    stack.wait_eligible(1).await;
    let session = format!(
        "http://{USERNAME}-session-keepip1:{}@{}",
        PASSWORD.replace(' ', "%20"),
        stack.proxy_addrs.proxy
    );
    let mut seen = std::collections::HashSet::new();
    for _ in 0..10 {
        let r = curl(&["-p", "-x", &session, &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
        seen.insert(serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip());
    }
    assert_eq!(seen.len(), 1, "one session, one egress IP: {seen:?}");
    // Rotating users still use both.
    let mut rotating = std::collections::HashSet::new();
    for _ in 0..20 {
        let r = curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()]).await;
        rotating.insert(serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip());
    }
    assert_eq!(rotating.len(), 2, "{rotating:?}");

    let mut dual = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    dual.add_agent_with_ips(&["::1".parse().unwrap(), "127.0.0.2".parse().unwrap()])
        .await;
    dual.wait_eligible(1).await;
    for _ in 0..20 {
        let r = curl(&["-p", "-x", &dual.proxy_url(), &dual.whoami_url()]).await;
        assert_eq!(
            r.status, 200,
            "an IPv4 target from a dual-stack exit: {}",
            r.headers
        );
    }
}
