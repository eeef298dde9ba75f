//! SOCKS5 UDP ASSOCIATE (RFC 1928 §7) through the whole stack: a raw
//! client's datagrams leave from an exit's egress address, replies come
//! back to the client's own socket, denied destinations are dropped, the
//! ledger bills the payload, and closing the control connection ends the
//! association.

use proxynet_tests::client::socks5;
use proxynet_tests::dns::TestDns;
use proxynet_tests::metrics::{sample, scrape};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions};
use proxynet_tests::targets::udp_echo;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpStream, UdpSocket};

const PASS: &str = "udp-password-1";

/// Sends UDP ASSOCIATE (declaring no source) and reads the reply: its code
/// and the relay address.
async fn associate(control: &mut TcpStream) -> (u8, SocketAddr) {
    use tokio::io::AsyncWriteExt;
    control
        .write_all(&[5, 3, 0, 1, 0, 0, 0, 0, 0, 0])
        .await
        .unwrap();
    let mut head = [0u8; 4];
    control.read_exact(&mut head).await.unwrap();
    assert_eq!((head[0], head[3]), (5, 1), "an IPv4 relay address");
    let mut addr = [0u8; 6];
    control.read_exact(&mut addr).await.unwrap();
    let ip = std::net::Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
    (
        head[1],
        SocketAddr::from((ip, u16::from_be_bytes([addr[4], addr[5]]))),
    )
}

/// A SOCKS UDP request header for `host:port` (an IPv4 literal or a name).
fn header(host: &str, port: u16) -> Vec<u8> {
    let mut h = vec![0, 0, 0];
    match host.parse::<std::net::Ipv4Addr>() {
        Ok(ip) => {
            h.push(1);
            h.extend_from_slice(&ip.octets());
        }
        Err(_) => {
            h.push(3);
            h.push(host.len() as u8);
            h.extend_from_slice(host.as_bytes());
        }
    }
    h.extend_from_slice(&port.to_be_bytes());
    h
}

/// One datagram out, its echo back: the reply's source and payload.
async fn round_trip(
    client: &UdpSocket,
    relay: SocketAddr,
    host: &str,
    port: u16,
    payload: &[u8],
) -> Option<(SocketAddr, Vec<u8>)> {
    let mut packet = header(host, port);
    packet.extend_from_slice(payload);
    client.send_to(&packet, relay).await.unwrap();
    let mut buf = vec![0u8; 2048];
    let (n, from) = tokio::time::timeout(Duration::from_secs(5), client.recv_from(&mut buf))
        .await
        .ok()?
        .unwrap();
    assert_eq!(from, relay, "replies come from the relay");
    let reply = &buf[..n];
    assert_eq!(&reply[..4], &[0, 0, 0, 1], "an IPv4 source: {reply:?}");
    let source = SocketAddr::from((
        std::net::Ipv4Addr::new(reply[4], reply[5], reply[6], reply[7]),
        u16::from_be_bytes([reply[8], reply[9]]),
    ));
    Some((source, reply[10..].to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn udp_associate_relays_datagrams_through_an_exit_and_bills_them() {
    let dns = TestDns::start(vec!["127.0.0.1".parse().unwrap()]).await;
    let stack = Stack::start_with(StackOptions {
        agent_args: vec!["--dns-server".into(), dns.addr.to_string()],
        ..Default::default()
    })
    .await;
    let account = stack.create_account("udp").await;
    let user = stack.create_user(account, "udpuser", PASS).await;
    let (echo, seen) = udp_echo().await;

    let mut control = socks5::login(stack.proxy_addrs.socks, "udpuser", PASS)
        .await
        .unwrap();
    let (reply, relay) = associate(&mut control).await;
    assert_eq!(reply, 0, "UDP ASSOCIATE is served");
    let client = UdpSocket::bind("127.0.0.1:0").await.unwrap();

    let mut billed = 0u64;
    for i in 0..20 {
        let payload = format!("by-address-{i:02}");
        let (source, echoed) =
            round_trip(&client, relay, "127.0.0.1", echo.port(), payload.as_bytes())
                .await
                .unwrap_or_else(|| panic!("datagram {i} came back"));
        assert_eq!(source, echo, "the reply names its source");
        assert_eq!(echoed, payload.as_bytes());
        billed += payload.len() as u64;
    }
    for i in 0..5 {
        // Resolved at the exit (the test DNS answers 127.0.0.1).
        let payload = format!("by-name-{i}");
        let (source, echoed) = round_trip(
            &client,
            relay,
            "udp-echo.test",
            echo.port(),
            payload.as_bytes(),
        )
        .await
        .unwrap_or_else(|| panic!("datagram {i} by name came back"));
        assert_eq!(source, echo);
        assert_eq!(echoed, payload.as_bytes());
        billed += payload.len() as u64;
    }
    let sources: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|a| a.ip().to_string())
        .collect();
    assert_eq!(sources.len(), 25, "{sources:?}");
    assert!(
        sources
            .iter()
            .all(|ip| ip == "127.0.0.2" || ip == "127.0.0.3"),
        "the echo saw the exit's egress address: {sources:?}"
    );

    // The metadata address is denied: dropped, counted, never billed.
    let mut denied = header("169.254.169.254", 53);
    denied.extend_from_slice(b"never-sent");
    client.send_to(&denied, relay).await.unwrap();
    let http = reqwest::Client::new();
    eventually(
        "the denied datagram to be counted",
        Duration::from_secs(5),
        || async {
            let text = scrape(&http, stack.proxy_addrs.admin).await;
            (sample(
                &text,
                "proxynet_udp_datagrams_total",
                &["outcome=\"denied\""],
            ) >= 1.0)
                .then_some(())
        },
    )
    .await;
    // A fragment is dropped as RFC 1928 allows.
    let mut fragment = header("127.0.0.1", echo.port());
    fragment[2] = 1;
    client.send_to(&fragment, relay).await.unwrap();
    // Another socket of the same host is not the association's client.
    let stranger = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut foreign = header("127.0.0.1", echo.port());
    foreign.extend_from_slice(b"foreign");
    stranger.send_to(&foreign, relay).await.unwrap();
    eventually(
        "the fragment and the stranger to be dropped",
        Duration::from_secs(5),
        || async {
            let text = scrape(&http, stack.proxy_addrs.admin).await;
            (sample(
                &text,
                "proxynet_udp_datagrams_total",
                &["outcome=\"fragment\""],
            ) >= 1.0
                && sample(
                    &text,
                    "proxynet_udp_datagrams_total",
                    &["outcome=\"foreign_source\""],
                ) >= 1.0)
                .then_some(())
        },
    )
    .await;
    assert_eq!(
        seen.lock().unwrap().len(),
        25,
        "nothing dropped reached the echo"
    );

    // Closing the control connection ends the association and its lease.
    drop(control);
    eventually(
        "the association to end",
        Duration::from_secs(10),
        || async {
            let text = scrape(&http, stack.proxy_addrs.admin).await;
            (sample(&text, "proxynet_tunnels_active", &[]) == 0.0).then_some(())
        },
    )
    .await;
    stack.wait_for_usage(account, user, billed, billed).await;
}
