//! The dashboard as a hostile page or a guesser meets it: no cross-site
//! login or logout, no framing, no caching, `Secure` behind TLS, login
//! attempts throttled per address, sessions per key bounded.

use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN};

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

async fn login(stack: &Stack, key: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut r = client()
        .post(stack.api("/dashboard/login"))
        .form(&[("key", key)]);
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

fn no_agents() -> StackOptions {
    StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cross_site_requests_framing_and_caching_are_refused() {
    let stack = Stack::start_with(no_agents()).await;
    let page = client()
        .get(stack.api("/dashboard/login"))
        .send()
        .await
        .unwrap();
    let h = page.headers();
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("frame-ancestors 'none'"), "{csp}");
    assert!(
        csp.contains("script-src 'sha256-"),
        "only its own script: {csp}"
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert_eq!(h["cache-control"], "no-store");

    // A login posted by another site (login CSRF), or a logout.
    for headers in [
        &[("origin", "http://evil.example")][..],
        &[("sec-fetch-site", "cross-site")][..],
    ] {
        let r = login(&stack, ADMIN_TOKEN, headers).await;
        assert_eq!(r.status(), 403, "{headers:?}");
        assert!(r.headers().get("set-cookie").is_none());
        let r = client()
            .post(stack.api("/dashboard/logout"))
            .header(headers[0].0, headers[0].1)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "logout {headers:?}");
    }
    // The dashboard's own form (same origin) logs in; behind TLS the cookie is Secure.
    let origin = stack.api_url.clone();
    let r = login(&stack, ADMIN_TOKEN, &[("origin", &origin)]).await;
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && !cookie.contains("Secure"),
        "{cookie}"
    );
    let r = login(&stack, ADMIN_TOKEN, &[("x-forwarded-proto", "https")]).await;
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    assert!(cookie.contains("; Secure"), "{cookie}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_are_throttled_per_address() {
    let stack = Stack::start_with(no_agents()).await;
    // Successful logins cost nothing: operators sharing one address (a
    // terminating proxy) do not lock each other out.
    let mut cookies = Vec::new();
    for _ in 0..12 {
        let r = login(&stack, ADMIN_TOKEN, &[]).await;
        assert_eq!(r.status(), 303);
        let cookie = r.headers()["set-cookie"].to_str().unwrap();
        cookies.push(cookie.split(';').next().unwrap().to_owned());
    }
    // Ten failures a minute; the eleventh attempt, right or wrong, waits.
    for _ in 0..10 {
        assert_eq!(login(&stack, "not-a-key", &[]).await.status(), 401);
    }
    let r = login(&stack, "not-a-key", &[]).await;
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let r = login(&stack, ADMIN_TOKEN, &[]).await;
    assert_eq!(r.status(), 429);
    // Sessions already open are not affected.
    let r = client()
        .get(stack.api("/dashboard/usage"))
        .header("cookie", &cookies[0])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}
