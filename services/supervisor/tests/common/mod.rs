//! Scenario harness: a real dbus-daemon with the shipped policy, the real
//! `airlock-supervisor` binary as a child process (test authoriser, temp
//! DB), root clients over zbus, and unprivileged clients (`busctl`,
//! `dbus-send`) run as other uids.

#![allow(dead_code)]

use airlock_localbus::PrivateBus;
use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};
use zbus::Connection;

pub const NAME: &str = "org.airlock.Supervisor1";
pub const PATH: &str = "/org/airlock/Supervisor1";
pub const TASKS: &str = "org.airlock.Tasks2";
pub const WORKER: &str = "org.airlock.Worker1";

/// The uid the tests configure as the worker (`nobody`).
pub const WORKER_UID: u32 = 65534;
/// Some other unprivileged uid (`daemon`; dbus-daemon refuses uids that
/// have no passwd entry).
pub const STRANGER_UID: u32 = 1;

pub const BASE: &str = "a642b045775b9154a00ae78543037fbef4fb447b";
pub const HEAD: &str = "71523aef6e48b1e2fa516c456ca189b7a039104b";

/// How the supervisor under test is configured.
#[derive(Clone, Debug)]
pub struct Opts {
    pub authorizer: String,
    pub auto_accept: bool,
    pub lease_seconds: u32,
    pub sweep_interval_seconds: u32,
    pub extra_args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Run the supervisor as this uid (and the bus policy lets `user` own
    /// the name), instead of root.
    pub run_as: Option<(u32, &'static str)>,
    /// More bus policy files to include.
    pub extra_policies: Vec<PathBuf>,
    /// `[supervisor] database` instead of an SQLite file in the test's
    /// directory (e.g. a postgresql:// URL).
    pub database: Option<String>,
    /// More keys of `[supervisor]`, as TOML lines.
    pub supervisor_extra: String,
    /// More tables at the end of the file (`[[agent]]`, …).
    pub config_extra: String,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            authorizer: "allow-all-for-tests".into(),
            auto_accept: false,
            lease_seconds: 300,
            sweep_interval_seconds: 1,
            extra_args: vec![],
            env: vec![],
            run_as: None,
            extra_policies: vec![],
            database: None,
            supervisor_extra: String::new(),
            config_extra: String::new(),
        }
    }
}

/// A supervisor child process on a test bus.
#[derive(Debug)]
pub struct Supervisor {
    pub bus: PrivateBus,
    dir: tempfile::TempDir,
    pub db: PathBuf,
    pub config: PathBuf,
    pub opts: Opts,
    child: Option<Child>,
    notify: UnixDatagram,
    pub notifications: Vec<String>,
}

impl Supervisor {
    /// A new bus and a supervisor on it, ready (READY=1 received).
    pub fn start(opts: Opts) -> Supervisor {
        let owner = opts.run_as.map_or("root", |(_, user)| user);
        let extra: Vec<&Path> = opts.extra_policies.iter().map(PathBuf::as_path).collect();
        let bus = PrivateBus::start_with(owner, &extra).expect("start dbus-daemon");
        let dir = tempfile::tempdir().unwrap();
        if opts.run_as.is_some() {
            // The unprivileged supervisor creates its store here.
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        let db = dir.path().join("tasks.sqlite3");
        let config = dir.path().join("airlock.toml");
        std::fs::write(
            &config,
            format!(
                r#"[supervisor]
database = "{db}"
lease_seconds = {lease}
sweep_interval_seconds = {sweep}
auto_accept = {auto}
worker_user = "nobody"
authorizer = "polkit"
{supervisor_extra}
[worker]
renew_interval_seconds = 5

[[repository]]
name = "demo"
path = "/srv/git/demo.git"
{config_extra}"#,
                db = opts
                    .database
                    .clone()
                    .unwrap_or_else(|| db.display().to_string()),
                lease = opts.lease_seconds,
                sweep = opts.sweep_interval_seconds,
                auto = opts.auto_accept,
                supervisor_extra = opts.supervisor_extra,
                config_extra = opts.config_extra,
            ),
        )
        .unwrap();
        let notify_path = dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&notify_path).unwrap();
        std::fs::set_permissions(&notify_path, std::fs::Permissions::from_mode(0o666)).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut s = Supervisor {
            bus,
            dir,
            db,
            config,
            opts,
            child: None,
            notify,
            notifications: vec![],
        };
        s.spawn();
        s
    }

    /// The supervisor's log (all its runs).
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("supervisor.log")
    }

    fn notify_path(&self) -> PathBuf {
        self.dir.path().join("notify.sock")
    }

    /// Starts the child (again) on the same bus and DB and waits for READY.
    pub fn spawn(&mut self) {
        assert!(self.child.is_none(), "already running");
        self.notifications.clear();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock-supervisor"));
        cmd.arg("--config")
            .arg(&self.config)
            .arg("--bus-address")
            .arg(self.bus.address())
            .arg("--authorizer")
            .arg(&self.opts.authorizer)
            .args(&self.opts.extra_args)
            .env("NOTIFY_SOCKET", self.notify_path())
            .env("AIRLOCK_LOG", "debug")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .stdin(Stdio::null());
        for (k, v) in &self.opts.env {
            cmd.env(k, v);
        }
        if let Some((uid, _)) = self.opts.run_as {
            cmd.uid(uid).gid(uid);
        }
        // The supervisor's journal goes to a file (shown when a wait fails),
        // or to the terminal with AIRLOCK_TEST_VERBOSE=1.
        if std::env::var_os("AIRLOCK_TEST_VERBOSE").is_none() {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.log_path())
                .unwrap();
            cmd.stderr(Stdio::from(log));
        }
        self.child = Some(cmd.spawn().expect("spawn airlock-supervisor"));
        self.wait_notification("READY=1", Duration::from_secs(20));
    }

    /// Waits until a notification containing `needle` arrives.
    pub fn wait_notification(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        let mut buf = [0u8; 4096];
        loop {
            if let Some(found) = self.notifications.iter().find(|n| n.contains(needle)) {
                return found.clone();
            }
            if Instant::now() > deadline {
                panic!(
                    "no {needle:?} notification within {timeout:?}; got {:?}\n{}",
                    self.notifications,
                    std::fs::read_to_string(self.log_path()).unwrap_or_default()
                );
            }
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "supervisor exited early: {status}\n{}",
                        std::fs::read_to_string(self.log_path()).unwrap_or_default()
                    );
                }
            }
            if let Ok(n) = self.notify.recv(&mut buf) {
                self.notifications
                    .push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// Sends SIGTERM (does not wait).
    pub fn sigterm(&self) {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.pid() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
    }

    /// Waits for the child to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut c = self.child.take().expect("running");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                panic!("supervisor did not exit within {timeout:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A root client connection.
    pub async fn client(&self) -> Connection {
        self.bus.connect().await.expect("connect to the test bus")
    }

    /// Opens the task store directly (a second connection; WAL).
    pub fn store(&self) -> airlock_taskdb::tasks::SqliteStore {
        airlock_taskdb::tasks::SqliteStore::open(&self.db).unwrap()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A D-Bus error as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusErr {
    pub name: String,
    pub message: String,
}

impl BusErr {
    pub fn code(&self) -> Option<airlock_proto::Code> {
        airlock_proto::Code::from_dbus_error_name(&self.name)
    }
}

fn to_bus_err(e: zbus::Error) -> BusErr {
    match e {
        zbus::Error::MethodError(name, msg, _) => BusErr {
            name: name.to_string(),
            message: msg.unwrap_or_default(),
        },
        other => BusErr {
            name: "transport".into(),
            message: other.to_string(),
        },
    }
}

/// Calls a method returning one string.
pub async fn call_s<B>(
    conn: &Connection,
    iface: &str,
    method: &str,
    body: &B,
) -> Result<String, BusErr>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    let reply = conn
        .call_method(Some(NAME), PATH, Some(iface), method, body)
        .await
        .map_err(to_bus_err)?;
    Ok(reply.body().deserialize::<String>().unwrap())
}

/// Calls a method returning one string holding JSON.
pub async fn call_json<B>(
    conn: &Connection,
    iface: &str,
    method: &str,
    body: &B,
) -> Result<Value, BusErr>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    let s = call_s(conn, iface, method, body).await?;
    Ok(serde_json::from_str(&s).unwrap())
}

/// Reads a property.
pub async fn property<T>(conn: &Connection, name: &str) -> T
where
    T: TryFrom<zbus::zvariant::OwnedValue>,
    <T as TryFrom<zbus::zvariant::OwnedValue>>::Error: std::fmt::Debug,
{
    let reply = conn
        .call_method(
            Some(NAME),
            PATH,
            Some("org.freedesktop.DBus.Properties"),
            "Get",
            &(TASKS, name),
        )
        .await
        .unwrap();
    let v: zbus::zvariant::OwnedValue = reply.body().deserialize().unwrap();
    T::try_from(v).unwrap()
}

pub fn binding(task_id: &str) -> Value {
    json!({
        "task_id": task_id, "job_id": format!("job-{task_id}"), "repository": "demo",
        "base_oid": BASE, "expected_branch_oid": HEAD, "target_branch": format!("agent/{task_id}"),
        "branch_mode": "CONTINUE_EXISTING", "generation": 1, "idempotency_key": format!("key-{task_id}-0001"),
    })
}

pub fn execution(content: &str) -> Value {
    json!({
        "action": "deterministic",
        "change_set": [{"path": "x.py", "operation": "write_file", "content": content}],
        "verification": [{"label": "compile", "argv": ["/usr/bin/python3", "-m", "py_compile", "x.py"]}],
        "capability_scope": ["git.test", "git.read"],
    })
}

pub fn plan(task_id: &str, version: u32, previous: Option<&str>) -> Value {
    let mut p = json!({
        "schema": "airlock.plan.v1", "task_id": task_id, "job_id": format!("job-{task_id}"),
        "source_head_oid": HEAD, "generation": 1,
        "idempotency_key": format!("plan-{task_id}-v{version}"),
        "execution": execution(&format!("x = {version}\n")),
    });
    if let Some(d) = previous {
        p["expected_previous_plan_digest"] = json!(d);
    }
    p
}

pub fn submission(task_id: &str) -> Value {
    json!({"schema": "airlock.task.v1", "binding": binding(task_id), "plan": plan(task_id, 1, None), "max_attempts": 2})
}

/// A passed result for a claim grant.
pub fn passed_result(grant: &Value) -> Value {
    json!({
        "schema": "airlock.task-result.v1",
        "task_id": grant["task_id"],
        "attempt": grant["attempt"],
        "execution_digest": grant["envelope"]["execution_digest"],
        "outcome": "passed",
        "commit_oid": "c".repeat(40),
        "target_branch": grant["envelope"]["target_branch"],
        "exec_result_sha256": "e".repeat(64),
        "failure_code": null,
        "verification": [{"label": "compile", "exit_code": 0, "timed_out": false, "duration_ms": 12}],
        "isolation": {"landlock_abi": 7, "landlock": "full", "seccomp": "enforced", "namespaces": ["user", "mnt", "pid"], "view": "minimal-root", "uid": 992},
    })
}

/// Runs a program as `uid` (and its own gid), with no supplementary groups.
pub fn run_as(uid: u32, program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .uid(uid)
        .gid(uid)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {program} as uid {uid}: {e}"))
}

/// `busctl call` as `uid`; Ok(stdout JSON) or Err(stderr).
pub fn busctl_call(
    sup: &Supervisor,
    uid: u32,
    iface: &str,
    method: &str,
    sig_and_args: &[&str],
) -> Result<Value, String> {
    let address = format!("--address={}", sup.bus.address());
    let mut args = vec![
        address.as_str(),
        "--json=short",
        "call",
        NAME,
        PATH,
        iface,
        method,
    ];
    args.extend_from_slice(sig_and_args);
    let out = run_as(uid, "/usr/bin/busctl", &args);
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The first returned value of a `busctl --json=short` reply.
pub fn busctl_data(v: &Value) -> &Value {
    &v["data"][0]
}

/// `dbus-send --print-reply` as `uid`; Err((error name, message)) on an error reply.
pub fn dbus_send(
    sup: &Supervisor,
    uid: u32,
    iface_method: &str,
    args: &[&str],
) -> Result<String, BusErr> {
    dbus_send_at(sup.bus.address(), uid, iface_method, args)
}

/// [`dbus_send`] to the supervisor on the bus at `address`.
pub fn dbus_send_at(
    address: &str,
    uid: u32,
    iface_method: &str,
    args: &[&str],
) -> Result<String, BusErr> {
    let bus = format!("--bus={address}");
    let mut argv = vec![
        bus.as_str(),
        "--print-reply",
        "--dest=org.airlock.Supervisor1",
        PATH,
        iface_method,
    ];
    argv.extend_from_slice(args);
    let out = run_as(uid, "/usr/bin/dbus-send", &argv);
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        // "Error org.airlock.Error.PEER_UID_DENIED: message"
        let line = err
            .lines()
            .find(|l| l.starts_with("Error "))
            .unwrap_or(&err);
        let rest = line.trim_start_matches("Error ");
        let (name, message) = rest.split_once(": ").unwrap_or((rest, ""));
        Err(BusErr {
            name: name.trim().to_owned(),
            message: message.trim().to_owned(),
        })
    }
}

/// Claim as the worker uid via busctl; the grant JSON, or Null.
pub fn worker_claim(sup: &Supervisor) -> Value {
    let v = busctl_call(sup, WORKER_UID, WORKER, "Claim", &[]).expect("claim as the worker");
    serde_json::from_str(busctl_data(&v).as_str().unwrap()).unwrap()
}

/// Renew as the worker uid via busctl.
pub fn worker_renew(sup: &Supervisor, uid: u32, grant: &Value, epoch: u64) -> Result<i64, String> {
    let epoch = epoch.to_string();
    let v = busctl_call(
        sup,
        uid,
        WORKER,
        "Renew",
        &[
            "sts",
            grant["task_id"].as_str().unwrap(),
            &epoch,
            grant["lease_token"].as_str().unwrap(),
        ],
    )?;
    Ok(busctl_data(&v).as_i64().unwrap())
}

/// SubmitResult as `uid` via busctl.
pub fn worker_submit(
    sup: &Supervisor,
    uid: u32,
    grant: &Value,
    epoch: u64,
    result: &Value,
) -> Result<Value, String> {
    let epoch = epoch.to_string();
    let key = format!(
        "result-{}-{}",
        grant["task_id"].as_str().unwrap(),
        grant["attempt"]
    );
    let result = result.to_string();
    let v = busctl_call(
        sup,
        uid,
        WORKER,
        "SubmitResult",
        &[
            "stsss",
            grant["task_id"].as_str().unwrap(),
            &epoch,
            grant["lease_token"].as_str().unwrap(),
            &key,
            &result,
        ],
    )?;
    Ok(serde_json::from_str(busctl_data(&v).as_str().unwrap()).unwrap())
}

/// Submits a task as root; returns the reply JSON.
pub async fn submit(conn: &Connection, task_id: &str) -> Value {
    call_json(
        conn,
        TASKS,
        "SubmitTask",
        &(submission(task_id).to_string(),),
    )
    .await
    .expect("submit")
}

/// A supervisor whose planner agents are real processes, started by a
/// real AgentHost1 (the process driver, served here as airlock-local
/// serves it), as user airlock-agent (or nobody).
pub struct Stack {
    pub sup: Supervisor,
    pub host: Connection,
    _policy: tempfile::TempDir,
}

impl Stack {
    /// `opts` (the agent driver and the host's bus policy added), with
    /// the `[[agent]]` tables `agents` and more tables `more_config`.
    pub async fn start(opts: Opts, agents: &str, more_config: &str) -> Stack {
        Stack::start_with_host(opts, agents, "", more_config).await
    }

    /// [`Stack::start`], the host also knowing the `[[agent]]` tables
    /// `host_only` (agents a reload adds later).
    pub async fn start_with_host(
        opts: Opts,
        agents: &str,
        host_only: &str,
        more_config: &str,
    ) -> Stack {
        use airlock_agents::host::{AgentHost, bus_policy, serve};
        use airlock_agents::process::{Identity, ProcessDriver};
        let policy_dir = tempfile::tempdir().unwrap();
        let policy = policy_dir.path().join("org.airlock.AgentHost1.conf");
        std::fs::write(&policy, bus_policy("root", "root")).unwrap();
        let config = airlock_config::Config::parse(
            &format!(
                "[[repository]]\nname = \"demo\"\npath = \"/srv/git/demo.git\"\n{more_config}{agents}{host_only}"
            ),
            std::path::Path::new("agents.toml"),
        )
        .unwrap();
        // The harness starts the bus with a supervisor (no agents yet); the
        // host takes its name; then the supervisor restarts with the agents.
        let mut extra_policies = opts.extra_policies.clone();
        extra_policies.push(policy.clone());
        let opts = Opts {
            supervisor_extra: format!("{}agent_driver = \"local-host\"\n", opts.supervisor_extra),
            config_extra: format!("{}{more_config}", opts.config_extra),
            extra_policies,
            ..opts
        };
        let mut sup = Supervisor::start(opts);
        let host_conn = zbus::connection::Builder::address(sup.bus.address())
            .unwrap()
            .build()
            .await
            .unwrap();
        let identity = Identity::lookup("airlock-agent")
            .or_else(|_| Identity::lookup("nobody"))
            .unwrap();
        let env = vec![(
            "DBUS_SYSTEM_BUS_ADDRESS".to_owned(),
            sup.bus.address().to_owned(),
        )];
        let driver = ProcessDriver::new(Some(identity), sup.dir().join("agents"), env)
            .unwrap()
            .with_grace(Duration::from_millis(500));
        serve(
            &host_conn,
            AgentHost::new(std::sync::Arc::new(driver), config.agents, 0),
        )
        .await
        .unwrap();
        sup.sigterm();
        sup.wait_exit(Duration::from_secs(20));
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&sup.config)
            .unwrap();
        std::io::Write::write_all(&mut file, agents.as_bytes()).unwrap();
        sup.spawn();
        Stack {
            sup,
            host: host_conn,
            _policy: policy_dir,
        }
    }
}

/// A directory under /tmp the agents' user may write (sticky, 1777).
pub fn scratch_dir(prefix: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .unwrap();
    dir
}

/// A bus connection authenticated as `uid`: the socket is connected by a
/// thread whose effective uid alone was switched, so the bus daemon
/// records `uid` as its peer (the kernel's, not a claim).
pub async fn connect_as(address: &str, uid: u32) -> Connection {
    let path = address
        .strip_prefix("unix:path=")
        .and_then(|a| a.split(',').next())
        .expect("a unix:path address")
        .to_owned();
    let stream = std::thread::spawn(move || {
        // SAFETY: the raw system call (unlike glibc's setresuid, which
        // changes every thread) sets the effective uid of this thread
        // alone; it only connects one socket and ends, and no other
        // thread's credentials change.
        let rc = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_setresuid,
                u32::MAX, // -1: keep
                uid,
                u32::MAX,
            )
        };
        assert_eq!(rc, 0, "setresuid for this thread");
        UnixStream::connect(&path).expect("connect to the bus as another uid")
    })
    .join()
    .unwrap();
    stream.set_nonblocking(true).unwrap();
    let stream = tokio::net::UnixStream::from_std(stream).unwrap();
    zbus::connection::Builder::unix_stream(stream)
        .user_id(uid)
        .build()
        .await
        .expect("a bus connection as another uid")
}

/// The arguments of a call of D-Bus signature `signature` (of the
/// contract's basic types), every string `text` and every number the
/// largest of its type; `None` for no arguments.
pub fn arguments(signature: &str, text: &str) -> Option<zbus::zvariant::Structure<'static>> {
    if signature.is_empty() {
        return None;
    }
    let mut b = zbus::zvariant::StructureBuilder::new();
    for c in signature.chars() {
        b = match c {
            's' => b.add_field(text.to_owned()),
            'u' => b.add_field(u32::MAX),
            'i' => b.add_field(i32::MIN),
            'x' => b.add_field(i64::MIN),
            't' => b.add_field(u64::MAX),
            'b' => b.add_field(true),
            other => panic!("no argument of D-Bus type {other:?}"),
        };
    }
    Some(b.build().expect("a structure of basic types"))
}

/// Calls `interface.method` with arguments of `signature` ([`arguments`]);
/// the reply's signature, or the error as the caller saw it.
pub async fn call_with_signature(
    conn: &Connection,
    interface: &str,
    method: &str,
    signature: &str,
    text: &str,
) -> Result<String, BusErr> {
    let reply = match arguments(signature, text) {
        None => {
            conn.call_method(Some(NAME), PATH, Some(interface), method, &())
                .await
        }
        Some(args) => {
            conn.call_method(Some(NAME), PATH, Some(interface), method, &args)
                .await
        }
    }
    .map_err(to_bus_err)?;
    Ok(reply.body().signature().to_string_no_parens())
}

/// Waits (a minute at most) until `path` exists.
pub async fn wait_file(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !path.exists() {
        assert!(Instant::now() < deadline, "never written: {path:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
