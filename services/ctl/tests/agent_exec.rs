//! `airlockctl agent exec NAME`, the entry point of
//! `airlock-agent@NAME.service`: it runs the configured argv (never one
//! from anywhere else) with a clean environment, refuses root, and refuses a
//! name the configuration does not have.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

use serde_json::Value;

const CONFIG: &str = r#"
[[repository]]
name = "demo"
path = "/srv/git/demo.git"

[[agent]]
name = "plain"
command = ["/usr/bin/env"]
repositories = ["demo"]
environment = ["ALLOWED_VAR"]

[[agent]]
name = "keyed"
command = ["/usr/bin/env"]
repositories = ["demo"]
credential_file = "/etc/airlock/agents/keyed.key"
"#;

/// uid and gid `nobody` (65534 on Debian).
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

fn config() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("airlock.toml");
    std::fs::write(&path, CONFIG).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    (dir, path)
}

/// `airlockctl --json agent exec --config CONFIG NAME`, as `nobody` when
/// `as_nobody`, with a few variables in its environment that only an
/// allowlist may pass.
fn exec(config: &std::path::Path, name: &str, as_nobody: bool) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlockctl"));
    cmd.args(["--json", "agent", "exec", "--config"])
        .arg(config)
        .arg(name)
        .env_clear()
        .env("ALLOWED_VAR", "passed")
        .env("SECRET_VAR", "kept-back")
        .env("CREDENTIALS_DIRECTORY", "/run/credentials/x")
        .env("STATE_DIRECTORY", "/tmp")
        .current_dir("/");
    if as_nobody {
        cmd.uid(NOBODY).gid(NOBODY);
    }
    cmd.output().unwrap()
}

fn error_code(o: &Output) -> String {
    let v: Value = serde_json::from_slice(&o.stderr)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&o.stderr)));
    v["error"]["code"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn agent_exec_runs_the_configured_argv_with_its_environment_only() {
    assert!(
        is_root(),
        "agent_exec_runs_the_configured_argv_with_its_environment_only needs root (it runs the agent as another user); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    let (_dir, config) = config();

    let o = exec(&config, "plain", true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env = String::from_utf8(o.stdout).unwrap();
    let mut vars: Vec<&str> = env.lines().collect();
    vars.sort_unstable();
    assert_eq!(
        vars,
        [
            "AIRLOCK_AGENT=plain",
            "ALLOWED_VAR=passed",
            "HOME=/tmp",
            "PATH=/usr/local/bin:/usr/bin:/bin",
        ],
        "the agent's whole environment"
    );

    // With a credential_file, systemd's CREDENTIALS_DIRECTORY is passed on.
    let o = exec(&config, "keyed", true);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let env = String::from_utf8(o.stdout).unwrap();
    assert!(
        env.lines()
            .any(|l| l == "CREDENTIALS_DIRECTORY=/run/credentials/x"),
        "{env}"
    );
    assert!(!env.contains("ALLOWED_VAR"), "not on its allowlist: {env}");
}

#[test]
fn agent_exec_refuses_root_and_an_unknown_name() {
    assert!(
        is_root(),
        "agent_exec_refuses_root_and_an_unknown_name needs root (to show that root is refused); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    let (_dir, config) = config();
    let o = exec(&config, "plain", false);
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "nothing ran");
    assert_eq!(error_code(&o), "AUTHORIZATION_DENIED");

    let o = exec(&config, "ghost", true);
    assert!(!o.status.success());
    assert!(o.stdout.is_empty(), "nothing ran");
    assert_eq!(error_code(&o), "AGENT_NOT_FOUND");
}
