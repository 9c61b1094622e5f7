//! `airlockctl repo` and read-only source access, with the package's real
//! users (run as root; systemd-sysusers makes them from sysusers/airlock.conf
//! when missing): an administrator imports a repository, and uid
//! airlock-agent clones and reads it but cannot write a ref, an object or
//! the configuration, nor read the worker's state; what the worker writes
//! later stays readable; `propose --dry-run` works as airlock-agent. Also
//! `repo list`, `remove` (data kept) and `remove --purge`.

use airlock_testkit::git;
use serde_json::Value;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Fails `test` when not root: it gives files to the package's distinct
/// uids, and must not pass without checking.
fn require_root(test: &str) {
    assert!(
        is_root(),
        "{test} needs root (the package's distinct uids); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
}

/// The package's users and groups, made as the package makes them.
fn users() -> (nix::unistd::User, nix::unistd::User, u32) {
    airlock_testkit::package_users();
    let user = |n: &str| nix::unistd::User::from_name(n).unwrap().unwrap();
    let readers = nix::unistd::Group::from_name("airlock-readers")
        .unwrap()
        .unwrap();
    (
        user("airlock-agent"),
        user("airlock-worker"),
        readers.gid.as_raw(),
    )
}

/// `program args…` as `user`, with the user's own groups (as a login would
/// give them), HOME in `home`.
fn as_user(user: &nix::unistd::User, home: &Path, program: &str, args: &[&str]) -> Output {
    let name = std::ffi::CString::new(user.name.clone()).unwrap();
    let groups = nix::unistd::getgrouplist(&name, user.gid).unwrap();
    let (uid, gid) = (user.uid, user.gid);
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .current_dir(home);
    // SAFETY: between fork and exec only setgroups/setresgid/setresuid on
    // values prepared before the fork; nothing allocates or locks.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setgroups(&groups)?;
            nix::unistd::setresgid(gid, gid, gid)?;
            nix::unistd::setresuid(uid, uid, uid)?;
            Ok(())
        });
    }
    cmd.output().unwrap()
}

fn ctl() -> &'static str {
    env!("CARGO_BIN_EXE_airlockctl")
}

struct Site {
    _dir: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    source: PathBuf,
    home: PathBuf,
}

fn site(agent: &nix::unistd::User) -> Site {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().to_path_buf();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    let etc = root.join("etc");
    std::fs::create_dir(&etc).unwrap();
    let config = etc.join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nrepository_root = \"{}\"\n",
            root.join("srv").display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The administrator's own repository, in a work tree.
    let source = root.join("src");
    std::fs::create_dir(&source).unwrap();
    git(&source, &["init", "-q", "-b", "main"]);
    std::fs::write(source.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    git(&source, &["add", "-A"]);
    git(&source, &["commit", "-q", "-m", "base"]);
    // Another user's checkout, as an administrator usually imports.
    Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(&source)
        .status()
        .unwrap();
    let home = root.join("agent-home");
    std::fs::create_dir(&home).unwrap();
    nix::unistd::chown(&home, Some(agent.uid), Some(agent.gid)).unwrap();
    Site {
        _dir: dir,
        root,
        config,
        source,
        home,
    }
}

fn run_ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_reader_clones_and_reads_an_added_repository_but_cannot_write_it() {
    require_root("a_reader_clones_and_reads_an_added_repository_but_cannot_write_it");
    let (agent, worker, readers) = users();
    let s = site(&agent);
    let cfg = s.config.to_str().unwrap();
    let added: Value = serde_json::from_str(&run_ok(
        &Command::new(ctl())
            .args(["--json", "repo", "--config", cfg, "add", "calc", "--from"])
            .arg(&s.source)
            .arg("--no-reload")
            .output()
            .unwrap(),
    ))
    .unwrap();
    let bare = s.root.join("srv/calc.git");
    assert_eq!(added["path"], bare.to_str().unwrap());
    assert_eq!(added["branches"], serde_json::json!(["main"]));
    // Owners and modes: the worker's, the readers' group, nobody else.
    for path in [s.root.join("srv"), bare.clone(), bare.join("objects")] {
        let m = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (m.uid(), m.gid()),
            (worker.uid.as_raw(), readers),
            "{}",
            path.display()
        );
        assert_eq!(m.mode() & 0o7777, 0o2750, "{}", path.display());
    }
    assert_eq!(
        std::fs::metadata(bare.join("config")).unwrap().mode() & 0o777,
        0o640
    );
    // No hard link into the administrator's repository, no remote back to it.
    for entry in walk(&bare) {
        assert_eq!(
            std::fs::metadata(&entry).unwrap().nlink(),
            1,
            "{}",
            entry.display()
        );
    }
    assert!(
        !std::fs::read_to_string(bare.join("config"))
            .unwrap()
            .contains("remote")
    );
    let drop_in = airlock_config::drop_in_dir(&s.config).join("calc.toml");
    assert!(drop_in.is_file());
    // The same name again, or a path that is no repository: refused with their codes.
    let again = Command::new(ctl())
        .args(["repo", "--config", cfg, "add", "calc", "--from"])
        .arg(&s.source)
        .output()
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(airlock_proto::Code::REPOSITORY_EXISTS.exit_code().into())
    );
    let bogus = Command::new(ctl())
        .args([
            "--json",
            "repo",
            "--config",
            cfg,
            "add",
            "other",
            "--from",
            "/etc",
            "--no-reload",
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&bogus.stderr).contains("REPOSITORY_SOURCE_INVALID"));

    // As airlock-agent: clone and read.
    let clone = s.home.join("calc");
    run_ok(&as_user(
        &agent,
        &s.home,
        ctl(),
        &[
            "repo",
            "--config",
            cfg,
            "clone",
            "calc",
            clone.to_str().unwrap(),
        ],
    ));
    let log = run_ok(&as_user(
        &agent,
        &s.home,
        "/usr/bin/git",
        &["-C", clone.to_str().unwrap(), "log", "--oneline"],
    ));
    assert!(log.contains("base"), "{log}");
    let b = bare.to_str().unwrap();
    let git_dir = format!("--git-dir={b}");
    let shown = run_ok(&as_user(
        &agent,
        &s.home,
        "/usr/bin/git",
        &[&git_dir, "show", "main:calc.py"],
    ));
    assert!(shown.contains("return a - b"));
    // … but not write a ref, an object or the configuration.
    let denied = |args: &[&str]| {
        let mut full = vec!["-c", "safe.directory=*", git_dir.as_str()];
        full.extend_from_slice(args);
        let out = as_user(&agent, &s.home, "/usr/bin/git", &full);
        assert!(
            !out.status.success(),
            "git {args:?} succeeded as airlock-agent"
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    for (args, says) in [
        (
            &["update-ref", "refs/heads/agent/mine", "main"][..],
            "cannot lock ref",
        ),
        (&["update-ref", "refs/heads/main", "main^{tree}"][..], ""),
        (
            &["hash-object", "-w", "/etc/hostname"][..],
            "insufficient permission",
        ),
        (
            &["config", "core.hooksPath", "/tmp"][..],
            "Permission denied",
        ),
    ] {
        let err = denied(args);
        assert!(err.contains(says), "git {args:?}: {err}");
    }
    assert_eq!(
        git(&s.root, &[&git_dir, "rev-parse", "main"]),
        git(
            &s.root,
            &[
                &format!("--git-dir={}", s.source.join(".git").display()),
                "rev-parse",
                "main"
            ]
        )
    );
    // Nor read the worker's state (its state directory is 0700).
    let state = s.root.join("worker-state");
    std::fs::create_dir(&state).unwrap();
    nix::unistd::chown(&state, Some(worker.uid), Some(worker.gid)).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700)).unwrap();
    let ls = as_user(&agent, &s.home, "/bin/ls", &[state.to_str().unwrap()]);
    assert!(!ls.status.success());
    // The agent's git configuration was not touched (no global safe.directory).
    assert!(!s.home.join(".gitconfig").exists());

    // What the worker writes later (umask 0027, as its unit) stays readable.
    let commit = run_ok(&as_user_umask(
        &worker,
        &s.home,
        &[
            "-c",
            &format!("safe.directory={b}"),
            &git_dir,
            "-c",
            "user.name=w",
            "-c",
            "user.email=w@w.invalid",
            "commit-tree",
            "-p",
            "main",
            "-m",
            "worker",
            "main^{tree}",
        ],
    ));
    let commit = commit.trim();
    run_ok(&as_user_umask(
        &worker,
        &s.home,
        &[
            "-c",
            &format!("safe.directory={b}"),
            &git_dir,
            "update-ref",
            "refs/heads/agent/w",
            commit,
        ],
    ));
    let fetched = as_user(
        &agent,
        &s.home,
        "/usr/bin/git",
        &["-C", clone.to_str().unwrap(), "fetch", "origin", "agent/w"],
    );
    run_ok(&fetched);
    let seen = run_ok(&as_user(
        &agent,
        &s.home,
        "/usr/bin/git",
        &["-C", clone.to_str().unwrap(), "rev-parse", "FETCH_HEAD"],
    ));
    assert_eq!(seen.trim(), commit);

    // The planner's dry run, as airlock-agent, from its clone.
    std::fs::write(clone.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
    let task: Value = serde_json::from_str(&run_ok(&as_user(
        &agent,
        &s.home,
        ctl(),
        &[
            "--json",
            "propose",
            "--config",
            cfg,
            "--repo",
            "calc",
            "--base",
            "main",
            "--worktree",
            clone.to_str().unwrap(),
            "--verify",
            "python3 -m unittest",
            "--dry-run",
        ],
    )))
    .unwrap();
    assert_eq!(task["binding"]["repository"], "calc");
    assert_eq!(
        task["plan"]["execution"]["change_set"][0]["path"],
        "calc.py"
    );

    // list, remove (data kept), remove --purge.
    let listed: Value = serde_json::from_str(&run_ok(
        &Command::new(ctl())
            .args(["--json", "repo", "--config", cfg, "list"])
            .output()
            .unwrap(),
    ))
    .unwrap();
    assert_eq!(listed[0]["name"], "calc");
    assert_eq!(listed[0]["registered_in"], drop_in.to_str().unwrap());
    run_ok(
        &Command::new(ctl())
            .args(["repo", "--config", cfg, "remove", "calc", "--no-reload"])
            .output()
            .unwrap(),
    );
    assert!(!drop_in.exists());
    assert!(bare.join("objects").is_dir(), "remove keeps the data");
    // Re-adding over kept data is refused; a purge after re-registering removes it.
    std::fs::remove_dir_all(&bare).unwrap();
    run_ok(
        &Command::new(ctl())
            .args(["repo", "--config", cfg, "add", "calc", "--from"])
            .arg(&s.source)
            .arg("--no-reload")
            .output()
            .unwrap(),
    );
    run_ok(
        &Command::new(ctl())
            .args([
                "repo",
                "--config",
                cfg,
                "remove",
                "calc",
                "--purge",
                "--no-reload",
            ])
            .output()
            .unwrap(),
    );
    assert!(!bare.exists());
    // Not as root: refused.
    let out = as_user(
        &agent,
        &s.home,
        ctl(),
        &["repo", "--config", cfg, "add", "x", "--from", "/tmp"],
    );
    assert_eq!(
        out.status.code(),
        Some(airlock_proto::Code::AUTHORIZATION_DENIED.exit_code().into())
    );
}

/// git as `user` with the worker unit's umask.
fn as_user_umask(user: &nix::unistd::User, home: &Path, args: &[&str]) -> Output {
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o027));
    let out = as_user(user, home, "/usr/bin/git", args);
    nix::sys::stat::umask(old);
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// `repo add --upstream`: the registration holds the upstream and the
/// signer, the credentials go beside the configuration (root, 0600) and
/// into the worker's unit drop-in as LoadCredential=, never into the
/// registration; wrong inputs are refused with their codes and change
/// nothing.
#[test]
fn an_upstream_is_registered_and_its_credentials_installed_for_the_worker_alone() {
    require_root("an_upstream_is_registered_and_its_credentials_installed_for_the_worker_alone");
    let (agent, _worker, _readers) = users();
    let s = site(&agent);
    let cfg = s.config.to_str().unwrap();
    let units = s.root.join("units");
    let key = s.root.join("deploy");
    airlock_testkit::ssh_keygen(&key);
    let signing = s.root.join("signing");
    airlock_testkit::ssh_keygen(&signing);
    let host_key = "forge.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
    let add = |extra: &[&str]| {
        Command::new(ctl())
            .env("AIRLOCK_SYSTEMD_UNIT_DIR", &units)
            .args(["--json", "repo", "--config", cfg, "add"])
            .args(extra)
            .arg("--no-reload")
            .output()
            .unwrap()
    };
    let code = |out: &Output| {
        let text = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "accepted: {text}");
        text
    };
    // Refusals first: nothing is made by any of them.
    let refused = [
        (
            vec!["r1", "--upstream", "git@forge.example:team/r.git"],
            "UPSTREAM_URL_INVALID",
        ),
        (
            vec![
                "r1",
                "--upstream",
                "ssh://git@forge.example/team/r.git",
                "--credential",
                key.to_str().unwrap(),
            ],
            "UPSTREAM_HOST_KEY_CHANGED",
        ),
        (
            vec![
                "r1",
                "--upstream",
                "ssh://git@forge.example/team/r.git",
                "--host-key",
                host_key,
            ],
            "UPSTREAM_AUTH_FAILED",
        ),
        (
            vec![
                "r1",
                "--upstream",
                "/srv/none.git",
                "--signing-key",
                "/etc/hostname",
                "--signer",
                "a@b",
            ],
            "SIGNING_KEY_INVALID",
        ),
    ];
    for (args, expected) in &refused {
        let text = code(&add(args));
        assert!(text.contains(expected), "{args:?}: {text}");
    }
    assert!(!s.root.join("srv/r1.git").exists());
    assert!(!units.exists());
    assert!(!s.root.join("etc/credentials").exists());

    let out = add(&[
        "calc",
        "--upstream",
        "ssh://git@forge.example:2222/team/calc.git",
        "--credential",
        key.to_str().unwrap(),
        "--host-key",
        host_key,
        "--push-option",
        "merge_request.create",
        "--signing-key",
        signing.to_str().unwrap(),
        "--signer",
        "agent@example.org",
    ]);
    let added: Value = serde_json::from_str(&run_ok(&out)).unwrap();
    assert_eq!(
        added["upstream"]["url"],
        "ssh://git@forge.example:2222/team/calc.git"
    );
    assert_eq!(added["signing"]["principal"], "agent@example.org");
    // The registration: upstream and signer, no secret.
    let drop_in =
        std::fs::read_to_string(airlock_config::drop_in_dir(&s.config).join("calc.toml")).unwrap();
    assert!(
        drop_in.contains("[repository.upstream]") && drop_in.contains("merge_request.create"),
        "{drop_in}"
    );
    assert!(drop_in.contains("[repository.signing]"), "{drop_in}");
    let key_text = std::fs::read_to_string(&key).unwrap();
    let secret = key_text.lines().nth(1).unwrap();
    assert!(!drop_in.contains(secret));
    // The credentials: root's, 0600, in a 0700 directory.
    let creds = s.root.join("etc/credentials");
    assert_eq!(std::fs::metadata(&creds).unwrap().mode() & 0o777, 0o700);
    for name in ["upstream-calc", "signing-calc"] {
        let m = std::fs::metadata(creds.join(name)).unwrap();
        assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600), "{name}");
    }
    assert_eq!(
        std::fs::read_to_string(creds.join("upstream-calc")).unwrap(),
        key_text
    );
    // The worker's unit loads them and may reach the network.
    let unit =
        std::fs::read_to_string(units.join("airlock-worker.service.d/upstream-calc.conf")).unwrap();
    assert!(
        unit.contains(&format!(
            "LoadCredential=upstream-calc:{}",
            creds.join("upstream-calc").display()
        )),
        "{unit}"
    );
    assert!(
        unit.contains(&format!(
            "LoadCredential=signing-calc:{}",
            creds.join("signing-calc").display()
        )),
        "{unit}"
    );
    assert!(
        unit.contains("RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6"),
        "{unit}"
    );
    // The whole configuration still loads, with the upstream.
    let c = airlock_config::Config::load(&s.config).unwrap();
    assert_eq!(
        c.repository("calc")
            .unwrap()
            .upstream
            .as_ref()
            .unwrap()
            .push_options,
        ["merge_request.create"]
    );
    // `repo show` says so; `repo sync` without a worker says that.
    let shown: Value = serde_json::from_str(&run_ok(
        &Command::new(ctl())
            .args(["--json", "repo", "--config", cfg, "show", "calc"])
            .output()
            .unwrap(),
    ))
    .unwrap();
    assert_eq!(shown["upstream"]["publish"], true);
    assert!(shown["last_sync"].is_null());
    let sync = Command::new(ctl())
        .args(["repo", "--config", cfg, "sync", "calc", "--wait", "1"])
        .output()
        .unwrap();
    assert!(code(&sync).contains("RUNTIME_UNAVAILABLE"));
    // remove takes the credentials and the unit drop-in with it.
    run_ok(
        &Command::new(ctl())
            .env("AIRLOCK_SYSTEMD_UNIT_DIR", &units)
            .args(["repo", "--config", cfg, "remove", "calc", "--no-reload"])
            .output()
            .unwrap(),
    );
    assert!(!creds.join("upstream-calc").exists() && !creds.join("signing-calc").exists());
    assert!(
        !units
            .join("airlock-worker.service.d/upstream-calc.conf")
            .exists()
    );
}

/// `repo add --upstream` refuses, with UPSTREAM_URL_INVALID and before
/// anything is made, an upstream the worker must not be opened to or one
/// that would store a password: a system directory, a missing path, a work
/// tree, a path through a symbolic link, airlock's own repository root, an
/// ssh URL with a password, an https URL with a token. No refusal shows the
/// password. A bare repository by its own path is accepted, opened to the
/// worker with a `-` (a path removed later never stops the worker).
#[test]
fn upstreams_that_open_a_system_path_or_store_a_password_are_refused_and_change_nothing() {
    require_root(
        "upstreams_that_open_a_system_path_or_store_a_password_are_refused_and_change_nothing",
    );
    let (agent, _worker, _readers) = users();
    let s = site(&agent);
    let cfg = s.config.to_str().unwrap();
    let units = s.root.join("units");
    let key = s.root.join("deploy");
    airlock_testkit::ssh_keygen(&key);
    let host_key = "forge.example ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl";
    let bare = s.root.join("up/team.git");
    std::fs::create_dir_all(bare.parent().unwrap()).unwrap();
    git(&s.root, &["init", "-q", "--bare", bare.to_str().unwrap()]);
    let link = s.root.join("up/link.git");
    std::os::unix::fs::symlink(&bare, &link).unwrap();
    let inside = s.root.join("srv/own.git");
    std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
    git(&s.root, &["init", "-q", "--bare", inside.to_str().unwrap()]);
    let add = |args: &[&str]| {
        Command::new(ctl())
            .env("AIRLOCK_SYSTEMD_UNIT_DIR", &units)
            .args(["--json", "repo", "--config", cfg, "add", "r"])
            .args(args)
            .arg("--no-reload")
            .output()
            .unwrap()
    };
    let src = s.source.to_str().unwrap().to_owned();
    let file_etc = "file:///etc".to_owned();
    let cases: Vec<Vec<String>> = vec![
        vec!["--upstream".into(), file_etc],
        vec!["--upstream".into(), "/etc".into()],
        vec![
            "--upstream".into(),
            s.root.join("up/none.git").display().to_string(),
        ],
        vec!["--upstream".into(), src.clone()],
        vec!["--upstream".into(), link.display().to_string()],
        vec!["--upstream".into(), inside.display().to_string()],
        vec![
            "--upstream".into(),
            "ssh://git:hunter2@forge.example/team/r.git".into(),
            "--credential".into(),
            key.display().to_string(),
            "--host-key".into(),
            host_key.into(),
        ],
        vec![
            "--upstream".into(),
            "https://user:hunter2@forge.example/team/r.git".into(),
        ],
        vec![
            "--upstream".into(),
            "https://hunter2@forge.example/team/r.git".into(),
        ],
    ];
    for args in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = add(&args);
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!out.status.success(), "{args:?} accepted: {text}");
        assert!(text.contains("UPSTREAM_URL_INVALID"), "{args:?}: {text}");
        assert!(
            !text.contains("hunter2"),
            "{args:?} shows the password: {text}"
        );
        assert!(!s.root.join("srv/r.git").exists(), "{args:?}");
        assert!(!s.root.join("etc/repositories.d").exists(), "{args:?}");
        assert!(!units.exists(), "{args:?} wrote a unit drop-in");
    }
    // A bare repository by its own path is registered, opened to the
    // worker with `-`.
    let url = bare.display().to_string();
    run_ok(&add(&["--upstream", &url, "--from", &src]));
    let drop_in =
        std::fs::read_to_string(units.join("airlock-worker.service.d/upstream-r.conf")).unwrap();
    assert!(
        drop_in.contains(&format!("ReadWritePaths=-{url}\n")),
        "{drop_in}"
    );
}

/// `airlockctl config migrate`, as the package's upgrade runs it: an
/// earlier release's edited airlock.toml (every default written out)
/// becomes a drop-in holding only what was changed, the file itself is
/// untouched, an existing drop-in is never overwritten, and a drop-in with
/// which the configuration would not load is removed again.
#[test]
fn config_migrate_moves_the_changed_settings_into_a_drop_in() {
    let dir = tempfile::tempdir().unwrap();
    let etc = dir.path();
    let config = etc.join("airlock.toml");
    std::fs::write(&config, "# only comments, as the package ships it\n").unwrap();
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/airlock.toml"),
    )
    .unwrap();
    // Earlier releases installed the example without its demo repository.
    let example = &example[..example.find("\n[[repository]]").unwrap()];
    let old = etc.join("airlock.toml.dpkg-old");
    let edited = example.replacen("auto_accept = false", "auto_accept = true", 1)
        + "\n[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/calc.git\"\n";
    std::fs::write(&old, &edited).unwrap();
    let to = etc.join("airlock.toml.d/50-migrated.toml");
    let migrate = |extra: &[&str]| {
        Command::new(ctl())
            .args(["--json", "config", "migrate", "--from"])
            .arg(&old)
            .arg("--to")
            .arg(&to)
            .arg("--config")
            .arg(&config)
            .args(extra)
            .output()
            .unwrap()
    };

    // --dry-run prints and writes nothing.
    let out = migrate(&["--dry-run"]);
    let v: Value = serde_json::from_str(&run_ok(&out)).unwrap();
    assert_eq!(v["written"], false);
    assert!(
        v["text"].as_str().unwrap().contains("auto_accept = true"),
        "{v}"
    );
    assert!(!to.exists());

    let out = migrate(&[]);
    let v: Value = serde_json::from_str(&run_ok(&out)).unwrap();
    assert_eq!(v["written"], true, "{v}");
    assert_eq!(
        v["kept"],
        serde_json::json!(["repository", "supervisor.auto_accept"])
    );
    let text = std::fs::read_to_string(&to).unwrap();
    assert!(text.contains("auto_accept = true"), "{text}");
    assert!(
        !text.contains("lease_seconds"),
        "a default was carried:\n{text}"
    );
    assert_eq!(std::fs::metadata(&to).unwrap().mode() & 0o7777, 0o644);
    assert_eq!(
        std::fs::read_to_string(&old).unwrap(),
        edited,
        "the earlier file is kept"
    );
    let loaded = airlock_config::Config::load(&config).unwrap();
    assert!(loaded.supervisor.auto_accept);
    assert_eq!(loaded.repository_names(), ["calc"]);

    // Once: a second run refuses to overwrite the drop-in.
    let out = migrate(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("CONFIG_INVALID") && err.contains("exists already"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&to).unwrap(), text);

    // A drop-in that would clash with what is registered already is
    // removed again, and the configuration is as it was.
    std::fs::remove_file(&to).unwrap();
    std::fs::write(
        &config,
        "[[repository]]\nname = \"calc\"\npath = \"/srv/airlock/other.git\"\n",
    )
    .unwrap();
    let out = migrate(&[]);
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("removed again"), "{err}");
    assert!(!to.exists());

    // A file this release refuses migrates to nothing.
    std::fs::write(&old, "[supervisor]\nlease = 5\n").unwrap();
    let out = migrate(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("supervisor.lease"));
    assert!(!to.exists());
}

/// `airlockctl config show`: the configuration as the services read it,
/// drop-ins merged and defaults filled in, with the files it came from;
/// its TOML reads back as the same configuration, and a drop-in the
/// services would refuse is refused with their message.
#[test]
fn config_show_prints_the_merged_configuration_and_its_files() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(&config, "[supervisor]\nlease_seconds = 600\n").unwrap();
    let settings = airlock_config::settings_dir(&config);
    std::fs::create_dir(&settings).unwrap();
    std::fs::write(
        settings.join("50-accept.toml"),
        "[supervisor]\nauto_accept = true\n",
    )
    .unwrap();
    let repos = airlock_config::drop_in_dir(&config);
    std::fs::create_dir(&repos).unwrap();
    let calc = airlock_config::Repository {
        name: "calc".into(),
        path: "/srv/airlock/calc.git".into(),
        description: None,
        environment: None,
        upstream: None,
        signing: None,
        drop_in: None,
    };
    std::fs::write(repos.join("calc.toml"), airlock_config::drop_in_text(&calc)).unwrap();
    let show = |json: bool| {
        let mut cmd = Command::new(ctl());
        if json {
            cmd.arg("--json");
        }
        cmd.args(["config", "show", "--config"])
            .arg(&config)
            .output()
            .unwrap()
    };

    let v: Value = serde_json::from_str(&run_ok(&show(true))).unwrap();
    let files: Vec<&str> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert_eq!(
        files,
        [
            config.display().to_string(),
            settings.join("50-accept.toml").display().to_string(),
            repos.join("calc.toml").display().to_string(),
        ]
    );
    assert_eq!(v["config"]["supervisor"]["lease_seconds"], 600);
    assert_eq!(v["config"]["supervisor"]["auto_accept"], true);
    assert_eq!(
        v["config"]["supervisor"]["sweep_interval_seconds"], 15,
        "a default filled in"
    );
    assert_eq!(v["config"]["repository"][0]["name"], "calc");

    // The text reads back as the configuration the services load.
    let text = run_ok(&show(false));
    assert!(text.starts_with("# The configuration"), "{text}");
    let mut loaded = airlock_config::Config::load(&config).unwrap();
    for r in &mut loaded.repositories {
        r.drop_in = None;
    }
    assert_eq!(
        airlock_config::Config::parse(&text, Path::new("shown.toml")).unwrap(),
        loaded
    );

    // A drop-in the services would refuse.
    std::fs::write(settings.join("60-typo.toml"), "[supervisor]\nlease = 1\n").unwrap();
    let out = show(false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("60-typo.toml:2:1") && err.contains("supervisor.lease"),
        "{err}"
    );
}

/// The worker's record of a sync (`<worker state>/upstream/NAME.json`) as
/// the release of protocol 11.0 wrote it — no schema tag, the
/// optional fields left out — is shown by this `repo show`, as text and
/// as JSON (where it gains the tag it is read as), after an upgrade.
#[test]
fn repo_show_reads_the_sync_record_the_previous_release_wrote() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let state = root.join("worker");
    std::fs::create_dir_all(state.join("upstream")).unwrap();
    let config = root.join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[worker]\nrepository_root = \"{root}/srv\"\njournal = \"{journal}\"\n\n\
             [[repository]]\nname = \"calc\"\npath = \"{root}/srv/calc.git\"\n\
             [repository.upstream]\nurl = \"{root}/up/calc.git\"\n",
            root = root.display(),
            journal = state.join("checkpoints.sqlite3").display(),
        ),
    )
    .unwrap();
    let show = |json: bool| {
        let mut cmd = Command::new(ctl());
        if json {
            cmd.arg("--json");
        }
        run_ok(
            &cmd.args(["repo", "--config", config.to_str().unwrap(), "show", "calc"])
                .output()
                .unwrap(),
        )
    };
    let record = state.join("upstream/calc.json");
    // A sync that moved main by a force-push and found a new tag.
    std::fs::write(
        &record,
        r#"{
  "repository": "calc",
  "url": "/srv/upstream/calc.git",
  "finished_at_ms": 1764979200000,
  "request": "00112233aabbccdd",
  "report": {
    "changes": [
      {
        "name": "refs/heads/main",
        "old": "1111111111111111111111111111111111111111",
        "new": "2222222222222222222222222222222222222222",
        "forced": true
      },
      {
        "name": "refs/tags/v1",
        "old": null,
        "new": "3333333333333333333333333333333333333333",
        "forced": false
      }
    ]
  },
  "last_success_ms": 1764979200000
}"#,
    )
    .unwrap();
    let text = show(false);
    assert!(text.contains("last sync: ok, 2 ref(s) changed"), "{text}");
    assert!(
        text.contains(
            "refs/heads/main 2222222222222222222222222222222222222222 (FORCE-PUSHED upstream, followed)"
        ),
        "{text}"
    );
    assert!(
        text.contains("refs/tags/v1 3333333333333333333333333333333333333333 (new)"),
        "{text}"
    );
    let shown: Value = serde_json::from_str(&show(true)).unwrap();
    let last = &shown["last_sync"];
    assert_eq!(last["schema"], "airlock.upstream-sync.v1", "{shown}");
    assert_eq!(last["request"], "00112233aabbccdd");
    assert_eq!(last["report"]["changes"][0]["forced"], true);
    assert_eq!(last["last_success_ms"], 1764979200000u64);
    // A failed sync.
    std::fs::write(
        &record,
        r#"{
  "repository": "calc",
  "url": "/srv/upstream/calc.git",
  "finished_at_ms": 1764979260000,
  "code": "UPSTREAM_UNREACHABLE",
  "detail": "UPSTREAM_UNREACHABLE: connection refused",
  "report": {
    "changes": []
  }
}"#,
    )
    .unwrap();
    let text = show(false);
    assert!(
        text.contains(
            "last sync: FAILED [UPSTREAM_UNREACHABLE] UPSTREAM_UNREACHABLE: connection refused"
        ),
        "{text}"
    );
    let shown: Value = serde_json::from_str(&show(true)).unwrap();
    assert_eq!(shown["last_sync"]["code"], "UPSTREAM_UNREACHABLE");
    // A record this release cannot read is shown as none, as before.
    std::fs::write(&record, r#"{"schema": "airlock.upstream-sync.v9"}"#).unwrap();
    assert!(show(false).contains("last sync: none yet"));
    let shown: Value = serde_json::from_str(&show(true)).unwrap();
    assert!(shown["last_sync"].is_null(), "{shown}");
}
