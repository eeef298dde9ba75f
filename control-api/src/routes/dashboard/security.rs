//! What keeps another site out of the dashboard: the origin check on every
//! state-changing request, the client's address for the login throttle, and
//! the headers every page carries (CSP by script hash, no framing, no caching).

use super::*;

/// The client's address (unspecified when the server was not told it).
pub(crate) struct Peer(pub(super) std::net::IpAddr);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Peer {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Peer(
            parts
                .extensions
                .get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
                .map_or(std::net::IpAddr::from([0, 0, 0, 0]), |c| c.0.ip()),
        ))
    }
}

/// A state-changing dashboard request must come from a page of this origin:
/// a browser sends `Origin` (and `Sec-Fetch-Site`) with every cross-site
/// POST, so a foreign page cannot log a visitor in (login CSRF) or out.
/// Tools that send neither (curl) pass: they carry no ambient cookie.
pub(super) fn same_origin(headers: &HeaderMap) -> Result<(), Box<Response>> {
    let forbidden = || {
        Box::new(
            (
                StatusCode::FORBIDDEN,
                Html("<p>Cross-site requests to the dashboard are refused.</p>".to_owned()),
            )
                .into_response(),
        )
    };
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        if site != "same-origin" && site != "none" {
            return Err(forbidden());
        }
    }
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    let origin_host = origin
        .to_str()
        .ok()
        .and_then(|o| o.split_once("://"))
        .map(|(_, rest)| rest);
    match (origin_host, host) {
        (Some(o), Some(h)) if o.eq_ignore_ascii_case(h) => Ok(()),
        _ => Err(forbidden()),
    }
}

/// `; Secure` when the dashboard is reached over TLS: the operator says so
/// (`--dashboard-secure-cookie`), or the terminating proxy does
/// (`X-Forwarded-Proto: https`).
pub(super) fn secure_attr(state: &AppState, headers: &HeaderMap) -> &'static str {
    let forwarded_tls = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|p| p.eq_ignore_ascii_case("https"));
    if state.config.dashboard_secure_cookie || forwarded_tls {
        "; Secure"
    } else {
        ""
    }
}

/// Headers on every dashboard response: no framing, no caching, and only
/// this page's own script may run.
pub(crate) async fn security_headers(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_str(csp()).unwrap_or(HeaderValue::from_static("default-src 'none'")),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

/// The Content-Security-Policy: every script asset ([`SCRIPTS`]) by its
/// hash, inline styles, requests to this origin only, no framing.
pub(super) fn csp() -> &'static str {
    static CSP: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    CSP.get_or_init(|| {
        use base64::Engine as _;
        use sha2::Digest as _;
        let hashes: Vec<String> = SCRIPTS
            .iter()
            .map(|s| {
                format!(
                    "'sha256-{}'",
                    base64::engine::general_purpose::STANDARD
                        .encode(sha2::Sha256::digest(s.as_bytes()))
                )
            })
            .collect();
        let hashes = hashes.join(" ");
        format!(
            "default-src 'none'; script-src {hashes}; style-src 'unsafe-inline'; \
             img-src 'self' data:; connect-src 'self'; form-action 'self'; \
             frame-ancestors 'none'; base-uri 'none'"
        )
    })
}
