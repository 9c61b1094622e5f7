//! What the uncredentialed side may link: the executor's and
//! airlock-confine's dependency closures stay free of bus, database, HTTP
//! and git code, airlock-egress's too, and airlock-retryd's free of SQLite (it asks the
//! supervisor instead). `cargo metadata` gives the resolved graph; only
//! normal dependencies count (build and dev dependencies never reach the
//! binary).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

fn resolved() -> (BTreeMap<String, String>, BTreeMap<String, Vec<String>>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: BTreeMap<String, String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["id"].as_str().unwrap().to_owned(),
                p["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let mut deps = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let normal: Vec<String> = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| d["pkg"].as_str().unwrap().to_owned())
            .collect();
        deps.insert(node["id"].as_str().unwrap().to_owned(), normal);
    }
    (names, deps)
}

fn closure(root: &str) -> BTreeSet<String> {
    let (names, deps) = resolved();
    let start = names
        .iter()
        .find(|(_, n)| *n == root)
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("{root} is not in the workspace"));
    let mut seen = BTreeSet::new();
    let mut todo = vec![start];
    while let Some(id) = todo.pop() {
        if seen.insert(id.clone()) {
            todo.extend(deps.get(&id).cloned().unwrap_or_default());
        }
    }
    seen.iter().map(|id| names[id].clone()).collect()
}

#[test]
fn the_executor_and_confine_link_no_bus_database_http_or_git_code() {
    const FORBIDDEN: &[&str] = &[
        "zbus",
        "rusqlite",
        "libsqlite3-sys",
        "postgres",
        "tokio-postgres",
        "tokio-postgres-rustls",
        "rustls",
        "ring",
        "hyper",
        "airlock-git",
        "airlock-client",
        "airlock-sqlite",
        "airlock-taskdb",
        "airlock-journal",
        "airlock-supervisor",
    ];
    for root in ["airlock-executor", "airlock-confine"] {
        let linked = closure(root);
        assert!(
            linked.len() > 5,
            "{root}: the closure looks empty: {linked:?}"
        );
        let found: Vec<_> = FORBIDDEN.iter().filter(|f| linked.contains(**f)).collect();
        assert!(found.is_empty(), "{root} links {found:?}");
    }
}

/// The test kit and the throwaway PostgreSQL cluster are for tests and
/// benchmarks: no shipped binary links them.
#[test]
fn no_shipped_binary_links_the_test_kit() {
    for root in [
        "airlock-supervisor",
        "airlock-worker",
        "airlock-executor",
        "airlock-confine",
        "airlock-egress",
        "airlock-retryd",
        "airlockctl",
        "airlock-local",
        "airlock-mcp",
    ] {
        let linked = closure(root);
        assert!(
            !linked.contains("airlock-testkit"),
            "{root} links airlock-testkit"
        );
    }
}

#[test]
fn retryd_links_no_database() {
    let linked = closure("airlock-retryd");
    assert!(
        linked.contains("hyper") && linked.contains("zbus"),
        "{linked:?}"
    );
    for f in [
        "rusqlite",
        "libsqlite3-sys",
        "airlock-sqlite",
        "airlock-taskdb",
        "airlock-journal",
    ] {
        assert!(!linked.contains(f), "airlock-retryd links {f}");
    }
}

#[test]
fn each_store_is_linked_by_its_owner_only() {
    let supervisor = closure("airlock-supervisor");
    assert!(supervisor.contains("airlock-taskdb"), "{supervisor:?}");
    for f in ["airlock-journal", "airlock-git", "hyper"] {
        assert!(!supervisor.contains(f), "airlock-supervisor links {f}");
    }
    let worker = closure("airlock-worker");
    assert!(worker.contains("airlock-journal"), "{worker:?}");
    for f in ["airlock-taskdb", "hyper"] {
        assert!(!worker.contains(f), "airlock-worker links {f}");
    }
    for ctl in ["airlockctl", "airlock-local"] {
        let linked = closure(ctl);
        for f in ["airlock-taskdb", "airlock-journal", "airlock-supervisor"] {
            assert!(!linked.contains(f), "{ctl} links {f}");
        }
    }
}

/// airlock-egress holds nothing on the server: it links no bus, store,
/// git or HTTP-server code (it parses one request head with httparse and
/// splices bytes). The executor may link its library for the protocol
/// without gaining any of that either.
#[test]
fn egress_links_no_bus_database_http_server_or_git_code() {
    let linked = closure("airlock-egress");
    assert!(
        linked.contains("tokio") && linked.contains("httparse"),
        "{linked:?}"
    );
    for f in [
        "zbus",
        "rusqlite",
        "libsqlite3-sys",
        "postgres",
        "tokio-postgres",
        "tokio-postgres-rustls",
        "rustls",
        "ring",
        "hyper",
        "airlock-git",
        "airlock-client",
        "airlock-sqlite",
        "airlock-taskdb",
        "airlock-journal",
        "airlock-supervisor",
        "airlock-spool",
    ] {
        assert!(!linked.contains(f), "airlock-egress links {f}");
    }
}
