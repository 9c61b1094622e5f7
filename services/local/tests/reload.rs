//! Repositories registered while the whole suite runs: a drop-in plus
//! SIGHUP (what `airlockctl repo add` and `systemctl reload` do on an
//! installed system) makes the supervisor accept and the worker serve a new
//! repository without a restart; removing it makes the supervisor refuse it.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

fn wait_for(log: &Path, needle: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.matches(needle).count() >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in {}:\n{text}",
            log.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn ctl(bus: &str, args: &[&str]) -> Output {
    airlock_testkit::airlockctl(&airlock_local::sibling("airlockctl").unwrap(), bus, args)
}

#[test]
fn a_reload_serves_a_new_repository_and_refuses_a_removed_one() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning::default(),
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let pids = |s: &airlock_local::Suite| (s.fleet.pid("supervisor"), s.fleet.pid("worker"));
    let before = pids(&suite);
    let hup = |s: &airlock_local::Suite| {
        for name in ["supervisor", "worker"] {
            let pid = s.fleet.pid(name).unwrap();
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGHUP,
            )
            .unwrap();
        }
    };
    let logs = suite.layout.logs();

    // An administrator's repository, imported where the worker owns it, and its drop-in.
    let demo = suite.layout.repos().join("demo.git");
    airlock_local::import::repository(&suite.layout, &suite.ids, "extra", &demo).unwrap();
    let drop_in = airlock_config::drop_in_dir(&config).join("extra.toml");
    let extra = airlock_config::Repository {
        name: "extra".into(),
        path: suite.layout.repos().join("extra.git"),
        description: None,
        environment: None,
        upstream: None,
        signing: None,
        drop_in: None,
    };
    std::fs::write(&drop_in, airlock_config::drop_in_text(&extra)).unwrap();
    hup(&suite);
    wait_for(
        &logs.join("supervisor.log"),
        "reloaded the registered repositories",
        1,
    );
    wait_for(
        &logs.join("worker.log"),
        "reloaded the registered repositories",
        1,
    );

    let patch = scratch.path().join("fix.patch");
    std::fs::write(
        &patch,
        "--- a/calc.py\n+++ b/calc.py\n@@ -1,2 +1,2 @@\n def add(a, b):\n-    return a - b\n+    return a + b\n",
    )
    .unwrap();
    let propose = |id: &str, extra_args: &[&str]| {
        let mut args = vec![
            "--json",
            "propose",
            "--config",
            cfg,
            "--repo",
            "extra",
            "--base",
            "main",
            "--patch",
            patch.to_str().unwrap(),
            "--verify",
            "python3 -m unittest -q",
            "--max-attempts",
            "1",
            "--task-id",
            id,
        ];
        args.extend_from_slice(extra_args);
        ctl(&bus, &args)
    };
    let out = propose("reload-extra-1", &["--wait"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(last["state"], "SUCCEEDED", "{last}");
    assert!(last["result"]["commit_oid"].is_string());

    // A task built while it was registered, submitted after it was removed.
    let built = propose("reload-extra-2", &["--dry-run"]);
    assert!(built.status.success());
    let task = scratch.path().join("task.json");
    std::fs::write(&task, &built.stdout).unwrap();
    std::fs::remove_file(&drop_in).unwrap();
    hup(&suite);
    wait_for(
        &logs.join("supervisor.log"),
        "reloaded the registered repositories",
        2,
    );
    wait_for(
        &logs.join("worker.log"),
        "reloaded the registered repositories",
        2,
    );
    let out = ctl(&bus, &["--json", "submit", task.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(
            airlock_proto::Code::REPOSITORY_NOT_REGISTERED
                .exit_code()
                .into()
        ),
        "{err}"
    );
    assert!(err.contains("REPOSITORY_NOT_REGISTERED"), "{err}");

    // Reloads, not restarts.
    assert_eq!(pids(&suite), before);
    suite.fleet.check_alive().unwrap();
}
