//! Where the API is and what token to present: flags win over environment
//! variables (clap merges those two), which win over the config file
//! (`--config PATH`, default `$XDG_CONFIG_HOME/proxynet/ctl.toml` or
//! `~/.config/proxynet/ctl.toml`). The token may also come from a file of
//! its own (`--token-file`); a token typed on the command line draws a
//! warning, and an `http://` API beyond loopback needs
//! `--allow-insecure-http`, since the token would cross the network in clear.
//!
//! The file is a two-key subset of TOML, read by a small parser here:
//!
//! ```toml
//! api = "http://127.0.0.1:8081"
//! token = "pnkey_..."
//! ```

use std::fmt;
use std::path::{Path, PathBuf};

use crate::error::Failure;

/// A bearer token: never printed, not even by `{:?}`.
#[derive(Clone)]
pub(crate) struct Token(String);

impl Token {
    pub(crate) fn new(value: String) -> Self {
        Self(value)
    }

    /// The only place the token is read: the Authorization header.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// What the invocation talks to.
#[derive(Debug)]
pub(crate) struct Settings {
    pub(crate) api: reqwest::Url,
    pub(crate) token: Option<Token>,
}

/// The config file's contents.
#[derive(Debug, Default, PartialEq)]
struct FileConfig {
    api: Option<String>,
    token: Option<String>,
}

/// The default config file: `$XDG_CONFIG_HOME/proxynet/ctl.toml`, else
/// `$HOME/.config/proxynet/ctl.toml`.
fn default_path(var: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let base = match var("XDG_CONFIG_HOME").filter(|v| Path::new(v).is_absolute()) {
        Some(xdg) => PathBuf::from(xdg),
        None => PathBuf::from(var("HOME").filter(|h| !h.is_empty())?).join(".config"),
    };
    Some(base.join("proxynet").join("ctl.toml"))
}

/// What clap gave (each a flag, else its environment variable).
#[derive(Debug, Default)]
pub(crate) struct Sources {
    pub(crate) api: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) token_file: Option<PathBuf>,
    pub(crate) config: Option<PathBuf>,
    pub(crate) allow_insecure_http: bool,
}

/// Whether the arguments carry the token itself (`--token T` or
/// `--token=T`), where every local user can read it.
pub(crate) fn token_on_command_line(args: impl IntoIterator<Item = std::ffi::OsString>) -> bool {
    args.into_iter()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--token" || a.to_string_lossy().starts_with("--token="))
}

/// Resolves the settings from what clap gave (flag, else environment) and
/// the config file. An explicit `--config` must exist; the default file may
/// be absent, and is only read when a flag or variable leaves something out.
pub(crate) fn resolve(sources: Sources) -> Result<Settings, Failure> {
    resolve_with(sources, &|name| std::env::var(name).ok())
}

fn resolve_with(
    sources: Sources,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, Failure> {
    let Sources {
        api,
        token,
        token_file,
        config: explicit,
        allow_insecure_http,
    } = sources;
    let explicit = explicit.as_deref();
    let api = api.filter(|a| !a.trim().is_empty());
    let token = match token_file {
        Some(path) => Some(read_token_file(&path)?),
        None => token,
    };
    // Tokens hold no white space: a trailing newline (`$(cat file)` keeps
    // none, but an editor's file does) is not part of one.
    let token = token.map(|t| t.trim().to_owned()).filter(|t| !t.is_empty());
    let file = match explicit {
        Some(path) => read(path)?,
        None if api.is_none() || token.is_none() => match default_path(var) {
            Some(path) if path.exists() => read(&path)?,
            _ => FileConfig::default(),
        },
        None => FileConfig::default(),
    };
    let api = api.or(file.api).ok_or_else(|| {
        Failure::usage(
            "no API address: pass --api URL, set PROXYNET_API, or put api = \"...\" in the config file",
        )
    })?;
    Ok(Settings {
        api: parse_api(&api, allow_insecure_http)?,
        token: token
            .or(file.token.map(|t| t.trim().to_owned()))
            .filter(|t| !t.is_empty())
            .map(Token::new),
    })
}

/// An http(s) base URL; plain `http://` only to a loopback host unless
/// `insecure` says the caller means it.
fn parse_api(text: &str, insecure: bool) -> Result<reqwest::Url, Failure> {
    let url = reqwest::Url::parse(text.trim())
        .map_err(|e| Failure::usage(format!("--api {text:?}: {e} (e.g. http://127.0.0.1:8081)")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(Failure::usage(format!(
            "--api {text:?}: an http:// or https:// URL"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(Failure::usage(format!(
            "--api {text:?}: a base URL, without query or fragment"
        )));
    }
    if url.scheme() == "http" && !insecure && !is_loopback(&url) {
        return Err(Failure::usage(format!(
            "--api {text:?}: http:// to a host other than loopback would send the token in clear; \
             use https:// (with --cacert for a private CA), or pass --allow-insecure-http"
        )));
    }
    Ok(url)
}

/// `localhost`, 127.0.0.0/8 or `::1`.
fn is_loopback(url: &reqwest::Url) -> bool {
    let host = url.host_str().unwrap_or_default();
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    match bare.parse::<std::net::IpAddr>() {
        Ok(ip) => ip.is_loopback(),
        Err(_) => {
            let name = host.trim_end_matches('.').to_ascii_lowercase();
            name == "localhost" || name.ends_with(".localhost")
        }
    }
}

/// The token file's contents (one line; white space around it dropped); a
/// file others can read draws the same warning as a shared config file.
fn read_token_file(path: &Path) -> Result<String, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("--token-file {}: {e}", path.display())))?;
    let token = text.trim();
    if token.is_empty() || token.contains(char::is_whitespace) {
        return Err(Failure::usage(format!(
            "--token-file {}: the file must hold the token alone",
            path.display()
        )));
    }
    warn_if_shared(path);
    Ok(token.to_owned())
}

fn read(path: &Path) -> Result<FileConfig, Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::usage(format!("config file {}: {e}", path.display())))?;
    let config =
        parse(&text).map_err(|e| Failure::usage(format!("config file {}: {e}", path.display())))?;
    if config.token.is_some() {
        warn_if_shared(path);
    }
    Ok(config)
}

/// A token in a file others can read is a token others have.
#[cfg(unix)]
fn warn_if_shared(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(meta) = std::fs::metadata(path) {
        if meta.permissions().mode() & 0o077 != 0 {
            eprintln!(
                "warning: {} holds a token and is readable by others (chmod 600 it)",
                path.display()
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_shared(_: &Path) {}

/// `key = "value"` lines (basic or literal TOML strings), `#` comments and
/// blank lines; the keys `api` and `token`, each at most once.
fn parse(text: &str) -> Result<FileConfig, String> {
    let mut config = FileConfig::default();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |what: &str| format!("line {}: {what}", n + 1);
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| at("expected key = \"value\""))?;
        let value = string(value.trim()).map_err(|e| at(&e))?;
        let slot = match key.trim() {
            "api" => &mut config.api,
            "token" => &mut config.token,
            other => return Err(at(&format!("unknown key {other:?} (api or token)"))),
        };
        if slot.replace(value).is_some() {
            return Err(at(&format!("{} given twice", key.trim())));
        }
    }
    Ok(config)
}

/// A TOML basic (`"..."`, with escapes) or literal (`'...'`) string,
/// optionally followed by a comment.
fn string(text: &str) -> Result<String, String> {
    let mut chars = text.chars();
    let quote = chars.next().filter(|c| *c == '"' || *c == '\'');
    let Some(quote) = quote else {
        return Err("the value must be a quoted string".into());
    };
    let mut out = String::new();
    loop {
        let c = chars.next().ok_or("unterminated string")?;
        match c {
            c if c == quote => break,
            '\\' if quote == '"' => {
                let escaped = chars.next().ok_or("unterminated string")?;
                out.push(match escaped {
                    '"' => '"',
                    '\\' => '\\',
                    'n' => '\n',
                    't' => '\t',
                    'r' => '\r',
                    'u' => {
                        let hex: String = chars.by_ref().take(4).collect();
                        u32::from_str_radix(&hex, 16)
                            .ok()
                            .and_then(char::from_u32)
                            .ok_or("invalid \\u escape")?
                    }
                    other => return Err(format!("unknown escape \\{other}")),
                });
            }
            c => out.push(c),
        }
    }
    let rest = chars.as_str().trim();
    if !rest.is_empty() && !rest.starts_with('#') {
        return Err(format!("unexpected {rest:?} after the string"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_holds_api_and_token() {
        let config =
            parse("# proxynetctl\napi = \"http://127.0.0.1:8081\"  # local\n\ntoken = 'pn\\key'\n")
                .unwrap();
        assert_eq!(config.api.as_deref(), Some("http://127.0.0.1:8081"));
        assert_eq!(config.token.as_deref(), Some("pn\\key"));
        assert_eq!(
            parse("token = \"a\\\"b\\u0041\"").unwrap().token.as_deref(),
            Some("a\"bA")
        );
    }

    #[test]
    fn mistakes_name_their_line() {
        assert_eq!(
            parse("api = \"x\"\napi = \"y\"").unwrap_err(),
            "line 2: api given twice"
        );
        assert!(parse("apii = \"x\"").unwrap_err().contains("unknown key"));
        assert!(parse("api = x").unwrap_err().contains("quoted string"));
        assert!(parse("api = \"x").unwrap_err().contains("unterminated"));
        assert!(parse("[ctl]").unwrap_err().starts_with("line 1"));
        assert!(parse("api = \"x\" y")
            .unwrap_err()
            .contains("after the string"));
    }

    #[test]
    fn flags_and_variables_win_over_the_file() {
        let dir = tempdir();
        let path = dir.join("ctl.toml");
        std::fs::write(&path, "api = \"http://file:1\"\ntoken = \"from-file\"\n").unwrap();
        let none = |_: &str| None;
        let from = |api: Option<&str>, token: Option<&str>, config: Option<&Path>| Sources {
            api: api.map(str::to_owned),
            token: token.map(str::to_owned),
            config: config.map(Path::to_path_buf),
            allow_insecure_http: true,
            ..Sources::default()
        };
        let s = resolve_with(from(None, None, Some(&path)), &none).unwrap();
        assert_eq!(s.api.as_str(), "http://file:1/");
        assert_eq!(s.token.unwrap().expose(), "from-file");
        let s = resolve_with(
            from(Some("http://flag:2"), Some("from-flag"), Some(&path)),
            &none,
        )
        .unwrap();
        assert_eq!(s.api.as_str(), "http://flag:2/");
        assert_eq!(s.token.unwrap().expose(), "from-flag");
        // The default file, under XDG_CONFIG_HOME, fills what is missing.
        std::fs::create_dir_all(dir.join("proxynet")).unwrap();
        std::fs::rename(&path, dir.join("proxynet/ctl.toml")).unwrap();
        let xdg = dir.display().to_string();
        let var = move |name: &str| (name == "XDG_CONFIG_HOME").then(|| xdg.clone());
        let s = resolve_with(from(Some("http://flag:2"), None, None), &var).unwrap();
        assert_eq!(s.api.as_str(), "http://flag:2/");
        assert_eq!(s.token.unwrap().expose(), "from-file");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_default_path_follows_xdg_then_home() {
        let xdg = |n: &str| match n {
            "XDG_CONFIG_HOME" => Some("/x".to_owned()),
            "HOME" => Some("/h".to_owned()),
            _ => None,
        };
        assert_eq!(
            default_path(&xdg).unwrap(),
            PathBuf::from("/x/proxynet/ctl.toml")
        );
        let home = |n: &str| (n == "HOME").then(|| "/h".to_owned());
        assert_eq!(
            default_path(&home).unwrap(),
            PathBuf::from("/h/.config/proxynet/ctl.toml")
        );
        assert!(default_path(&|_: &str| None).is_none());
    }

    #[test]
    fn an_api_is_an_http_base_url_and_required() {
        let none = |_: &str| None;
        let api = |a: &str, insecure: bool| Sources {
            api: Some(a.to_owned()),
            allow_insecure_http: insecure,
            ..Sources::default()
        };
        for bad in ["ftp://x", "127.0.0.1:8081", "http://x/?a=b"] {
            let e = resolve_with(api(bad, true), &none).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        let token_only = Sources {
            token: Some("t".into()),
            ..Sources::default()
        };
        let e = resolve_with(token_only, &none).unwrap_err();
        assert!(e.to_string().contains("PROXYNET_API"), "{e}");
    }

    #[test]
    fn plain_http_beyond_loopback_needs_the_flag() {
        let none = |_: &str| None;
        let api = |a: &str, insecure: bool| Sources {
            api: Some(a.to_owned()),
            allow_insecure_http: insecure,
            ..Sources::default()
        };
        for local in [
            "http://127.0.0.1:8081",
            "http://127.8.9.1",
            "http://[::1]:8081",
            "http://localhost:8081",
            "http://api.localhost",
            "https://control.example.net",
        ] {
            resolve_with(api(local, false), &none).unwrap();
        }
        let e = resolve_with(api("http://control.example.net", false), &none).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--allow-insecure-http"), "{e}");
        resolve_with(api("http://control.example.net", true), &none).unwrap();
    }

    #[test]
    fn the_token_file_holds_the_token_alone() {
        let none = |_: &str| None;
        let dir = tempdir();
        let path = dir.join("token");
        std::fs::write(&path, "pnkey_abc\n").unwrap();
        let sources = |file: &Path| Sources {
            api: Some("http://127.0.0.1:1".into()),
            token_file: Some(file.to_path_buf()),
            ..Sources::default()
        };
        let s = resolve_with(sources(&path), &none).unwrap();
        assert_eq!(s.token.unwrap().expose(), "pnkey_abc");
        std::fs::write(&path, "two words\n").unwrap();
        assert_eq!(
            resolve_with(sources(&path), &none).unwrap_err().exit_code(),
            2
        );
        let e = resolve_with(sources(&dir.join("absent")), &none).unwrap_err();
        assert!(e.to_string().contains("--token-file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_token_on_the_command_line_is_noticed() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert!(token_on_command_line(args(&[
            "ctl", "--token", "t", "exits", "list"
        ])));
        assert!(token_on_command_line(args(&[
            "ctl",
            "exits",
            "list",
            "--token=t"
        ])));
        assert!(!token_on_command_line(args(&[
            "ctl",
            "--token-file",
            "f",
            "exits"
        ])));
        assert!(!token_on_command_line(args(&[
            "ctl", "api", "--", "--token"
        ])));
    }

    #[test]
    fn a_token_never_prints() {
        let t = Token::new("secret-value".into());
        assert_eq!(format!("{t:?}"), "[redacted]");
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "proxynetctl-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
