//! What only the PostgreSQL engine has: the supervisors' role without
//! UPDATE or DELETE on the append-only tables, notifications of every
//! change, the schema's own migration rules, and races between writers
//! on several sessions (as several hosts would be) — the duplicate
//! executions River, graphile-worker, pg-boss and solid_queue shipped:
//! a rescue overwriting a completion, a late result accepted after
//! requeue, a job both finished and failed.

#[path = "tasks_common.rs"]
mod common;

use airlock_proto::Code;
use airlock_proto::task::{Outcome, TaskState};
use airlock_taskdb::tasks::postgres::{PgListener, latest_version, migrate_at};
use airlock_taskdb::tasks::{Actor, PgStore};
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// A session as the supervisors' role (its password), for raw SQL.
fn as_supervisor_role(pg: &PgParts) -> postgres::Client {
    let mut cfg: postgres::Config = pg.db.url.parse().unwrap();
    cfg.password(pg.db.password.as_str());
    cfg.connect(postgres::NoTls).unwrap()
}

fn sqlstate(e: &postgres::Error) -> String {
    e.code().map(|c| c.code().to_owned()).unwrap_or_default()
}

#[test]
fn the_supervisors_role_may_not_rewrite_history_and_triggers_stop_even_the_owner() {
    let mut fx = Fixture::new(Backend::Postgres);
    fx.submit("task-a", 1);
    let g = fx.claim();
    fx.finish(&g, Outcome::Passed, false);
    let pg = fx.pg.as_ref().unwrap();
    let mut role = as_supervisor_role(pg);
    for sql in [
        "UPDATE events SET action = 'FORGED'",
        "DELETE FROM events",
        "TRUNCATE events",
        "UPDATE results SET result_sha256 = 'x'",
        "DELETE FROM results",
        "DELETE FROM task_retry_extensions",
        "DELETE FROM tasks",
        "DROP TRIGGER events_append_only ON events",
        "ALTER TABLE events DISABLE TRIGGER events_append_only",
    ] {
        let err = role.batch_execute(sql).unwrap_err();
        // 42501 insufficient_privilege, 42501/42P01-style ownership errors.
        assert!(
            ["42501"].contains(&sqlstate(&err).as_str()),
            "{sql}: {err:?}"
        );
    }
    // The schema's owner has the privileges, and the triggers stop it.
    let mut owner_cfg: postgres::Config = pg.db.owner_url.parse().unwrap();
    owner_cfg.password(pg.db.owner_password.as_str());
    let mut owner = owner_cfg.connect(postgres::NoTls).unwrap();
    for sql in [
        "UPDATE events SET action = 'FORGED'",
        "DELETE FROM events",
        "TRUNCATE events",
        "TRUNCATE results",
    ] {
        let err = owner.batch_execute(sql).unwrap_err();
        let msg = err
            .as_db_error()
            .map(|d| d.message().to_owned())
            .unwrap_or_default();
        assert!(msg.contains("append-only"), "{sql}: {msg}");
    }
    assert_eq!(fx.row("SELECT COUNT(*) FROM events"), texts(&["3"]));
    fx.store.integrity_check().unwrap();
    // A disabled trigger is caught by the integrity check.
    fx.exec("ALTER TABLE events DISABLE TRIGGER events_append_only")
        .unwrap();
    assert_eq!(
        fx.store.integrity_check().unwrap_err().code(),
        Code::STORE_CORRUPT
    );
}

#[test]
fn the_schema_is_versioned_and_a_newer_one_is_refused() {
    let fx = Fixture::new(Backend::Postgres);
    let pg = fx.pg.as_ref().unwrap();
    assert_eq!(
        fx.row("SELECT kind, version FROM airlock_schema"),
        texts(&["airlock-tasks", &latest_version().to_string()])
    );
    // Migrating again changes nothing.
    assert_eq!(migrate_at(&pg.owner_location()).unwrap(), latest_version());
    fx.exec(&format!(
        "UPDATE airlock_schema SET version = {}",
        latest_version() + 1
    ))
    .unwrap();
    assert_eq!(
        PgStore::open(&pg.location()).unwrap_err().code(),
        Code::SCHEMA_VERSION_UNSUPPORTED
    );
}

#[test]
fn every_committed_change_is_announced_to_listeners() {
    let mut fx = Fixture::new(Backend::Postgres);
    let pg = fx.pg.as_ref().unwrap();
    let mut listener = PgListener::new(&pg.location());
    // The first wait connects and LISTENs.
    assert!(listener.wait(Duration::from_millis(50)).unwrap().is_empty());
    fx.submit("task-a", 2);
    let g = fx.claim();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while seen.len() < 2 && Instant::now() < deadline {
        seen.extend(listener.wait(Duration::from_millis(200)).unwrap());
    }
    let seen: Vec<(String, TaskState, i64)> = seen
        .into_iter()
        .map(|c| (c.task_id, c.state, c.revision))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("task-a".into(), TaskState::Queued, 1),
            ("task-a".into(), TaskState::Running, 2)
        ]
    );
    // A rolled-back change (a refusal) announces nothing.
    let _ = fx
        .store
        .renew("task-a", g.lease_epoch, "wrong-token", LEASE, &worker());
    assert!(
        listener
            .wait(Duration::from_millis(300))
            .unwrap()
            .is_empty()
    );
}

/// Several sessions (hosts) claim, renew, report and sweep at once under
/// short leases on the server's own clock. Per task attempt: at most one
/// holder, and either its result was accepted or its lease expired —
/// never both, never twice.
#[test]
fn sweepers_and_late_results_race_without_a_duplicate_or_a_double_end() {
    const TASKS: usize = 40;
    const HOSTS: usize = 4;
    let pg = pg_parts(false);
    let mut setup = PgStore::open(&pg.location()).unwrap();
    for i in 0..TASKS {
        setup
            .submit(&submission(&format!("race-{i:02}"), 3), &planner())
            .unwrap();
    }
    let barrier = Arc::new(Barrier::new(HOSTS));
    let threads: Vec<_> = (0..HOSTS)
        .map(|h| {
            let loc = pg.location();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                let mut store = PgStore::open(&loc).unwrap();
                let me = Actor::worker(Some(1002), format!("host-{h}"));
                let mut accepted = Vec::new();
                let mut swept = Vec::new();
                let mut refused: BTreeMap<&'static str, usize> = BTreeMap::new();
                barrier.wait();
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut n = 0u64;
                loop {
                    assert!(Instant::now() < deadline, "race ran too long");
                    n += 1;
                    // Every host sweeps, often.
                    swept.extend(store.sweep_expired().unwrap());
                    let Some(g) = store.claim(&me, 150).unwrap() else {
                        let s = store.summary().unwrap();
                        if s.queued == 0 && s.running == 0 {
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    // Work for about the lease: some results land before
                    // the expiry, some after, some race the sweepers.
                    std::thread::sleep(Duration::from_millis(100 + (n * 37) % 100));
                    let outcome = if n % 4 == 0 {
                        Outcome::Failed
                    } else {
                        Outcome::Passed
                    };
                    match store.submit_result(
                        &g.task_id,
                        g.lease_epoch,
                        &g.lease_token,
                        &result_key(&g),
                        &result_for(&g, outcome),
                        true,
                        &me,
                    ) {
                        Ok(r) => {
                            assert!(!r.idempotent);
                            accepted.push((g.task_id.clone(), g.attempt));
                        }
                        Err(e) => {
                            *refused.entry(e.code().as_str()).or_default() += 1;
                        }
                    }
                }
                (accepted, swept, refused)
            })
        })
        .collect();
    let mut accepted: Vec<(String, u32)> = Vec::new();
    let mut swept = Vec::new();
    let mut refused: BTreeMap<&'static str, usize> = BTreeMap::new();
    for t in threads {
        let (a, s, r) = t.join().unwrap();
        accepted.extend(a);
        swept.extend(s);
        for (code, n) in r {
            *refused.entry(code).or_default() += n;
        }
    }
    // Each (task, attempt) accepted at most once.
    let unique: BTreeSet<_> = accepted.iter().cloned().collect();
    assert_eq!(unique.len(), accepted.len(), "a result accepted twice");
    // Events: per (task, attempt) one claim; then exactly one of accepted
    // result or lease expiry.
    let store = PgStore::open(&pg.location()).unwrap();
    let mut ends: BTreeMap<(String, u64), Vec<String>> = BTreeMap::new();
    let mut claims: BTreeMap<(String, u64), usize> = BTreeMap::new();
    let mut after = 0;
    loop {
        let page = store.events(None, after, 1000).unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        for e in page {
            if e.outcome != airlock_taskdb::tasks::EventOutcome::Allowed {
                continue;
            }
            let key = (
                e.task_id.clone().unwrap_or_default(),
                e.payload["attempt"].as_u64().unwrap_or(0),
            );
            match e.action.as_str() {
                "TASK_CLAIMED" => *claims.entry(key).or_default() += 1,
                "TASK_RESULT_SUBMITTED" | "TASK_LEASE_EXPIRED" => {
                    ends.entry(key).or_default().push(e.action.clone())
                }
                _ => {}
            }
        }
    }
    assert!(claims.values().all(|n| *n == 1), "an attempt claimed twice");
    for (key, n) in &claims {
        let e = ends.get(key).cloned().unwrap_or_default();
        assert_eq!(e.len(), 1, "{key:?} (claimed {n}) ended {e:?}");
    }
    assert_eq!(ends.len(), claims.len());
    // Every task ended, and the accepted results are exactly those events.
    let s = store.summary().unwrap();
    assert_eq!(s.queued + s.running + s.verifying, 0, "{s:?}");
    let result_events: BTreeSet<(String, u32)> = ends
        .iter()
        .filter(|(_, v)| v[0] == "TASK_RESULT_SUBMITTED")
        .map(|((t, a), _)| (t.clone(), *a as u32))
        .collect();
    assert_eq!(result_events, unique);
    eprintln!(
        "race: {} attempts, {} results accepted, {} leases expired, refusals {refused:?}",
        claims.len(),
        unique.len(),
        claims.len() - unique.len()
    );
    assert!(
        claims.len() > unique.len(),
        "no lease expired: the race did not happen"
    );
    let late: usize = refused.values().sum();
    assert!(
        late > 0,
        "no late result was refused: the race did not happen"
    );
    for code in refused.keys() {
        assert!(
            [
                Code::LEASE_EXPIRED.as_str(),
                Code::LEASE_EPOCH_STALE.as_str(),
                Code::TASK_STATE_INVALID.as_str()
            ]
            .contains(code),
            "unexpected refusal {code:?}"
        );
    }
    drop(swept);
}
