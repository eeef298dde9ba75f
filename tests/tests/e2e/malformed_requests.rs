//! Bad input gets a clear error: requests hyper refuses still carry
//! `Proxy-Status`, and the API's rejections are problem details.

use proxynet_tests::client::assert_gateway_error;
use proxynet_tests::client::raw_request;
use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN};
use serde_json::json;
use std::time::Duration;

/// What hyper itself would refuse gets our 400 with `Proxy-Status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_hyper_refuses_carry_proxy_status() {
    let stack = Stack::start().await;
    for line in [
        "CONNECT 127.0.0.1%0d%0aX:80 HTTP/1.1",
        "CONNECT %zz:80 HTTP/1.1",
        "CONNECT a^b:80 HTTP/1.1",
        "GET http://[::1/ HTTP/1.1",
        "CONNECT http://a:80/ HTTP/1.1",
        "GET http://a{b}/ HTTP/1.1",
    ] {
        let request = format!("{line}\r\nHost: x\r\n\r\n");
        let r = raw_request(
            stack.proxy_addrs.proxy,
            request.as_bytes(),
            Duration::from_secs(10),
        )
        .await;
        assert_gateway_error(&r, 400, "http_request_error");
    }
}

/// Requests axum refuses answer problem+json like every other API error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_rejections_are_problem_details() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    })
    .await;
    let cases = [
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .header("content-type", "application/json")
            .body("{not json"),
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .json(&json!({"name": "x", "unknown": 1})),
        stack
            .http
            .post(stack.api("/v1/accounts"))
            .body("{\"name\":\"x\"}"),
        stack.http.get(stack.api("/v1/users/not-a-uuid")),
        stack.http.get(stack.api("/v1/exits?limit=lots")),
    ];
    for request in cases {
        let r = request.bearer_auth(ADMIN_TOKEN).send().await.unwrap();
        let status = r.status().as_u16();
        assert!((400..500).contains(&status), "{status}");
        assert_eq!(
            r.headers()["content-type"].to_str().unwrap(),
            "application/problem+json"
        );
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["status"], status);
        assert!(
            body["detail"].as_str().is_some_and(|d| !d.is_empty()),
            "{body}"
        );
    }
}
