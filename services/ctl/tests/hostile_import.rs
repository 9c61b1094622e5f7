//! Importing a repository that someone else owns and has armed: as root,
//! `airlockctl repo add`, `repo clone` (and a later `git fetch` in that
//! clone) and airlock-local's `--repo` import each succeed, and no program
//! the source names runs — hooks, `core.hooksPath`, `core.fsmonitor`,
//! `core.sshCommand`, `uploadpack.packObjectsHook`, alternates with
//! `core.alternateRefsCommand`, filter and textconv drivers with matching
//! attributes, a pager, an editor, a credential helper, signing. And
//! source paths holding `$(…)`, backquotes, `;`, quotes, spaces and a
//! newline import correctly with no command run: every shell that could
//! see such a path would start the canary, first on airlockctl's PATH
//! under the names such a shell would look up (crates/git gives git a PATH
//! of its own; the canaries the armed configuration names are absolute).
//!
//! Run as root (CI is): the source belongs to `nobody`, as a colleague's
//! checkout would.

use airlock_testkit::git_hermetic as git;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const HOOKS: &[&str] = &[
    "applypatch-msg",
    "pre-applypatch",
    "post-applypatch",
    "pre-commit",
    "pre-merge-commit",
    "prepare-commit-msg",
    "commit-msg",
    "post-commit",
    "pre-rebase",
    "post-checkout",
    "post-merge",
    "pre-push",
    "pre-receive",
    "update",
    "proc-receive",
    "post-receive",
    "post-update",
    "reference-transaction",
    "push-to-checkout",
    "pre-auto-gc",
    "post-rewrite",
    "fsmonitor-watchman",
    "post-index-change",
];

/// A canary: any run of it leaves a file in `fired`, naming how it was called.
struct Canary {
    dir: PathBuf,
    program: PathBuf,
    fired: PathBuf,
}

impl Canary {
    fn new(root: &Path) -> Canary {
        let dir = root.join("bin");
        let fired = root.join("fired");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&fired).unwrap();
        std::fs::set_permissions(&fired, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let program = dir.join("airlock-canary");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\necho \"$0 $*\" > \"{}/$$-$(date +%s%N)\"\nexit 0\n",
                fired.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        // Names a shell would look up from the hostile directory names.
        for alias in ["touch", "pwn", "id"] {
            std::os::unix::fs::symlink(&program, dir.join(alias)).unwrap();
        }
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        Canary {
            dir,
            program,
            fired,
        }
    }

    fn runs(&self) -> Vec<String> {
        std::fs::read_dir(&self.fired)
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
            .collect()
    }

    fn path_env(&self) -> String {
        format!("{}:/usr/bin:/bin", self.dir.display())
    }
}

/// A work tree at `dir` with two commits on main and a tag; when `armed`,
/// its objects partly borrowed from another repository (alternates), its
/// configuration and hooks naming the canary everywhere git would run a
/// program, and its content asking for a filter and a textconv driver.
fn source(dir: &Path, canary: &Canary, armed: bool) -> String {
    std::fs::create_dir_all(dir).unwrap();
    if armed {
        let lender = dir.with_extension("lender");
        std::fs::create_dir_all(&lender).unwrap();
        git(&lender, &["init", "-q", "-b", "main"]);
        std::fs::write(lender.join("lent.txt"), "from the alternate\n").unwrap();
        git(&lender, &["add", "-A"]);
        git(&lender, &["commit", "-q", "-m", "lent"]);
        git(
            dir.parent().unwrap(),
            &[
                "clone",
                "-q",
                "--shared",
                lender.to_str().unwrap(),
                dir.to_str().unwrap(),
            ],
        );
        assert!(dir.join(".git/objects/info/alternates").is_file());
        std::fs::write(dir.join(".gitattributes"), "* filter=evil diff=evil\n").unwrap();
    } else {
        git(dir, &["init", "-q", "-b", "main"]);
    }
    std::fs::write(dir.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", "base"]);
    std::fs::write(dir.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
    git(dir, &["commit", "-q", "-am", "fix"]);
    git(dir, &["tag", "-a", "-m", "one", "v1"]);
    if armed {
        let c = canary.program.to_str().unwrap();
        let hooks = dir.join("armed-hooks");
        std::fs::create_dir_all(&hooks).unwrap();
        for hook in HOOKS {
            for d in [hooks.clone(), dir.join(".git/hooks")] {
                let h = d.join(hook);
                std::fs::write(&h, format!("#!/bin/sh\nexec {c} hook {hook}\n")).unwrap();
                std::fs::set_permissions(&h, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
        }
        for (key, value) in [
            ("core.hooksPath", hooks.to_str().unwrap()),
            ("core.fsmonitor", c),
            ("core.sshCommand", c),
            ("core.gitProxy", c),
            ("core.pager", c),
            ("core.editor", c),
            ("core.askPass", c),
            ("core.alternateRefsCommand", c),
            ("uploadpack.packObjectsHook", c),
            ("credential.helper", c),
            ("filter.evil.clean", c),
            ("filter.evil.smudge", c),
            ("filter.evil.process", c),
            ("filter.evil.required", "true"),
            ("diff.evil.textconv", c),
            ("diff.external", c),
            ("gpg.program", c),
            ("commit.gpgSign", "true"),
            ("remote.origin.uploadpack", c),
            ("protocol.allow", "always"),
        ] {
            git(dir, &["config", key, value]);
        }
    }
    let head = git(dir, &["rev-parse", "HEAD"]);
    Command::new("chown")
        .args(["-R", "nobody:nogroup"])
        .arg(dir)
        .status()
        .unwrap();
    if armed {
        Command::new("chown")
            .args(["-R", "nobody:nogroup"])
            .arg(dir.with_extension("lender"))
            .status()
            .unwrap();
    }
    head
}

struct Site {
    _tmp: tempfile::TempDir,
    root: PathBuf,
    config: PathBuf,
    canary: Canary,
}

fn site() -> Site {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().to_path_buf();
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
    airlock_testkit::package_users();
    let canary = Canary::new(&root.join("canary"));
    Site {
        _tmp: tmp,
        root,
        config,
        canary,
    }
}

impl Site {
    fn ctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlockctl"));
        cmd.env("PATH", self.canary.path_env())
            .current_dir(&self.root)
            .arg("repo")
            .arg("--config")
            .arg(&self.config)
            .args(args);
        cmd
    }
}

fn ok(out: &Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn authority_head(path: &Path, rev: &str) -> String {
    git(
        Path::new("/"),
        &[&format!("--git-dir={}", path.display()), "rev-parse", rev],
    )
}

#[test]
fn an_armed_source_owned_by_another_user_imports_and_clones_with_no_canary_run() {
    assert!(nix::unistd::Uid::effective().is_root(), "run as root");
    let s = site();
    let src = s.root.join("colleague").join("armed");
    let head = source(&src, &s.canary, true);
    // The control: the armed repository does fire the canary for an
    // ordinary git run in it, so a silent canary below means something.
    let control = Command::new("/usr/bin/git")
        .env("PATH", s.canary.path_env())
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["-c", "safe.directory=*", "-C", src.to_str().unwrap()])
        .args(["status", "--short"])
        .output()
        .unwrap();
    // (It may fail: the filter it is made to run answers nothing.)
    let _ = control.status;
    assert!(
        !s.canary.runs().is_empty(),
        "the armed source did not fire the canary in an ordinary git status"
    );
    for f in std::fs::read_dir(&s.canary.fired).unwrap() {
        std::fs::remove_file(f.unwrap().path()).unwrap();
    }

    ok(&s
        .ctl(&[
            "add",
            "armed",
            "--from",
            src.to_str().unwrap(),
            "--no-reload",
        ])
        .output()
        .unwrap());
    let bare = s.root.join("srv/armed.git");
    assert_eq!(authority_head(&bare, "refs/heads/main"), head);
    assert_eq!(authority_head(&bare, "HEAD"), head);
    assert!(!authority_head(&bare, "refs/tags/v1").is_empty());
    // Nothing of the source came along: no alternate, no hook, no remote,
    // none of its configuration.
    assert!(!bare.join("objects/info/alternates").exists());
    let config = std::fs::read_to_string(bare.join("config")).unwrap();
    assert!(
        !config.contains("canary") && !config.contains("remote"),
        "{config}"
    );
    git(
        Path::new("/"),
        &[&format!("--git-dir={}", bare.display()), "fsck", "--full"],
    );

    // A reader's clone (as airlock-agent, a member of airlock-readers),
    // then a later fetch through the clone's own upload-pack setting.
    let agent = nix::unistd::User::from_name("airlock-agent")
        .unwrap()
        .unwrap();
    let home = s.root.join("agent-home");
    std::fs::create_dir(&home).unwrap();
    nix::unistd::chown(&home, Some(agent.uid), Some(agent.gid)).unwrap();
    let clone = home.join("armed");
    let mut cmd = s.ctl(&["clone", "armed", clone.to_str().unwrap()]);
    as_user(&mut cmd, &agent, &home);
    ok(&cmd.output().unwrap());
    assert_eq!(
        std::fs::read_to_string(clone.join("calc.py")).unwrap(),
        "def add(a, b):\n    return a + b\n"
    );
    let mut fetch = Command::new("/usr/bin/git");
    fetch
        .args([
            "-C",
            clone.to_str().unwrap(),
            "fetch",
            "-q",
            "origin",
            "refs/tags/v1",
        ])
        .env("PATH", s.canary.path_env());
    as_user(&mut fetch, &agent, &home);
    ok(&fetch.output().unwrap());

    // airlock-local's --repo import of the same source, new and again.
    let layout = airlock_local::layout::Layout {
        root: s.root.join("local"),
    };
    std::fs::create_dir_all(layout.repos()).unwrap();
    let ids = airlock_local::layout::Ids::for_caller().unwrap();
    airlock_local::import::repository(&layout, &ids, "armed", &src).unwrap();
    airlock_local::import::repository(&layout, &ids, "armed", &src).unwrap();
    assert_eq!(
        authority_head(&layout.repos().join("armed.git"), "refs/heads/main"),
        head
    );

    assert_eq!(s.canary.runs(), Vec::<String>::new(), "a canary ran");
}

#[test]
fn source_paths_with_shell_characters_import_as_data() {
    assert!(nix::unistd::Uid::effective().is_root(), "run as root");
    let s = site();
    let names = [
        "a$(touch pwned)b",
        "back`pwn`tick",
        "semi;pwn;colon",
        "q'uo\"te",
        "sp ace $HOME",
        "new\nline",
        "-dash",
        "colon:sep",
    ];
    let layout = airlock_local::layout::Layout {
        root: s.root.join("local"),
    };
    std::fs::create_dir_all(layout.repos()).unwrap();
    let ids = airlock_local::layout::Ids::for_caller().unwrap();
    for (i, name) in names.iter().enumerate() {
        let src = s.root.join("paths").join(name).join("repo");
        let head = source(&src, &s.canary, false);
        let repo = format!("p{i}");
        ok(&s
            .ctl(&["add", &repo, "--from", src.to_str().unwrap(), "--no-reload"])
            .output()
            .unwrap());
        assert_eq!(
            authority_head(&s.root.join(format!("srv/{repo}.git")), "refs/heads/main"),
            head,
            "{name:?}"
        );
        airlock_local::import::repository(&layout, &ids, &repo, &src).unwrap();
        assert_eq!(
            authority_head(
                &layout.repos().join(format!("{repo}.git")),
                "refs/heads/main"
            ),
            head,
            "{name:?}"
        );
    }
    assert_eq!(s.canary.runs(), Vec::<String>::new(), "a canary ran");
    assert!(!s.root.join("pwned").exists());
}

#[test]
fn a_source_that_is_not_a_repository_is_refused_with_its_code_and_nothing_is_made() {
    assert!(nix::unistd::Uid::effective().is_root(), "run as root");
    let s = site();
    let plain = s.root.join("plain$(pwn)");
    std::fs::create_dir_all(&plain).unwrap();
    let out = s
        .ctl(&["add", "x", "--from", plain.to_str().unwrap(), "--no-reload"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("REPOSITORY_SOURCE_INVALID"), "{err}");
    assert!(!s.root.join("srv/x.git").exists());
    assert!(
        !s.config
            .with_file_name("repositories.d")
            .join("x.toml")
            .exists()
    );
    assert_eq!(s.canary.runs(), Vec::<String>::new());
}

fn as_user(cmd: &mut Command, user: &nix::unistd::User, home: &Path) {
    let name = std::ffi::CString::new(user.name.clone()).unwrap();
    let groups = nix::unistd::getgrouplist(&name, user.gid).unwrap();
    let (uid, gid) = (user.uid, user.gid);
    cmd.env("HOME", home).current_dir(home);
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
}
