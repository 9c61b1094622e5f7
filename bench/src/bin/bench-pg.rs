//! bench-pg: the task store on PostgreSQL, in one run, on one throwaway
//! cluster (Debian's postgresql, `fsync=on`, `synchronous_commit=on`,
//! reached through its UNIX socket):
//!
//! 1. **single-row commits/s** (the baseline): one session inserting one
//!    row per transaction — PostgreSQL's own durable-commit rate here;
//! 2. **claim→result cycles/s** through `PgStore`: per cycle one
//!    submission, one claim and one result with auto-accept — three
//!    transactions, each with its audit event — from 1 session, and from
//!    3 sessions at once (three hosts' supervisors sharing the queue);
//!    the same cycle on the SQLite store beside it, on the same machine;
//! 3. **end-to-end tasks/s with 1, 2 and 3 stacks** (supervisor, worker,
//!    executor, retry API each) sharing the PostgreSQL queue and one
//!    repository directory: a batch of one-file tasks verified by
//!    `/bin/true`, submitted round robin, timed until every task is
//!    SUCCEEDED.
//!
//! Every figure is a median over rounds. Prints figures; asserts nothing.
//!
//! ```text
//! bench-pg [--seconds S] [--rounds R] [--tasks N]
//! ```

use airlock_local::client::{Supervisor, task_on_demo};
use airlock_local::layout::Ids;
use airlock_local::{SharedStore, Suite, Tuning, start_with};
use airlock_pgcluster::Cluster;
use airlock_proto::canonical::sha256_hex;
use airlock_proto::checkpoint::result_idempotency_key;
use airlock_proto::task::{
    CommandSummary, Outcome, RESULT_SCHEMA, TaskResult, TaskState, TaskSubmission,
};
use airlock_taskdb::tasks::{Actor, PgLocation, PgStore, SqliteStore, TaskStore};
use airlock_testkit::git_dir_or_empty as git;
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    seconds: f64,
    rounds: usize,
    tasks: usize,
}

fn args() -> Result<Args, String> {
    let mut a = Args {
        seconds: 2.0,
        rounds: 3,
        tasks: 30,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match flag.as_str() {
            "--seconds" => a.seconds = value("--seconds")?.parse().map_err(|e| format!("{e}"))?,
            "--rounds" => a.rounds = value("--rounds")?.parse().map_err(|e| format!("{e}"))?,
            "--tasks" => a.tasks = value("--tasks")?.parse().map_err(|e| format!("{e}"))?,
            "-h" | "--help" => {
                println!(
                    "bench-pg [--seconds S (2)] [--rounds R (3)] [--tasks N (30)]\n\nThe task store on a throwaway PostgreSQL cluster: single-row commits/s (baseline), claim→result cycles/s (1 and 3 sessions, and SQLite beside it), end-to-end tasks/s with 1, 2 and 3 stacks sharing the queue."
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if !(0.1..=600.0).contains(&a.seconds) || a.rounds == 0 || a.tasks == 0 {
        return Err("--seconds in 0.1..=600, --rounds and --tasks at least 1".into());
    }
    Ok(a)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Runs `op` until `window` passes; operations per second.
fn rate(window: Duration, mut op: impl FnMut(u64) -> BenchResult<()>) -> BenchResult<f64> {
    let start = Instant::now();
    let mut n = 0;
    while start.elapsed() < window || n == 0 {
        op(n)?;
        n += 1;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn submission(task_id: &str) -> BenchResult<TaskSubmission> {
    let head = "b".repeat(40);
    Ok(TaskSubmission::from_value(&json!({
        "schema": "airlock.task.v1",
        "binding": {
            "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "bench",
            "base_oid": "a".repeat(40), "expected_branch_oid": head,
            "target_branch": format!("agent/{task_id}"), "branch_mode": "CONTINUE_EXISTING",
            "generation": 1, "idempotency_key": format!("submit-{task_id}"),
        },
        "plan": {
            "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
            "source_head_oid": head, "generation": 1,
            "idempotency_key": format!("plan-{task_id}"),
            "execution": {
                "action": "deterministic",
                "change_set": [{"path": "x.txt", "operation": "write_file", "content": "x\n"}],
                "verification": [{"label": "test", "argv": ["/bin/true"]}],
                "capability_scope": ["git.read", "git.test"],
            },
        },
        "max_attempts": 1,
    }))?)
}

/// One claim→result cycle on `store`: submit, claim (whatever is oldest),
/// report it passed with auto-accept.
fn cycle(store: &mut dyn TaskStore, task_id: &str, worker: &Actor) -> BenchResult<()> {
    store.submit(&submission(task_id)?, &Actor::planner(None, "bench"))?;
    let grant = store
        .claim(worker, 60_000)?
        .ok_or("nothing claimable after a submission")?;
    let id = grant.task_id.clone();
    let digest = grant.envelope["execution_digest"]
        .as_str()
        .ok_or("no execution_digest")?
        .to_owned();
    let result = TaskResult {
        schema: RESULT_SCHEMA.into(),
        task_id: id.clone(),
        attempt: grant.attempt,
        execution_digest: digest.clone(),
        outcome: Outcome::Passed,
        commit_oid: Some("c".repeat(40)),
        target_branch: format!("agent/{id}"),
        exec_result_sha256: Some(sha256_hex(id.as_bytes())),
        failure_code: None,
        reconciliation: None,
        publication: None,
        signature: None,
        isolation: Some(airlock_proto::task::Isolation {
            landlock_abi: Some(7),
            landlock: "full".into(),
            seccomp: "enforced".into(),
            namespaces: Some(vec!["user".into(), "mnt".into(), "pid".into()]),
            view: "minimal-root".into(),
            uid: Some(992),
            layer: None,
        }),
        verification: vec![CommandSummary {
            label: "test".into(),
            exit_code: Some(0),
            timed_out: false,
            duration_ms: 1,
            stdout_tail: None,
            stderr_tail: None,
            wall: None,
        }],
        captured: None,
    };
    let receipt = store.submit_result(
        &id,
        grant.lease_epoch,
        &grant.lease_token,
        &result_idempotency_key(&id, grant.attempt, &digest),
        &result,
        true,
        worker,
    )?;
    if receipt.task.state != TaskState::Succeeded {
        return Err(format!("{id} ended {:?}", receipt.task.state).into());
    }
    Ok(())
}

/// Submits `n` tasks round robin over the stacks and waits until every one
/// is SUCCEEDED; tasks per second.
fn end_to_end(stacks: &[Suite], repo: &Path, prefix: &str, n: usize) -> BenchResult<f64> {
    let clients: Vec<Supervisor> = stacks
        .iter()
        .map(|s| Supervisor::connect(Some(s.bus.address())))
        .collect::<Result<_, _>>()?;
    let base = git(repo, &["rev-parse", "refs/heads/main"]);
    let ids: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:04}")).collect();
    let start = Instant::now();
    for (i, id) in ids.iter().enumerate() {
        let t = task_on_demo(
            id,
            &base,
            3,
            json!({"operation": "write_file", "path": "bench.txt", "content": format!("{id}\n")}),
            json!([{"label": "true", "argv": ["/bin/true"], "timeout_seconds": 30}]),
        );
        clients[i % clients.len()].submit_task(&t)?;
    }
    let mut open: Vec<&String> = ids.iter().collect();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !open.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("{} tasks not done after 600 s", open.len()).into());
        }
        std::thread::sleep(Duration::from_millis(20));
        let mut still = Vec::new();
        for id in open {
            let v = clients[0].get_task(id)?;
            match v.state {
                TaskState::Succeeded => {}
                TaskState::Failed | TaskState::Cancelled => {
                    return Err(format!("{id} ended {}", v.state.as_str()).into());
                }
                _ => still.push(id),
            }
        }
        open = still;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn main() -> BenchResult<()> {
    let a = args()?;
    let window = Duration::from_secs_f64(a.seconds);
    let cluster = Cluster::start()?;
    let db = cluster.create_store_database("airlock")?;
    let owner = PgLocation::parse(&db.owner_url)?.with_password(db.owner_password.as_bytes());
    airlock_taskdb::tasks::postgres::migrate_at(&owner)?;
    let location = PgLocation::parse(&db.url)?.with_password(db.password.as_bytes());
    println!(
        "bench-pg: PostgreSQL {} on a UNIX socket (fsync=on, synchronous_commit=on); {} rounds of {:.1} s",
        airlock_pgcluster::bin_dir()?
            .parent()
            .and_then(Path::file_name)
            .and_then(|v| v.to_str())
            .unwrap_or("?"),
        a.rounds,
        a.seconds
    );

    // 1 + 2: the store.
    let mut su = cluster.superuser(&db.name)?;
    su.batch_execute(
        "CREATE TABLE bench_commit (id bigserial PRIMARY KEY, payload text NOT NULL)",
    )?;
    let sqlite_dir = tempfile::Builder::new()
        .prefix("airlock-bench-pg.")
        .tempdir_in("/var/tmp")?;
    let (mut commits, mut one, mut three, mut sqlite) = (vec![], vec![], vec![], vec![]);
    for round in 0..a.rounds {
        let stmt = su.prepare("INSERT INTO bench_commit (payload) VALUES ($1)")?;
        commits.push(rate(window, |_| {
            su.execute(&stmt, &[&"x".repeat(256)])?;
            Ok(())
        })?);
        let mut store = PgStore::open(&location)?;
        let worker = Actor::worker(None, "bench-worker");
        one.push(rate(window, |i| {
            cycle(&mut store, &format!("pg1-r{round}-{i:08}"), &worker)
        })?);
        // Three sessions at once, as three hosts' supervisors.
        let threads: Vec<_> = (0..3)
            .map(|h| {
                let location = location.clone();
                std::thread::spawn(move || -> Result<(u64, Duration), String> {
                    let mut store = PgStore::open(&location).map_err(|e| e.to_string())?;
                    let worker = Actor::worker(None, format!("bench-host-{h}"));
                    let start = Instant::now();
                    let mut n = 0u64;
                    while start.elapsed() < window {
                        cycle(&mut store, &format!("pg3-r{round}-h{h}-{n:08}"), &worker)
                            .map_err(|e| e.to_string())?;
                        n += 1;
                    }
                    Ok((n, start.elapsed()))
                })
            })
            .collect();
        let mut total = 0.0;
        for t in threads {
            let (n, elapsed) = t.join().map_err(|_| "a session panicked")??;
            total += n as f64 / elapsed.as_secs_f64();
        }
        three.push(total);
        let mut lite = SqliteStore::open(&sqlite_dir.path().join(format!("r{round}.sqlite3")))?;
        sqlite.push(rate(window, |i| {
            cycle(&mut lite, &format!("lite-r{round}-{i:08}"), &worker)
        })?);
    }
    let (commits, one, three, sqlite) =
        (median(commits), median(one), median(three), median(sqlite));
    println!("  PostgreSQL single-row commits/s (baseline) {commits:>9.1}");
    println!(
        "  claim→result cycles/s, 1 session          {one:>9.1}   = {:.3} × baseline ({:.2} commits' time per cycle; a cycle is 3 transactions)",
        one / commits,
        commits / one
    );
    println!(
        "  claim→result cycles/s, 3 sessions         {three:>9.1}   = {:.3} × baseline, {:.2} × 1 session",
        three / commits,
        three / one
    );
    println!(
        "  claim→result cycles/s, SQLite (same host) {sqlite:>9.1}   (context: the embedded default)"
    );

    // 3: end to end, 1..=3 stacks sharing the queue and the repositories.
    let root = tempfile::Builder::new()
        .prefix("airlock-bench-pg-stacks.")
        .tempdir_in("/var/tmp")?;
    let ids = Ids::for_caller()?;
    let repos = root.path().join("repos");
    std::fs::create_dir_all(&repos)?;
    airlock_local::layout::chown_tree(&repos, ids.worker, &ids)?;
    let mut results = Vec::new();
    for n in 1..=3usize {
        let stacks: Vec<Suite> = (0..n)
            .map(|h| {
                start_with(
                    root.path().join(format!("s{n}-host-{h}")),
                    true,
                    &Tuning {
                        lease_seconds: 60,
                        parallel_tasks: 2,
                        shared_store: Some(SharedStore {
                            url: db.url.clone(),
                            password: db.password.clone(),
                            allow_plaintext: false,
                        }),
                        repos: Some(repos.clone()),
                        netns: None,
                        ..Tuning::default()
                    },
                )
            })
            .collect::<Result<_, _>>()?;
        let repo = repos.join("demo.git");
        // A warm-up task per stack, untimed.
        end_to_end(&stacks, &repo, &format!("warm{n}"), n)?;
        let mut rates = Vec::new();
        for round in 0..a.rounds {
            rates.push(end_to_end(
                &stacks,
                &repo,
                &format!("e2e{n}-r{round}"),
                a.tasks,
            )?);
        }
        let r = median(rates);
        results.push(r);
        println!(
            "  end-to-end tasks/s, {n} stack{}            {r:>9.2}   ({} tasks per round, 2 worker threads per stack){}",
            if n == 1 { " " } else { "s" },
            a.tasks,
            if n > 1 {
                format!(", {:.2} × 1 stack", r / results[0])
            } else {
                String::new()
            }
        );
        drop(stacks);
    }
    println!(
        "  (this machine: {} CPUs; every stack's executor, confinement and git run on them)",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    Ok(())
}
