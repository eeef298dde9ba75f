//! The shipped systemd units verify and are hardened.

use proxynet_tests::process::bin;

/// The systemd units are valid and hardened.
#[test]
fn systemd_units_verify_and_are_hardened() {
    let units = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd");
    let dir = tempfile::tempdir().unwrap();
    for name in ["superproxy", "control-api", "exit-agent"] {
        let file = format!("proxynet-{name}.service");
        let text = std::fs::read_to_string(units.join(&file)).unwrap();
        for required in [
            "DynamicUser=yes",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            "StateDirectoryMode=0700",
        ] {
            assert!(text.contains(required), "{file} lacks {required}");
        }
        // Verify against the binaries this build produced.
        let local = text.replace(
            &format!("/usr/local/bin/{name}"),
            &bin(name).display().to_string(),
        );
        std::fs::write(dir.path().join(&file), local).unwrap();
    }
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .args(
            ["superproxy", "control-api", "exit-agent"]
                .map(|n| dir.path().join(format!("proxynet-{n}.service"))),
        )
        .output()
        .expect("systemd-analyze is installed (scripts/test installs it)");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
