//! The HTTP side: one request at a time to the control API, its problem+json
//! errors turned into [`Failure::Api`], and keyset pagination followed
//! through `Link: <...>; rel="next"` headers.

use std::time::{Duration, Instant};

use reqwest::header::{HeaderMap, CONTENT_TYPE, LINK};
use reqwest::{Method, StatusCode, Url};
use serde_json::Value;

use crate::config::{Settings, Token};
use crate::error::{chain, one_line, Failure};

/// The largest page the API serves (`routes/page.rs`).
const MAX_PAGE: u64 = 1000;

pub(crate) struct Client {
    http: reqwest::Client,
    base: Url,
    token: Option<Token>,
    verbose: bool,
}

/// A request body.
pub(crate) enum Body {
    Json(Value),
}

/// A successful answer.
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Answer {
    pub(crate) fn is_json(&self) -> bool {
        self.headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|t| t.contains("json"))
    }

    /// The body as JSON (`null` for an empty one, e.g. a 204).
    pub(crate) fn json(&self) -> Result<Value, Failure> {
        if self.body.is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_slice(&self.body)
            .map_err(|e| Failure::Answer(format!("the API's answer is not JSON: {e}")))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// How many rows of a list to fetch.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Paging {
    /// At most this many rows in all; `None`: the API's default page.
    pub(crate) limit: Option<u64>,
    /// Every page.
    pub(crate) all: bool,
    /// Rows per request; `None`: as many as allowed when following pages,
    /// else the API's default.
    pub(crate) page_size: Option<u64>,
}

/// A list, its JSON text as the API sent it (pages joined into one array),
/// and whether the API had more than was fetched.
pub(crate) struct Rows {
    pub(crate) rows: Vec<Value>,
    pub(crate) raw: String,
    pub(crate) more: bool,
}

impl Rows {
    fn new(rows: Vec<Value>, pages: &[String], more: bool) -> Self {
        let items: Vec<&str> = pages
            .iter()
            .filter_map(|p| {
                let inner = p.trim().strip_prefix('[')?.strip_suffix(']')?.trim();
                (!inner.is_empty()).then_some(inner)
            })
            .collect();
        Self {
            rows,
            raw: format!("[{}]", items.join(",")),
            more,
        }
    }
}

impl Client {
    pub(crate) fn new(
        settings: Settings,
        verbose: bool,
        timeout: Duration,
        cacert: Option<&std::path::Path>,
    ) -> Result<Self, Failure> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("proxynetctl/", env!("CARGO_PKG_VERSION")))
            // The API never redirects; a redirect would carry the token elsewhere.
            .redirect(reqwest::redirect::Policy::none());
        if let Some(path) = cacert {
            let pem = std::fs::read(path)
                .map_err(|e| Failure::usage(format!("--cacert {}: {e}", path.display())))?;
            let cert = reqwest::Certificate::from_pem(&pem).map_err(|e| {
                Failure::usage(format!("--cacert {}: {}", path.display(), chain(&e)))
            })?;
            builder = builder.add_root_certificate(cert);
        }
        let http = builder
            .build()
            .map_err(|e| Failure::usage(format!("HTTP client: {}", chain(&e))))?;
        Ok(Self {
            http,
            base: settings.api,
            token: settings.token,
            verbose,
        })
    }

    /// `path` (already encoded, may carry a query) under the base URL.
    fn url(&self, path: &str, query: &[(String, String)]) -> Result<Url, Failure> {
        let base = self.base.as_str().trim_end_matches('/');
        let mut url = Url::parse(&format!("{base}{path}"))
            .map_err(|e| Failure::usage(format!("{path}: {e}")))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        Ok(url)
    }

    /// The base URL as printed: no user name or password.
    fn shown(url: &Url) -> String {
        let mut url = url.clone();
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.to_string()
    }

    /// Sends one request; an answer of 400 or more is a [`Failure::Api`].
    pub(crate) async fn send(
        &self,
        method: Method,
        path: &str,
        query: &[(String, String)],
        body: Option<Body>,
    ) -> Result<Answer, Failure> {
        let url = self.url(path, query)?;
        let mut request = self.http.request(method.clone(), url.clone());
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.expose());
        }
        match body {
            Some(Body::Json(value)) => request = request.json(&value),
            None => {}
        }
        if self.verbose {
            eprintln!("> {method} {}", Self::shown(&url));
        }
        let started = Instant::now();
        let unreachable = |e: reqwest::Error| Failure::Unreachable {
            url: Self::shown(&self.base).trim_end_matches('/').to_owned(),
            cause: cause(&e),
        };
        let response = request.send().await.map_err(|e| {
            if e.is_builder() {
                // E.g. a token that cannot be a header value (the message
                // names the problem, never the value).
                Failure::usage(format!("cannot make the request, {}", cause(&e)))
            } else {
                unreachable(e)
            }
        })?;
        let status = response.status();
        let headers = response.headers().clone();
        let body = response.bytes().await.map_err(unreachable)?.to_vec();
        if self.verbose {
            eprintln!(
                "< {} {} ({} bytes, {} ms)",
                status.as_u16(),
                status.canonical_reason().unwrap_or(""),
                body.len(),
                started.elapsed().as_millis()
            );
        }
        if status.is_client_error() || status.is_server_error() {
            return Err(self.problem(status, &body));
        }
        if status.is_redirection() {
            return Err(Failure::Answer(format!(
                "the API answered {} (a redirect, not followed): is --api the control API's address?",
                status.as_u16()
            )));
        }
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// An error answer as one line: the problem's `detail` (RFC 9457), else
    /// the start of whatever text came back.
    fn problem(&self, status: StatusCode, body: &[u8]) -> Failure {
        let detail = match serde_json::from_slice::<Value>(body) {
            Ok(v) => v
                .get("detail")
                .or_else(|| v.get("title"))
                .and_then(Value::as_str)
                .map(one_line),
            Err(_) => {
                let text = one_line(&String::from_utf8_lossy(body));
                (!text.is_empty()).then(|| text.chars().take(200).collect())
            }
        };
        let hint = (status == StatusCode::UNAUTHORIZED && self.token.is_none()).then(|| {
            "no token given: pass --token, set PROXYNET_ADMIN_TOKEN, or put token = \"...\" in the config file"
                .to_owned()
        });
        Failure::Api {
            status: status.as_u16(),
            detail,
            hint,
        }
    }

    /// `GET` as JSON.
    pub(crate) async fn get(
        &self,
        path: &str,
        query: &[(String, String)],
    ) -> Result<Value, Failure> {
        self.send(Method::GET, path, query, None).await?.json()
    }

    /// A request with a JSON body (or none), its answer as JSON (`null` when empty).
    pub(crate) async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, Failure> {
        self.send(method, path, &[], body.map(Body::Json))
            .await?
            .json()
    }

    /// A paginated list (`?limit=&after=`, `Link: <...>; rel="next"`):
    /// one page by default, up to `paging.limit` rows, or every page.
    pub(crate) async fn list(
        &self,
        path: &str,
        query: &[(String, String)],
        paging: Paging,
    ) -> Result<Rows, Failure> {
        let mut rows: Vec<Value> = Vec::new();
        let mut pages: Vec<String> = Vec::new();
        let mut params: Vec<(String, String)> = query.to_vec();
        loop {
            let size = paging.page_size.unwrap_or(MAX_PAGE).min(MAX_PAGE);
            let want = match paging.limit {
                Some(limit) => Some((limit - rows.len() as u64).min(size)),
                None if paging.all => Some(size),
                None => paging.page_size,
            };
            let mut page_query = params.clone();
            set(&mut page_query, "limit", want.map(|n| n.to_string()));
            let answer = self.send(Method::GET, path, &page_query, None).await?;
            let next = next_link(&answer.headers);
            match answer.json()? {
                Value::Array(page) => {
                    rows.extend(page);
                    pages.push(answer.text());
                }
                other => {
                    return Err(Failure::Answer(format!(
                        "expected a list from {path}, got {}",
                        kind(&other)
                    )))
                }
            }
            let Some(next) = next else {
                return Ok(Rows::new(rows, &pages, false));
            };
            let room = paging.limit.is_none_or(|l| (rows.len() as u64) < l);
            if !(room && (paging.all || paging.limit.is_some())) {
                return Ok(Rows::new(rows, &pages, true));
            }
            // The next page: this query, with what the link says (its
            // cursor, and any filters it carries) put over it.
            for (k, v) in next {
                set(&mut params, &k, Some(v));
            }
        }
    }
}

/// Why a request got no answer, briefly: reqwest's outer message restates
/// the URL, so the innermost cause speaks (`connect: Connection refused`).
fn cause(e: &reqwest::Error) -> String {
    let mut innermost: &dyn std::error::Error = e;
    while let Some(next) = innermost.source() {
        innermost = next;
    }
    let what = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "connect"
    } else if e.is_body() || e.is_decode() {
        "reading the answer"
    } else if e.is_builder() {
        "building it"
    } else {
        "request"
    };
    if std::ptr::addr_eq(innermost, e as &dyn std::error::Error) {
        return format!("{what}: {}", one_line(&e.to_string()));
    }
    format!("{what}: {}", one_line(&innermost.to_string()))
}

/// Replaces (or removes) `key` in a query.
fn set(query: &mut Vec<(String, String)>, key: &str, value: Option<String>) {
    query.retain(|(k, _)| k != key);
    if let Some(v) = value {
        query.push((key.to_owned(), v));
    }
}

/// The query pairs of the `rel="next"` link, if any (except `limit`, which
/// the caller sets per page).
fn next_link(headers: &HeaderMap) -> Option<Vec<(String, String)>> {
    for value in headers.get_all(LINK) {
        let Ok(text) = value.to_str() else { continue };
        for link in text.split(',') {
            let mut parts = link.split(';');
            let target = parts.next()?.trim();
            let is_next = parts.any(|p| {
                let p = p.trim().replace(' ', "");
                p == "rel=\"next\"" || p == "rel=next"
            });
            if !is_next {
                continue;
            }
            let target = target.strip_prefix('<')?.strip_suffix('>')?;
            let url = Url::parse("http://link.invalid/").ok()?.join(target).ok()?;
            return Some(
                url.query_pairs()
                    .filter(|(k, _)| k != "limit")
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect(),
            );
        }
    }
    None
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// A path from segments, each percent-encoded (an id cannot step out of
/// its place in the path); `.` and `..` are refused, as URL parsers resolve
/// them even encoded.
pub(crate) fn path(segments: &[&str]) -> Result<String, Failure> {
    let mut out = String::new();
    for segment in segments {
        if segment.is_empty() || *segment == "." || *segment == ".." {
            return Err(Failure::usage(format!(
                "{segment:?} is not a valid id or name"
            )));
        }
        out.push('/');
        for b in segment.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(b as char);
            } else {
                out.push_str(&format!("%{b:02X}"));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    #[test]
    fn segments_are_encoded_and_dots_refused() {
        assert_eq!(
            path(&["v1", "exits", "a b/c"]).unwrap(),
            "/v1/exits/a%20b%2Fc"
        );
        assert!(path(&["v1", ".."]).is_err());
        assert!(path(&["v1", ""]).is_err());
    }

    #[test]
    fn the_next_link_gives_its_cursor_and_filters() {
        let mut h = HeaderMap::new();
        h.insert(
            LINK,
            HeaderValue::from_static(
                "</v1/audit?limit=10&after=42&action=exit.drain>; rel=\"next\"",
            ),
        );
        assert_eq!(
            next_link(&h).unwrap(),
            vec![
                ("after".to_owned(), "42".to_owned()),
                ("action".to_owned(), "exit.drain".to_owned())
            ]
        );
        let mut prev = HeaderMap::new();
        prev.insert(
            LINK,
            HeaderValue::from_static("</v1/x?after=1>; rel=\"prev\""),
        );
        assert!(next_link(&prev).is_none());
        assert!(next_link(&HeaderMap::new()).is_none());
    }

    #[test]
    fn pages_join_into_one_array() {
        let pages = vec![
            "[{\"a\":1}]".to_owned(),
            "[ ]".to_owned(),
            "[{\"a\":2},3]".to_owned(),
        ];
        assert_eq!(
            Rows::new(vec![], &pages, false).raw,
            "[{\"a\":1},{\"a\":2},3]"
        );
        assert_eq!(Rows::new(vec![], &[], false).raw, "[]");
    }

    #[test]
    fn set_replaces_a_key() {
        let mut q = vec![
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), "2".to_owned()),
        ];
        set(&mut q, "a", Some("3".into()));
        set(&mut q, "b", None);
        assert_eq!(q, vec![("a".to_owned(), "3".to_owned())]);
    }
}
