//! What can go wrong, each with its exit code and its one line on stderr.
//!
//! Exit codes (docs/cli.md): 0 success; 1 the API answered with an error
//! (its problem+json detail is printed); 2 a usage error (clap's own, or an
//! argument, input file or config file this program could not use); 3 the
//! API could not be reached (connection refused, DNS, TLS, timeout).

use std::fmt;

/// A failure of one invocation; printed as `error: {self}`.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Failure {
    /// The API answered 4xx/5xx.
    #[error("{}", api_line(*status, detail.as_deref(), hint.as_deref()))]
    Api {
        status: u16,
        detail: Option<String>,
        hint: Option<String>,
    },
    /// The API answered success with something that cannot be read.
    #[error("{0}")]
    Answer(String),
    /// Arguments, input files or configuration this program cannot use.
    #[error("{0}")]
    Usage(String),
    /// No answer from the API.
    #[error("cannot reach the API at {url}: {cause}")]
    Unreachable { url: String, cause: String },
}

impl Failure {
    pub(crate) fn exit_code(&self) -> i32 {
        match self {
            Failure::Api { .. } | Failure::Answer(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Unreachable { .. } => 3,
        }
    }

    pub(crate) fn usage(message: impl fmt::Display) -> Self {
        Failure::Usage(message.to_string())
    }
}

/// `403 Forbidden: detail`, with the status' canonical reason.
fn api_line(status: u16, detail: Option<&str>, hint: Option<&str>) -> String {
    let reason = reqwest::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("error");
    let mut line = format!("{status} {reason}");
    if let Some(detail) = detail.filter(|d| !d.is_empty()) {
        line.push_str(": ");
        line.push_str(detail);
    }
    if let Some(hint) = hint {
        line.push_str(" (");
        line.push_str(hint);
        line.push(')');
    }
    line
}

/// One line: line breaks and tabs become spaces, runs of spaces collapse.
pub(crate) fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// An error and its causes, `outer: inner: innermost`, repeats dropped
/// (reqwest's messages often restate their source).
pub(crate) fn chain(error: &dyn std::error::Error) -> String {
    let mut parts: Vec<String> = vec![error.to_string()];
    let mut source = error.source();
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    one_line(&parts.join(": "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_failure_reads_as_status_reason_and_detail() {
        let f = Failure::Api {
            status: 403,
            detail: Some("operator only".into()),
            hint: None,
        };
        assert_eq!(f.to_string(), "403 Forbidden: operator only");
        assert_eq!(f.exit_code(), 1);
        let bare = Failure::Api {
            status: 502,
            detail: None,
            hint: Some("hint".into()),
        };
        assert_eq!(bare.to_string(), "502 Bad Gateway (hint)");
    }

    #[test]
    fn codes_distinguish_usage_and_reachability() {
        assert_eq!(Failure::usage("x").exit_code(), 2);
        let down = Failure::Unreachable {
            url: "http://127.0.0.1:1".into(),
            cause: "connection refused".into(),
        };
        assert_eq!(down.exit_code(), 3);
        assert_eq!(
            down.to_string(),
            "cannot reach the API at http://127.0.0.1:1: connection refused"
        );
    }

    #[test]
    fn text_is_folded_onto_one_line() {
        assert_eq!(one_line("a\nb\t c\r\n"), "a b c");
    }
}
