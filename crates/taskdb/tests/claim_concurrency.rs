//! Claims from several real processes on one database file: no attempt is
//! ever claimed twice, and every attempt of every task is claimed.
//!
//! The parent test re-executes this test binary once per worker, running
//! only the ignored `claim_child` test with the database path in the
//! environment. Each child claims in a loop, prints what it claimed to
//! stdout, and reports a failed result so that tasks with attempts left are
//! queued again and claimed by whichever process is quickest.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::task::{Outcome, TaskState};
use airlock_taskdb::tasks::{Actor, EventOutcome, PgLocation, PgStore, SqliteStore, action};
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const DB_ENV: &str = "AIRLOCK_TEST_CLAIM_CHILD_DB";
const PG_URL_ENV: &str = "AIRLOCK_TEST_CLAIM_CHILD_PG_URL";
const PG_PASSWORD_ENV: &str = "AIRLOCK_TEST_CLAIM_CHILD_PG_PASSWORD";
const GO_ENV: &str = "AIRLOCK_TEST_CLAIM_CHILD_GO";
const NAME_ENV: &str = "AIRLOCK_TEST_CLAIM_CHILD_NAME";
const TASKS: u32 = 60;
const CHILDREN: usize = 6;
const MARK: &str = "CLAIMED ";

#[test]
#[ignore = "runs only as a child process of claims_from_many_processes_never_collide"]
fn claim_child() {
    let db = std::env::var(DB_ENV).ok();
    let pg = std::env::var(PG_URL_ENV).ok();
    if db.is_none() && pg.is_none() {
        return;
    }
    let go = PathBuf::from(std::env::var(GO_ENV).expect("go file"));
    let name = std::env::var(NAME_ENV).expect("worker name");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !go.exists() {
        assert!(Instant::now() < deadline, "never told to start");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut store: Box<dyn TaskStore> = match (db, pg) {
        (Some(db), _) => Box::new(SqliteStore::open(Path::new(&db)).expect("child open")),
        (_, Some(url)) => {
            let password = std::env::var(PG_PASSWORD_ENV).expect("password");
            let loc = PgLocation::parse(&url)
                .expect("url")
                .with_password(password.as_bytes());
            Box::new(PgStore::open(&loc).expect("child open"))
        }
        _ => unreachable!(),
    };
    let me = Actor::worker(None, name.clone());
    loop {
        assert!(Instant::now() < deadline, "child {name} ran too long");
        match store.claim(&me, 60_000).expect("claim") {
            Some(g) => {
                println!("{MARK}{name} {} {} {}", g.task_id, g.attempt, g.lease_epoch);
                store
                    .submit_result(
                        &g.task_id,
                        g.lease_epoch,
                        &g.lease_token,
                        &result_key(&g),
                        &result_for(&g, Outcome::Failed),
                        false,
                        &me,
                    )
                    .expect("submit result");
            }
            None => {
                let s = store.summary().expect("summary");
                if s.queued == 0 && s.running == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }
}

fn claims_from_many_processes_never_collide(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("tasks.sqlite3");
    // PostgreSQL: the real server clock (no test clock), as in production.
    let pg = (backend == Backend::Postgres).then(|| pg_parts(false));
    let mut store: Box<dyn TaskStore> = match &pg {
        None => Box::new(SqliteStore::open(&db).unwrap()),
        Some(pg) => Box::new(PgStore::open(&pg.location()).unwrap()),
    };
    let mut expected = BTreeSet::new();
    let mut budgets = BTreeMap::new();
    for i in 0..TASKS {
        let id = format!("task-{i:03}");
        let max = 1 + i % 3;
        store.submit(&submission(&id, max), &planner()).unwrap();
        budgets.insert(id.clone(), max);
        for attempt in 1..=max {
            expected.insert((id.clone(), attempt));
        }
    }

    let go = dir.path().join("go");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..CHILDREN)
        .map(|n| {
            let mut cmd = Command::new(&exe);
            cmd.args([
                "claim_child",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ]);
            match &pg {
                None => cmd.env(DB_ENV, &db),
                Some(pg) => cmd
                    .env(PG_URL_ENV, &pg.db.url)
                    .env(PG_PASSWORD_ENV, &pg.db.password),
            };
            cmd.env(GO_ENV, &go)
                .env(NAME_ENV, format!("worker-{n}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::fs::write(&go, b"go").unwrap();

    let mut claims: Vec<(String, String, u32, u64)> = Vec::new();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        for line in stdout.lines() {
            let Some(at) = line.find(MARK) else { continue };
            let f: Vec<&str> = line[at + MARK.len()..].split_whitespace().collect();
            assert_eq!(f.len(), 4, "{line}");
            claims.push((
                f[0].to_owned(),
                f[1].to_owned(),
                f[2].parse().unwrap(),
                f[3].parse().unwrap(),
            ));
        }
    }

    let mut seen = BTreeSet::new();
    for (worker, task, attempt, epoch) in &claims {
        assert!(
            seen.insert((task.clone(), *attempt)),
            "{task} attempt {attempt} was claimed twice (again by {worker})"
        );
        assert_eq!(u64::from(*attempt), *epoch, "one epoch per attempt");
    }
    assert_eq!(
        seen, expected,
        "every attempt of every task is claimed once"
    );

    let per_worker: BTreeMap<&str, usize> = claims.iter().fold(BTreeMap::new(), |mut m, c| {
        *m.entry(c.0.as_str()).or_default() += 1;
        m
    });
    eprintln!("claims per worker: {per_worker:?}");

    // The store agrees: every task used its whole budget and failed.
    for (id, max) in &budgets {
        let t = store.get(id).unwrap();
        assert_eq!(
            (t.state, t.attempt, t.max_attempts),
            (TaskState::Failed, *max, *max),
            "{id}"
        );
    }
    let s = store.summary().unwrap();
    assert_eq!((s.failed, s.total()), (u64::from(TASKS), u64::from(TASKS)));
    // One allowed claim event per attempt (paging through the whole log).
    let mut after = 0;
    let mut claimed = 0;
    loop {
        let page = store.events(None, after, 1000).unwrap();
        let Some(last) = page.last() else { break };
        after = last.id;
        claimed += page
            .iter()
            .filter(|e| e.action == action::TASK_CLAIMED && e.outcome == EventOutcome::Allowed)
            .count();
    }
    assert_eq!(claimed, expected.len());
    store.integrity_check().unwrap();
}

both_backends!(claims_from_many_processes_never_collide);
