//! A refusal only configuration can change ends the setup, whatever the
//! setup command makes of it (docs/environments.md, issue 45 item 3).
//!
//! Real processes through airlock-local (executor, forwarder, the
//! production airlock-egress), no registry and no test switch of the
//! proxy: each setup asks the proxy, through its forwarder, for a target
//! the proxy refuses on configuration alone (a host not listed; a listed
//! loopback listener on a port the proxy does not connect to), prints the
//! answer, ignores it and exits 0 after writing its output. The task ends
//! FAILED with the proxy's code, the verification (which would pass) never
//! runs, no layer is sealed, and a second task on the same inputs runs the
//! setup again and ends the same way. The loopback listener accepts
//! nothing.

use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A setup in node that CONNECTs through the forwarder to `target`, prints
/// the proxy's status and code, writes `node_modules/made` and exits 0
/// whatever the answer.
fn ignoring_setup(target: &str, egress: &str) -> airlock_config::Environment {
    let script = format!(
        "const fs=require('fs');fs.mkdirSync('node_modules',{{recursive:true}});fs.writeFileSync('node_modules/made','x');\
         const r=require('http').request({{host:'127.0.0.1',port:3128,method:'CONNECT',path:'{target}'}});\
         r.on('connect',res=>{{console.log('ANSWER '+res.statusCode+' '+res.headers['x-airlock-refusal']);process.exit(0)}});\
         r.on('error',e=>{{console.log('ERROR '+e.code);process.exit(0)}});r.end();"
    );
    airlock_config::Environment {
        programs: vec!["node".into()],
        variables: [("PATH".to_owned(), "/usr/bin:/bin".to_owned())].into(),
        setup: Some(airlock_config::Setup {
            commands: vec![vec!["node".into(), "-e".into(), script]],
            inputs: vec!["package.json".into()],
            outputs: vec!["node_modules".into()],
            egress: vec![egress.to_owned()],
            timeout_seconds: 120,
        }),
        ..Default::default()
    }
}

/// The sealed layers of the executor's cache under `state` (every
/// `layers/KEY` directory holding a `seal.json`).
fn sealed_layers(state: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            let p = e.path();
            if !e.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            if p.file_name().is_some_and(|n| n == "layers") {
                for layer in std::fs::read_dir(&p).into_iter().flatten().flatten() {
                    if layer.path().join("seal.json").exists() {
                        out.push(layer.path().display().to_string());
                    }
                }
            } else {
                walk(&p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(state, &mut out);
    out
}

#[test]
fn a_setup_that_ignores_a_refusal_and_exits_0_ends_with_the_code_and_seals_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let node = airlock_testkit::node_project(scratch.path(), "calc-node");
    // A loopback listener the proxy must never reach.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let hits = Arc::new(AtomicUsize::new(0));
    {
        let hits = hits.clone();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                hits.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 64];
                let _ = conn.read(&mut buf);
            }
        });
    }
    let looped = format!("127.0.0.1:{port}");
    let state = scratch.path().join("state");
    let suite = airlock_local::start_with(
        state.clone(),
        true,
        &airlock_local::Tuning {
            repositories: vec![
                ("unlisted".into(), node.clone()),
                ("port".into(), node.clone()),
            ],
            environments: vec![
                (
                    "unlisted".into(),
                    ignoring_setup("other.example.invalid:443", "allowed.example.invalid:443"),
                ),
                ("port".into(), ignoring_setup(&looped, &looped)),
            ],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    let logs = |name: &str| {
        std::fs::read_to_string(state.join(format!("logs/{name}.log"))).unwrap_or_default()
    };
    // The verification would pass with any layer: only the refusal fails.
    let propose = |repo: &str| -> Value {
        airlock_testkit::propose_patch(
            &ctl,
            &bus,
            cfg,
            repo,
            "node --version",
            airlock_testkit::NODE_FIX,
        )
    };
    for (repo, target, code) in [
        (
            "unlisted",
            "other.example.invalid:443",
            "EGRESS_HOST_NOT_ALLOWED",
        ),
        ("port", looped.as_str(), "EGRESS_PORT_NOT_ALLOWED"),
    ] {
        // Twice: a sealed layer would make the second task skip the setup
        // (no connection, no refusal) and pass.
        for attempt in 1..=2 {
            let task = propose(repo);
            assert_eq!(
                task["state"],
                "FAILED",
                "{repo} #{attempt}: {task}\nexecutor: {}",
                logs("executor")
            );
            assert_eq!(
                task["result"]["failure_code"],
                code,
                "{repo} #{attempt}: {task}\nexecutor: {}",
                logs("executor")
            );
            // The executor's account: the proxy's refusal of the target,
            // and the command's exit status 0.
            let log = logs("executor");
            assert!(
                log.contains(&format!(
                    "the egress proxy refused {target} ({code}); setup-1 exited 0"
                )),
                "{log}"
            );
            assert!(
                task["result"]["verification"]
                    .as_array()
                    .is_none_or(Vec::is_empty),
                "the verification ran: {task}"
            );
            let sealed = sealed_layers(&state);
            assert!(sealed.is_empty(), "layers sealed: {sealed:?}");
        }
    }
    assert_eq!(hits.load(Ordering::SeqCst), 0, "the listener was reached");
}
