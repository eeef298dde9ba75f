//! The PROXY protocol behind a real HAProxy (`send-proxy-v2`): a client
//! through the balancer is itself everywhere — it logs in by its own IP
//! allow-list and the access log names it — while the balancer's address
//! without a header is closed and anyone else's header is just bad input.

use proxynet_tests::process::{eventually, read_log, Proc};
use proxynet_tests::stack::{Stack, StackOptions, SuperproxyArgs};
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// Where HAProxy's connections to the superproxy come from: the only
/// trusted network.
const BALANCER: &str = "127.0.0.88";
/// The client behind the balancer, allow-listed by its /24.
const CLIENT: &str = "127.0.77.1";

async fn connect_from(from: &str, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::new(from.parse::<IpAddr>().unwrap(), 0))?;
    socket.connect(to).await
}

/// HAProxy in TCP mode on `listen`, relaying to `superproxy` from
/// [`BALANCER`] with a v2 header; its port answers before this returns.
async fn haproxy(dir: &Path, listen: SocketAddr, superproxy: SocketAddr) -> Proc {
    let installed = std::process::Command::new("haproxy")
        .arg("-v")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        installed,
        "haproxy is not installed: this test needs the Debian package `haproxy` \
         (scripts/test installs it with PROXYNET_INSTALL_TEST_TOOLS=1)"
    );
    let config = dir.join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "defaults\n\
             \x20   mode tcp\n\
             \x20   timeout connect 5s\n\
             \x20   timeout client 60s\n\
             \x20   timeout server 60s\n\
             frontend clients\n\
             \x20   bind {listen}\n\
             \x20   default_backend superproxies\n\
             backend superproxies\n\
             \x20   server superproxy {superproxy} source {BALANCER} send-proxy-v2\n"
        ),
    )
    .unwrap();
    let child = tokio::process::Command::new("haproxy")
        .arg("-f")
        .arg(&config)
        .arg("-db")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start haproxy");
    let proc = Proc {
        name: "haproxy".into(),
        child,
    };
    eventually("haproxy to listen", Duration::from_secs(10), || async {
        TcpStream::connect(listen).await.ok()
    })
    .await;
    proc
}

/// A CONNECT to `target` without credentials on `stream`: the answer's head.
async fn connect_head(stream: &mut TcpStream, preamble: &[u8], target: SocketAddr) -> String {
    let mut request = preamble.to_vec();
    request.extend_from_slice(
        format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes(),
    );
    if stream.write_all(&request).await.is_err() {
        return String::new();
    }
    proxynet_tests::client::read_head(stream).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_behind_haproxy_is_itself_and_no_one_else_can_claim_an_address() {
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("superproxy.log");
    let stack = Stack::start_with(StackOptions {
        superproxy_args: SuperproxyArgs::new()
            .proxy_protocol_from(format!("{BALANCER}/32").parse().unwrap())
            .into(),
        superproxy_log: Some(log.clone()),
        ..Default::default()
    })
    .await;
    let account = stack.create_account("balanced").await;
    stack.allow_loopback_allowlists(account).await;
    let r = stack
        .admin()
        .create_user_with(
            account,
            &json!({
                "username": "office",
                "password": "allowlisted-pw-1",
                "allowed_source_cidrs": ["127.0.77.0/24"],
            }),
        )
        .await;
    assert_eq!(r.status().as_u16(), 201);

    let listen = {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        free.local_addr().unwrap()
    };
    let _haproxy = haproxy(logs.path(), listen, stack.proxy_addrs.proxy).await;
    let whoami = stack.whoami;

    // Through HAProxy from 127.0.77.1: logged in by its allow-list, which
    // names no address of HAProxy's.
    let tunnel = eventually(
        "an allow-listed CONNECT through haproxy",
        Duration::from_secs(10),
        || async {
            let mut s = connect_from(CLIENT, listen).await.ok()?;
            let head = connect_head(&mut s, b"", whoami).await;
            head.starts_with("HTTP/1.1 200").then_some(s)
        },
    )
    .await;
    drop(tunnel);
    // The access log names the client, never the balancer.
    eventually(
        "the tunnel's access-log line naming the client",
        Duration::from_secs(10),
        || async {
            let text = read_log(&log);
            text.lines()
                .filter(|l| l.contains("proxynet::access"))
                .any(|l| {
                    l.contains(&format!("client={CLIENT}:"))
                        && (l.contains("user=office ") || l.contains("user=\"office\""))
                })
                .then_some(())
        },
    )
    .await;
    let text = read_log(&log);
    assert!(
        !text
            .lines()
            .any(|l| l.contains("proxynet::access") && l.contains(&format!("client={BALANCER}:"))),
        "an access-log line names the balancer"
    );

    // The balancer's address without a header: closed unanswered.
    let mut bare = connect_from(BALANCER, stack.proxy_addrs.proxy)
        .await
        .unwrap();
    let head = tokio::time::timeout(Duration::from_secs(5), connect_head(&mut bare, b"", whoami))
        .await
        .expect("a headerless connection from the balancer is closed at once");
    assert!(head.is_empty(), "answered without a header: {head:?}");
    let mut rest = [0u8; 1];
    assert!(matches!(
        tokio::time::timeout(Duration::from_secs(5), bare.read(&mut rest)).await,
        Ok(Ok(0)) | Ok(Err(_))
    ));

    // A v1 header written by hand from the balancer's address works too.
    let mut by_hand = connect_from(BALANCER, stack.proxy_addrs.proxy)
        .await
        .unwrap();
    let v1 = format!(
        "PROXY TCP4 {CLIENT} {} 40001 {}\r\n",
        stack.proxy_addrs.proxy.ip(),
        stack.proxy_addrs.proxy.port()
    );
    let head = connect_head(&mut by_hand, v1.as_bytes(), whoami).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // The same header from anyone else is not read as one: it claims no
    // address, it is a bad request.
    let mut forged = TcpStream::connect(stack.proxy_addrs.proxy).await.unwrap();
    let head = connect_head(
        &mut forged,
        b"PROXY TCP4 127.0.77.1 127.0.0.1 40002 8080\r\n",
        whoami,
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
}
