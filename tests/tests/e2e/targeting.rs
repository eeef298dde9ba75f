//! Finer targeting and session control from the client's side: `continent`,
//! `state`/`region` (the subdivision an exit's token declares), `notexit`,
//! `rotate`, `sessidle`, and moving a session's time over the API.

use proxynet_tests::client::{curl, egress_via, proxy_as};
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{spawn_superproxy, Stack, ADMIN_TOKEN, USERNAME};
use proxynet_tests::whoami::Seen;
use serde_json::json;
use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use uuid::Uuid;

/// A response header's value (last occurrence), lower-cased name.
fn header(headers: &str, name: &str) -> Option<String> {
    headers.lines().rev().find_map(|l| {
        let (n, v) = l.split_once(':')?;
        n.trim()
            .eq_ignore_ascii_case(name)
            .then(|| v.trim().to_owned())
    })
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Every egress IP one curl process's kept-alive connection used for `n`
/// absolute-form requests as `user`.
async fn egress_of_one_connection(stack: &Stack, user: &str, n: usize) -> HashSet<String> {
    let url = stack.whoami_url();
    let urls: Vec<&str> = std::iter::repeat_n(url.as_str(), n).collect();
    let proxy = proxy_as(user, stack.proxy_addrs.proxy);
    let mut args = vec!["-x", proxy.as_str()];
    args.extend(urls);
    let r = curl(&args).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    // curl prints each response body followed by its status line (-w).
    let bodies = r.body.replace("\n200", "");
    let seen: Vec<String> = serde_json::Deserializer::from_str(&bodies)
        .into_iter::<Seen>()
        .map(|seen| seen.unwrap().peer.ip().to_string())
        .collect();
    assert_eq!(seen.len(), n, "{bodies}");
    seen.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_by_continent_uses_the_exits_there_and_names_the_key_when_none_is() {
    let stack = Stack::start().await;
    let demo: HashSet<String> = stack
        .agents
        .iter()
        .map(|a| a.egress_ip.to_string())
        .collect();
    // The demo exits are in DE: Europe.
    let europe = proxy_as(&format!("{USERNAME}-continent-eu"), stack.proxy_addrs.proxy);
    for _ in 0..12 {
        let ip = egress_via(&europe, &stack.whoami_url()).await;
        assert!(
            demo.contains(&ip),
            "continent-eu left from {ip}, not a DE exit"
        );
    }

    let asia = proxy_as(&format!("{USERNAME}-continent-as"), stack.proxy_addrs.proxy);
    let r = curl(&["-p", "-x", &asia, &stack.whoami_url()]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 503"), "{h}");
    assert!(
        h.contains("error=destination_unavailable") && h.contains("continent=as"),
        "{h}"
    );
    assert!(h.contains("retry-after:"), "{h}");

    // A continent the country asked for is not on: refused, with the reason.
    let contradiction = proxy_as(
        &format!("{USERNAME}-continent-as-country-de"),
        stack.proxy_addrs.proxy,
    );
    let r = curl(&["-p", "-x", &contradiction, &stack.whoami_url()]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(
        h.contains(" 400") && h.contains("not on the continent asked for"),
        "{h}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_notexit_never_uses_that_exit() {
    let stack = Stack::start().await;
    let (excluded, other) = (&stack.agents[0], &stack.agents[1]);
    let user = format!("{USERNAME}-notexit-{}", excluded.addrs.exit_id.simple());
    let proxy = proxy_as(&user, stack.proxy_addrs.proxy);
    for _ in 0..20 {
        assert_eq!(
            egress_via(&proxy, &stack.whoami_url()).await,
            other.egress_ip.to_string()
        );
    }
    // Absolute-form too.
    let seen = egress_of_one_connection(&stack, &user, 10).await;
    assert_eq!(seen, HashSet::from([other.egress_ip.to_string()]));
    // Excluding the one exit asked for is a contradiction.
    let both = proxy_as(
        &format!(
            "{USERNAME}-exit-{0}-notexit-{0}",
            excluded.addrs.exit_id.simple()
        ),
        stack.proxy_addrs.proxy,
    );
    let r = curl(&["-p", "-x", &both, &stack.whoami_url()]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(
        h.contains(" 400") && h.contains("exit and notexit name the same exit"),
        "{h}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_by_state_uses_the_exit_whose_token_declared_it() {
    let mut stack = Stack::start().await;
    let source = stack.complete_dc_source().await;
    let token = |region: &str| json!({"name": "bavarian", "source_id": source, "country": "DE", "region": region});
    let post = |body: serde_json::Value| {
        stack
            .http
            .post(stack.api("/v1/enrollment-tokens"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
    };
    // The region must be a subdivision of the token's own country.
    for bad in ["FR-IDF", "DE", "DE-BAYERN", "XX-BY", "de_by"] {
        let r = post(token(bad)).await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
        let problem: serde_json::Value = r.json().await.unwrap();
        assert!(
            problem["detail"].as_str().unwrap().starts_with("region:"),
            "{problem}"
        );
    }
    let r = post(token("de-by")).await.unwrap();
    assert_eq!(r.status(), 201);
    let secret = r.json::<serde_json::Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let i = stack
        .add_agent_with_token(&["127.0.0.4".parse().unwrap()], secret)
        .await;
    stack.wait_eligible(3).await;
    let exit_id = stack.agents[i].addrs.exit_id;
    let exit = stack.admin_get_json(&format!("/v1/exits/{exit_id}")).await;
    assert_eq!(exit["region"], "DE-BY", "{exit}");
    assert_eq!(exit["country"], "DE");
    let demo = stack
        .admin_get_json(&format!("/v1/exits/{}", stack.agents[0].addrs.exit_id))
        .await;
    assert!(demo["region"].is_null(), "{demo}");

    for key in ["state", "region"] {
        let bavaria = proxy_as(&format!("{USERNAME}-{key}-de-by"), stack.proxy_addrs.proxy);
        for _ in 0..6 {
            assert_eq!(egress_via(&bavaria, &stack.whoami_url()).await, "127.0.0.4");
        }
    }
    let berlin = proxy_as(&format!("{USERNAME}-state-de-be"), stack.proxy_addrs.proxy);
    let r = curl(&["-p", "-x", &berlin, &stack.whoami_url()]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(h.contains(" 503") && h.contains("region=de-be"), "{h}");
    let both = proxy_as(
        &format!("{USERNAME}-state-de-by-region-de-by"),
        stack.proxy_addrs.proxy,
    );
    let r = curl(&["-p", "-x", &both, &stack.whoami_url()]).await;
    let h = r.headers.to_ascii_lowercase();
    assert!(
        h.contains(" 400") && h.contains("state and region are the same key"),
        "{h}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_rotate_tunnel_keeps_a_connections_exit_and_rotate_request_does_not() {
    let stack = Stack::start().await;
    let kept = egress_of_one_connection(&stack, &format!("{USERNAME}-rotate-tunnel"), 12).await;
    assert_eq!(
        kept.len(),
        1,
        "rotate-tunnel: one exit per connection: {kept:?}"
    );
    // rotate-request spreads one connection's requests (power of two
    // choices may favour a clearly faster exit for a while: ask again).
    eventually(
        "rotate-request to spread one connection's requests over both exits",
        Duration::from_secs(20),
        || async {
            let spread =
                egress_of_one_connection(&stack, &format!("{USERNAME}-rotate-request"), 12).await;
            (spread.len() == 2).then_some(())
        },
    )
    .await;
    // CONNECT tunnels pick afresh under either value.
    let tunnels = proxy_as(
        &format!("{USERNAME}-rotate-tunnel"),
        stack.proxy_addrs.proxy,
    );
    let seen = std::sync::Mutex::new(HashSet::new());
    eventually(
        "rotate-tunnel CONNECT tunnels to use both exits",
        Duration::from_secs(20),
        || async {
            let ip = egress_via(&tunnels, &stack.whoami_url()).await;
            let mut seen = seen.lock().unwrap();
            seen.insert(ip);
            (seen.len() == 2).then_some(())
        },
    )
    .await;
    let with_session = proxy_as(
        &format!("{USERNAME}-session-r1-rotate-tunnel"),
        stack.proxy_addrs.proxy,
    );
    let r = curl(&["-p", "-x", &with_session, &stack.whoami_url()]).await;
    assert!(r.headers.contains(" 400"), "{}", r.headers);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_session_time_moves_over_the_api_and_every_superproxy_honours_it() {
    let stack = Stack::start().await;
    let (_second, second_addrs) = spawn_superproxy(&stack.stores, &[]).await;
    stack.wait_eligible_at(second_addrs.admin, 2).await;
    let user = format!("{USERNAME}-session-long1-sesstime-5");
    let first = curl(&[
        "-p",
        "-x",
        &proxy_as(&user, stack.proxy_addrs.proxy),
        &stack.whoami_url(),
    ])
    .await;
    assert_eq!(first.status, 200, "{}", first.headers);
    let pinned_exit = header(&first.headers, "proxynet-exit").unwrap();

    let base = stack.api(&format!("/v1/users/{}/sessions", stack.user_id));
    let patch = |session: &str, body: serde_json::Value, key: &str| {
        stack
            .http
            .patch(format!("{base}/{session}"))
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    let r = patch("long1", json!({"sesstime_minutes": 60}), ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let view: serde_json::Value = r.json().await.unwrap();
    assert!(
        view["expires_in_ms"].as_i64().unwrap() >= 3_000_000,
        "{view}"
    );
    assert_eq!(view["exit_id"], pinned_exit.as_str());

    let listed: serde_json::Value = stack
        .http
        .get(&base)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let long1 = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["session"] == "long1")
        .unwrap();
    let left = long1["expires_in_ms"].as_i64().unwrap();
    assert!((3_000_000..=3_600_000).contains(&left), "{listed}");

    // Both superproxies answer with the moved expiry, on the same exit.
    for proxy in [stack.proxy_addrs.proxy, second_addrs.proxy] {
        let r = curl(&["-p", "-x", &proxy_as(&user, proxy), &stack.whoami_url()]).await;
        assert_eq!(r.status, 200, "{}", r.headers);
        assert_eq!(header(&r.headers, "proxynet-exit").unwrap(), pinned_exit);
        let expires: u64 = header(&r.headers, "proxynet-session-expires")
            .unwrap()
            .parse()
            .unwrap();
        assert!(expires >= unix_now() + 50 * 60, "{expires} via {proxy}");
    }

    // Shorter works too.
    let r = patch("long1", json!({"sesstime_minutes": 1}), ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let view: serde_json::Value = r.json().await.unwrap();
    assert!(view["expires_in_ms"].as_i64().unwrap() <= 60_000, "{view}");
    let r = curl(&[
        "-p",
        "-x",
        &proxy_as(&user, second_addrs.proxy),
        &stack.whoami_url(),
    ])
    .await;
    let expires: u64 = header(&r.headers, "proxynet-session-expires")
        .unwrap()
        .parse()
        .unwrap();
    assert!(expires <= unix_now() + 61, "{expires}");

    // Bounds, absent sessions, and tenancy like the other session routes.
    for bad in [
        json!({"sesstime_minutes": 0}),
        json!({"sesstime_minutes": 1441}),
    ] {
        let r = patch("long1", bad.clone(), ADMIN_TOKEN).await.unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    // Not the body's shape at all: the API's 422, as for every body.
    for bad in [
        json!({}),
        json!({"sesstime_minutes": "60"}),
        json!({"minutes": 60}),
    ] {
        let r = patch("long1", bad.clone(), ADMIN_TOKEN).await.unwrap();
        assert_eq!(r.status(), 422, "{bad}");
    }
    let r = patch("nosuch", json!({"sesstime_minutes": 5}), ADMIN_TOKEN)
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let other = stack.create_account("other").await;
    let (other_key, _) = stack.account_key(other).await;
    let r = patch("long1", json!({"sesstime_minutes": 60}), &other_key)
        .await
        .unwrap();
    assert_eq!(r.status(), 404, "another account's user");
    let acme: Uuid = stack
        .admin_get_json(&format!("/v1/users/{}", stack.user_id))
        .await["account_id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let (own_key, _) = stack.account_key(acme).await;
    let r = patch("long1", json!({"sesstime_minutes": 30}), &own_key)
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "the account's own key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targeting_sessidle_pins_and_a_pin_idle_past_its_deadline_is_picked_afresh() {
    let stack = Stack::start().await;
    let user = proxy_as(
        &format!("{USERNAME}-session-idle1-sessidle-1-sesstime-30"),
        stack.proxy_addrs.proxy,
    );
    let pinned = egress_via(&user, &stack.whoami_url()).await;
    for _ in 0..5 {
        assert_eq!(egress_via(&user, &stack.whoami_url()).await, pinned);
    }
    let session: serde_json::Value = stack
        .http
        .get(stack.api(&format!("/v1/users/{}/sessions/idle1", stack.user_id)))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // The pin lives its sesstime, unless a minute passes without a tunnel.
    let idle = session["idle_expires_in_ms"].as_i64().unwrap();
    assert!(idle > 0 && idle <= 60_000, "{session}");
    assert!(
        session["expires_in_ms"].as_i64().unwrap() > 29 * 60_000,
        "{session}"
    );

    // A pin idle past its deadline is gone. No minute is waited for: the
    // deadline the pin carries is moved into the past, as if it had been
    // (the rule itself is unit-tested on an injected clock in
    // superproxy/src/select/sessions.rs), and the pin's life shortened so a
    // fresh pin is told apart by its full sesstime.
    let session_url = stack.api(&format!("/v1/users/{}/sessions/idle1", stack.user_id));
    let r = stack
        .http
        .patch(&session_url)
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"sesstime_minutes": 5}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut redis = stack.stores.redis().await;
    let key = stack.stores.keys().session(stack.user_id, "idle1");
    let rewritten: i64 = redis::Script::new(
        r"local v = redis.call('GET', KEYS[1])
          local base = string.gsub(v, ' idle:%d+$', '')
          redis.call('SET', KEYS[1], base .. ' idle:1', 'KEEPTTL')
          return 1",
    )
    .key(&key)
    .invoke_async(&mut redis)
    .await
    .unwrap();
    assert_eq!(rewritten, 1);
    let gone = stack
        .http
        .get(&session_url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), 404, "an idle pin is no session");
    // The next tunnel picks afresh: a new pin with the whole sesstime.
    let r = curl(&["-p", "-x", &user, &stack.whoami_url()]).await;
    assert_eq!(r.status, 200, "{}", r.headers);
    let fresh: serde_json::Value = stack
        .http
        .get(&session_url)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        fresh["expires_in_ms"].as_i64().unwrap() > 29 * 60_000,
        "a fresh pin: {fresh}"
    );
    let idle = fresh["idle_expires_in_ms"].as_i64().unwrap();
    assert!(idle > 0 && idle <= 60_000, "{fresh}");

    let r = curl(&[
        "-p",
        "-x",
        &proxy_as(&format!("{USERNAME}-sessidle-1"), stack.proxy_addrs.proxy),
        &stack.whoami_url(),
    ])
    .await;
    let h = r.headers.to_ascii_lowercase();
    assert!(
        h.contains(" 400") && h.contains("sessidle needs a session key"),
        "{h}"
    );
}
