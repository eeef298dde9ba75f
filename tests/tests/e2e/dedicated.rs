//! Dedicated IPs: addresses allocated to one account leave the shared pool,
//! carry only that account's `-dedicated` tunnels, come back on release,
//! are replaced (cutting what is open) within an allowance, answer 502 when
//! their exit is down, are billed by the day, and an IPv6 /64 of an exit's
//! prefix can be dedicated like a single address.

use proxynet_tests::client::{
    assert_gateway_error, basic_credential, closed_within, connect_tunnel, egress_via, proxy_as,
    raw_request,
};
use proxynet_tests::netns::ExitHost;
use proxynet_tests::process::eventually;
use proxynet_tests::stack::{Stack, StackOptions, ADMIN_TOKEN, PASSWORD};
use proxynet_tests::targets::echo_server;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

/// One absolute-form request to the whoami target: the egress address it
/// saw, or the gateway's refusal.
async fn egress(
    stack: &Stack,
    username: &str,
) -> Result<IpAddr, proxynet_tests::client::RawResponse> {
    let request = format!(
        "GET http://{w}/ HTTP/1.1\r\nHost: {w}\r\nProxy-Authorization: Basic {}\r\nConnection: close\r\n\r\n",
        basic_credential(username, PASSWORD),
        w = stack.whoami
    );
    let r = raw_request(
        stack.proxy_addrs.proxy,
        request.as_bytes(),
        Duration::from_secs(10),
    )
    .await;
    if r.status != 200 {
        return Err(r);
    }
    let seen: proxynet_tests::whoami::Seen = serde_json::from_str(&r.body).unwrap();
    Ok(seen.peer.ip())
}

/// How many of `n` requests left from each address (every one must succeed).
async fn spread(stack: &Stack, username: &str, n: usize) -> HashMap<IpAddr, usize> {
    let mut seen = HashMap::new();
    for i in 0..n {
        let ip = egress(stack, username)
            .await
            .unwrap_or_else(|r| panic!("request {i} as {username}: {r:?}"));
        *seen.entry(ip).or_insert(0) += 1;
    }
    seen
}

async fn send(
    stack: &Stack,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = stack
        .http
        .request(method, stack.api(path))
        .bearer_auth(token);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let r = request.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Waits until the superproxy's pool shows exactly `held` dedicated
/// addresses: the allocation has reached the data plane.
async fn pool_shows(stack: &Stack, held: usize) {
    eventually(
        &format!("the superproxy to hold {held} dedicated address(es)"),
        Duration::from_secs(10),
        || async {
            let pool = stack.pool().await;
            let count: usize = pool["eligible"]
                .as_array()?
                .iter()
                .map(|e| e["dedicated"].as_array().map_or(0, Vec::len))
                .sum();
            (count == held).then_some(())
        },
    )
    .await;
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dedicated_addresses_serve_only_their_account_and_return_on_release() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![ip("127.0.0.2"), ip("127.0.0.3"), ip("127.0.0.4")],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(3).await;
    let (a, b, c) = (
        stack.create_account("ded-a").await,
        stack.create_account("ded-b").await,
        stack.create_account("ded-c").await,
    );
    stack.create_user(a, "dalice", PASSWORD).await;
    stack.create_user(b, "dbob", PASSWORD).await;
    stack.create_user(c, "dcarol", PASSWORD).await;
    let (a_key, _) = stack.account_key(a).await;

    // Without a plan that allows any, an account's key allocates nothing.
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{a}/dedicated-ips"),
        &a_key,
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("plan allows 0"),
        "{body}"
    );
    // An account may not name addresses; the operator may.
    let (status, _) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{a}/dedicated-ips"),
        &a_key,
        Some(json!({"ips": ["127.0.0.2"]})),
    )
    .await;
    assert_eq!(status, 403);
    for (account, address) in [(a, "127.0.0.2"), (b, "127.0.0.3")] {
        let (status, body) = send(
            &stack,
            reqwest::Method::POST,
            &format!("/v1/accounts/{account}/dedicated-ips"),
            ADMIN_TOKEN,
            Some(json!({"ips": [address]})),
        )
        .await;
        assert_eq!(status, 201, "{body}");
        assert_eq!(body["items"][0]["ip"], address, "{body}");
    }
    // Taken is taken.
    let (status, _) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{c}/dedicated-ips"),
        ADMIN_TOKEN,
        Some(json!({"ips": ["127.0.0.2"]})),
    )
    .await;
    assert_eq!(status, 409);
    pool_shows(&stack, 2).await;

    // 200 dedicated requests each leave only from the account's own address.
    assert_eq!(
        spread(&stack, "dalice-dedicated", 200).await,
        HashMap::from([(ip("127.0.0.2"), 200)])
    );
    assert_eq!(
        spread(&stack, "dbob-dedicated", 200).await,
        HashMap::from([(ip("127.0.0.3"), 200)])
    );
    assert_eq!(
        spread(&stack, "dalice-ip-127.0.0.2", 20).await,
        HashMap::from([(ip("127.0.0.2"), 20)])
    );
    // Another account's address cannot be named.
    let refused = egress(&stack, "dalice-ip-127.0.0.3").await.unwrap_err();
    assert_gateway_error(&refused, 502, "destination_unavailable");
    // A third account never leaves from either while they are held, and
    // neither do the owners' shared tunnels.
    assert_eq!(
        spread(&stack, "dcarol", 200).await,
        HashMap::from([(ip("127.0.0.4"), 200)])
    );
    assert_eq!(
        spread(&stack, "dalice", 20).await,
        HashMap::from([(ip("127.0.0.4"), 20)])
    );
    // An account without dedicated addresses asking for them: 502, named.
    let refused = egress(&stack, "dcarol-dedicated").await.unwrap_err();
    assert_gateway_error(&refused, 502, "destination_unavailable");
    assert!(
        refused
            .header("proxy-status")
            .unwrap_or_default()
            .contains("dedicated"),
        "{refused:?}"
    );

    // The account lists its own; the operator sees the whole map.
    let (status, listing) = send(
        &stack,
        reqwest::Method::GET,
        &format!("/v1/accounts/{a}/dedicated-ips"),
        &a_key,
        None,
    )
    .await;
    assert_eq!(status, 200, "{listing}");
    assert_eq!(listing["items"].as_array().unwrap().len(), 1, "{listing}");
    assert_eq!(listing["items"][0]["ip"], "127.0.0.2");
    let (_, map) = send(
        &stack,
        reqwest::Method::GET,
        "/v1/dedicated-ips",
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(map["items"].as_array().unwrap().len(), 2, "{map}");
    let (status, _) = send(
        &stack,
        reqwest::Method::GET,
        "/v1/dedicated-ips",
        &a_key,
        None,
    )
    .await;
    assert_eq!(status, 403);
    // Another account's address is not A's to release.
    let (status, _) = send(
        &stack,
        reqwest::Method::DELETE,
        &format!("/v1/accounts/{a}/dedicated-ips/127.0.0.3"),
        &a_key,
        None,
    )
    .await;
    assert_eq!(status, 404);

    // Released (by the account itself, and by the operator), both are shared again.
    let (status, _) = send(
        &stack,
        reqwest::Method::DELETE,
        &format!("/v1/accounts/{a}/dedicated-ips/127.0.0.2"),
        &a_key,
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _) = send(
        &stack,
        reqwest::Method::DELETE,
        &format!("/v1/accounts/{b}/dedicated-ips/127.0.0.3"),
        ADMIN_TOKEN,
        None,
    )
    .await;
    assert_eq!(status, 204);
    pool_shows(&stack, 0).await;
    let after = spread(&stack, "dcarol", 200).await;
    assert!(
        after.contains_key(&ip("127.0.0.2")) && after.contains_key(&ip("127.0.0.3")),
        "{after:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_cuts_open_tunnels_is_rationed_and_billed_by_the_day() {
    let mut stack = Stack::start_with(StackOptions {
        egress_ips: vec![ip("127.0.0.2"), ip("127.0.0.3"), ip("127.0.0.4")],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(3).await;
    let echo = echo_server().await;
    let account = stack.create_account("replacer").await;
    stack.create_user(account, "ddana", PASSWORD).await;
    let (key, _) = stack.account_key(account).await;
    let (status, plan) = send(
        &stack,
        reqwest::Method::POST,
        "/v1/plans",
        ADMIN_TOKEN,
        Some(json!({"name": "dedicated-plan", "prices": {"dc": 100}, "dedicated_ip_price_cents": 3000, "dedicated_replacements_per_month": 1, "dedicated_max_addresses": 5})),
    )
    .await;
    assert_eq!(status, 201, "{plan}");
    let (status, _) = send(
        &stack,
        reqwest::Method::PUT,
        &format!("/v1/accounts/{account}/plan"),
        ADMIN_TOKEN,
        Some(json!({"plan_id": plan["id"]})),
    )
    .await;
    assert_eq!(status, 204);

    // The customer allocates by targeting: more than exist is a 409 saying so.
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{account}/dedicated-ips"),
        &key,
        Some(json!({"count": 4})),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("only 3"),
        "{body}"
    );
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{account}/dedicated-ips"),
        &key,
        Some(json!({"count": 1, "country": "DE"})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    let old: IpAddr = body["items"][0]["ip"].as_str().unwrap().parse().unwrap();
    assert_eq!(body["items"][0]["cents_per_month"], 3000, "{body}");
    pool_shows(&stack, 1).await;
    assert_eq!(egress(&stack, "ddana-dedicated").await.unwrap(), old);

    // A tunnel open through the old address is cut by the replacement.
    let (mut open, head) =
        connect_tunnel(stack.proxy_addrs.proxy, "ddana-dedicated", PASSWORD, echo).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{account}/dedicated-ips/{old}/replace"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let new: IpAddr = body["items"][0]["ip"].as_str().unwrap().parse().unwrap();
    assert_ne!(new, old);
    assert!(
        closed_within(&mut open, Duration::from_secs(5)).await,
        "the tunnel through {old} is still open"
    );
    eventually(
        "new tunnels to leave from the replacement",
        Duration::from_secs(10),
        || async { (egress(&stack, "ddana-dedicated").await.ok()? == new).then_some(()) },
    )
    .await;
    // The allowance (1 a month on this plan) is used.
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{account}/dedicated-ips/{new}/replace"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"]
            .as_str()
            .unwrap_or_default()
            .contains("allowance"),
        "{body}"
    );
    let (_, listing) = send(
        &stack,
        reqwest::Method::GET,
        &format!("/v1/accounts/{account}/dedicated-ips"),
        &key,
        None,
    )
    .await;
    assert_eq!(listing["replacements"]["used"], 1, "{listing}");
    assert_eq!(listing["replacements"]["allowed"], 1, "{listing}");

    // The invoice counts address-days from the two intervals.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let (status, invoice) = send(
        &stack,
        reqwest::Method::GET,
        &format!("/v1/accounts/{account}/invoices?month={month}"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, 200, "{invoice}");
    let lines = invoice["dedicated"]
        .as_array()
        .unwrap_or_else(|| panic!("{invoice}"));
    assert_eq!(lines.len(), 2, "{invoice}");
    let days_in_month = {
        use chrono::Datelike;
        let now = chrono::Utc::now();
        let first = chrono::NaiveDate::from_ymd_opt(now.year(), now.month(), 1).unwrap();
        let next = if now.month() == 12 {
            chrono::NaiveDate::from_ymd_opt(now.year() + 1, 1, 1).unwrap()
        } else {
            chrono::NaiveDate::from_ymd_opt(now.year(), now.month() + 1, 1).unwrap()
        };
        (next - first).num_days()
    };
    for line in lines {
        // Minutes old: one started day each.
        assert_eq!(line["address_days"], 1, "{line}");
        assert_eq!(
            line["amount_cents"],
            (3000 + days_in_month - 1) / days_in_month,
            "{line}"
        );
    }
    assert_eq!(invoice["address_days"], 2, "{invoice}");

    // The exit of the dedicated address goes down: 502 naming the cause,
    // never a silent shared address.
    let index = stack
        .agents
        .iter()
        .position(|a| a.egress_ip == new)
        .unwrap();
    stack.agents[index].proc.kill().await;
    let refused = eventually(
        "the dedicated exit to leave the pool",
        Duration::from_secs(15),
        || async { egress(&stack, "ddana-dedicated").await.err() },
    )
    .await;
    assert_gateway_error(&refused, 502, "destination_unavailable");
    assert!(refused.body.contains("dedicated"), "{refused:?}");
    // With the operator's fallback the account leaves from a shared address.
    let (status, body) = send(
        &stack,
        reqwest::Method::PATCH,
        &format!("/v1/accounts/{account}"),
        &key,
        Some(json!({"dedicated_fallback": true})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = send(
        &stack,
        reqwest::Method::PATCH,
        &format!("/v1/accounts/{account}"),
        ADMIN_TOKEN,
        Some(json!({"dedicated_fallback": true})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let shared = eventually(
        "the fallback to reach the superproxy",
        Duration::from_secs(10),
        || async { egress(&stack, "ddana-dedicated").await.ok() },
    )
    .await;
    assert_ne!(shared, new, "a shared address, not the dead dedicated one");
}

/// A user set to `dedicated_only` leaves from the account's addresses
/// without asking, and an address assigned to some users serves only them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_can_be_bound_to_dedicated_addresses_and_to_a_subset() {
    let stack = Stack::start_with(StackOptions {
        egress_ips: vec![ip("127.0.0.2"), ip("127.0.0.3")],
        ..Default::default()
    })
    .await;
    stack.wait_eligible(2).await;
    let account = stack.create_account("splitter").await;
    let erin = stack.create_user(account, "derin", PASSWORD).await;
    let frank = stack.create_user(account, "dfrank", PASSWORD).await;
    let (key, _) = stack.account_key(account).await;
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{account}/dedicated-ips"),
        ADMIN_TOKEN,
        Some(json!({"ips": ["127.0.0.2"], "users": [erin]})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["items"][0]["users"], json!([erin]), "{body}");
    pool_shows(&stack, 1).await;
    assert_eq!(
        spread(&stack, "derin-dedicated", 20).await,
        HashMap::from([(ip("127.0.0.2"), 20)])
    );
    let refused = egress(&stack, "dfrank-dedicated").await.unwrap_err();
    assert_gateway_error(&refused, 502, "destination_unavailable");
    // The operator's assignment binds the customer.
    let (status, _) = send(
        &stack,
        reqwest::Method::PUT,
        &format!("/v1/accounts/{account}/dedicated-ips/127.0.0.2/users"),
        &key,
        Some(json!({"user_ids": [erin, frank]})),
    )
    .await;
    assert_eq!(status, 403);
    let (status, _) = send(
        &stack,
        reqwest::Method::PUT,
        &format!("/v1/accounts/{account}/dedicated-ips/127.0.0.2/users"),
        ADMIN_TOKEN,
        Some(json!({"user_ids": []})),
    )
    .await;
    assert_eq!(status, 200);
    eventually(
        "frank to be served too",
        Duration::from_secs(10),
        || async {
            (egress(&stack, "dfrank-dedicated").await.ok()? == ip("127.0.0.2")).then_some(())
        },
    )
    .await;
    // Always dedicated, without saying so.
    let (status, body) = send(
        &stack,
        reqwest::Method::PATCH,
        &format!("/v1/users/{frank}"),
        &key,
        Some(json!({"dedicated_only": true})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dedicated_only"], true, "{body}");
    eventually(
        "frank's plain login to leave from the dedicated address",
        Duration::from_secs(10),
        || async { (egress(&stack, "dfrank").await.ok()? == ip("127.0.0.2")).then_some(()) },
    )
    .await;
    assert_eq!(
        spread(&stack, "dfrank", 20).await,
        HashMap::from([(ip("127.0.0.2"), 20)])
    );
    assert_eq!(
        spread(&stack, "derin", 20).await,
        HashMap::from([(ip("127.0.0.3"), 20)])
    );
}

/// An exit on a host of its own with an IPv6 egress prefix: its /64 goes to
/// one account, whose tunnels then leave from inside it, and nobody else's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ipv6_64_of_an_egress_prefix_is_dedicated_to_one_account() {
    let host = ExitHost::create();
    let mut stack = Stack::start_with(host.stack_options(StackOptions {
        egress_ips: Vec::new(),
        ..Default::default()
    }))
    .await;
    stack
        .add_agent_in(&host, &[], &[host.prefix_v6, host.prefix_v4], &[])
        .await;
    stack.wait_eligible(1).await;
    let whoami = host.start_whoami();
    let owner = stack.create_account("v6-owner").await;
    let other = stack.create_account("v6-other").await;
    stack.create_user(owner, "dolga", PASSWORD).await;
    stack.create_user(other, "doscar", PASSWORD).await;
    let (key, _) = stack.account_key(owner).await;
    let (status, plan) = send(
        &stack,
        reqwest::Method::POST,
        "/v1/plans",
        ADMIN_TOKEN,
        Some(json!({"name": "v6-plan", "prices": {"dc": 100}, "dedicated_prefix_price_cents": 9000, "dedicated_max_addresses": 1})),
    )
    .await;
    assert_eq!(status, 201, "{plan}");
    let (status, _) = send(
        &stack,
        reqwest::Method::PUT,
        &format!("/v1/accounts/{owner}/plan"),
        ADMIN_TOKEN,
        Some(json!({"plan_id": plan["id"]})),
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{owner}/dedicated-ips"),
        &key,
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["items"][0]["ip"], host.prefix_v6.to_string(), "{body}");
    assert_eq!(body["items"][0]["prefix"], true, "{body}");
    assert_eq!(body["items"][0]["cents_per_month"], 9000, "{body}");
    // The plan's cap: one is all this account may hold by its own key.
    let (status, _) = send(
        &stack,
        reqwest::Method::POST,
        &format!("/v1/accounts/{owner}/dedicated-ips"),
        &key,
        Some(json!({"count": 1})),
    )
    .await;
    assert_eq!(status, 403);
    pool_shows(&stack, 1).await;
    let proxy = stack.proxy_addrs.proxy;
    let mut drawn = std::collections::HashSet::new();
    for _ in 0..10 {
        let ip: IpAddr = egress_via(
            &proxy_as("dolga-dedicated-ipversion-6", proxy),
            &whoami.url(true),
        )
        .await
        .parse()
        .unwrap();
        assert!(host.prefix_v6.contains(ip), "{ip}");
        drawn.insert(ip);
    }
    assert!(drawn.len() > 5, "addresses drawn across the /64: {drawn:?}");
    // Nobody else leaves from the /64: IPv6 is refused, IPv4 still shared.
    let r = proxynet_tests::client::curl(&[
        "-p",
        "-x",
        &proxy_as("doscar-ipversion-6", proxy),
        &whoami.url(true),
    ])
    .await;
    assert_ne!(r.status, 200, "{}", r.body);
    let v4: IpAddr = egress_via(&proxy_as("doscar", proxy), &whoami.url(false))
        .await
        .parse()
        .unwrap();
    assert!(host.prefix_v4.contains(v4), "{v4}");
    // The owner names it by its network address to release it.
    let network = host.prefix_v6.network();
    let (status, _) = send(
        &stack,
        reqwest::Method::DELETE,
        &format!("/v1/accounts/{owner}/dedicated-ips/{network}"),
        &key,
        None,
    )
    .await;
    assert_eq!(status, 204);
    pool_shows(&stack, 0).await;
    let ip: IpAddr = egress_via(&proxy_as("doscar-ipversion-6", proxy), &whoami.url(true))
        .await
        .parse()
        .unwrap();
    assert!(host.prefix_v6.contains(ip), "{ip}");
}
