//! Header hygiene for absolute-form requests and their responses.
//!
//! RFC 9110 §7.6.1: hop-by-hop fields describe one connection and must not be
//! forwarded — `Connection` and every field it names, plus the fixed list below.
//! `Proxy-Authorization` carries our customer's credentials and ends here. We
//! add nothing that identifies the client or our infrastructure (no `Via`,
//! `X-Forwarded-For`, `Forwarded`). The map is rebuilt rather than edited in
//! place because `HeaderMap::remove` reorders the remaining fields.

use http::header::{HeaderMap, HeaderName};

/// Always hop-by-hop, whether or not `Connection` names them.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
    // Requests to this gateway (docs/username.md): they end here, and an
    // origin answering with them cannot speak for the gateway.
    "proxynet-options",
    "proxynet-report",
];

/// A copy of `headers` without hop-by-hop fields, in the original order.
pub(crate) fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .chain(headers.get_all("proxy-connection").iter())
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let is_hop = |name: &HeaderName| {
        let n = name.as_str();
        HOP_BY_HOP.contains(&n) || named.iter().any(|t| t == n)
    };
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !is_hop(name) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strips_fixed_and_connection_named_fields_keeping_order() {
        let mut h = HeaderMap::new();
        h.append("host", "a".parse().unwrap());
        h.append("connection", "X-Hop, keep-alive".parse().unwrap());
        h.append("x-hop", "1".parse().unwrap());
        h.append("keep-alive", "timeout=5".parse().unwrap());
        h.append("proxy-connection", "keep-alive".parse().unwrap());
        h.append("proxy-authorization", "Basic eA==".parse().unwrap());
        h.append("te", "trailers".parse().unwrap());
        h.append("accept", "*/*".parse().unwrap());
        h.append("x-end", "1".parse().unwrap());
        h.append("x-end", "2".parse().unwrap());
        h.append("proxynet-options", "country-de".parse().unwrap());
        h.append("proxynet-report", "blocked".parse().unwrap());
        let out = end_to_end(&h);
        let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["host", "accept", "x-end", "x-end"]);
    }
}
