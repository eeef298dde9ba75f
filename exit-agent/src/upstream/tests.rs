//! The gateway handshakes against in-process fake partners, the template,
//! and the egress policy before the partner.

use super::http::{http_outcome, parse_head};
use super::template::TemplateKeys;
use super::*;
use base64::Engine as _;
use proxynet_common::egress::EgressPolicyConfig;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

const TEMPLATE: &str = "{user}-country-{country}-session-{session}";

fn ask(session: Option<&str>, country: Option<&str>, city: Option<&str>) -> UpstreamAsk {
    UpstreamAsk {
        session: session.map(str::to_owned),
        country: country.map(str::to_owned),
        city: city.map(str::to_owned),
    }
}

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn basic(user_pass: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(user_pass)
}

// ---- templates ----

#[test]
fn a_template_renders_every_value_it_is_given() {
    let t = Template::parse(TEMPLATE).unwrap();
    assert_eq!(
        t.render("acme", &ask(Some("s1"), Some("US"), None)),
        "acme-country-us-session-s1"
    );
}

#[test]
fn a_missing_value_takes_its_key_segment_with_it() {
    let t = Template::parse(TEMPLATE).unwrap();
    assert_eq!(
        t.render("acme", &ask(Some("s1"), None, None)),
        "acme-session-s1"
    );
    assert_eq!(
        t.render("acme", &ask(None, Some("de"), None)),
        "acme-country-de"
    );
    assert_eq!(t.render("acme", &UpstreamAsk::default()), "acme");
    // A value that sanitises to nothing is no value.
    assert_eq!(t.render("acme", &ask(Some("--"), Some(" "), None)), "acme");
}

#[test]
fn a_segment_with_its_own_key_goes_alone_and_a_placeholder_key_stays() {
    let t = Template::parse("{user}-zone-resi-cc_{country}-{session}").unwrap();
    assert_eq!(
        t.render("acme", &ask(Some("s1"), Some("fr"), None)),
        "acme-zone-resi-cc_fr-s1"
    );
    // `cc_{country}` carries its key; `{session}` follows a segment with a
    // placeholder, which is no key and stays.
    assert_eq!(t.render("acme", &ask(None, None, None)), "acme-zone-resi");
    let t = Template::parse("{user}-{country}").unwrap();
    assert_eq!(t.render("acme", &UpstreamAsk::default()), "acme");
}

#[test]
fn values_cannot_inject_separators() {
    let t = Template::parse("{user}-country-{country}-city-{city}-session-{session}").unwrap();
    let rendered = t.render(
        "acme",
        &ask(Some("a-b:c d"), Some("U-S:"), Some("New York")),
    );
    assert_eq!(rendered, "acme-country-us-city-NewYork-session-abcd");
    assert_eq!(
        t.render("acme", &ask(None, None, Some("São Paulo"))),
        "acme-city-SoPaulo"
    );
}

#[test]
fn bad_templates_are_refused_at_parse() {
    for bad in [
        "",
        "{user}-{zone}",
        "{user",
        "user}",
        "{{user}}",
        "{us-er}",
        "{user}--session-{session}",
        "-{user}",
        "{user}:x",
        "{user} x",
    ] {
        assert!(Template::parse(bad).is_err(), "{bad:?}");
    }
    let unknown = Template::parse("{user}-{zone}").unwrap_err();
    assert!(unknown.contains("{zone}"), "{unknown}");
}

#[test]
fn a_template_says_which_options_it_passes_on() {
    let keys = Template::parse(TEMPLATE).unwrap().keys();
    assert_eq!(
        keys,
        TemplateKeys {
            session: true,
            country: true,
            city: false
        }
    );
    assert_eq!(keys.names(), ["session", "country"]);
    let none = Template::parse("{user}").unwrap().keys();
    assert!(none.names().is_empty());
}

// ---- upstream URLs ----

#[test]
fn upstream_urls_name_a_scheme_a_host_and_a_port() {
    let up = Upstream::parse(
        "http://acme@gw.partner.example:3128",
        TEMPLATE,
        Some("s3cret\n".into()),
    )
    .unwrap();
    assert_eq!(up.scheme, Scheme::Http);
    assert_eq!((up.host(), up.port()), ("gw.partner.example", 3128));
    assert_eq!(up.user, "acme");
    assert_eq!(up.password.expose(), "s3cret");
    assert_eq!(up.to_string(), "http://gw.partner.example:3128");

    let up = Upstream::parse(
        "socks5://acme@gw.partner.example:1080/",
        TEMPLATE,
        Some("p".into()),
    )
    .unwrap();
    assert_eq!(up.scheme, Scheme::Socks5h);

    let up = Upstream::parse(
        "SOCKS5H://acme@[2001:db8::1]:1080",
        TEMPLATE,
        Some("p".into()),
    )
    .unwrap();
    assert_eq!((up.host(), up.port()), ("2001:db8::1", 1080));
    assert_eq!(up.to_string(), "socks5h://[2001:db8::1]:1080");

    // No user is fine when the template does not use one.
    let up = Upstream::parse("http://gw:3128", "customer7-{session}", Some("p".into())).unwrap();
    assert_eq!(
        up.template.render(&up.user, &ask(Some("x"), None, None)),
        "customer7-x"
    );
}

#[test]
fn what_an_upstream_url_must_not_be_is_refused_clearly() {
    let parse = |url: &str| Upstream::parse(url, TEMPLATE, Some("p".into())).unwrap_err();
    assert!(parse("https://acme@gw:443").contains("not supported yet"));
    let with_password = parse("http://acme:hunter2@gw:3128");
    assert!(
        with_password.contains("--upstream-password-file"),
        "{with_password}"
    );
    assert!(!with_password.contains("hunter2"), "{with_password}");
    assert!(parse("http://acme@gw").contains("port"));
    assert!(parse("http://acme@gw:0").contains("port"));
    assert!(parse("http://acme@2001:db8::1:3128").contains("brackets"));
    assert!(parse("http://acme@[2001:db8::1]").contains("port"));
    assert!(parse("http://acme@gw:3128/path").contains("path"));
    assert!(parse("ftp://acme@gw:21").contains("not supported"));
    assert!(parse("acme@gw:3128").contains("scheme"));
    assert!(parse("http://gw:3128").contains("{user}"));
    let no_password = Upstream::parse("http://acme@gw:3128", TEMPLATE, None).unwrap_err();
    assert!(no_password.contains("--upstream-password-file"));
    assert!(Upstream::parse("http://acme@gw:3128", TEMPLATE, Some("\n".into())).is_err());
    assert!(Upstream::parse("http://acme@gw:3128", "{user}-{zone}", Some("p".into())).is_err());
}

#[test]
fn the_password_is_never_debug_printed() {
    let up = Upstream::parse("http://acme@gw:3128", TEMPLATE, Some("hunter2".into())).unwrap();
    let printed = format!("{up:?} {up}");
    assert!(!printed.contains("hunter2"), "{printed}");
    assert!(printed.contains("acme"), "{printed}");
}

// ---- egress policy ----

#[test]
fn targets_are_vetted_without_resolving_names() {
    let policy = EgressPolicy::new(EgressPolicyConfig::default());
    for (host, port) in [
        ("127.0.0.1", 80),
        ("127.1", 80),
        ("0x7f.1", 80),
        ("[::1]", 80),
        ("10.0.0.1", 443),
        ("localhost", 443),
        ("LOCALHOST.", 443),
        ("api.localhost", 443),
        ("printer.local", 631),
        ("metadata.google.internal", 80),
        ("nas.home.arpa", 443),
        ("intranet", 80),
        ("example.com", 25),
        ("93.184.215.14", 25),
    ] {
        assert_eq!(
            vet_target(&policy, host, port),
            Err(Outcome::PolicyDenied),
            "{host}:{port}"
        );
    }
    for (host, port) in [
        ("example.com", 443),
        ("example.com.", 80),
        ("93.184.215.14", 443),
        ("[2606:4700::1111]", 443),
    ] {
        assert_eq!(vet_target(&policy, host, port), Ok(()), "{host}:{port}");
    }
}

// ---- HTTP answers ----

fn judge(head: &str) -> Result<(), Outcome> {
    let (status, headers) = parse_head(head.as_bytes())?;
    http_outcome(status, &headers)
}

#[test]
fn gateway_answers_map_to_outcomes() {
    use Outcome::*;
    let cases: &[(&str, Result<(), Outcome>)] = &[
        ("HTTP/1.1 200 Connection established\r\n\r\n", Ok(())),
        ("HTTP/1.0 200\r\n\r\n", Ok(())),
        ("HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic\r\n\r\n", Err(UpstreamRefused)),
        ("HTTP/1.1 403 Forbidden\r\n\r\n", Err(PolicyDenied)),
        ("HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\n\r\n", Err(Refused)),
        ("HTTP/1.1 503 Service Unavailable\r\nx-squid-error: ERR_CONNECT_FAIL 110\r\n\r\n", Err(TimedOut)),
        ("HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_CONNECT_FAIL 113\r\n\r\n", Err(Unreachable)),
        ("HTTP/1.1 503 Service Unavailable\r\nX-Squid-Error: ERR_DNS_FAIL 0\r\n\r\n", Err(DnsError)),
        ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=connection_refused\r\n\r\n", Err(Refused)),
        ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=dns_timeout\r\n\r\n", Err(DnsError)),
        ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=dns_error; rcode=NXDOMAIN\r\n\r\n", Err(DnsError)),
        ("HTTP/1.1 504 Gateway Timeout\r\nProxy-Status: gw; error=connection_timeout\r\n\r\n", Err(TimedOut)),
        ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; error=destination_ip_unroutable\r\n\r\n", Err(Unreachable)),
        // A quoted detail is no parameter; the real one follows.
        ("HTTP/1.1 502 Bad Gateway\r\nProxy-Status: gw; details=\"x; error=dns_error\", edge; error=destination_unavailable\r\n\r\n", Err(Unreachable)),
        ("HTTP/1.1 504 Gateway Timeout\r\n\r\n", Err(TimedOut)),
        ("HTTP/1.1 502 Bad Gateway\r\n\r\n", Err(UpstreamRefused)),
        ("HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\n\r\n", Err(UpstreamRefused)),
        // Detail counts only on 502-504.
        ("HTTP/1.1 500 Internal Server Error\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\n\r\n", Err(UpstreamRefused)),
        ("HTTP/1.1 429 Too Many Requests\r\n\r\n", Err(UpstreamRefused)),
        ("HTTP/1.1 301 Moved\r\n\r\n", Err(UpstreamRefused)),
        // Not an HTTP answer at all.
        ("SSH-2.0-OpenSSH_9.6\r\n\r\n", Err(UpstreamRefused)),
        ("HTTP/1.1 2000 OK\r\n\r\n", Err(UpstreamRefused)),
        ("HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", Err(UpstreamRefused)),
    ];
    for (head, expected) in cases {
        assert_eq!(judge(head), *expected, "{head:?}");
    }
}

// ---- fake partners on loopback ----

/// Echoes until the peer closes.
async fn echo(conn: &mut TcpStream) {
    let mut buf = [0u8; 1024];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if conn.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// A partner's HTTP gateway: takes one connection, reads the request
/// head, sends `answer` (its chunks a moment apart), then echoes until
/// the tunnel closes. Gives back the head it read.
async fn http_partner(answer: Vec<&'static str>) -> (SocketAddr, JoinHandle<String>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(conn.read_u8().await.unwrap());
        }
        for (i, chunk) in answer.into_iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            conn.write_all(chunk.as_bytes()).await.unwrap();
        }
        echo(&mut conn).await;
        String::from_utf8(head).unwrap()
    });
    (addr, task)
}

fn http_upstream(addr: SocketAddr, template: &str) -> Upstream {
    Upstream::parse(
        &format!("http://acme@{addr}"),
        template,
        Some("s3cret".into()),
    )
    .unwrap()
}

#[tokio::test]
async fn http_connect_authenticates_and_leaves_the_tunnels_bytes_unread() {
    // The blank line ending the head is split across two writes, and the
    // target's first bytes come right behind it.
    let (addr, partner) =
        http_partner(vec!["HTTP/1.1 200 Connection established\r\n\r", "\nearly"]).await;
    let upstream = http_upstream(addr, TEMPLATE);
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut tunnel = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &ask(Some("s1"), Some("US"), None),
        soon(),
    )
    .await
    .unwrap();
    let mut early = [0u8; 5];
    tunnel.read_exact(&mut early).await.unwrap();
    assert_eq!(&early, b"early");
    tunnel.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"ping");
    drop(tunnel);
    let head = partner.await.unwrap();
    assert_eq!(
        head,
        format!(
            "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nProxy-Authorization: Basic {}\r\n\r\n",
            basic("acme-country-us-session-s1:s3cret")
        )
    );
}

#[tokio::test]
async fn http_connect_names_ip_targets_canonically_and_ipv6_in_brackets() {
    let (addr, partner) = http_partner(vec!["HTTP/1.1 200 OK\r\n\r\n"]).await;
    let upstream = http_upstream(addr, TEMPLATE);
    let stream = TcpStream::connect(addr).await.unwrap();
    let tunnel = connect_through(
        &upstream,
        stream,
        "[2606:4700:0::1111]",
        8443,
        &UpstreamAsk::default(),
        soon(),
    )
    .await
    .unwrap();
    drop(tunnel);
    let head = partner.await.unwrap();
    assert!(
        head.starts_with(
            "CONNECT [2606:4700::1111]:8443 HTTP/1.1\r\nHost: [2606:4700::1111]:8443\r\n"
        ),
        "{head}"
    );
    assert!(
        head.contains(&format!("Basic {}\r\n", basic("acme:s3cret"))),
        "{head}"
    );
}

#[tokio::test]
async fn a_407_is_the_upstreams_refusal() {
    let (addr, partner) = http_partner(vec![
        "HTTP/1.1 407 Proxy Authentication Required\r\nProxy-Authenticate: Basic realm=\"gw\"\r\nContent-Length: 0\r\n\r\n",
    ])
    .await;
    let upstream = http_upstream(addr, TEMPLATE);
    let stream = TcpStream::connect(addr).await.unwrap();
    let result = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &UpstreamAsk::default(),
        soon(),
    )
    .await;
    assert_eq!(result.err(), Some(Outcome::UpstreamRefused));
    partner.await.unwrap();
}

#[tokio::test]
async fn a_squid_connect_failure_is_the_targets_refusal() {
    let (addr, partner) = http_partner(vec![
        "HTTP/1.1 503 Service Unavailable\r\nServer: squid\r\nX-Squid-Error: ERR_CONNECT_FAIL 111\r\nContent-Length: 0\r\n\r\n",
    ])
    .await;
    let upstream = http_upstream(addr, TEMPLATE);
    let stream = TcpStream::connect(addr).await.unwrap();
    let result = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &UpstreamAsk::default(),
        soon(),
    )
    .await;
    assert_eq!(result.err(), Some(Outcome::Refused));
    partner.await.unwrap();
}

/// An HTTP gateway silent after our CONNECT may be waiting on the
/// target: the budget running out is the target's timeout, not the
/// exit's fault (a customer aiming at a black hole must not get upstream
/// exits ejected). A SOCKS5 gateway that never greets is the gateway's.
#[tokio::test]
async fn a_gateway_silent_after_the_request_is_a_timeout_before_it_its_fault() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(conn);
    });
    let upstream = http_upstream(addr, TEMPLATE);
    let stream = TcpStream::connect(addr).await.unwrap();
    let deadline = Instant::now() + Duration::from_millis(100);
    let result = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &UpstreamAsk::default(),
        deadline,
    )
    .await;
    assert_eq!(result.err(), Some(Outcome::TimedOut));
    silent.abort();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mute = tokio::spawn(async move {
        let (conn, _) = listener.accept().await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
        drop(conn);
    });
    let upstream = Upstream::parse(
        &format!("socks5h://partner@{addr}"),
        TEMPLATE,
        Some("secret".to_owned()),
    )
    .unwrap();
    let stream = TcpStream::connect(addr).await.unwrap();
    let deadline = Instant::now() + Duration::from_millis(100);
    let result = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &UpstreamAsk::default(),
        deadline,
    )
    .await;
    assert_eq!(result.err(), Some(Outcome::UpstreamRefused));
    mute.abort();
}

/// What a fake SOCKS5 gateway was told.
#[derive(Debug)]
struct SocksSeen {
    methods: Vec<u8>,
    user: String,
    password: String,
    atyp: u8,
    addr: Vec<u8>,
    port: u16,
}

/// A partner's SOCKS5 gateway: takes one connection, accepts any
/// username/password, answers the CONNECT with `reply` (success with a
/// domain-typed bound address, so its length byte is exercised), then
/// echoes until the tunnel closes.
async fn socks_partner(reply: u8) -> (SocketAddr, JoinHandle<SocksSeen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; 2];
        conn.read_exact(&mut hello).await.unwrap();
        assert_eq!(hello[0], 5);
        let mut methods = vec![0u8; usize::from(hello[1])];
        conn.read_exact(&mut methods).await.unwrap();
        conn.write_all(&[5, 2]).await.unwrap();

        assert_eq!(conn.read_u8().await.unwrap(), 1);
        let mut user = vec![0u8; usize::from(conn.read_u8().await.unwrap())];
        conn.read_exact(&mut user).await.unwrap();
        let mut password = vec![0u8; usize::from(conn.read_u8().await.unwrap())];
        conn.read_exact(&mut password).await.unwrap();
        conn.write_all(&[1, 0]).await.unwrap();

        let mut request = [0u8; 4];
        conn.read_exact(&mut request).await.unwrap();
        assert_eq!(&request[..3], &[5, 1, 0]);
        let atyp = request[3];
        let len = match atyp {
            1 => 4,
            4 => 16,
            3 => usize::from(conn.read_u8().await.unwrap()),
            other => panic!("address type {other}"),
        };
        let mut target = vec![0u8; len];
        conn.read_exact(&mut target).await.unwrap();
        let port = conn.read_u16().await.unwrap();
        if reply == 0 {
            conn.write_all(&[5, 0, 0, 3, 2, b'g', b'w', 0x04, 0x38])
                .await
                .unwrap();
            echo(&mut conn).await;
        } else {
            conn.write_all(&[5, reply, 0, 1, 0, 0, 0, 0, 0, 0])
                .await
                .unwrap();
        }
        SocksSeen {
            methods,
            user: String::from_utf8(user).unwrap(),
            password: String::from_utf8(password).unwrap(),
            atyp,
            addr: target,
            port,
        }
    });
    (addr, task)
}

fn socks_upstream(addr: SocketAddr) -> Upstream {
    Upstream::parse(
        &format!("socks5h://acme@{addr}"),
        "{user}-session-{session}",
        Some("s3cret".into()),
    )
    .unwrap()
}

#[tokio::test]
async fn socks5_authenticates_and_sends_names_as_names() {
    let (addr, partner) = socks_partner(0).await;
    let upstream = socks_upstream(addr);
    let stream = TcpStream::connect(addr).await.unwrap();
    let mut tunnel = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &ask(Some("s1"), Some("us"), None),
        soon(),
    )
    .await
    .unwrap();
    tunnel.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    tunnel.read_exact(&mut pong).await.unwrap();
    assert_eq!(&pong, b"ping");
    drop(tunnel);
    let seen = partner.await.unwrap();
    assert_eq!(seen.methods, [2]);
    assert_eq!(seen.user, "acme-session-s1");
    assert_eq!(seen.password, "s3cret");
    assert_eq!(seen.atyp, 3);
    assert_eq!(seen.addr, b"example.com");
    assert_eq!(seen.port, 443);
}

#[tokio::test]
async fn socks5_sends_ip_literals_as_addresses() {
    let (addr, partner) = socks_partner(0).await;
    let upstream = socks_upstream(addr);
    let stream = TcpStream::connect(addr).await.unwrap();
    let tunnel = connect_through(
        &upstream,
        stream,
        "93.184.215.14",
        80,
        &UpstreamAsk::default(),
        soon(),
    )
    .await
    .unwrap();
    drop(tunnel);
    let seen = partner.await.unwrap();
    assert_eq!(seen.user, "acme");
    assert_eq!(seen.atyp, 1);
    assert_eq!(seen.addr, [93, 184, 215, 14]);
    assert_eq!(seen.port, 80);
}

#[tokio::test]
async fn a_socks5_refusal_is_the_targets() {
    let (addr, partner) = socks_partner(0x05).await;
    let upstream = socks_upstream(addr);
    let stream = TcpStream::connect(addr).await.unwrap();
    let result = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &UpstreamAsk::default(),
        soon(),
    )
    .await;
    assert_eq!(result.err(), Some(Outcome::Refused));
    partner.await.unwrap();
}

#[tokio::test]
async fn a_socks5_gateway_refusing_our_method_is_the_upstreams_refusal() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let partner = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; 3];
        conn.read_exact(&mut hello).await.unwrap();
        conn.write_all(&[5, 0xff]).await.unwrap();
    });
    let upstream = socks_upstream(addr);
    let stream = TcpStream::connect(addr).await.unwrap();
    let result = connect_through(
        &upstream,
        stream,
        "example.com",
        443,
        &UpstreamAsk::default(),
        soon(),
    )
    .await;
    assert_eq!(result.err(), Some(Outcome::UpstreamRefused));
    partner.await.unwrap();
}
