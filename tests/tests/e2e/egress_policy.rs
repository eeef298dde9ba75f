//! The egress policy at the gateway: invalid ports are refused before any
//! exit is dialled, and the stack's own services are prohibited by name and
//! by every embedded spelling of their addresses.

use proxynet_tests::client::assert_gateway_error;
use proxynet_tests::client::{curl, raw_request, socks5};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{redis_service_addr, Stack, StackOptions, PASSWORD, USERNAME};
use std::time::Duration;
use tokio::net::TcpListener;

fn basic_auth() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{USERNAME}:{PASSWORD}"))
}

/// An invalid port is a 400 on every ingress, never a default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_ports_are_refused_and_nothing_is_dialled() {
    let stack = Stack::start().await;
    // The port the bug silently rewrote to: if we can listen there, nothing
    // may ever connect to it.
    let port80 = TcpListener::bind("127.0.0.1:80").await.ok();
    let auth = basic_auth();
    for port in ["99999", "65536", "0", "", "8o", "-1"] {
        let absolute = format!(
            "GET http://127.0.0.1:{port}/x HTTP/1.1\r\nHost: 127.0.0.1\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
        );
        let r = raw_request(
            stack.proxy_addrs.proxy,
            absolute.as_bytes(),
            Duration::from_secs(10),
        )
        .await;
        assert_gateway_error(&r, 400, "http_request_error");
        let connect = format!(
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
        );
        let r = raw_request(
            stack.proxy_addrs.proxy,
            connect.as_bytes(),
            Duration::from_secs(10),
        )
        .await;
        assert_gateway_error(&r, 400, "http_request_error");
    }
    // SOCKS5: a port 0 target is refused (general failure), not dialled.
    let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
        .await
        .unwrap();
    assert_eq!(socks5::request(&mut s, 1, "127.0.0.1", 0).await, 0x01);
    if let Some(listener) = port80 {
        let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
        assert!(accepted.is_err(), "something dialled port 80");
    }
}

/// The stack's own services are refused when named, not only as literals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stacks_own_services_are_prohibited_by_name() {
    let stack = Stack::start().await;
    let api_port = stack.api_url.rsplit(':').next().unwrap().to_owned();
    for port in [
        stack.proxy_addrs.admin.port().to_string(),
        stack.proxy_addrs.link.port().to_string(),
        stack.proxy_addrs.proxy.port().to_string(),
        api_port,
    ] {
        eventually(
            "the agent to learn the stack's addresses",
            Duration::from_secs(10),
            || async {
                let r = curl(&[
                    "-x",
                    &stack.proxy_url(),
                    &format!("http://localhost:{port}/"),
                ])
                .await;
                (r.status == 403 && r.headers.contains("destination_ip_prohibited")).then_some(())
            },
        )
        .await;
    }
}

/// IPv6 spellings of a protected loopback service are refused as
/// such (403 / SOCKS reply 2), at the superproxy's early check and, with
/// that check out of the way, at the exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_loopback_spellings_of_a_protected_service_are_prohibited() {
    let redis_port: u16 = redis_service_addr()
        .expect("scripts/test exports the Redis port")
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let spellings = [
        "64:ff9b::7f00:1",
        "2002:7f00:1::",
        "::127.0.0.1",
        "::ffff:127.0.0.1",
        "2001:0:4136:e378:8000:63bf:80ff:fffe",
    ];
    for superproxy_checks in [true, false] {
        let stack = Stack::start_with(StackOptions {
            superproxy_protects_redis: superproxy_checks,
            // Without the early check, an exit that egresses over IPv6 is
            // asked, so its own check is what refuses.
            egress_ips: if superproxy_checks {
                StackOptions::default().egress_ips
            } else {
                vec!["::1".parse().unwrap()]
            },
            ..Default::default()
        })
        .await;
        let auth = basic_auth();
        for ip in spellings {
            let connect = format!(
                "CONNECT [{ip}]:{redis_port} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
            );
            let r = raw_request(
                stack.proxy_addrs.proxy,
                connect.as_bytes(),
                Duration::from_secs(10),
            )
            .await;
            assert_gateway_error(&r, 403, "destination_ip_prohibited");
            if superproxy_checks {
                assert!(
                    r.body.contains("belongs to the proxy network"),
                    "refused by the early check: {r:?}"
                );
            }
            let absolute = format!(
                "GET http://[{ip}]:{redis_port}/ HTTP/1.1\r\nHost: x\r\nProxy-Authorization: Basic {auth}\r\n\r\n"
            );
            let r = raw_request(
                stack.proxy_addrs.proxy,
                absolute.as_bytes(),
                Duration::from_secs(10),
            )
            .await;
            assert_gateway_error(&r, 403, "destination_ip_prohibited");
            let mut s = socks5::login(stack.proxy_addrs.socks, USERNAME, PASSWORD)
                .await
                .unwrap();
            assert_eq!(
                socks5::request(&mut s, 1, ip, redis_port).await,
                0x02,
                "{ip}"
            );
        }
    }
}
