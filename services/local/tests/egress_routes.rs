//! airlock-egress's routes under the whole stack: setups reach the real
//! registries through a real parent proxy (Debian's tinyproxy on loopback,
//! with basic authentication), its credential handed to airlock-egress
//! alone; a refused credential, and a name resolving outside its route's
//! ranges, end the task with their codes.
//!
//! No registry is named here: each package client is run once through a
//! logging CONNECT proxy on loopback, and the `host:port` it asked for is
//! both the environment's egress entry and a route `via` the parent.

use airlock_testkit::{
    NODE_FIX, PY_FIX, ParentProxy, node_project, npm_ci_environment, pip_install_environment,
    python_project, setup_environment,
};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;

fn propose(bus: &str, cfg: &str, repo: &str, verify: &str, patch: &str) -> Value {
    let ctl = airlock_local::sibling("airlockctl").unwrap();
    airlock_testkit::propose_patch(&ctl, bus, cfg, repo, verify, patch)
}

/// A setup that asks the proxy for `target` with a raw CONNECT and prints
/// the answer's status and refusal code (exit 0 on 200, 4 otherwise).
fn connect_setup(target: &str) -> airlock_config::Environment {
    let script = format!(
        "const r=require('http').request({{host:'127.0.0.1',port:3128,method:'CONNECT',path:'{target}'}});r.on('connect',res=>{{console.log('{target} '+res.statusCode+' '+res.headers['x-airlock-refusal']);process.exit(res.statusCode==200?0:4)}});r.on('error',e=>{{console.log('error '+e.code);process.exit(5)}});r.end();"
    );
    setup_environment(
        &["node"],
        vec![vec!["node", "-e", &script]],
        &["package.json"],
        &["node_modules"],
        vec![target.to_owned()],
        &[],
    )
}

#[test]
fn setups_fetch_through_a_parent_proxy_and_its_refusals_end_the_task() {
    let scratch = tempfile::tempdir().unwrap();
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let npm_registry = airlock_testkit::npm_registry(&scratch.path().join("npm-cache"));
    let pip_registry = airlock_testkit::pip_registry(&scratch.path().join("pip-dl"));
    let node = node_project(scratch.path(), "calc-node");
    let python = python_project(scratch.path(), "calc-py");
    let password = "parent-s3cret-7";
    let parent = ParentProxy::start("airlock", password);
    let good = scratch.path().join("parent.credential");
    std::fs::write(&good, format!("airlock:{password}\n")).unwrap();
    let wrong = scratch.path().join("wrong.credential");
    std::fs::write(&wrong, "airlock:not-the-password\n").unwrap();
    // The registries through the parent with its credential; a host through
    // it with a wrong one; localhost confined to a range it is not in.
    let registries = [npm_registry.clone(), pip_registry.clone()].concat();
    let routes = format!(
        "{}[[route]]\nhost = \"parent-auth.example.invalid\"\nvia = \"http://127.0.0.1:{}\"\ncredential = \"wrong\"\n\n\
         [[route]]\nhost = \"localhost\"\naddresses = [\"10.9.0.0/16\"]\n",
        airlock_testkit::via_routes(&registries, parent.port, Some("parent-proxy")),
        parent.port
    );
    let node_env = npm_ci_environment(npm_registry.clone(), &[]);
    let python_env = pip_install_environment(pip_registry.clone());
    let suite = airlock_local::start_with(
        scratch.path().join("state"),
        true,
        &airlock_local::Tuning {
            repositories: vec![
                ("node".into(), node.clone()),
                ("py".into(), python),
                ("auth".into(), node.clone()),
                ("outside".into(), node.clone()),
            ],
            environments: vec![
                ("node".into(), node_env),
                ("py".into(), python_env),
                (
                    "auth".into(),
                    connect_setup("parent-auth.example.invalid:443"),
                ),
                ("outside".into(), connect_setup("localhost:443")),
            ],
            egress_routes: Some(routes),
            egress_credentials: vec![("parent-proxy".into(), good), ("wrong".into(), wrong)],
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("starting airlock-local: {e}"));
    let bus = suite.bus.address().to_owned();
    let config = suite.layout.config();
    let cfg = config.to_str().unwrap();
    let logs = |name: &str| {
        std::fs::read_to_string(scratch.path().join(format!("state/logs/{name}.log")))
            .unwrap_or_default()
    };

    // Node: npm ci through airlock-egress, which CONNECTs through the parent.
    let node_task = propose(&bus, cfg, "node", "npm test", NODE_FIX);
    assert_eq!(
        node_task["state"],
        "SUCCEEDED",
        "{node_task}\negress: {}\nparent: {}",
        logs("egress"),
        parent.log()
    );
    let layer = &node_task["result"]["isolation"]["layer"];
    let decisions = layer["egress"].as_array().unwrap();
    assert!(
        !decisions.is_empty() && decisions.iter().all(|d| d["allowed"] == true),
        "{layer}"
    );
    // Python: pip install through the same parent.
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
        "{py}\negress: {}\nparent: {}",
        logs("egress"),
        parent.log()
    );
    // The parent made each registry's CONNECT; airlock-egress's log names
    // the route and never the credential.
    let parent_log = parent.log();
    for target in &registries {
        assert!(
            parent_log.contains(&format!("CONNECT {target}")),
            "the parent never carried {target}: {parent_log}"
        );
    }
    let egress_log = logs("egress");
    assert!(
        egress_log.contains(&format!(
            "airlock_egress_route=via 127.0.0.1:{} ",
            parent.port
        )),
        "{egress_log}"
    );
    assert!(!egress_log.contains(password), "{egress_log}");

    // A wrong credential for the parent: the task ends with its code.
    let auth = propose(&bus, cfg, "auth", "node test.js", NODE_FIX);
    assert_eq!(auth["state"], "FAILED", "{auth}");
    assert_eq!(
        auth["result"]["failure_code"],
        "EGRESS_PARENT_AUTH_FAILED",
        "{auth}\negress: {}",
        logs("egress")
    );
    assert!(!logs("egress").contains("not-the-password"));
    // A name resolving outside its route's ranges: refused.
    let outside = propose(&bus, cfg, "outside", "node test.js", NODE_FIX);
    assert_eq!(outside["state"], "FAILED", "{outside}");
    assert_eq!(
        outside["result"]["failure_code"],
        "EGRESS_ADDRESS_FORBIDDEN",
        "{outside}\negress: {}",
        logs("egress")
    );
    assert!(
        logs("egress").contains("outside the route's addresses"),
        "{}",
        logs("egress")
    );
}
