//! Where the API is and what token to present: flags win over environment
//! variables (clap merges those two), which win over the config file
//! (`--config PATH`, default `$XDG_CONFIG_HOME/proxynet/ctl.toml` or
//! `~/.config/proxynet/ctl.toml`).
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

/// Resolves the settings from what clap gave (flag, else environment) and
/// the config file. An explicit `--config` must exist; the default file may
/// be absent, and is only read when a flag or variable leaves something out.
pub(crate) fn resolve(
    api: Option<String>,
    token: Option<String>,
    explicit: Option<&Path>,
) -> Result<Settings, Failure> {
    resolve_with(api, token, explicit, &|name| std::env::var(name).ok())
}

fn resolve_with(
    api: Option<String>,
    token: Option<String>,
    explicit: Option<&Path>,
    var: &dyn Fn(&str) -> Option<String>,
) -> Result<Settings, Failure> {
    let api = api.filter(|a| !a.trim().is_empty());
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
        api: parse_api(&api)?,
        token: token
            .or(file.token.map(|t| t.trim().to_owned()))
            .filter(|t| !t.is_empty())
            .map(Token::new),
    })
}

/// An http(s) base URL.
fn parse_api(text: &str) -> Result<reqwest::Url, Failure> {
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
    Ok(url)
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
        let s = resolve_with(None, None, Some(&path), &none).unwrap();
        assert_eq!(s.api.as_str(), "http://file:1/");
        assert_eq!(s.token.unwrap().expose(), "from-file");
        let s = resolve_with(
            Some("http://flag:2".into()),
            Some("from-flag".into()),
            Some(&path),
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
        let s = resolve_with(Some("http://flag:2".into()), None, None, &var).unwrap();
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
        for bad in ["ftp://x", "127.0.0.1:8081", "http://x/?a=b"] {
            let e = resolve_with(Some(bad.into()), None, None, &none).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
        }
        let e = resolve_with(None, Some("t".into()), None, &none).unwrap_err();
        assert!(e.to_string().contains("PROXYNET_API"), "{e}");
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
