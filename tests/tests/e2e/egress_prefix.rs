//! Egress prefixes: an exit on a host of its own (network namespaces) sends
//! each tunnel from an address of its prefix that the superproxy drew, a
//! session keeps its address, the exit's record shows its prefixes and the
//! abuse desk finds a tunnel by the drawn address or the prefix, and
//! `ipversion-4|6` picks the family a name leaves in (only exits with an
//! address of that family are eligible).

use chrono::{SecondsFormat, Utc};
use proxynet_tests::client::{curl, egress_via, proxy_as};
use proxynet_tests::netns::ExitHost;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, USERNAME};
use proxynet_tests::whoami::Seen;
use std::collections::HashSet;
use std::net::IpAddr;
use std::time::Duration;

/// The address the whoami target saw a CONNECT tunnel to `url` come from.
async fn egress_of(proxy: &str, url: &str) -> IpAddr {
    egress_via(proxy, url).await.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_leave_from_drawn_prefix_addresses_and_a_session_keeps_one() {
    let host = ExitHost::create();
    let mut stack = Stack::start_with(host.stack_options(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    }))
    .await;
    let i = stack
        .add_agent_in(&host, &[], &[host.prefix_v6, host.prefix_v4], &[])
        .await;
    let exit = stack.agents[i].addrs.exit_id;
    stack.wait_eligible(1).await;
    let whoami = host.start_whoami();
    let proxy = stack.proxy_addrs.proxy;

    // The exit's record names its prefixes (it declared no single address).
    let record = stack.admin_get_json(&format!("/v1/exits/{exit}")).await;
    assert_eq!(
        record["egress_prefixes"],
        serde_json::json!([host.prefix_v6.to_string(), host.prefix_v4.to_string()]),
        "{record}"
    );
    assert_eq!(record["egress_ips"], serde_json::json!([]), "{record}");
    let cookie = stack
        .dashboard_session(proxynet_tests::stack::ADMIN_TOKEN)
        .await;
    let page = eventually(
        "the dashboard to sample the exit",
        Duration::from_secs(10),
        || async {
            let page = stack
                .dashboard_page(&cookie, &format!("/dashboard/exits/{exit}"))
                .await;
            page.contains("id=\"egress-prefixes\"").then_some(page)
        },
    )
    .await;
    assert!(
        page.contains(&format!(
            "<dd id=\"egress-prefixes\">{}, {}</dd>",
            host.prefix_v6, host.prefix_v4
        )),
        "{page}"
    );

    let rotating = proxy_as(&format!("{USERNAME}-ipversion-6"), proxy);
    let mut v6 = HashSet::new();
    for _ in 0..10 {
        let ip = egress_of(&rotating, &whoami.url(true)).await;
        assert!(
            host.prefix_v6.contains(ip),
            "{ip} outside {}",
            host.prefix_v6
        );
        v6.insert(ip);
    }
    assert!(
        v6.len() >= 8,
        "a /64 draws a new address per tunnel: {v6:?}"
    );

    // A complaint names one drawn address and a time: the abuse desk finds
    // the account by it, and by the whole prefix.
    let drawn = *v6.iter().next().unwrap();
    let at = Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true);
    let by_address = format!("/v1/abuse/lookup?egress_ip={drawn}&at={at}");
    let rows = eventually(
        "the target log to have the drawn address",
        Duration::from_secs(20),
        || async {
            let rows = stack.admin_get_json(&by_address).await;
            (!rows.as_array()?.is_empty()).then_some(rows)
        },
    )
    .await;
    assert_eq!(rows.as_array().unwrap().len(), 1, "one tunnel: {rows}");
    assert_eq!(rows[0]["egress_ip"], drawn.to_string(), "{rows}");
    assert_eq!(rows[0]["matched"], "bound");
    assert_eq!(rows[0]["account_name"], "acme");
    assert_eq!(rows[0]["username"], USERNAME);
    assert_eq!(rows[0]["exit_id"], exit.to_string());
    let by_prefix = format!(
        "/v1/abuse/lookup?egress_ip={}&at={at}",
        host.prefix_v6.to_string().replace('/', "%2F")
    );
    let rows = eventually(
        "the target log to have all ten",
        Duration::from_secs(20),
        || async {
            let rows = stack.admin_get_json(&by_prefix).await;
            let tunnels: u64 = rows
                .as_array()?
                .iter()
                .filter_map(|r| r["tunnels"].as_u64())
                .sum();
            (tunnels == 10).then_some(rows)
        },
    )
    .await;
    for row in rows.as_array().unwrap() {
        let ip: IpAddr = row["egress_ip"].as_str().unwrap().parse().unwrap();
        assert!(v6.contains(&ip), "{row}");
        assert_eq!(row["username"], USERNAME);
    }

    // The IPv4 prefix works the same way (14 usable addresses in a /28).
    let plain = proxy_as(USERNAME, proxy);
    let mut v4 = HashSet::new();
    for _ in 0..10 {
        let ip = egress_of(&plain, &whoami.url(false)).await;
        assert!(
            host.prefix_v4.contains(ip),
            "{ip} outside {}",
            host.prefix_v4
        );
        v4.insert(ip);
    }
    assert!(v4.len() >= 3, "{v4:?}");

    let session = proxy_as(&format!("{USERNAME}-session-x1-ipversion-6"), proxy);
    let mut kept = HashSet::new();
    for _ in 0..4 {
        let ip = egress_of(&session, &whoami.url(true)).await;
        assert!(host.prefix_v6.contains(ip), "{ip}");
        kept.insert(ip);
    }
    assert_eq!(kept.len(), 1, "one session, one address: {kept:?}");

    // The prefix is routed to the exit host itself: its addresses are the
    // exit's own, never a destination (they would reach its services). A
    // unique-local prefix is already refused at the superproxy; the agent's
    // own rule is checked in its unit tests (`policy::deny_own_egress`).
    let own = host.prefix_v6.host_address(1);
    let r = curl(&[
        "-p",
        "-x",
        &rotating,
        &format!("http://[{own}]:{}/", whoami.v6.port()),
    ])
    .await;
    assert!(r.headers.contains(" 403 "), "{}{}", r.headers, r.body);
}

/// A name with addresses of both families: the agent resolves it and dials
/// the family of the egress address the superproxy chose, IPv4 unless the
/// username asks for IPv6.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipversion_picks_the_family_a_name_leaves_in() {
    let host = ExitHost::create();
    host.exit.set_hosts(&[
        (IpAddr::V4(host.target_v4), "whoami.test"),
        (IpAddr::V6(host.target_v6), "whoami.test"),
    ]);
    let mut stack = Stack::start_with(host.stack_options(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    }))
    .await;
    let v4_egress = IpAddr::V4(host.exit_wan_v4);
    stack
        .add_agent_in(&host, &[v4_egress], &[host.prefix_v6], &[])
        .await;
    stack.wait_eligible(1).await;
    let whoami = host.start_whoami();
    let url = format!("http://whoami.test:{}/", whoami.v4.port());
    let proxy = stack.proxy_addrs.proxy;

    for (username, v6) in [
        (USERNAME.to_owned(), false),
        (format!("{USERNAME}-ipversion-4"), false),
        (format!("{USERNAME}-ipversion-6"), true),
    ] {
        for _ in 0..3 {
            let ip = egress_of(&proxy_as(&username, proxy), &url).await;
            if v6 {
                assert!(host.prefix_v6.contains(ip), "{username}: {ip}");
            } else {
                assert_eq!(ip, v4_egress, "{username}");
            }
        }
    }
    // Absolute-form takes the same path.
    let r = curl(&[
        "-x",
        &proxy_as(&format!("{USERNAME}-ipversion-6"), proxy),
        &url,
    ])
    .await;
    assert_eq!(r.status, 200, "{}{}", r.headers, r.body);
    let seen = serde_json::from_str::<Seen>(&r.body).unwrap().peer.ip();
    assert!(host.prefix_v6.contains(seen), "{seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipversion_6_without_an_ipv6_exit_is_503_naming_the_family() {
    // The default stack: two exits on loopback, IPv4 only.
    let stack = Stack::start().await;
    let v6_user = proxy_as(&format!("{USERNAME}-ipversion-6"), stack.proxy_addrs.proxy);
    let connect = curl(&["-p", "-x", &v6_user, &stack.whoami_url()]).await;
    let h = connect.headers.to_ascii_lowercase();
    assert!(h.contains(" 503"), "{h}");
    assert!(
        h.contains("error=destination_unavailable")
            && h.contains("no eligible exit has an ipv6 egress address"),
        "{h}"
    );
    let absolute = curl(&["-x", &v6_user, &stack.whoami_url()]).await;
    assert_eq!(absolute.status, 503, "{}", absolute.headers);
    assert!(
        absolute
            .headers
            .contains("no eligible exit has an IPv6 egress address"),
        "{}",
        absolute.headers
    );
    // The same exits serve IPv4 when asked for it.
    let v4_user = proxy_as(&format!("{USERNAME}-ipversion-4"), stack.proxy_addrs.proxy);
    let ok = curl(&["-p", "-x", &v4_user, &stack.whoami_url()]).await;
    assert_eq!(ok.status, 200, "{}", ok.headers);
}

/// The harness itself: sockets made inside a namespace serve from the
/// test's runtime, the UDP echo records its sources, and a panicking test
/// leaves no namespace or veth behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_hosts_echo_udp_and_vanish_even_when_a_test_panics() {
    let host = ExitHost::create();
    let echo = host.start_udp_echo();
    let from = std::net::SocketAddr::new(IpAddr::V6(host.exit_wan_v6), 0);
    let socket = tokio::net::UdpSocket::from_std(host.exit.bind_udp(from)).unwrap();
    socket.send_to(b"ping", echo.v6).await.unwrap();
    let mut buf = [0u8; 16];
    let (n, _) = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        socket.recv_from(&mut buf),
    )
    .await
    .expect("the echo answers")
    .unwrap();
    assert_eq!(&buf[..n], b"ping");
    assert_eq!(
        echo.source_ips(),
        HashSet::from([IpAddr::V6(host.exit_wan_v6)])
    );
    let names = [host.exit.name().to_owned(), host.target.name().to_owned()];
    drop((socket, echo));

    let panicked = std::thread::spawn(move || {
        let _host = host;
        panic!("a test failing with an exit host in scope");
    })
    .join();
    assert!(panicked.is_err());
    let listed = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&listed.stdout);
    for name in &names {
        assert!(
            !listed
                .lines()
                .any(|l| l.split_whitespace().next() == Some(name)),
            "{name} left behind: {listed}"
        );
    }
}
