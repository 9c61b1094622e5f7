//! A partition between a supervisor's host and PostgreSQL
//! (docs/postgresql.md): the server in a network namespace of its own,
//! the store in another (a thread joined to it), reached over TCP across
//! a bridge; the link cut by a packet filter that drops every packet, as
//! a dead switch port would (airlock_pgcluster::network).
//!
//! Across the cut, a store call must fail with `STORE_UNAVAILABLE` — not
//! wait for TCP's own retransmission limit (about 15 minutes on Linux),
//! holding the store's one session, and with it every caller of that
//! supervisor — and a call again after the heal works, also when
//! PostgreSQL was restarted during the partition (the session kept from
//! before the cut is dead; the store notices and reconnects).
//!
//! Needs root (network namespaces); elsewhere it says so and passes
//! without running.

#[path = "tasks_common.rs"]
mod common;

use airlock_pgcluster::Cluster;
use airlock_pgcluster::network::{Network, SERVER_ADDRESS};
use airlock_proto::Code;
use airlock_taskdb::tasks::{PgLocation, PgSecurity, PgStore};
use common::{planner, submission};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// What the store thread is asked to do.
enum Ask {
    Submit(String),
    Get(String),
}

/// Far above what a call may take with a bounded connection (the
/// location's TCP user timeout and connect timeout), far below TCP's own
/// limit: a call still waiting then is the hang this test is about.
const HANG: Duration = Duration::from_secs(120);

#[test]
fn store_calls_across_a_cut_link_fail_as_unavailable_and_recover_after_the_heal() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "store_calls_across_a_cut_link_fail_as_unavailable_and_recover_after_the_heal needs root (network namespaces); CI runs the tests as root: run this one as root (sudo), it fails rather than pass without checking"
    );
    let mut net = Network::new(&format!("airlock-tdbp-{}", std::process::id())).unwrap();
    let host = net.add_host().unwrap();
    let mut cluster = Cluster::start_in(net.server()).expect("PostgreSQL in its namespace");
    let db = cluster.create_store_database("airlock").unwrap();
    let owner = PgLocation::parse(&db.owner_url)
        .unwrap()
        .with_password(db.owner_password.as_bytes());
    airlock_taskdb::tasks::postgres::migrate_at(&owner).unwrap();
    let url = cluster.tcp_url_at(SERVER_ADDRESS.into(), &db.role, &db.name);
    let location = PgLocation::parse_with(
        &url,
        &PgSecurity {
            ca_file: None,
            allow_plaintext: true,
        },
    )
    .unwrap()
    .with_password(db.password.as_bytes());

    // The store, on a thread inside the host's namespace (setns(2) moves
    // the calling thread only). It answers each ask with the call's code
    // (None: it worked) and how long it took.
    let (ask, asks) = mpsc::channel::<Ask>();
    let (answer, answers) = mpsc::channel::<(Option<Code>, Duration)>();
    let ns = std::fs::File::open(net.host(host).path()).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut store = PgStore::open(&location).expect("the store over TCP");
        for a in asks {
            let started = Instant::now();
            let code = match a {
                Ask::Submit(id) => store
                    .submit(&submission(&id, 3), &planner())
                    .err()
                    .map(|e| e.code()),
                Ask::Get(id) => store.get(&id).err().map(|e| e.code()),
            };
            if answer.send((code, started.elapsed())).is_err() {
                return;
            }
        }
    });
    let call = |a: Ask, what: &str| -> (Option<Code>, Duration) {
        ask.send(a).unwrap();
        answers
            .recv_timeout(HANG)
            .unwrap_or_else(|_| panic!("{what}: no answer in {HANG:?}: the call hangs"))
    };

    assert_eq!(call(Ask::Submit("part-1".into()), "submit").0, None);
    assert_eq!(call(Ask::Get("part-1".into()), "get").0, None);

    // Cut: a call on the live session, then one that must reconnect.
    net.cut(host).unwrap();
    let (on_session, took_session) = call(Ask::Get("part-1".into()), "a read across the cut");
    let (reconnect, took_reconnect) = call(Ask::Submit("part-2".into()), "a write across the cut");
    // PostgreSQL restarts while the host is cut off: the session from
    // before the cut dies on the server's side, unseen by the host.
    cluster.crash();
    cluster.start_again().unwrap();
    net.heal(host).unwrap();
    let (healed, _) = call(Ask::Get("part-1".into()), "a read after the heal");
    let (healed_write, _) = call(Ask::Submit("part-2".into()), "a write after the heal");

    // And a cut with no call during it, PostgreSQL restarted meanwhile:
    // the first call after the heal runs on a session that died unseen.
    net.cut(host).unwrap();
    cluster.crash();
    cluster.start_again().unwrap();
    net.heal(host).unwrap();
    let (stale, _) = call(
        Ask::Get("part-2".into()),
        "a read on a session that died unseen",
    );

    println!(
        "partition: a read across the cut failed with {} in {took_session:.1?}, a write (reconnecting) with {} in {took_reconnect:.1?}; after the heal (PostgreSQL restarted during the cut): read {}, write {}; first call on a session that died unseen: {}",
        code_str(on_session),
        code_str(reconnect),
        code_str(healed),
        code_str(healed_write),
        code_str(stale),
    );
    assert_eq!(on_session, Some(Code::STORE_UNAVAILABLE));
    assert_eq!(reconnect, Some(Code::STORE_UNAVAILABLE));
    assert_eq!(healed, None, "the store recovers after the heal");
    assert_eq!(
        healed_write, None,
        "the write refused during the cut is made after it"
    );
    assert_eq!(stale, None, "a session that died unseen is replaced");
    drop(ask);
    drop(cluster);
    drop(net);
}

fn code_str(c: Option<Code>) -> &'static str {
    c.map_or("nothing (it worked)", |c| c.as_str())
}
