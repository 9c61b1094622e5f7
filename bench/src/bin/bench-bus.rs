//! `bench-bus`: round-trip latency and calls/s of the supervisor's D-Bus
//! methods over a real bus.
//!
//! Starts a private dbus-daemon (the shipped policy included), runs the
//! supervisor in-process ([`InProcess`]) on its own runtime threads (the local authoriser for its own uid, a temporary
//! task store with WAL and synchronous=FULL), and measures from a separate
//! client connection: SubmitTask, GetTask (sequential and concurrent),
//! Claim and SubmitResult. Prints median, p99 and calls/s for each.

use airlock_client::Supervisor;
use airlock_localbus::PrivateBus;
use airlock_proto::bus::LeaseRef;
use airlock_proto::task::TaskResult;
use airlock_supervisor::authz::local::LocalAuthorizer;
use airlock_supervisor::daemon::AuthorizerChoice;
use airlock_testkit::InProcess;
use clap::Parser;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Measure the supervisor's D-Bus round trips on a private bus.
#[derive(Debug, Parser)]
#[command(name = "bench-bus", version)]
struct Args {
    /// Tasks to submit, then claim and complete.
    #[arg(long, default_value_t = 300)]
    tasks: usize,
    /// Sequential GetTask calls.
    #[arg(long, default_value_t = 2000)]
    gets: usize,
    /// Concurrent callers for the GetTask throughput run.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Print the results as one JSON object.
    #[arg(long)]
    json: bool,
}

const HEAD: &str = "71523aef6e48b1e2fa516c456ca189b7a039104b";
const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";

/// Latencies of one kind of call.
struct Series {
    name: String,
    samples: Vec<Duration>,
    wall: Duration,
    calls: usize,
}

impl Series {
    fn quantile(&self, q: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        if s.is_empty() {
            return Duration::ZERO;
        }
        let i = ((s.len() as f64 * q).ceil() as usize).clamp(1, s.len()) - 1;
        s[i]
    }

    fn rate(&self) -> f64 {
        self.calls as f64 / self.wall.as_secs_f64()
    }

    fn to_json(&self) -> Value {
        json!({
            "name": self.name,
            "calls": self.calls,
            "median_us": self.quantile(0.5).as_micros() as u64,
            "p99_us": self.quantile(0.99).as_micros() as u64,
            "calls_per_s": (self.rate() * 10.0).round() / 10.0,
        })
    }
}

fn submission(i: usize) -> Value {
    let id = format!("bench-{i:06}");
    json!({
        "schema": "airlock.task.v1",
        "binding": {
            "task_id": id, "job_id": format!("job-{id}"), "repository": "demo",
            "base_oid": BASE, "expected_branch_oid": HEAD, "target_branch": format!("agent/{id}"),
            "branch_mode": "CONTINUE_EXISTING", "generation": 1, "idempotency_key": format!("key-{id}-0001"),
        },
        "plan": {
            "schema": "airlock.plan.v1", "task_id": id, "job_id": format!("job-{id}"),
            "source_head_oid": HEAD, "generation": 1, "idempotency_key": format!("plan-{id}-0001"),
            "execution": {
                "action": "deterministic",
                "change_set": [{"path": "x.py", "operation": "write_file", "content": "x = 1\n"}],
                "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"]}],
                "capability_scope": ["git.test"],
            },
        },
        "max_attempts": 3,
    })
}

async fn timed<F, T>(samples: &mut Vec<Duration>, f: F) -> T
where
    F: std::future::Future<Output = T>,
{
    let t = Instant::now();
    let out = f.await;
    samples.push(t.elapsed());
    out
}

async fn bench(args: &Args, bus: &PrivateBus) -> Vec<Series> {
    airlock_testkit::supervisor::named(bus).await;
    let conn = bus.connect().await.expect("client connection");
    let client = Supervisor::on(conn.clone()).await.expect("client");
    let mut out = Vec::new();

    // SubmitTask.
    let mut samples = Vec::new();
    let start = Instant::now();
    for i in 0..args.tasks {
        let body = submission(i);
        timed(&mut samples, client.submit_task(&body))
            .await
            .expect("SubmitTask");
    }
    out.push(Series {
        name: "SubmitTask".into(),
        wall: start.elapsed(),
        calls: args.tasks,
        samples,
    });

    // GetTask, one caller.
    let mut samples = Vec::new();
    let start = Instant::now();
    for i in 0..args.gets {
        let id = format!("bench-{:06}", i % args.tasks.max(1));
        timed(&mut samples, client.get_task(&id))
            .await
            .expect("GetTask");
    }
    out.push(Series {
        name: "GetTask".into(),
        wall: start.elapsed(),
        calls: args.gets,
        samples,
    });

    // GetTask, concurrent callers on their own connections.
    let mut clients = Vec::new();
    for _ in 0..args.concurrency {
        clients.push(Supervisor::on(bus.connect().await.unwrap()).await.unwrap());
    }
    let per = args.gets / args.concurrency.max(1);
    let start = Instant::now();
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(c, client)| {
            let tasks = args.tasks.max(1);
            tokio::spawn(async move {
                let mut samples = Vec::new();
                for i in 0..per {
                    let id = format!("bench-{:06}", (i + c) % tasks);
                    timed(&mut samples, client.get_task(&id))
                        .await
                        .expect("GetTask");
                }
                samples
            })
        })
        .collect();
    let mut samples = Vec::new();
    for h in handles {
        samples.extend(h.await.unwrap());
    }
    out.push(Series {
        name: format!("GetTask x{} concurrent", args.concurrency),
        wall: start.elapsed(),
        calls: per * args.concurrency,
        samples,
    });

    // Claim, then SubmitResult, task by task.
    let (mut claims, mut results) = (Vec::new(), Vec::new());
    let (mut claim_wall, mut result_wall) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..args.tasks {
        let t = Instant::now();
        let grant = timed(&mut claims, client.claim())
            .await
            .expect("Claim")
            .expect("a queued task");
        claim_wall += t.elapsed();
        let result: TaskResult = serde_json::from_value(json!({
            "schema": "airlock.task-result.v1",
            "task_id": grant.task_id, "attempt": grant.attempt,
            "execution_digest": grant.envelope["execution_digest"],
            "outcome": "passed", "commit_oid": "c".repeat(40),
            "target_branch": grant.envelope["target_branch"],
            "exec_result_sha256": "e".repeat(64), "failure_code": null,
            "verification": [{"label": "compile", "exit_code": 0, "timed_out": false, "duration_ms": 3}],
            "isolation": {"landlock_abi": 7, "landlock": "full", "seccomp": "enforced", "namespaces": ["user", "mnt", "pid"], "view": "minimal-root", "uid": 992},
        }))
        .expect("a result");
        let key = format!("result-{}-1", grant.task_id);
        let t = Instant::now();
        timed(
            &mut results,
            client.submit_result(&LeaseRef::of(&grant), &key, &result),
        )
        .await
        .expect("SubmitResult");
        result_wall += t.elapsed();
    }
    out.push(Series {
        name: "Claim".into(),
        wall: claim_wall,
        calls: args.tasks,
        samples: claims,
    });
    out.push(Series {
        name: "SubmitResult".into(),
        wall: result_wall,
        calls: args.tasks,
        samples: results,
    });
    out
}

fn main() {
    let args = Args::parse();
    // The supervisor on its own runtime and threads, as in its own
    // process; the benchmark is its own admin (the local authoriser, no
    // polkit).
    let me = nix::unistd::getuid().as_raw();
    let sup = InProcess::builder(AuthorizerChoice::Local(LocalAuthorizer::new([me])))
        .sweep_interval(Duration::from_secs(15))
        .start_threaded();

    let client = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("client runtime");
    let series = client.block_on(bench(&args, &sup.bus));
    if let Err(e) = sup.stop_thread() {
        eprintln!("supervisor: {e}");
    }

    if args.json {
        let all: Vec<Value> = series.iter().map(Series::to_json).collect();
        println!("{}", json!({"bench": "bus", "results": all}));
        return;
    }
    println!(
        "airlock-supervisor over a private dbus-daemon (synchronous=FULL store, local authoriser)"
    );
    println!(
        "{:<26} {:>7} {:>12} {:>12} {:>10}",
        "call", "calls", "median", "p99", "calls/s"
    );
    for s in &series {
        println!(
            "{:<26} {:>7} {:>10.3}ms {:>10.3}ms {:>10.1}",
            s.name,
            s.calls,
            s.quantile(0.5).as_secs_f64() * 1000.0,
            s.quantile(0.99).as_secs_f64() * 1000.0,
            s.rate()
        );
    }
}
