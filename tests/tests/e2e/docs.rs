//! docs/ describes what is built: these tests fail when the code and the
//! reference pages drift apart. `PROXYNET_UPDATE_DOCS=1` rewrites config.md.

use proxynet_tests::process::bin;
use superproxy::error::{ErrorKind, Source};

fn repo_file(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path)
}

#[test]
fn error_catalogue_matches_the_error_type() {
    let doc = std::fs::read_to_string(repo_file("docs/errors.md")).unwrap();
    for kind in ErrorKind::ALL {
        let row = doc
            .lines()
            .find(|l| l.starts_with(&format!("| {kind:?} |")))
            .unwrap_or_else(|| panic!("docs/errors.md has no row for {kind:?}"));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let source = match kind.source() {
            Source::Client => "client",
            Source::ExitLink => "exit link",
            Source::Target => "target",
            Source::Policy => "policy",
            Source::Internal => "internal",
        };
        assert_eq!(cells[2], kind.status().as_str(), "{kind:?} status");
        assert_eq!(cells[3], kind.proxy_status_error(), "{kind:?} Proxy-Status");
        assert_eq!(
            cells[4],
            format!("0x{:02x}", kind.socks_reply()),
            "{kind:?} SOCKS reply"
        );
        assert_eq!(cells[5], source, "{kind:?} source");
        assert_eq!(
            cells[6],
            if kind.retry_safe() { "yes" } else { "no" },
            "{kind:?} retry"
        );
    }
}

#[test]
fn config_reference_matches_each_binarys_help() {
    let path = repo_file("docs/config.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let mut expected = doc.split("## control-api").next().unwrap().to_owned();
    for name in ["control-api", "superproxy", "exit-agent"] {
        let out = std::process::Command::new(bin(name))
            .arg("--help")
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success());
        expected.push_str(&format!(
            "## {name}\n\n```text\n{}```\n\n",
            String::from_utf8_lossy(&out.stdout)
        ));
    }
    if std::env::var_os("PROXYNET_UPDATE_DOCS").is_some() {
        std::fs::write(&path, &expected).unwrap();
        return;
    }
    assert!(
        doc == expected,
        "docs/config.md is stale: run `PROXYNET_UPDATE_DOCS=1 cargo nextest run config_reference` and commit"
    );
}

#[test]
fn the_fault_matrix_table_names_exactly_the_fault_tests() {
    let doc = std::fs::read_to_string(repo_file("docs/health.md")).unwrap();
    let table = doc
        .split("<!-- fault-matrix -->")
        .nth(1)
        .and_then(|rest| rest.split("<!-- /fault-matrix -->").next())
        .expect("docs/health.md has the fault matrix between its markers");
    let mut documented: Vec<String> = table
        .lines()
        .filter_map(|l| l.split('|').nth(3))
        .filter_map(|cell| {
            cell.trim()
                .strip_prefix('`')?
                .strip_suffix('`')
                .map(str::to_owned)
        })
        .collect();
    let source = std::fs::read_to_string(repo_file("tests/tests/e2e/fault_matrix.rs")).unwrap();
    let mut tested: Vec<String> = source
        .split("#[tokio::test")
        .skip(1)
        .filter_map(|after| {
            let name = after.split("async fn ").nth(1)?;
            Some(name.split('(').next()?.to_owned())
        })
        .collect();
    documented.sort();
    tested.sort();
    assert_eq!(
        documented, tested,
        "docs/health.md's fault matrix and fault_matrix.rs differ"
    );
}
