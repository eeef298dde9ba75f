//! `proxynetctl`, the built binary, against a real stack: exits as a table,
//! accounts as JSON a script parses, pages followed, an exit drained and a
//! user created through it, a refusal printed as one line with a non-zero
//! exit code, the token never printed; and docs/cli.md is its `--help`.
//! `PROXYNET_UPDATE_DOCS=1` rewrites docs/cli.md's reference part.

use proxynet_tests::process::bin;
use proxynet_tests::stack::{Stack, ADMIN_TOKEN};
use serde_json::Value;
use std::process::Stdio;
use tokio::io::AsyncWriteExt;

/// What one run of the binary did.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(self) -> Self {
        assert_eq!(
            self.code, 0,
            "proxynetctl failed: {}\n{}",
            self.stderr, self.stdout
        );
        self
    }

    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }
}

/// Runs `proxynetctl args` against `api` with `token` (by environment),
/// feeding `stdin`; nothing else of the test's environment reaches it.
async fn ctl_with(api: &str, token: &str, args: &[&str], stdin: &str) -> Run {
    let mut child = tokio::process::Command::new(bin("proxynetctl"))
        .args(args)
        .env_clear()
        .env("PROXYNET_API", api)
        .env("PROXYNET_ADMIN_TOKEN", token)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("proxynetctl finished")
        .unwrap();
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

async fn ctl(stack: &Stack, args: &[&str]) -> Run {
    ctl_with(&stack.api_url, ADMIN_TOKEN, args, "").await
}

#[tokio::test]
async fn cli_lists_the_demo_exits_as_a_table() {
    let stack = Stack::start().await;
    let run = ctl(&stack, &["exits", "list"]).await.ok();
    let lines: Vec<&str> = run.stdout.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        ["ID", "NAME", "COUNTRY", "TYPE", "STATE", "EGRESS", "SCORE"],
        "{}",
        run.stdout
    );
    assert_eq!(
        lines.len(),
        3,
        "a header and one row per exit: {}",
        run.stdout
    );
    let api = stack.admin_get_json("/v1/exits").await;
    for exit in api.as_array().unwrap() {
        let (id, name) = (exit["id"].as_str().unwrap(), exit["name"].as_str().unwrap());
        let row = lines
            .iter()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id}: {}", run.stdout));
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(cells[1], name);
        assert_eq!(cells[2], "DE");
        assert_eq!(cells[3], "dc");
        assert_eq!(cells[4], "live");
        assert_eq!(cells[5], exit["egress_ips"][0].as_str().unwrap());
    }
    for name in ["exit-127.0.0.2", "exit-127.0.0.3"] {
        assert!(run.stdout.contains(name), "{name} missing: {}", run.stdout);
    }
    // Columns line up: every row's NAME starts where the header's does.
    let at = lines[0].find("NAME").unwrap();
    for row in &lines[1..] {
        assert_eq!(&row[at..at + 5], "exit-", "{}", run.stdout);
    }
}

#[tokio::test]
async fn cli_prints_accounts_as_json_and_follows_pages() {
    let stack = Stack::start().await;
    stack.create_account("beta").await;
    stack.create_account("gamma").await;
    let run = ctl(&stack, &["--output", "json", "accounts", "list"])
        .await
        .ok();
    let accounts = run.json();
    let api = stack.admin_get_json("/v1/accounts").await;
    assert_eq!(accounts, api, "the API's JSON as is");
    let names: Vec<&str> = accounts
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"acme") && names.contains(&"beta") && names.contains(&"gamma"));
    // One row per request, every page followed: the same list.
    let paged = ctl(
        &stack,
        &[
            "-o",
            "json",
            "accounts",
            "list",
            "--all",
            "--page-size",
            "1",
        ],
    )
    .await
    .ok();
    assert_eq!(paged.json(), api);
    // Capped: two rows, and a note on stderr that there are more.
    let capped = ctl(
        &stack,
        &[
            "accounts",
            "list",
            "-o",
            "json",
            "--limit",
            "2",
            "--page-size",
            "1",
        ],
    )
    .await
    .ok();
    assert_eq!(capped.json().as_array().unwrap().len(), 2);
    assert!(capped.stderr.contains("--all"), "{}", capped.stderr);
    // A single object, too.
    let id = api[0]["id"].as_str().unwrap();
    let one = ctl(&stack, &["-o", "json", "accounts", "get", id])
        .await
        .ok();
    assert_eq!(one.json()["id"], api[0]["id"]);
}

#[tokio::test]
async fn cli_drives_an_exit_a_user_and_a_key() {
    let stack = Stack::start().await;
    let exit = stack.agents[0].addrs.exit_id.to_string();
    let drained = ctl(&stack, &["exits", "drain", &exit]).await.ok();
    assert!(drained.stdout.contains("draining"), "{}", drained.stdout);
    let view = stack.admin_get_json(&format!("/v1/exits/{exit}")).await;
    assert_eq!(view["admin_draining"], true);
    ctl(&stack, &["exits", "undrain", &exit]).await.ok();
    let view = stack.admin_get_json(&format!("/v1/exits/{exit}")).await;
    assert_eq!(view["admin_draining"], false);

    let account = stack.create_account("cli").await.to_string();
    let created = ctl_with(
        &stack.api_url,
        ADMIN_TOKEN,
        &[
            "-o",
            "json",
            "users",
            "create",
            &account,
            "scraper1",
            "--password-stdin",
            "--limits",
            r#"{"max_concurrent_tunnels": 5}"#,
        ],
        "long-random-password\n",
    )
    .await
    .ok();
    let user = created.json();
    assert_eq!(user["username"], "scraper1");
    assert_eq!(user["max_concurrent_tunnels"], 5);
    let id = user["id"].as_str().unwrap();
    ctl(&stack, &["users", "update", id, "--enabled", "false"])
        .await
        .ok();
    let table = ctl(&stack, &["users", "list", &account]).await.ok();
    let row = table.stdout.lines().nth(1).unwrap();
    assert!(
        row.contains("scraper1") && row.contains(" no "),
        "{}",
        table.stdout
    );

    let key = ctl(
        &stack,
        &[
            "-o",
            "json",
            "keys",
            "create",
            "--account",
            &account,
            "--name",
            "ci",
        ],
    )
    .await
    .ok()
    .json();
    assert!(key["key"].as_str().unwrap().starts_with("pnkey"));
    let key_id = key["id"].as_str().unwrap();
    let revoked = ctl(&stack, &["keys", "revoke", key_id]).await.ok();
    assert!(revoked.stdout.contains("revoked"), "{}", revoked.stdout);
    let keys = ctl(
        &stack,
        &["-o", "json", "keys", "list", "--account", &account],
    )
    .await
    .ok()
    .json();
    assert!(!keys[0]["revoked_at"].is_null(), "{keys}");
}

#[tokio::test]
async fn cli_refusals_are_one_line_with_a_non_zero_code() {
    let stack = Stack::start().await;
    let account = stack.create_account("customer").await;
    let (key, _) = stack.account_key(account).await;
    // An account key calling an operator-only command.
    let run = ctl_with(&stack.api_url, &key, &["exits", "list"], "").await;
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stdout.is_empty(), "{}", run.stdout);
    let lines: Vec<&str> = run.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", run.stderr);
    assert!(
        lines[0].starts_with("error: 403 Forbidden: "),
        "{}",
        run.stderr
    );
    // Its own account it may read.
    ctl_with(
        &stack.api_url,
        &key,
        &["accounts", "get", &account.to_string()],
        "",
    )
    .await
    .ok();
    // A bad token: 401, also one line.
    let run = ctl_with(&stack.api_url, "wrong", &["accounts", "list"], "").await;
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.starts_with("error: 401 Unauthorized"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1);
    // A usage error is clap's: code 2.
    let run = ctl(&stack, &["exits", "list", "--limit", "0"]).await;
    assert_eq!(run.code, 2, "{}", run.stderr);
    // Nobody listening: code 3, one line.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let run = ctl_with(
        &format!("http://{closed}"),
        ADMIN_TOKEN,
        &["exits", "list"],
        "",
    )
    .await;
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(
        run.stderr.starts_with("error: cannot reach the API"),
        "{}",
        run.stderr
    );
    assert_eq!(run.stderr.lines().count(), 1);
    // The token is never printed, not even with --verbose.
    let run = ctl(&stack, &["--verbose", "exits", "list"]).await.ok();
    assert!(run.stderr.contains("> GET "), "{}", run.stderr);
    for text in [&run.stdout, &run.stderr] {
        assert!(!text.contains(ADMIN_TOKEN), "the token leaked: {text}");
    }
    let help = ctl(&stack, &["--help"]).await.ok();
    assert!(!help.stdout.contains(ADMIN_TOKEN));
}

/// The token kept off the command line: `--token-file` (and its variable)
/// works, `--token` works but warns on stderr that every local user can
/// read it, and an `http://` API beyond loopback is refused unless asked for.
#[tokio::test]
async fn cli_takes_the_token_from_a_file_and_warns_about_one_on_the_command_line() {
    let stack = Stack::start().await;
    let dir = std::env::temp_dir().join(format!("pn-ctl-token-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("token");
    std::fs::write(&file, format!("{ADMIN_TOKEN}\n")).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let run = |args: Vec<String>, env: Vec<(&'static str, String)>| {
        let out = std::process::Command::new(bin("proxynetctl"))
            .args(&args)
            .env_clear()
            .env("PROXYNET_API", &stack.api_url)
            .envs(env)
            .output()
            .unwrap();
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8(out.stdout).unwrap(),
            stderr: String::from_utf8(out.stderr).unwrap(),
        }
    };
    let path = file.display().to_string();
    let by_flag = run(
        vec![
            "--token-file".into(),
            path.clone(),
            "exits".into(),
            "list".into(),
        ],
        vec![],
    )
    .ok();
    assert!(
        by_flag.stdout.contains("exit-127.0.0.2"),
        "{}",
        by_flag.stdout
    );
    assert!(!by_flag.stderr.contains("warning"), "{}", by_flag.stderr);
    run(
        vec!["exits".into(), "list".into()],
        vec![("PROXYNET_ADMIN_TOKEN_FILE", path)],
    )
    .ok();
    let typed = run(
        vec![
            "--token".into(),
            ADMIN_TOKEN.into(),
            "exits".into(),
            "list".into(),
        ],
        vec![],
    )
    .ok();
    assert!(
        typed
            .stderr
            .contains("warning: a token given with --token is visible"),
        "{}",
        typed.stderr
    );
    assert!(!typed.stderr.contains(ADMIN_TOKEN));
    // Plain http:// to a host beyond loopback: a usage error before any request.
    let far = run(
        vec![
            "--api".into(),
            "http://control.example.net".into(),
            "exits".into(),
            "list".into(),
        ],
        vec![("PROXYNET_ADMIN_TOKEN", ADMIN_TOKEN.into())],
    );
    assert_eq!(far.code, 2, "{}", far.stderr);
    assert!(
        far.stderr.contains("--allow-insecure-http"),
        "{}",
        far.stderr
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_completion_scripts_are_printed() {
    for shell in ["bash", "zsh", "fish"] {
        let out = std::process::Command::new(bin("proxynetctl"))
            .args(["completion", shell])
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(
            script.contains("proxynetctl") && script.contains("exits"),
            "{shell}"
        );
    }
}

fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

/// `proxynetctl [PATH..] --help`, run with an empty environment.
fn help(path: &[String]) -> String {
    let out = std::process::Command::new(bin("proxynetctl"))
        .args(path)
        .arg("--help")
        .env_clear()
        .output()
        .unwrap();
    assert!(out.status.success(), "{path:?} --help");
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a help text lists (`help` aside).
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_owned)
        .collect()
}

/// The reference part of docs/cli.md: every command's help, depth first.
fn reference() -> String {
    let mut out = String::from(
        "## Reference\n\n<!-- Generated from the binary's --help by tests/tests/e2e/cli.rs: \
         PROXYNET_UPDATE_DOCS=1 cargo nextest run -p proxynet-tests cli_reference -->\n\n",
    );
    let mut stack: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = stack.pop() {
        let text = help(&path);
        let title = std::iter::once("proxynetctl".to_owned())
            .chain(path.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        out.push_str(&format!("### {title}\n\n```text\n{text}```\n\n"));
        for name in subcommands(&text).into_iter().rev() {
            let mut next = path.clone();
            next.push(name);
            stack.push(next);
        }
    }
    out
}

#[test]
fn cli_reference_matches_the_binarys_help() {
    let path = repo_file("docs/cli.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let intro = doc
        .split("## Reference\n")
        .next()
        .expect("docs/cli.md has its intro")
        .to_owned();
    let expected = format!("{intro}{}", reference());
    let expected = format!("{}\n", expected.trim_end());
    if std::env::var_os("PROXYNET_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    assert!(
        doc == expected,
        "docs/cli.md is stale: run `PROXYNET_UPDATE_DOCS=1 cargo nextest run -p proxynet-tests cli_reference` and commit"
    );
    // Every resource the issue names has its command.
    for resource in [
        "accounts",
        "users",
        "keys",
        "plans",
        "entitlements",
        "policy",
        "sources",
        "consent",
        "exits",
        "dedicated",
        "sessions",
        "usage",
        "invoices",
        "abuse",
        "webhooks",
        "audit",
        "completion",
    ] {
        assert!(
            doc.contains(&format!("### proxynetctl {resource}\n")),
            "{resource}"
        );
    }
}

/// `proxynetctl dedicated`: allocate by count, list with the allowance,
/// replace, the operator's map and move, release — against the real API.
#[tokio::test]
async fn cli_allocates_lists_replaces_moves_and_releases_dedicated_addresses() {
    let stack = Stack::start().await;
    let first = stack.create_account("cli-ded-1").await.to_string();
    let second = stack.create_account("cli-ded-2").await.to_string();
    let allocated = ctl(
        &stack,
        &[
            "-o",
            "json",
            "dedicated",
            "allocate",
            "--account",
            &first,
            "--count",
            "1",
        ],
    )
    .await
    .ok()
    .json();
    let ip = allocated["items"][0]["ip"].as_str().unwrap().to_owned();
    let listed = ctl(&stack, &["dedicated", "list", "--account", &first])
        .await
        .ok();
    assert!(listed.stdout.contains(&ip), "{}", listed.stdout);
    assert!(listed.stdout.contains("0 of 2 used"), "{}", listed.stdout);
    let replaced = ctl(
        &stack,
        &[
            "-o",
            "json",
            "dedicated",
            "replace",
            "--account",
            &first,
            &ip,
        ],
    )
    .await
    .ok()
    .json();
    let new = replaced["items"][0]["ip"].as_str().unwrap().to_owned();
    assert_ne!(new, ip);
    ctl(&stack, &["dedicated", "move", &new, "--to", &second])
        .await
        .ok();
    let map = ctl(&stack, &["-o", "json", "dedicated", "map"])
        .await
        .ok()
        .json();
    assert_eq!(map["items"].as_array().unwrap().len(), 1, "{map}");
    assert_eq!(map["items"][0]["account_id"], second.as_str(), "{map}");
    ctl(
        &stack,
        &["dedicated", "release", "--account", &second, &new],
    )
    .await
    .ok();
    let map = ctl(&stack, &["-o", "json", "dedicated", "map"])
        .await
        .ok()
        .json();
    assert_eq!(map["items"], serde_json::json!([]), "{map}");
    // Too many: one line, non-zero.
    let refused = ctl(
        &stack,
        &[
            "dedicated",
            "allocate",
            "--account",
            &first,
            "--count",
            "50",
        ],
    )
    .await;
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("free address"),
        "{}",
        refused.stderr
    );
}
