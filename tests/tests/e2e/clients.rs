//! The HTTPS proxy listener, IP allow-list login, and real clients
//! (curl, Python requests and httpx, Node undici, headless Chromium) against
//! the real stack.

use proxynet_tests::client::curl;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, PASSWORD, USERNAME};
use proxynet_tests::targets::{echo_round_trip, echo_server};
use proxynet_tests::whoami::Seen;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn exit_ips() -> [&'static str; 2] {
    ["127.0.0.2", "127.0.0.3"]
}

fn tls_stack() -> StackOptions {
    StackOptions {
        proxy_tls: true,
        ..Default::default()
    }
}

type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

/// A TLS connection to the HTTPS proxy trusting only `ca`.
async fn tls_connect(addr: SocketAddr, ca: &Path) -> TlsStream {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    connector
        .connect("localhost".try_into().unwrap(), tcp)
        .await
        .unwrap()
}

fn peer_cert(stream: &TlsStream) -> Vec<u8> {
    stream.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn cert_der(path: &Path) -> Vec<u8> {
    use rustls::pki_types::pem::PemObject;
    rustls::pki_types::CertificateDer::pem_file_iter(path)
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_https_proxy_listener_serves_tunnels_and_reloads_its_certificate_on_sighup() {
    let stack = Stack::start_with(tls_stack()).await;
    let files = stack.tls.as_ref().unwrap();
    let ca = files.ca.ca_pem.display().to_string();
    let proxy = stack.tls_proxy_url();
    for extra in [&[][..], &["-p"][..]] {
        let mut args = vec!["--proxy", &proxy[..], "--proxy-cacert", &ca];
        args.extend_from_slice(extra);
        let target = stack.whoami_url();
        args.push(&target);
        let r = curl(&args).await;
        assert_eq!(r.status, 200, "{} {}", r.headers, r.body);
        let seen: Seen = serde_json::from_str(&r.body).unwrap();
        assert!(exit_ips().contains(&seen.peer.ip().to_string().as_str()));
    }
    let wrong = stack.tls_proxy_url().replace("correct", "wrong");
    let r = curl(&[
        "-p",
        "--proxy",
        &wrong,
        "--proxy-cacert",
        &ca,
        &stack.whoami_url(),
    ])
    .await;
    assert!(r.headers.contains(" 407"), "{}", r.headers);
    assert!(
        r.headers
            .to_ascii_lowercase()
            .contains("proxy-status: proxynet; error=http_request_denied"),
        "{}",
        r.headers
    );

    // An open tunnel over TLS, then a new certificate on disk and SIGHUP.
    let tls_addr = stack.proxy_addrs.tls.unwrap();
    let echo = echo_server().await;
    let mut tunnel = tls_connect(tls_addr, &files.ca.ca_pem).await;
    assert_eq!(peer_cert(&tunnel), cert_der(&files.cert));
    use base64::Engine;
    let auth = base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"));
    tunnel
        .write_all(format!("CONNECT {echo} HTTP/1.1\r\nHost: {echo}\r\nProxy-Authorization: Basic {auth}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tunnel.read_exact(&mut byte).await.unwrap();
        head.push(byte[0]);
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    let old = cert_der(&files.cert);
    files.ca.issue("proxynet proxy 2", &files.cert, &files.key);
    let new = cert_der(&files.cert);
    assert_ne!(old, new);
    stack.proxy.signal(libc::SIGHUP);
    eventually(
        "the new certificate to be served",
        Duration::from_secs(10),
        || async {
            let next = tls_connect(tls_addr, &files.ca.ca_pem).await;
            (peer_cert(&next) == new).then_some(())
        },
    )
    .await;
    tunnel.write_all(b"still here").await.unwrap();
    let mut back = [0u8; 10];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still here", "the open tunnel kept flowing");
    let _ = echo_round_trip;
}

async fn create_user(stack: &Stack, account: uuid::Uuid, body: Value) -> (u16, Value) {
    let r = stack.admin().create_user_with(account, &body).await;
    (r.status().as_u16(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allow_listed_address_tunnels_without_credentials_and_is_billed() {
    let stack = Stack::start().await;
    let account = stack.create_account("office").await;
    stack.allow_loopback_allowlists(account).await;
    let (status, user) = create_user(
        &stack,
        account,
        json!({"username": "office", "password": "office-password-1",
               "allowed_source_cidrs": ["127.0.0.0/8"], "allowlist_options": "country-de"}),
    )
    .await;
    assert_eq!(status, 201, "{user}");
    let user_id: uuid::Uuid = user["id"].as_str().unwrap().parse().unwrap();
    assert_eq!(user["allowed_source_cidrs"], json!(["127.0.0.0/8"]));
    // Overlaps are refused, for any user.
    let (status, body) = create_user(
        &stack,
        account,
        json!({"username": "overlap", "password": "overlap-password-1", "allowed_source_cidrs": ["127.0.0.1/32"]}),
    )
    .await;
    assert_eq!(status, 409, "{body}");

    let bare = format!("http://{}", stack.proxy_addrs.proxy);
    let r = eventually(
        "the allow-list to reach the superproxy",
        Duration::from_secs(5),
        || async {
            let r = curl(&["-p", "-x", &bare, &stack.whoami_url()]).await;
            (r.status == 200).then_some(r)
        },
    )
    .await;
    let seen: Seen = serde_json::from_str(&r.body).unwrap();
    assert!(exit_ips().contains(&seen.peer.ip().to_string().as_str()));
    assert_eq!(
        curl(&["-x", &bare, &stack.whoami_url()]).await.status,
        200,
        "absolute-form too"
    );
    // Credentials, when present, still win.
    assert_eq!(
        curl(&["-p", "-x", &stack.proxy_url(), &stack.whoami_url()])
            .await
            .status,
        200
    );
    eventually(
        "the allow-listed bytes in the office user's ledger",
        Duration::from_secs(20),
        || async {
            let rows = stack.usage_by_user(account).await;
            rows.iter()
                .find(|r| r["user_id"] == user_id.to_string())
                .filter(|r| r["bytes_down"].as_u64().unwrap_or(0) > 0)
                .map(|_| ())
        },
    )
    .await;

    let r = stack
        .admin()
        .patch_user(user_id, &json!({"allowed_source_cidrs": []}))
        .await;
    assert_eq!(r.status(), 200);
    eventually(
        "the next tunnel to be refused",
        Duration::from_secs(5),
        || async {
            let r = curl(&["-p", "-x", &bare, &stack.whoami_url()]).await;
            r.headers.contains(" 407").then_some(())
        },
    )
    .await;
}

fn assert_all_left_from_an_exit(results: &Value) {
    let cases = results.as_object().unwrap();
    assert!(!cases.is_empty());
    for (case, result) in cases {
        assert_eq!(result["status"], 200, "{case}: {result}");
        let peer = result["peer"].as_str().unwrap_or_default();
        assert!(exit_ips().contains(&peer), "{case}: left from {peer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_node_and_chromium_clients_work_through_every_ingress() {
    let stack = Stack::start_with(tls_stack()).await;
    let files = stack.tls.as_ref().unwrap();
    let account = stack.create_account("browsers").await;
    stack.allow_loopback_allowlists(account).await;
    let (status, body) = create_user(
        &stack,
        account,
        json!({"username": "browser", "password": "browser-password-1", "allowed_source_cidrs": ["127.0.0.0/8"]}),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let bare = format!("http://{}", stack.proxy_addrs.proxy);
    eventually(
        "the allow-list to reach the superproxy",
        Duration::from_secs(5),
        || async {
            (curl(&["-p", "-x", &bare, &stack.whoami_url()]).await.status == 200).then_some(())
        },
    )
    .await;
    let shots = repo("target/test-artefacts");
    std::fs::create_dir_all(&shots).unwrap();
    let env = [
        ("TARGET", stack.whoami_url()),
        ("PROXY_HTTP", stack.proxy_url()),
        ("PROXY_SOCKS", stack.socks_url()),
        ("PROXY_HTTPS", stack.tls_proxy_url()),
        ("PROXY_CA", files.ca.ca_pem.display().to_string()),
        ("PROXY_CERT", files.cert.display().to_string()),
        ("PROXY_HTTP_PLAIN", bare.clone()),
        ("SCREENSHOT_DIR", shots.display().to_string()),
    ];
    let python = repo("tests/clients/.venv/bin/python");
    let out = tokio::process::Command::new(&python)
        .arg(repo("tests/clients/python_clients.py"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap_or_else(|e| panic!("{}: {e} (scripts/test creates the venv)", python.display()));
    let results: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    assert_all_left_from_an_exit(&results);
    let out = tokio::process::Command::new("node")
        .arg(repo("tests/browser/clients.mjs"))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .await
        .unwrap();
    let results: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|_| {
        panic!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_all_left_from_an_exit(&results);
}
