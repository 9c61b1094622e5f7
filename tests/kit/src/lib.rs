//! Helpers the test suites and benchmarks share: a supervisor in the
//! test's own process on a private bus ([`supervisor::InProcess`]), git in
//! a test directory, waiting for a condition ([`poll`]), package
//! registries learnt at run time, small real projects. (The full stack
//! the crash tests kill parts of is tests/crash/src/lib.rs's `Stack`: it
//! needs the worker's fault-injection build.)
//!
//! Owns: setup code a test would otherwise write again. The one crate
//! that imports a service (airlock-supervisor, for [`InProcess`]); so it
//! must never be linked by a shipped binary (a dev-dependency, or the
//! bench crate's; `services/executor/tests/closure.rs` checks) and never
//! names a registry's host: hosts are learnt from what each package
//! client asks a logging proxy for ([`registry_of`]).

pub mod supervisor;

pub use supervisor::InProcess;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Runs git in `dir` with no user or system configuration and a fixed
/// identity; panics with git's stderr when it fails. Returns stdout,
/// trimmed.
pub fn git(dir: &Path, args: &[&str]) -> String {
    git_with_global(dir, Path::new("/dev/null"), args)
}

/// [`git`] with `global` as the user configuration (for instance one that
/// trusts repositories another uid owns: `-c safe.directory` does not
/// reach the receive-pack a local push starts).
pub fn git_with_global(dir: &Path, global: &Path, args: &[&str]) -> String {
    run_git(
        Command::new("git").env("GIT_CONFIG_GLOBAL", global),
        dir,
        args,
    )
}

/// [`git`] with the commits it makes dated 1700000000 +0000 (author and
/// committer), for a test that checks what is made from them is
/// deterministic.
pub fn git_dated(dir: &Path, args: &[&str]) -> String {
    run_git(
        Command::new("git")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_AUTHOR_DATE", "1700000000 +0000")
            .env("GIT_COMMITTER_DATE", "1700000000 +0000"),
        dir,
        args,
    )
}

fn run_git(command: &mut Command, dir: &Path, args: &[&str]) -> String {
    let out = with_identity(command.current_dir(dir))
        .args(args)
        .output()
        .expect("git runs");
    succeeded(out, args, "")
}

/// `command` (a git) with no system configuration and the kit's fixed
/// identity for the commits it makes.
fn with_identity(command: &mut Command) -> &mut Command {
    command
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t.invalid")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t.invalid")
}

/// git on the bare repository `repo`, trusting that one directory, with
/// no user or system configuration and the fixed identity.
fn git_dir_command(repo: &Path) -> Command {
    let mut command = Command::new("git");
    with_identity(command.env("GIT_CONFIG_GLOBAL", "/dev/null"))
        .arg("-c")
        .arg(format!("safe.directory={}", repo.display()))
        .arg("--git-dir")
        .arg(repo);
    command
}

/// git's stdout, trimmed, when it succeeded; else a panic with its stderr
/// (`place`, when not empty, says where it ran).
fn succeeded(out: std::process::Output, args: &[&str], place: &str) -> String {
    assert!(
        out.status.success(),
        "git {args:?}{place}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Runs git on the bare repository `repo` (`--git-dir`), trusting that one
/// directory (it may belong to the worker's uid), with no user or system
/// configuration and [`git`]'s identity; panics with git's stderr when it
/// fails. Returns stdout, trimmed.
pub fn git_dir(repo: &Path, args: &[&str]) -> String {
    let out = git_dir_command(repo).args(args).output().expect("git runs");
    succeeded(out, args, &format!(" in {}", repo.display()))
}

/// [`git_dir`] with `input` on git's stdin (`hash-object --stdin`,
/// `mktree`), and the fixed identity of [`git`] for the commits it makes.
pub fn git_dir_input(repo: &Path, args: &[&str], input: &str) -> String {
    let mut child = git_dir_command(repo)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("git runs");
    child
        .stdin
        .take()
        .expect("git's stdin")
        .write_all(input.as_bytes())
        .expect("git reads its input");
    let out = child.wait_with_output().expect("git ends");
    succeeded(out, args, &format!(" in {}", repo.display()))
}

/// [`git`] sealed off from the test's own environment: /usr/bin/git with
/// an empty environment but PATH=/usr/bin:/bin and a HOME that does not
/// exist, every directory trusted. For a work tree another uid owns and
/// the test arms (hooks, configuration) against the program it tests.
pub fn git_hermetic(dir: &Path, args: &[&str]) -> String {
    let mut command = Command::new("/usr/bin/git");
    command
        .current_dir(dir)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", "/nonexistent")
        .env("GIT_CONFIG_GLOBAL", "/dev/null");
    let out = with_identity(&mut command)
        .args(["-c", "safe.directory=*"])
        .args(args)
        .output()
        .expect("git runs");
    succeeded(out, args, "")
}

/// git on the bare repository `repo` whoever owns it (every directory
/// trusted), with no user or system configuration; stdout trimmed, empty
/// when git fails (a `rev-parse --verify --quiet` of a missing ref
/// answers ""). For reading what a killed process left.
pub fn git_dir_or_empty(repo: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(repo)
        .args(args)
        .output()
        .expect("git runs");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Makes the package's users and groups as the package does:
/// `systemd-sysusers` on the repository's `sysusers/airlock.conf` (as
/// root; an existing user is left as it is).
pub fn package_users() {
    let sysusers = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sysusers/airlock.conf");
    let status = Command::new("systemd-sysusers")
        .arg(&sysusers)
        .status()
        .expect("systemd-sysusers runs");
    assert!(status.success(), "systemd-sysusers {}", sysusers.display());
}

/// A child killed and reaped when dropped, however the test ends.
#[derive(Debug)]
pub struct Reap(pub std::process::Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The start of a `git fast-import` stream for a generated repository of
/// `n` small files: blob `i` (mark `i + 1`) holds `file {i}\n`. With
/// [`numbered_paths`] and [`fast_import`], what the benchmarks grow their
/// repositories from.
pub fn numbered_blobs(n: usize) -> Vec<u8> {
    let mut stream = Vec::new();
    for i in 0..n {
        let content = format!("file {i}\n");
        write!(
            stream,
            "blob\nmark :{}\ndata {}\n{content}\n",
            i + 1,
            content.len()
        )
        .expect("writing to memory");
    }
    stream
}

/// The `M` lines of a fast-import commit placing blob `i` of
/// [`numbered_blobs`] at `{prefix}d{i / 100:04}/f{i:06}.txt` (100 files per
/// directory).
pub fn numbered_paths(stream: &mut Vec<u8>, n: usize, prefix: &str) {
    for i in 0..n {
        writeln!(
            stream,
            "M 100644 :{} {prefix}d{:04}/f{i:06}.txt",
            i + 1,
            i / 100
        )
        .expect("writing to memory");
    }
}

/// Runs `git fast-import --quiet` on the repository `git_dir` with
/// `stream`; panics when git fails.
pub fn fast_import(git_dir: &Path, stream: &[u8]) {
    let mut child = Command::new("git")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(git_dir)
        .args(["fast-import", "--quiet"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("git fast-import");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stream)
        .expect("fast-import stream");
    assert!(child.wait().expect("fast-import").success(), "fast-import");
}

/// Calls `check` every `every` until it answers `Ok`, and returns that;
/// panics with its last `Err` once `within` has passed.
pub fn poll<T>(
    within: Duration,
    every: Duration,
    mut check: impl FnMut() -> Result<T, String>,
) -> T {
    let start = Instant::now();
    loop {
        match check() {
            Ok(v) => return v,
            Err(why) if start.elapsed() >= within => panic!("{why}"),
            Err(_) => std::thread::sleep(every),
        }
    }
}

/// Whether `check` answers true within `within`, asked every `every`
/// (for a test that asserts the answer itself, or the opposite).
pub fn eventually(within: Duration, every: Duration, mut check: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= end {
            return false;
        }
        std::thread::sleep(every);
    }
}

/// [`poll`] for async checks, sleeping on the tokio timer.
pub async fn poll_async<T, F>(within: Duration, every: Duration, mut check: impl FnMut() -> F) -> T
where
    F: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(why) if start.elapsed() >= within => panic!("{why}"),
            Err(_) => tokio::time::sleep(every).await,
        }
    }
}

/// A CONNECT proxy on loopback that records each target and tunnels to it
/// (the test process reaches the registries directly). Returns its port
/// and the targets asked for, in order.
pub fn recording_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let port = listener.local_addr().expect("local address").port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let record = record.clone();
            std::thread::spawn(move || tunnel(conn, &record));
        }
    });
    (port, seen)
}

fn tunnel(conn: std::net::TcpStream, record: &Mutex<Vec<String>>) {
    let Ok(read_half) = conn.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut line = String::new();
    let _ = reader.read_line(&mut line);
    let target = line
        .strip_prefix("CONNECT ")
        .and_then(|t| t.split_whitespace().next())
        .unwrap_or("")
        .to_owned();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h).unwrap_or(0) == 0 || h == "\r\n" {
            break;
        }
    }
    if let Ok(mut r) = record.lock() {
        r.push(target.clone());
    }
    let Ok(upstream) = std::net::TcpStream::connect(&target) else {
        let _ = (&conn).write_all(b"HTTP/1.1 502 Bad Gateway\r\n\r\n");
        return;
    };
    let _ = (&conn).write_all(b"HTTP/1.1 200 Connection established\r\n\r\n");
    let (Ok(up2), Ok(conn2)) = (upstream.try_clone(), conn.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut reader, &mut &up2);
        let _ = up2.shutdown(std::net::Shutdown::Write);
    });
    let _ = std::io::copy(&mut &upstream, &mut &conn2);
    let _ = conn2.shutdown(std::net::Shutdown::Both);
}

/// Every `host:port` a package client asks a proxy for, learnt by running
/// it once (it must succeed) through [`recording_proxy`].
pub fn registry_of(what: &str, mut client: Command) -> Vec<String> {
    let (port, seen) = recording_proxy();
    let url = format!("http://127.0.0.1:{port}");
    for v in ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"] {
        client.env(v, &url);
    }
    client
        .env("npm_config_https_proxy", &url)
        .env("npm_config_proxy", &url)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let status = client.status().expect("the package client runs");
    assert!(
        status.success(),
        "{what} through the recording proxy (needs the package registry): {status}"
    );
    let mut seen = seen.lock().expect("targets").clone();
    seen.retain(|t| t.contains(':'));
    seen.sort();
    seen.dedup();
    assert!(!seen.is_empty(), "{what} asked the proxy for no host");
    seen
}

/// npm's registry hosts, learnt with `npm view` (`cache`: a fresh npm cache).
pub fn npm_registry(cache: &Path) -> Vec<String> {
    let mut c = Command::new("npm");
    c.args(["view", "is-number@7.0.0", "dist.tarball"])
        .env("npm_config_cache", cache);
    registry_of("npm", c)
}

/// pip's index and file hosts, learnt with `pip download` into `dir`.
pub fn pip_registry(dir: &Path) -> Vec<String> {
    let mut c = Command::new("/usr/bin/python3");
    c.args(["-m", "pip", "download", "--no-cache-dir", "--no-deps", "-d"])
        .arg(dir)
        .arg("pytest");
    registry_of("pip", c)
}

/// The addresses `host:port` resolves to here, learnt now.
pub fn addresses(target: &str) -> Vec<std::net::IpAddr> {
    use std::net::ToSocketAddrs;
    let mut found: Vec<std::net::IpAddr> = target
        .to_socket_addrs()
        .map(|a| a.map(|s| s.ip()).collect())
        .unwrap_or_default();
    found.sort();
    found.dedup();
    found
}

/// The host of a `host:port` as a routes file writes it.
fn host_of(target: &str) -> &str {
    target
        .rsplit_once(':')
        .map_or(target, |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
}

/// airlock-egress's routes file (`--config`) with one `addresses` route
/// per host of `targets` (`host:port`), listing the addresses that host
/// resolves to here, learnt now: how a test reaches the registries with
/// the production binary whatever ranges this machine's resolver answers
/// with (an administrator's route to an internal mirror, in effect).
pub fn address_routes(targets: &[String]) -> String {
    let mut hosts: Vec<&str> = targets.iter().map(|t| host_of(t)).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let mut text = String::new();
    for host in hosts {
        let found = addresses(&format!("{host}:443"));
        assert!(!found.is_empty(), "{host} does not resolve here");
        let list: Vec<String> = found.iter().map(|a| format!("\"{a}\"")).collect();
        text.push_str(&format!(
            "[[route]]\nhost = \"{host}\"\naddresses = [{}]\n\n",
            list.join(", ")
        ));
    }
    text
}

/// airlock-egress's routes file sending every host of `targets` through
/// the parent proxy on `127.0.0.1:port`, with the credential `credential`
/// (a name in the proxy's credentials directory) if given.
pub fn via_routes(targets: &[String], port: u16, credential: Option<&str>) -> String {
    let mut hosts: Vec<&str> = targets.iter().map(|t| host_of(t)).collect();
    hosts.sort_unstable();
    hosts.dedup();
    let mut text = String::new();
    for host in hosts {
        text.push_str(&format!(
            "[[route]]\nhost = \"{host}\"\nvia = \"http://127.0.0.1:{port}\"\n"
        ));
        if let Some(c) = credential {
            text.push_str(&format!("credential = \"{c}\"\n"));
        }
        text.push('\n');
    }
    text
}

/// A real parent proxy: Debian's tinyproxy on loopback, with basic
/// authentication, allowed to CONNECT to port 443 only; killed (by its
/// pid) when dropped.
#[derive(Debug)]
pub struct ParentProxy {
    child: std::process::Child,
    /// Its port on 127.0.0.1.
    pub port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl ParentProxy {
    /// Starts one that admits `user:password` alone.
    pub fn start(user: &str, password: &str) -> ParentProxy {
        let dir = tempfile::tempdir().expect("tinyproxy's directory");
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free loopback port")
            .port();
        let conf = dir.path().join("tinyproxy.conf");
        std::fs::write(
            &conf,
            format!(
                "Port {port}\nListen 127.0.0.1\nTimeout 120\nLogLevel Connect\nMaxClients 64\nBasicAuth {user} {password}\nConnectPort 443\nDisableViaHeader Yes\nPidFile \"{}\"\n",
                dir.path().join("tinyproxy.pid").display()
            ),
        )
        .expect("tinyproxy.conf");
        let log = dir.path().join("tinyproxy.log");
        let out = std::fs::File::create(&log).expect("tinyproxy.log");
        let child = Command::new("tinyproxy")
            .arg("-d")
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("tinyproxy.log"))
            .stderr(out)
            .spawn()
            .expect("tinyproxy runs (Debian's tinyproxy package; scripts/deps.sh installs it)");
        let proxy = ParentProxy {
            child,
            port,
            log,
            _dir: dir,
        };
        let up = eventually(Duration::from_secs(20), Duration::from_millis(50), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
        assert!(up, "tinyproxy did not listen on {port}: {}", proxy.log());
        proxy
    }

    /// What it logged so far (its CONNECT lines among them).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ParentProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A Node package in `dir/name`: `add` subtracts (a fix is [`NODE_FIX`]),
/// one registry dependency, `npm test` its suite, its lockfile made here
/// with the registry this machine reaches; committed on `main`.
pub fn node_project(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(name);
    std::fs::create_dir_all(&src).expect("project directory");
    git(&src, &["init", "-q", "-b", "main"]);
    let write = |f: &str, text: &str| std::fs::write(src.join(f), text).expect("project file");
    write(
        "package.json",
        r#"{"name":"calc","version":"1.0.0","private":true,"scripts":{"test":"node test.js"},"dependencies":{"is-number":"7.0.0"}}"#,
    );
    write(
        "calc.js",
        "const isNumber = require('is-number');\nexports.add = (a, b) => {\n  if (!isNumber(a) || !isNumber(b)) throw new TypeError('not numbers');\n  return a - b;\n};\n",
    );
    write(
        "test.js",
        "const assert = require('assert');\nconst { add } = require('./calc');\nassert.strictEqual(add(2, 3), 5, 'test_add_two_and_three');\nconsole.log('ok');\n",
    );
    let lock = Command::new("npm")
        .current_dir(&src)
        .args([
            "install",
            "--package-lock-only",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("npm runs");
    assert!(
        lock.status.success(),
        "npm install --package-lock-only (needs the package registry): {}",
        String::from_utf8_lossy(&lock.stderr)
    );
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "calc with an npm dependency"]);
    src
}

/// A Python package in `dir/name`: `add` subtracts (a fix is
/// [`PY_FIX`]), pytest its suite (`requirements.txt` names it); committed
/// on `main`.
pub fn python_project(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(name);
    std::fs::create_dir_all(&src).expect("project directory");
    git(&src, &["init", "-q", "-b", "main"]);
    let write = |f: &str, text: &str| std::fs::write(src.join(f), text).expect("project file");
    write("requirements.txt", "pytest\n");
    write("calc.py", "def add(a, b):\n    return a - b\n");
    write(
        "test_calc.py",
        "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n",
    );
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "calc with a pytest suite"]);
    src
}

/// The patch that fixes [`python_project`]'s `add`.
pub const PY_FIX: &str = "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n";

/// A verification environment with a setup: its programs, setup commands,
/// inputs, outputs, egress entries and variables (PATH defaults to
/// /usr/bin:/bin), a 600 s setup timeout.
pub fn setup_environment(
    programs: &[&str],
    commands: Vec<Vec<&str>>,
    inputs: &[&str],
    outputs: &[&str],
    egress: Vec<String>,
    variables: &[(&str, &str)],
) -> airlock_config::Environment {
    let owned = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let mut vars: std::collections::BTreeMap<String, String> = variables
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    vars.entry("PATH".into())
        .or_insert_with(|| "/usr/bin:/bin".into());
    airlock_config::Environment {
        paths: Vec::new(),
        programs: owned(programs),
        variables: vars,
        setup: Some(airlock_config::Setup {
            commands: commands.into_iter().map(|c| owned(&c)).collect(),
            inputs: owned(inputs),
            outputs: owned(outputs),
            egress,
            timeout_seconds: 600,
        }),
    }
}

/// [`node_project`]'s environment: `npm ci` (no scripts) of its lockfile
/// into `node_modules`, reaching `egress`, with `variables` beside PATH.
pub fn npm_ci_environment(
    egress: Vec<String>,
    variables: &[(&str, &str)],
) -> airlock_config::Environment {
    setup_environment(
        &["npm", "node"],
        vec![vec![
            "npm",
            "ci",
            "--ignore-scripts",
            "--no-audit",
            "--no-fund",
        ]],
        &["package.json", "package-lock.json"],
        &["node_modules"],
        egress,
        variables,
    )
}

/// [`python_project`]'s environment: `pip install --target deps` of its
/// requirements, reaching `egress`, with `deps` on PYTHONPATH.
pub fn pip_install_environment(egress: Vec<String>) -> airlock_config::Environment {
    setup_environment(
        &["python3"],
        vec![vec![
            "python3",
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--no-cache-dir",
            "--target",
            "deps",
            "-r",
            "requirements.txt",
        ]],
        &["requirements.txt"],
        &["deps"],
        egress,
        &[("PYTHONPATH", "/workspace/deps")],
    )
}

/// The patch that fixes [`node_project`]'s `add`.
pub const NODE_FIX: &str = "--- a/calc.js\n+++ b/calc.js\n@@ -2,4 +2,4 @@\n exports.add = (a, b) => {\n   if (!isNumber(a) || !isNumber(b)) throw new TypeError('not numbers');\n-  return a - b;\n+  return a + b;\n };\n";

/// The patch that breaks it differently (`*`).
pub const NODE_BREAK: &str = "--- a/calc.js\n+++ b/calc.js\n@@ -2,4 +2,4 @@\n exports.add = (a, b) => {\n   if (!isNumber(a) || !isNumber(b)) throw new TypeError('not numbers');\n-  return a - b;\n+  return a * b;\n };\n";

/// The registry hosts cargo asks for, learnt with `cargo fetch` of
/// `project` (its lockfile made already) with a fresh `CARGO_HOME`.
pub fn cargo_registry(project: &Path, cargo_home: &Path) -> Vec<String> {
    let mut c = Command::new("cargo");
    c.current_dir(project)
        .args(["fetch", "--locked"])
        .env("CARGO_HOME", cargo_home)
        .env("CARGO_HTTP_MULTIPLEXING", "false");
    registry_of("cargo", c)
}

/// A Rust crate in `dir/name` whose `add` subtracts, with one registry
/// dependency (`itoa`) and a test; its Cargo.lock made here with the
/// registry this machine reaches; committed on `main`.
pub fn rust_project(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(name);
    std::fs::create_dir_all(src.join("src")).expect("project directory");
    git(&src, &["init", "-q", "-b", "main"]);
    let write = |f: &str, text: &str| std::fs::write(src.join(f), text).expect("project file");
    write(
        "Cargo.toml",
        // The target named, so that the manifest alone parses (a setup sees
        // only its inputs).
        "[package]\nname = \"calc\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[lib]\npath = \"src/lib.rs\"\n\n[dependencies]\nitoa = \"1\"\n",
    );
    write(
        "src/lib.rs",
        "pub fn add(a: i64, b: i64) -> String {\n    itoa::Buffer::new().format(a - b).to_owned()\n}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn test_add_two_and_three() {\n        assert_eq!(super::add(2, 3), \"5\");\n    }\n}\n",
    );
    write(".gitignore", "/target\n");
    let lock = Command::new("cargo")
        .current_dir(&src)
        .arg("generate-lockfile")
        .stdin(Stdio::null())
        .output()
        .expect("cargo runs");
    assert!(
        lock.status.success(),
        "cargo generate-lockfile (needs the package registry): {}",
        String::from_utf8_lossy(&lock.stderr)
    );
    git(&src, &["add", "-A"]);
    git(
        &src,
        &["commit", "-q", "-m", "calc with a registry dependency"],
    );
    src
}

/// The patch that fixes [`rust_project`]'s `add`.
pub const RUST_FIX: &str = "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,3 +1,3 @@\n pub fn add(a: i64, b: i64) -> String {\n-    itoa::Buffer::new().format(a - b).to_owned()\n+    itoa::Buffer::new().format(a + b).to_owned()\n }\n";

/// A read-only copy of this machine's Rust toolchain (the directory of
/// `rustc --print sysroot`) under `parent`, hard-linked where it can be:
/// the toolchain rustup keeps under root's home is not reachable by other
/// users. Returns the copy's root (`bin/cargo`, `bin/rustc`, `lib/`).
pub fn toolchain_copy(parent: &Path) -> PathBuf {
    let out = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc runs");
    let sysroot = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let to = parent.join("toolchain");
    let linked = Command::new("cp")
        .args(["-al"])
        .arg(&sysroot)
        .arg(&to)
        .status()
        .is_ok_and(|s| s.success());
    if !linked {
        let _ = std::fs::remove_dir_all(&to);
        let copied = Command::new("cp")
            .args(["-a"])
            .arg(&sysroot)
            .arg(&to)
            .status()
            .expect("cp runs");
        assert!(copied.success(), "copying {}", sysroot.display());
    }
    to
}

/// Runs `airlockctl` (`ctl`) on the bus at `bus` with `args`; returns
/// what it printed and its status.
pub fn airlockctl(ctl: &Path, bus: &str, args: &[&str]) -> std::process::Output {
    Command::new(ctl)
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus)
        .args(args)
        .output()
        .expect("airlockctl runs")
}

/// Runs `airlockctl` (`ctl`) on the bus at `bus` with `args`, `patch` on
/// its standard input; returns what it printed and its status.
pub fn airlockctl_with_stdin(
    ctl: &Path,
    bus: &str,
    args: &[&str],
    patch: &str,
) -> std::process::Output {
    let mut child = Command::new(ctl)
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("airlockctl runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(patch.as_bytes())
        .expect("patch written");
    child.wait_with_output().expect("airlockctl")
}

/// The arguments of `airlockctl --json propose … --patch - --wait` for
/// one attempt of `verify` on `repo`'s main.
pub fn propose_args<'a>(
    config: &'a str,
    repo: &'a str,
    verify: &'a str,
    timeout: &'a str,
) -> Vec<&'a str> {
    vec![
        "--json",
        "propose",
        "--config",
        config,
        "--repo",
        repo,
        "--base",
        "main",
        "--patch",
        "-",
        "--verify",
        verify,
        "--max-attempts",
        "1",
        "--timeout",
        timeout,
        "--wait",
    ]
}

/// The last JSON object line `out` printed; panics with its stderr and
/// status when there is none.
pub fn last_json(out: &std::process::Output) -> serde_json::Value {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .unwrap_or_else(|| {
            panic!(
                "no JSON in {text}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                out.status
            )
        });
    serde_json::from_str(line).expect("a JSON line")
}

/// Proposes `patch` on `repo` with `verify`, one attempt, and waits: the
/// task as `airlockctl --json` prints it.
pub fn propose_patch(
    ctl: &Path,
    bus: &str,
    config: &str,
    repo: &str,
    verify: &str,
    patch: &str,
) -> serde_json::Value {
    let out = airlockctl_with_stdin(ctl, bus, &propose_args(config, repo, verify, "600"), patch);
    last_json(&out)
}

/// A real OpenSSH server on a loopback port, serving git as root with key
/// authentication only; killed when dropped.
#[derive(Debug)]
pub struct Sshd {
    child: std::process::Child,
    /// The port it listens on (127.0.0.1).
    pub port: u16,
    /// A known_hosts line pinning its host key for `[127.0.0.1]:PORT`.
    pub known_hosts: String,
    /// Its directory (host key, configuration, authorized keys).
    pub dir: PathBuf,
}

impl Sshd {
    /// Stops the server (connections are refused until [`Sshd::start`]).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port with the same keys.
    pub fn start(&mut self) {
        self.child = spawn_sshd(&self.dir, self.port);
    }
}

fn spawn_sshd(dir: &Path, port: u16) -> std::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("sshd.log"))
        .expect("sshd log");
    let child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(dir.join("sshd_config"))
        .stderr(log)
        .spawn()
        .expect("sshd starts (openssh-server installed?)");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "sshd did not listen: {}",
            std::fs::read_to_string(dir.join("sshd.log")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Makes an Ed25519 key pair at `path` (and `path.pub`) with OpenSSH's
/// ssh-keygen; returns the public key line.
pub fn ssh_keygen(path: &Path) -> String {
    let _ = std::fs::remove_file(path);
    let st = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "airlock-test", "-f"])
        .arg(path)
        .status()
        .expect("ssh-keygen runs");
    assert!(st.success(), "ssh-keygen failed");
    let mut public = path.as_os_str().to_owned();
    public.push(".pub");
    std::fs::read_to_string(public)
        .expect("public key")
        .trim()
        .to_owned()
}

/// Starts sshd in `dir` admitting the public keys `authorized` (each a
/// key line) as root, on a free loopback port.
pub fn sshd(dir: &Path, authorized: &[&str]) -> Sshd {
    std::fs::create_dir_all(dir).expect("sshd dir");
    std::fs::create_dir_all("/run/sshd").expect("/run/sshd");
    let host_key = dir.join("host_ed25519");
    let host_public = ssh_keygen(&host_key);
    let keys = dir.join("authorized_keys");
    let lines: Vec<String> = authorized
        .iter()
        .map(|k| format!("restrict {k}\n"))
        .collect();
    std::fs::write(&keys, lines.concat()).expect("authorized_keys");
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "ListenAddress 127.0.0.1\nPort {port}\nHostKey {}\nAuthorizedKeysFile {}\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             PermitRootLogin prohibit-password\nAllowUsers root\nStrictModes no\n\
             PidFile none\nLogLevel VERBOSE\nSubsystem sftp internal-sftp\n",
            host_key.display(),
            keys.display()
        ),
    )
    .expect("sshd_config");
    let child = spawn_sshd(dir, port);
    let mut parts = host_public.split(' ');
    let known_hosts = format!(
        "[127.0.0.1]:{port} {} {}",
        parts.next().unwrap_or(""),
        parts.next().unwrap_or("")
    );
    Sshd {
        child,
        port,
        known_hosts,
        dir: dir.to_path_buf(),
    }
}

/// `git verify-commit -v OID` on the bare repository `repo` (any owner
/// trusted) with an allowed-signers file holding `allowed` (one line, as
/// `airlock_git::Signer::allowed_signers_line` writes it), in `scratch`.
pub fn verify_commit(
    repo: &Path,
    scratch: &Path,
    allowed: &str,
    oid: &str,
) -> std::process::Output {
    let file = scratch.join("allowed_signers");
    std::fs::write(&file, format!("{allowed}\n")).expect("allowed signers");
    Command::new("git")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .arg("-c")
        .arg(format!("gpg.ssh.allowedSignersFile={}", file.display()))
        .args(["-c", "safe.directory=*", "--git-dir"])
        .arg(repo)
        .args(["verify-commit", "-v", oid])
        .output()
        .expect("git runs")
}

/// The length of a file now (0 when it does not exist).
pub fn file_len(path: &Path) -> u64 {
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// The text appended to a log since `offset` (a length from [`file_len`]).
pub fn log_since(path: &Path, offset: u64) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let start = usize::try_from(offset)
        .unwrap_or(usize::MAX)
        .min(bytes.len());
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}
