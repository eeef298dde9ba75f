//! The local secret that guards the admin listener's state-changing routes.
//!
//! The person behind an exit withdraws it through `POST /opt-out` on the
//! agent's admin listener (or `exit-agent opt-out`, which calls it). Without
//! a secret, any web page that person visits could send that POST (a "simple"
//! cross-site request needs no preflight), and so could a customer tunnelling
//! through another exit on the same network. The token lives in a file next
//! to the state file, created with mode 0600 at the first start, so only the
//! host's own user (and the CLI it runs) can read it.

use proxynet_common::secret::{constant_time_eq, Secret};
use std::path::{Path, PathBuf};

/// Where the token lives unless `--admin-token-file` says otherwise: beside
/// the state file (`exit-agent.json` → `exit-agent.admin-token`).
pub(crate) fn default_path(state_file: &Path) -> PathBuf {
    state_file.with_extension("admin-token")
}

/// Reads the token, creating it (32 random bytes, hex, mode 0600) if absent.
pub(crate) fn load_or_create(path: &Path) -> std::io::Result<Secret> {
    if let Some(token) = read(path)? {
        return Ok(token);
    }
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    let token = hex::encode(bytes);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    match options.open(path) {
        Ok(mut file) => {
            use std::io::Write;
            file.write_all(token.as_bytes())?;
            file.sync_all()?;
            Ok(Secret::new(token))
        }
        // Another process created it first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            read(path)?.ok_or_else(|| std::io::Error::other("admin token file is empty"))
        }
        Err(e) => Err(e),
    }
}

/// The token in `path`, if the file exists and holds one.
pub(crate) fn read(path: &Path) -> std::io::Result<Option<Secret>> {
    match std::fs::read_to_string(path) {
        Ok(text) if !text.trim().is_empty() => Ok(Some(Secret::new(text.trim().to_owned()))),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

/// Why a state-changing admin request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The request came from a browser page (it carries `Origin` or a
    /// cross-site `Sec-Fetch-Site`): the owner's tools never send those.
    CrossSite,
    /// `Host` is not a loopback name or address: a DNS-rebinding page, or a
    /// request from off the host.
    ForeignHost,
    /// No token, or the wrong one.
    BadToken,
}

impl Refusal {
    pub(crate) fn message(self) -> &'static str {
        match self {
            Refusal::CrossSite => "cross-site requests are refused\n",
            Refusal::ForeignHost => "only a loopback Host may change this agent's state\n",
            Refusal::BadToken => {
                "the admin token (in the file next to the state file) is missing or wrong\n"
            }
        }
    }
}

/// Checks a state-changing request's headers: no browser origin, a loopback
/// `Host`, and `Authorization: Bearer <token>`.
pub(crate) fn check(headers: &http::HeaderMap, token: &Secret) -> Result<(), Refusal> {
    if headers.contains_key(http::header::ORIGIN)
        || headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v != "none" && v != "same-origin")
    {
        return Err(Refusal::CrossSite);
    }
    let host = headers
        .get(http::header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if !is_loopback_host(host) {
        return Err(Refusal::ForeignHost);
    }
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim())
        .unwrap_or_default();
    if presented.is_empty() || !constant_time_eq(presented.as_bytes(), token.expose().as_bytes()) {
        return Err(Refusal::BadToken);
    }
    Ok(())
}

/// `localhost`, `127.x.y.z` or `[::1]`, with or without a port.
fn is_loopback_host(host: &str) -> bool {
    let name = if let Some(v6) = host.strip_prefix('[') {
        v6.split(']').next().unwrap_or_default()
    } else {
        host.rsplit_once(':').map_or(host, |(h, _)| h)
    };
    name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> http::HeaderMap {
        let mut h = http::HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        h
    }

    #[test]
    fn only_a_local_tool_with_the_token_passes() {
        let token = Secret::new("s3cret".to_owned());
        let ok = [
            ("host", "127.0.0.1:9091"),
            ("authorization", "Bearer s3cret"),
        ];
        assert_eq!(check(&headers(&ok), &token), Ok(()));
        for host in ["localhost:9091", "[::1]:9091", "127.0.0.5"] {
            let h = headers(&[("host", host), ("authorization", "Bearer s3cret")]);
            assert_eq!(check(&h, &token), Ok(()), "{host}");
        }
        let cases: &[(&[(&str, &str)], Refusal)] = &[
            (&[("host", "127.0.0.1:9091")], Refusal::BadToken),
            (
                &[
                    ("host", "127.0.0.1:9091"),
                    ("authorization", "Bearer wrong"),
                ],
                Refusal::BadToken,
            ),
            (
                &[
                    ("host", "127.0.0.1:9091"),
                    ("authorization", "Bearer s3cret"),
                    ("origin", "http://evil.example"),
                ],
                Refusal::CrossSite,
            ),
            (
                &[
                    ("host", "127.0.0.1:9091"),
                    ("authorization", "Bearer s3cret"),
                    ("sec-fetch-site", "cross-site"),
                ],
                Refusal::CrossSite,
            ),
            (
                &[
                    ("host", "evil.example:9091"),
                    ("authorization", "Bearer s3cret"),
                ],
                Refusal::ForeignHost,
            ),
            (
                &[
                    ("host", "10.0.0.7:9091"),
                    ("authorization", "Bearer s3cret"),
                ],
                Refusal::ForeignHost,
            ),
            (&[("authorization", "Bearer s3cret")], Refusal::ForeignHost),
        ];
        for (h, want) in cases {
            assert_eq!(check(&headers(h), &token), Err(*want), "{h:?}");
        }
    }

    #[test]
    fn the_token_file_is_created_once_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = default_path(&dir.path().join("exit-agent.json"));
        assert_eq!(path.file_name().unwrap(), "exit-agent.admin-token");
        let first = load_or_create(&path).unwrap();
        let again = load_or_create(&path).unwrap();
        assert_eq!(first.expose(), again.expose());
        assert_eq!(first.expose().len(), 64);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn a_token_file_is_read_trimmed_and_an_empty_one_holds_no_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit-agent.admin-token");
        assert!(read(&path).unwrap().is_none());
        std::fs::write(&path, "  \n").unwrap();
        assert!(read(&path).unwrap().is_none());
        // An empty file is not silently replaced by a token nobody knows of.
        assert!(load_or_create(&path).is_err());
        std::fs::write(&path, "abc123\n").unwrap();
        assert_eq!(read(&path).unwrap().unwrap().expose(), "abc123");
        assert_eq!(load_or_create(&path).unwrap().expose(), "abc123");
    }

    #[test]
    fn local_fetches_pass_with_any_case_bearer_but_other_schemes_do_not() {
        let token = Secret::new("s3cret");
        for fetch_site in ["none", "same-origin"] {
            let h = headers(&[
                ("host", "localhost"),
                ("authorization", "bearer s3cret"),
                ("sec-fetch-site", fetch_site),
            ]);
            assert_eq!(check(&h, &token), Ok(()), "{fetch_site}");
        }
        for authorization in ["Basic s3cret", "Bearer ", "s3cret"] {
            let h = headers(&[("host", "localhost"), ("authorization", authorization)]);
            assert_eq!(check(&h, &token), Err(Refusal::BadToken), "{authorization}");
        }
    }

    #[test]
    fn only_loopback_names_and_addresses_are_a_local_host() {
        for host in [
            "localhost",
            "LOCALHOST:80",
            "127.0.0.1",
            "127.255.0.1:9091",
            "[::1]",
            "[::1]:9091",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "",
            "localhost.evil.example",
            "0.0.0.0:9091",
            "[::]:9091",
            "10.0.0.1",
            "192.0.2.1:9091",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }
}
