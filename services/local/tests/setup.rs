//! A repository whose suite needs dependencies fetched from a package
//! registry: its environment's setup fetches them through airlock-egress,
//! and the dependency layer it seals is reused while the lockfile stays.
//!
//! Real package clients and the real registries this machine reaches. The
//! registry's host is never written here: each client is run once through
//! a logging CONNECT proxy on loopback, and the `host:port` it asked for is
//! the environment's egress entry; airlock-egress (the production binary)
//! reaches it through a route whose addresses are the ones that host
//! resolves to here, learnt at run time.
//!
//! - Node: `npm ci --ignore-scripts` as setup, `npm test` as verification
//!   (no network then); a fix ends SUCCEEDED with a fetched layer and the
//!   registry allowed in its egress evidence; a second task on the same
//!   lockfile reuses the layer (no setup command, no egress); a breaking
//!   change FAILED with the failing test named; a change to the lockfile
//!   makes a new layer.
//! - Python: `pip install --target` of pytest as setup, pytest as
//!   verification.
//! - Refusals, with only loopback targets: a setup that asks the proxy for
//!   an unlisted host, or for a loopback listener this test started, or
//!   that connects to that listener directly, ends FAILED with the code
//!   and the listener sees nothing; a verification command cannot reach
//!   the proxy, and no name resolves inside the sandbox.

use airlock_testkit::setup_environment as environment;
use airlock_testkit::{
    NODE_BREAK, NODE_FIX, PY_FIX, address_routes, node_project, npm_ci_environment,
    pip_install_environment, python_project,
};
use serde_json::Value;
use std::io::Read;
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn propose(bus: &str, cfg: &str, repo: &str, verify: &str, patch: &str) -> Value {
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    airlock_testkit::propose_patch(&ctl, bus, cfg, repo, verify, patch)
}

fn tails(task: &Value) -> String {
    let mut all = String::new();
    let layer = &task["result"]["isolation"]["layer"];
    for c in task["result"]["verification"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(layer["setup"].as_array().into_iter().flatten())
    {
        all.push_str(c["stdout_tail"].as_str().unwrap_or(""));
        all.push_str(c["stderr_tail"].as_str().unwrap_or(""));
    }
    all.push_str(&task.to_string());
    all
}

fn layer(task: &Value) -> &Value {
    &task["result"]["isolation"]["layer"]
}

/// A loopback listener that counts the connections it accepts.
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let c = count.clone();
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            c.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 64];
            let _ = conn.read(&mut buf);
        }
    });
    (port, count)
}

#[test]
fn setups_fetch_through_the_egress_proxy_and_their_layers_are_reused_per_lockfile() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let npm_registry = airlock_testkit::npm_registry(&scratch.path().join("npm-cache"));
    let pip_registry = airlock_testkit::pip_registry(&scratch.path().join("pip-dl"));
    let node = node_project(scratch.path(), "calc-node");
    let python = python_project(scratch.path(), "calc-py");
    let (listener_port, listener_hits) = counting_listener();
    let loopback = format!("127.0.0.1:{listener_port}");
    let node_env = npm_ci_environment(npm_registry.clone(), &[]);
    let python_env = pip_install_environment(pip_registry.clone());
    // Setups the proxy must refuse: an unlisted host (the listed entry is
    // the loopback listener, which the proxy never reaches either), and a
    // direct connection to the listener.
    let unlisted_env = npm_ci_environment(
        vec!["pkg.example.invalid:443".into()],
        &[("npm_config_fetch_retries", "0")],
    );
    let direct = format!(
        "const s=require('net').connect({listener_port},'127.0.0.1');s.on('connect',()=>{{console.log('CONNECTED');process.exit(0)}});s.on('error',e=>{{console.log('refused '+e.code);process.exit(3)}});"
    );
    let direct_env = environment(
        &["node"],
        vec![vec!["node", "-e", &direct]],
        &["package.json"],
        &["node_modules"],
        vec![],
        &[],
    );
    // CONNECTs through the proxy to the listener (its port is not one the
    // proxy reaches) and to a name that resolves into loopback.
    let loopback_env = {
        let script = format!(
            "const h=require('http');let n=0;for(const t of ['{loopback}','localhost:443']){{const r=h.request({{host:'127.0.0.1',port:3128,method:'CONNECT',path:t}});r.on('connect',res=>{{console.log(t+' '+res.statusCode+' '+res.headers['x-airlock-refusal']);if(res.statusCode==200)process.exit(0);if(++n==2)process.exit(4)}});r.on('error',e=>{{console.log(t+' error '+e.code);if(++n==2)process.exit(5)}});r.end();}}"
        );
        environment(
            &["node"],
            vec![vec!["node", "-e", &script]],
            &["package.json"],
            &["node_modules"],
            vec![loopback.clone(), "localhost:443".into()],
            &[],
        )
    };
    let routes = address_routes(&[npm_registry.clone(), pip_registry.clone()].concat());
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![
                ("node".into(), node.clone()),
                ("py".into(), python),
                ("unlisted".into(), node.clone()),
                ("direct".into(), node.clone()),
                ("loop".into(), node.clone()),
            ],
            environments: vec![
                ("node".into(), node_env),
                ("py".into(), python_env),
                ("unlisted".into(), unlisted_env),
                ("direct".into(), direct_env),
                ("loop".into(), loopback_env),
            ],
            egress_routes: Some(routes),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();

    // Node: the first task fetches, through the proxy, the listed registry.
    let first = propose(&bus, cfg, "node", "npm test", NODE_FIX);
    let logs = |name: &str| {
        std::fs::read_to_string(scratch.path().join(format!("state/logs/{name}.log")))
            .unwrap_or_default()
    };
    assert_eq!(
        first["state"],
        "SUCCEEDED",
        "{}\nexecutor: {}\negress: {}",
        tails(&first),
        logs("executor"),
        logs("egress")
    );
    let l1 = layer(&first);
    assert_eq!(l1["reused"], false, "{l1}");
    assert_eq!(l1["setup"][0]["exit_code"], 0, "{l1}");
    let egress = l1["egress"].as_array().unwrap();
    assert!(
        !egress.is_empty()
            && egress
                .iter()
                .all(|d| npm_registry.iter().any(|r| d["target"] == r.as_str())
                    && d["allowed"] == true),
        "{l1}"
    );
    // The next task on the same lockfile: the layer reused, no setup, no egress.
    let second = propose(&bus, cfg, "node", "npm test", NODE_FIX);
    assert_eq!(second["state"], "SUCCEEDED", "{}", tails(&second));
    let l2 = layer(&second);
    assert_eq!(l2["reused"], true, "{l2}");
    assert_eq!(l2["key"], l1["key"]);
    assert_eq!(l2["digest"], l1["digest"]);
    assert_eq!(l2["setup"].as_array().map(Vec::len), Some(0), "{l2}");
    assert_eq!(l2["egress"].as_array().map(Vec::len), Some(0), "{l2}");
    // A breaking change: FAILED, the failing test named, the layer reused.
    let bad = propose(&bus, cfg, "node", "npm test", NODE_BREAK);
    assert_eq!(bad["state"], "FAILED", "{bad}");
    assert!(
        tails(&bad).contains("test_add_two_and_three"),
        "{}",
        tails(&bad)
    );
    assert_eq!(layer(&bad)["reused"], true);
    // A change to the lockfile makes a new layer.
    let lock = std::fs::read_to_string(node.join("package-lock.json")).unwrap();
    let n = lock.lines().count();
    let last = lock.lines().last().unwrap();
    let patch = format!(
        "--- a/package-lock.json\n+++ b/package-lock.json\n@@ -{n},1 +{n},2 @@\n {last}\n+\n"
    );
    let relocked = propose(&bus, cfg, "node", "npm test", &format!("{patch}{NODE_FIX}"));
    assert_eq!(relocked["state"], "SUCCEEDED", "{}", tails(&relocked));
    assert_eq!(layer(&relocked)["reused"], false);
    assert_ne!(layer(&relocked)["key"], l1["key"]);

    // Python: pytest installed by the setup, verification offline.
    let py = propose(
        &bus,
        cfg,
        "py",
        "python3 -m pytest -q -p no:cacheprovider",
        PY_FIX,
    );
    assert_eq!(
        py["state"],
        "SUCCEEDED",
        "{}\nexecutor: {}",
        tails(&py),
        logs("executor")
    );
    assert_eq!(layer(&py)["reused"], false);
    let py2 = propose(
        &bus,
        cfg,
        "py",
        "python3 -m pytest -q -p no:cacheprovider",
        PY_FIX,
    );
    assert_eq!(py2["state"], "SUCCEEDED", "{}", tails(&py2));
    assert_eq!(layer(&py2)["reused"], true);
    // A breaking change: FAILED, pytest naming the failing test.
    let py_bad = propose(
        &bus,
        cfg,
        "py",
        "python3 -m pytest -q -p no:cacheprovider",
        &PY_FIX.replace("a + b", "a * b"),
    );
    assert_eq!(py_bad["state"], "FAILED", "{py_bad}");
    assert!(tails(&py_bad).contains("test_add"), "{}", tails(&py_bad));
    assert_eq!(layer(&py_bad)["reused"], true);

    // Refusals. An unlisted host: refused by the proxy with its code, which
    // ends the task at once.
    let unlisted = propose(&bus, cfg, "unlisted", "npm test", NODE_FIX);
    assert_eq!(unlisted["state"], "FAILED", "{unlisted}");
    assert!(
        unlisted.to_string().contains("EGRESS_HOST_NOT_ALLOWED"),
        "{unlisted}"
    );
    // The listener on the host's loopback, and a name resolving into
    // loopback, named to the proxy: both refused with their codes.
    let looped = propose(&bus, cfg, "loop", "node test.js", NODE_FIX);
    assert_eq!(looped["state"], "FAILED", "{looped}");
    // Both CONNECTs are in flight at once: the task ends with the code of
    // whichever the proxy refused first.
    let code = looped["result"]["failure_code"].as_str().unwrap_or("");
    assert!(
        ["EGRESS_PORT_NOT_ALLOWED", "EGRESS_ADDRESS_FORBIDDEN"].contains(&code),
        "{looped}"
    );
    let log = logs("executor");
    assert!(
        log.contains(&format!("{loopback} refused EGRESS_PORT_NOT_ALLOWED"))
            && log.contains("localhost:443 refused EGRESS_ADDRESS_FORBIDDEN"),
        "{log}"
    );
    // A direct connection to it from the setup: nothing there to reach.
    let direct = propose(&bus, cfg, "direct", "node test.js", NODE_FIX);
    assert_eq!(direct["state"], "FAILED", "{direct}");
    assert_eq!(
        direct["result"]["failure_code"],
        "SETUP_FAILED",
        "{direct}\n{}",
        logs("executor")
    );
    assert!(!direct.to_string().contains("CONNECTED"), "{direct}");
    assert_eq!(listener_hits.load(Ordering::SeqCst), 0);

    // Verification has no network: not the proxy's port, not a name.
    let name = npm_registry[0].rsplit_once(':').unwrap().0;
    let probe = format!(
        "node -e \"const s=require('net').connect(3128,'127.0.0.1');s.on('connect',()=>process.exit(0));s.on('error',e=>{{console.log('proxy '+e.code);require('dns').lookup('{name}',(err)=>{{console.log('dns '+(err?err.code:'resolved'));process.exit(err?7:8)}})}})\""
    );
    let offline = propose(&bus, cfg, "node", &probe, NODE_FIX);
    assert_eq!(offline["state"], "FAILED", "{offline}");
    let text = tails(&offline);
    assert!(
        text.contains("proxy ECONNREFUSED")
            || text.contains("proxy ENETUNREACH")
            || text.contains("proxy EPERM")
            || text.contains("proxy EACCES"),
        "{text}"
    );
    assert_eq!(
        offline["result"]["verification"][0]["exit_code"], 7,
        "{text}"
    );
    assert_eq!(listener_hits.load(Ordering::SeqCst), 0);
}

/// Rust: a toolchain from the environment's paths (this machine's, as a
/// read-only copy), `cargo fetch --locked` as setup into HOME's
/// `.cargo/registry`, `cargo test --offline` as verification.
#[test]
fn a_rust_crate_fetches_its_registry_in_setup_and_tests_offline() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let tools = tempfile::Builder::new()
        .prefix("airlock-rust-")
        .tempdir_in("/var/tmp")
        .unwrap();
    std::fs::set_permissions(tools.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let toolchain = airlock_testkit::toolchain_copy(tools.path());
    let crate_dir = airlock_testkit::rust_project(scratch.path(), "calc-rs");
    let registry = airlock_testkit::cargo_registry(&crate_dir, &scratch.path().join("cargo-home"));
    let bin = toolchain.join("bin");
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let mut env = environment(
        &["cargo"],
        vec![vec!["cargo", "fetch", "--locked"]],
        &["Cargo.toml", "Cargo.lock"],
        &["~/.cargo/registry"],
        registry.clone(),
        &[("PATH", &path), ("CARGO_HOME", "/tmp/.cargo")],
    );
    env.paths = vec![tools.path().to_path_buf()];
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![("calc".into(), crate_dir)],
            environments: vec![("calc".into(), env)],
            egress_routes: Some(address_routes(&registry)),
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let logs = || {
        std::fs::read_to_string(scratch.path().join("state/logs/executor.log")).unwrap_or_default()
    };
    let first = propose(
        &bus,
        cfg,
        "calc",
        "cargo test --offline",
        airlock_testkit::RUST_FIX,
    );
    assert_eq!(first["state"], "SUCCEEDED", "{}\n{}", tails(&first), logs());
    let l1 = layer(&first);
    assert_eq!(l1["reused"], false, "{l1}");
    assert!(
        l1["egress"]
            .as_array()
            .is_some_and(|e| !e.is_empty() && e.iter().all(|d| d["allowed"] == true)),
        "{l1}"
    );
    assert_eq!(
        first["result"]["verification"][0]["exit_code"], 0,
        "{first}"
    );
    // A breaking change (unfixed): FAILED, the failing test named, the
    // registry reused.
    let touch = "--- a/src/lib.rs\n+++ b/src/lib.rs\n@@ -1,3 +1,4 @@\n+// unchanged arithmetic\n pub fn add(a: i64, b: i64) -> String {\n     itoa::Buffer::new().format(a - b).to_owned()\n }\n";
    let bad = propose(&bus, cfg, "calc", "cargo test --offline", touch);
    assert_eq!(bad["state"], "FAILED", "{bad}");
    assert!(
        tails(&bad).contains("test_add_two_and_three"),
        "{}",
        tails(&bad)
    );
    assert_eq!(layer(&bad)["reused"], true, "{}", layer(&bad));
    assert_eq!(layer(&bad)["key"], l1["key"]);
}
