//! Real polkit decisions: the real `polkitd` (Debian package `polkitd`) on
//! the private test bus, in a mount namespace where airlock's shipped
//! actions and a test rule set are bind-mounted over polkit's directories,
//! and the supervisor running as an unprivileged user (as it does in
//! production), asking polkit about its callers.
//!
//! Skipped, with a notice, when polkitd is not installed.

mod common;

use airlock_proto::Code;
use airlock_taskdb::tasks::EventOutcome;
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const POLKITD: &str = "/usr/lib/polkit-1/polkitd";
const POLKIT_BUS_POLICY: &str = "/usr/share/dbus-1/system.d/org.freedesktop.PolicyKit1.conf";
const SHIPPED_ACTIONS: &str = include_str!("../../../polkit/org.airlock.policy");

/// The uid and user the supervisor runs as in these tests.
const SERVICE: (u32, &str) = (1, "daemon");

/// nobody may read, may never manage, and gets the default (auth_admin_keep) for submit;
/// bin (a planner) may read and submit, as 50-airlock-agent.rules lets airlock-agent.
const RULES: &str = r#"
polkit.addRule(function(action, subject) {
    if (subject.user == "bin" && (action.id == "org.airlock.tasks.read" || action.id == "org.airlock.tasks.submit")) { return polkit.Result.YES; }
    if (subject.user == "nobody" && action.id == "org.airlock.tasks.read") { return polkit.Result.YES; }
    if (subject.user == "nobody" && action.id == "org.airlock.tasks.manage") { return polkit.Result.NO; }
});
"#;

/// Fails the test when polkitd is not installed: a test of the real
/// authority must not pass without it.
fn require_polkit() {
    assert!(
        Path::new(POLKITD).exists() && Path::new(POLKIT_BUS_POLICY).exists(),
        "this test needs polkitd ({POLKITD}, {POLKIT_BUS_POLICY}; apt-get install polkitd): it fails rather than pass without checking"
    );
}

struct Polkitd {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Polkitd {
    /// Starts polkitd on `sup`'s bus with `actions` as its only actions file.
    fn start(sup: &Supervisor, actions: &str) -> Polkitd {
        let dir = tempfile::tempdir().unwrap();
        let (actions_dir, rules_dir) = (dir.path().join("actions"), dir.path().join("rules"));
        std::fs::create_dir(&actions_dir).unwrap();
        std::fs::create_dir(&rules_dir).unwrap();
        std::fs::write(actions_dir.join("org.airlock.policy"), actions).unwrap();
        std::fs::write(rules_dir.join("10-airlock-test.rules"), RULES).unwrap();
        let script = format!(
            "mount --bind {a} /usr/share/polkit-1/actions && mount --bind {r} /etc/polkit-1/rules.d && exec {POLKITD} --no-debug",
            a = actions_dir.display(),
            r = rules_dir.display(),
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("DBUS_SYSTEM_BUS_ADDRESS", sup.bus.address())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("unshare + polkitd");
        let pk = Polkitd { child, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(15);
        let address = format!("--address={}", sup.bus.address());
        while Instant::now() < deadline {
            let out = Command::new("busctl")
                .args([&address, "status", "org.freedesktop.PolicyKit1"])
                .output()
                .unwrap();
            if out.status.success() {
                return pk;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("polkitd did not appear on the test bus");
    }
}

impl Drop for Polkitd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_supervisor() -> Supervisor {
    Supervisor::start(Opts {
        authorizer: "polkit".into(),
        run_as: Some(SERVICE),
        extra_policies: vec![PathBuf::from(POLKIT_BUS_POLICY)],
        ..Opts::default()
    })
}

/// The shipped actions with the service user renamed to the test's.
fn actions_owned_by_test_user() -> String {
    let s = SHIPPED_ACTIONS.replace("unix-user:airlock", &format!("unix-user:{}", SERVICE.1));
    assert_ne!(s, SHIPPED_ACTIONS, "the shipped policy names its owner");
    s
}

#[test]
fn real_polkit_decides_per_caller_and_action() {
    require_polkit();
    let sup = start_supervisor();
    let _pk = Polkitd::start(&sup, &actions_owned_by_test_user());

    // nobody: read is YES by rule — the call goes through to the store.
    let err = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Tasks2.GetTask",
        &["string:task-pk"],
    )
    .unwrap_err();
    assert_eq!(err.code(), Some(Code::TASK_NOT_FOUND), "{err:?}");
    // submit falls to the default auth_admin_keep: no agent, so a challenge.
    let err = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Tasks2.SubmitTask",
        &["string:{}"],
    )
    .unwrap_err();
    assert_eq!(
        err.name, "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired",
        "{err:?}"
    );
    // plain busctl allows interactive authorisation by default; still no agent.
    let out = run_as(
        WORKER_UID,
        "/usr/bin/busctl",
        &[
            &format!("--address={}", sup.bus.address()),
            "call",
            NAME,
            PATH,
            TASKS,
            "SubmitTask",
            "s",
            "{}",
        ],
    );
    assert!(!out.status.success());
    // manage is NO by rule.
    let err = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Tasks2.CancelTask",
        &["string:task-pk", "string:why"],
    )
    .unwrap_err();
    assert_eq!(
        err.name, "org.freedesktop.DBus.Error.AccessDenied",
        "{err:?}"
    );
    // The subject is the caller, not the supervisor: the supervisor's own
    // user is not granted read, so a call from that user is challenged
    // while nobody's identical call was allowed.
    let err = dbus_send(
        &sup,
        SERVICE.0,
        "org.airlock.Tasks2.GetTask",
        &["string:task-pk"],
    )
    .unwrap_err();
    assert_eq!(
        err.code(),
        Some(Code::INTERACTIVE_AUTHORIZATION_REQUIRED),
        "{err:?}"
    );

    let events = sup.store().events(None, 0, 100).unwrap();
    let denied: Vec<(Option<Code>, Option<u32>)> = events
        .iter()
        .filter(|e| e.outcome == EventOutcome::Denied)
        .map(|e| (e.code, e.actor.uid))
        .collect();
    assert_eq!(
        denied,
        [
            (
                Some(Code::INTERACTIVE_AUTHORIZATION_REQUIRED),
                Some(WORKER_UID)
            ),
            (
                Some(Code::INTERACTIVE_AUTHORIZATION_REQUIRED),
                Some(WORKER_UID)
            ),
            (Some(Code::AUTHORIZATION_DENIED), Some(WORKER_UID)),
            (
                Some(Code::INTERACTIVE_AUTHORIZATION_REQUIRED),
                Some(SERVICE.0)
            ),
        ]
    );
}

#[test]
fn without_the_owner_annotation_polkit_refuses_to_answer_and_airlock_denies() {
    require_polkit();
    let sup = start_supervisor();
    let unowned: String = SHIPPED_ACTIONS
        .lines()
        .filter(|l| !l.contains("org.freedesktop.policykit.owner"))
        .collect::<Vec<_>>()
        .join("\n");
    let _pk = Polkitd::start(&sup, &unowned);
    let err = dbus_send(
        &sup,
        WORKER_UID,
        "org.airlock.Tasks2.GetTask",
        &["string:task-pk"],
    )
    .unwrap_err();
    assert_eq!(err.code(), Some(Code::AUTHORITY_UNAVAILABLE), "{err:?}");
    assert!(err.message.contains("trusted callers"), "{}", err.message);
}

/// The planner of [`RULES`].
const PLANNER: u32 = 2;

#[test]
fn under_real_polkit_a_planner_reads_its_own_tasks_and_root_every_task() {
    require_polkit();
    let sup = start_supervisor();
    let _pk = Polkitd::start(&sup, &actions_owned_by_test_user());
    for (uid, task) in [(0, "t-root"), (PLANNER, "t-bin")] {
        dbus_send(
            &sup,
            uid,
            "org.airlock.Tasks2.SubmitTask",
            &[&format!("string:{}", submission(task))],
        )
        .unwrap_or_else(|e| panic!("uid {uid} submits: {e:?}"));
    }
    let get = |uid: u32, task: &str| {
        dbus_send(
            &sup,
            uid,
            "org.airlock.Tasks2.GetTask",
            &[&format!("string:{task}")],
        )
    };
    let list = |uid: u32, method: &str, args: &[&str]| {
        dbus_send(&sup, uid, method, args).unwrap_or_else(|e| panic!("{method}: {e:?}"))
    };
    // root holds org.airlock.tasks.read-all (polkit: root is authorised
    // for every action): every task.
    assert!(get(0, "t-bin").unwrap().contains("t-bin"));
    let all = list(
        0,
        "org.airlock.Tasks2.ListTasks",
        &["string:", "string:", "uint32:0"],
    );
    assert!(all.contains("t-root") && all.contains("t-bin"), "{all}");
    // The planner: read is allowed, read-all is auth_admin, asked without
    // interaction — its own task, and root's answers as a missing one.
    assert!(get(PLANNER, "t-bin").unwrap().contains("t-bin"));
    let theirs = get(PLANNER, "t-root").unwrap_err();
    let missing = get(PLANNER, "t-none").unwrap_err();
    assert_eq!(theirs.code(), Some(Code::TASK_NOT_FOUND), "{theirs:?}");
    assert_eq!(
        theirs.message.replace("t-root", "ID"),
        missing.message.replace("t-none", "ID")
    );
    for (method, args) in [
        (
            "org.airlock.Tasks2.ListTasks",
            ["string:", "string:", "uint32:0"],
        ),
        (
            "org.airlock.Tasks1.ListTasks",
            ["string:", "string:", "uint32:0"],
        ),
        (
            "org.airlock.Tasks2.ListEvents",
            ["string:", "int64:0", "uint32:0"],
        ),
        (
            "org.airlock.Reconcile1.ListReconciliations",
            ["string:", "string:", "uint32:0"],
        ),
    ] {
        let out = list(PLANNER, method, &args);
        assert!(!out.contains("t-root"), "{method}: {out}");
        if !method.ends_with("ListReconciliations") {
            assert!(out.contains("t-bin"), "{method}: {out}");
        }
    }
    // busctl allows interactive authorisation: still no prompt, the same
    // narrower answer (polkit is never asked to interact for read-all).
    let out = run_as(
        PLANNER,
        "/usr/bin/busctl",
        &[
            &format!("--address={}", sup.bus.address()),
            "call",
            NAME,
            PATH,
            TASKS,
            "ListTasks",
            "ssu",
            "",
            "",
            "0",
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("t-bin") && !text.contains("t-root"), "{text}");
    // nobody may read but submitted nothing: it sees no task at all.
    let none = list(
        WORKER_UID,
        "org.airlock.Tasks2.ListTasks",
        &["string:", "string:", "uint32:0"],
    );
    assert!(
        !none.contains("t-root") && !none.contains("t-bin"),
        "{none}"
    );
}
