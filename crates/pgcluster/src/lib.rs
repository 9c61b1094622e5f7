//! airlock-pgcluster: a throwaway PostgreSQL cluster for tests and
//! benchmarks, from Debian's `postgresql` package (`scripts/deps.sh`
//! installs it).
//!
//! [`Cluster::start`] copies a template made once by `initdb` (cached per
//! PostgreSQL version under the temporary directory), then runs `postgres`
//! in the foreground as a child of the calling thread — as the `postgres`
//! user when the caller is root, which PostgreSQL requires — with its UNIX
//! socket in the cluster's own directory and, if asked, a loopback TCP
//! port. The child gets SIGQUIT (immediate shutdown) when the thread that
//! started it dies, so a killed test leaves no server behind; dropping the
//! [`Cluster`] stops it and removes its directory.
//!
//! Authentication is what a deployment would use: the superuser
//! `postgres` is trusted on the socket (the harness's own connection);
//! every other role must present a SCRAM password.
//!
//! [`Cluster::create_store_database`] prepares a database the way
//! docs/postgresql.md tells an administrator to: an owner role that runs
//! migrations, a login role for the supervisors, and the
//! `airlock_supervisor` group role that the schema grants to.
//!
//! [`Cluster::start_in`] runs the server inside a network namespace of a
//! [`network::Network`] the test made, listening there on TCP, so that
//! hosts in other namespaces reach it over a link the test can cut.
//!
//! Nothing here skips: without PostgreSQL installed, [`Cluster::start`]
//! fails and says what to install.
//!
//! Owns: a throwaway PostgreSQL cluster (initdb, pg_ctl) for tests and
//! benchmarks.
//! Never: be linked by a shipped service, or reach a cluster it did not
//! start.

pub mod network;

use nix::unistd::{Gid, Uid, User};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Bumped when the template's contents change (a new setting, a new role).
const TEMPLATE_FORMAT: u32 = 2;

/// Where the server listens besides its UNIX socket.
#[derive(Clone, Debug)]
enum Listen {
    /// Nowhere else.
    Socket,
    /// 127.0.0.1.
    Loopback,
    /// Every address of this network namespace (`/run/netns/NAME`), which
    /// the server runs in.
    Namespace(PathBuf),
}

/// A running cluster.
#[derive(Debug)]
pub struct Cluster {
    dir: PathBuf,
    data: PathBuf,
    socket_dir: PathBuf,
    bin: PathBuf,
    port: u16,
    listen: Listen,
    /// The server's certificate and key (PEM), in the cluster's directory.
    ssl: Option<(PathBuf, PathBuf)>,
    owner: Option<(Uid, Gid)>,
    child: Option<Child>,
}

/// A database prepared like a deployment's (see the crate docs).
#[derive(Clone, Debug)]
pub struct StoreDatabase {
    /// The database name.
    pub name: String,
    /// URL of the schema owner's role (no password in it).
    pub owner_url: String,
    /// The owner's password.
    pub owner_password: String,
    /// URL of the supervisors' login role (no password in it).
    pub url: String,
    /// Its password.
    pub password: String,
    /// The supervisors' login role.
    pub role: String,
}

/// How to start a cluster.
#[derive(Clone, Copy, Debug, Default)]
pub struct Options {
    /// Also listen on 127.0.0.1 (a free port chosen at start).
    pub tcp: bool,
}

fn err(what: &str, e: impl std::fmt::Display) -> String {
    format!("{what}: {e}")
}

/// A PostgreSQL error with the server's own words.
fn pg_err(what: &str, e: &postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{what}: {} {}: {}",
            db.severity(),
            db.code().code(),
            db.message()
        ),
        None => format!("{what}: {e}"),
    }
}

/// The newest `/usr/lib/postgresql/<version>/bin` with initdb and postgres.
pub fn bin_dir() -> Result<PathBuf, String> {
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map_err(|_| {
            "PostgreSQL is not installed (no /usr/lib/postgresql): install Debian's postgresql package (scripts/deps.sh does)".to_owned()
        })?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            (bin.join("initdb").exists() && bin.join("postgres").exists()).then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, b)| b)
        .ok_or_else(|| "no initdb under /usr/lib/postgresql/*/bin: install postgresql".to_owned())
}

fn postgres_ids() -> Result<Option<(Uid, Gid)>, String> {
    if !Uid::effective().is_root() {
        return Ok(None);
    }
    let u = User::from_name("postgres")
        .map_err(|e| err("looking up user postgres", e))?
        .ok_or("user postgres does not exist (the postgresql package creates it)")?;
    Ok(Some((u.uid, u.gid)))
}

fn chown(path: &Path, owner: Option<(Uid, Gid)>) -> Result<(), String> {
    if let Some((u, g)) = owner {
        nix::unistd::chown(path, Some(u), Some(g))
            .map_err(|e| err(&format!("chown {}", path.display()), e))?;
    }
    Ok(())
}

/// Runs `cmd` as `owner` (when set); fails with its output.
fn run(mut cmd: Command, owner: Option<(Uid, Gid)>, what: &str) -> Result<(), String> {
    if let Some((u, g)) = owner {
        // std drops the supplementary groups when root switches uid.
        cmd.uid(u.as_raw()).gid(g.as_raw());
    }
    let out = cmd.output().map_err(|e| err(what, e))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

const HBA: &str = "\
# airlock test cluster: the harness's superuser is trusted on the socket;
# every other role presents a SCRAM password, as in a deployment.
local all postgres trust
local all all scram-sha-256
host all postgres 127.0.0.1/32 trust
host all all 127.0.0.1/32 scram-sha-256
# The hosts of a test's own network (Cluster::start_in), on the server's
# directly connected subnets only.
host all all samenet scram-sha-256
";

/// The template data directory for this PostgreSQL, made once.
fn template(bin: &Path, owner: Option<(Uid, Gid)>) -> Result<PathBuf, String> {
    let version = bin
        .parent()
        .and_then(Path::file_name)
        .and_then(|v| v.to_str())
        .unwrap_or("x")
        .to_owned();
    let base = std::env::temp_dir();
    let path = base.join(format!(
        "airlock-pg-template-{version}-f{TEMPLATE_FORMAT}-u{}",
        Uid::effective()
    ));
    if path.join("PG_VERSION").exists() {
        return Ok(path);
    }
    let staging = base.join(format!(
        "airlock-pg-template-staging-{}-{}",
        std::process::id(),
        std::thread::current()
            .name()
            .unwrap_or("t")
            .replace("::", "-")
    ));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir(&staging).map_err(|e| err("creating the template", e))?;
    std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| err("template mode", e))?;
    chown(&staging, owner)?;
    let mut initdb = Command::new(bin.join("initdb"));
    initdb
        .args(["-D"])
        .arg(&staging)
        .args([
            "-U",
            "postgres",
            "-A",
            "trust",
            "-E",
            "UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        ])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LC_ALL", "C.UTF-8");
    if let Err(e) = run(initdb, owner, "initdb") {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    std::fs::write(staging.join("pg_hba.conf"), HBA).map_err(|e| err("pg_hba.conf", e))?;
    chown(&staging.join("pg_hba.conf"), owner)?;
    match std::fs::rename(&staging, &path) {
        Ok(()) => Ok(path),
        Err(_) if path.join("PG_VERSION").exists() => {
            let _ = std::fs::remove_dir_all(&staging);
            Ok(path)
        }
        Err(e) => Err(err("publishing the template", e)),
    }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| err("finding a port", e))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| err("finding a port", e))
}

impl Cluster {
    /// Starts a cluster reachable on its UNIX socket only.
    pub fn start() -> Result<Cluster, String> {
        Cluster::start_with(Options::default())
    }

    /// Starts a cluster with `options`.
    pub fn start_with(options: Options) -> Result<Cluster, String> {
        let listen = if options.tcp {
            Listen::Loopback
        } else {
            Listen::Socket
        };
        Cluster::start_inner(listen, None)
    }

    /// Starts a cluster inside network namespace `netns` (root only: the
    /// server joins it before dropping to its user), listening on every
    /// address there, port 5432, and on its UNIX socket (the harness's
    /// own connection, which no partition cuts). Hosts reach it at
    /// [`network::SERVER_ADDRESS`] ([`Cluster::tcp_url_at`]) and present
    /// a SCRAM password.
    pub fn start_in(netns: &network::Netns) -> Result<Cluster, String> {
        Cluster::start_inner(Listen::Namespace(netns.path()), None)
    }

    /// Starts a cluster that also listens on 127.0.0.1 with TLS (`ssl=on`),
    /// presenting the certificate `cert` (PEM, the chain the server sends)
    /// with its key `key`. Both are copied into the cluster's directory,
    /// owned by the server's user with mode 0600 as PostgreSQL requires.
    /// Plaintext TCP is still accepted: refusing it is the client's part.
    pub fn start_with_tls(cert: &Path, key: &Path) -> Result<Cluster, String> {
        Cluster::start_inner(Listen::Loopback, Some((cert.to_owned(), key.to_owned())))
    }

    fn start_inner(listen: Listen, ssl: Option<(PathBuf, PathBuf)>) -> Result<Cluster, String> {
        let bin = bin_dir()?;
        let owner = postgres_ids()?;
        let template = template(&bin, owner)?;
        let dir = tempfile::Builder::new()
            .prefix("airlock-pg-")
            .tempdir()
            .map_err(|e| err("temporary directory", e))?
            .keep();
        // The server (maybe another uid) and the daemons under test reach
        // the socket through here.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| err("cluster directory mode", e))?;
        let data = dir.join("data");
        let socket_dir = dir.join("socket");
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(&template).arg(&data);
        run(cp, None, "copying the template cluster")?;
        std::fs::create_dir(&socket_dir).map_err(|e| err("socket directory", e))?;
        std::fs::set_permissions(&socket_dir, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| err("socket directory mode", e))?;
        chown(&socket_dir, owner)?;
        let port = match listen {
            Listen::Loopback => free_port()?,
            // Alone in its namespace (and its socket in its own directory).
            Listen::Socket | Listen::Namespace(_) => 5432,
        };
        let ssl = match ssl {
            None => None,
            Some((cert, key)) => {
                let tls = dir.join("tls");
                std::fs::create_dir(&tls).map_err(|e| err("TLS directory", e))?;
                chown(&tls, owner)?;
                let mut copied = Vec::new();
                for (from, name) in [(cert, "server.crt"), (key, "server.key")] {
                    let to = tls.join(name);
                    std::fs::copy(&from, &to)
                        .map_err(|e| err(&format!("copying {}", from.display()), e))?;
                    std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o600))
                        .map_err(|e| err("TLS file mode", e))?;
                    chown(&to, owner)?;
                    copied.push(to);
                }
                let key = copied.pop();
                let cert = copied.pop();
                cert.zip(key)
            }
        };
        let mut cluster = Cluster {
            dir,
            data,
            socket_dir,
            bin,
            port,
            listen,
            ssl,
            owner,
            child: None,
        };
        cluster.spawn()?;
        Ok(cluster)
    }

    fn spawn(&mut self) -> Result<(), String> {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.join("postgres.log"))
            .map_err(|e| err("server log", e))?;
        let mut cmd = Command::new(self.bin.join("postgres"));
        if let Some((cert, key)) = &self.ssl {
            cmd.args(["-c", "ssl=on", "-c"])
                .arg(format!("ssl_cert_file={}", cert.display()))
                .arg("-c")
                .arg(format!("ssl_key_file={}", key.display()));
        }
        cmd.arg("-D")
            .arg(&self.data)
            .arg("-k")
            .arg(&self.socket_dir)
            .arg("-p")
            .arg(self.port.to_string())
            .args([
                "-c",
                match self.listen {
                    Listen::Socket => "listen_addresses=",
                    Listen::Loopback => "listen_addresses=127.0.0.1",
                    Listen::Namespace(_) => "listen_addresses=*",
                },
                "-c",
                "unix_socket_permissions=0777",
                "-c",
                "max_connections=200",
                "-c",
                "shared_buffers=64MB",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                "-c",
                "password_encryption=scram-sha-256",
            ])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("LC_ALL", "C.UTF-8")
            .stdin(Stdio::null())
            .stdout(log.try_clone().map_err(|e| err("server log", e))?)
            .stderr(log);
        let owner = self.owner;
        // Opened before the fork: the child only calls setns(2) on it.
        let netns = match &self.listen {
            Listen::Namespace(path) => Some(
                std::fs::File::open(path)
                    .map_err(|e| err(&format!("opening {}", path.display()), e))?,
            ),
            Listen::Socket | Listen::Loopback => None,
        };
        // SAFETY: the closure runs in the forked child before exec and only
        // makes system calls (setns, setgroups, setresgid, setresuid,
        // prctl) on values prepared before the fork; it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                if let Some(ns) = &netns {
                    nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                }
                if let Some((u, g)) = owner {
                    nix::unistd::setgroups(&[])?;
                    nix::unistd::setresgid(g, g, g)?;
                    nix::unistd::setresuid(u, u, u)?;
                }
                // After the id switch, which clears it.
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGQUIT)?;
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|e| err("starting postgres", e))?;
        self.child = Some(child);
        self.wait_ready(Duration::from_secs(30))
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<(), String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    return Err(format!(
                        "postgres exited ({status}):\n{}",
                        self.log_tail(20)
                    ));
                }
            }
            if postgres::Client::connect(&self.superuser_params("postgres"), postgres::NoTls)
                .is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "postgres did not accept connections in {timeout:?}:\n{}",
                    self.log_tail(20)
                ));
            }
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// The directory holding the server's UNIX socket.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The port (of the socket file name, and of TCP when enabled).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    fn superuser_params(&self, db: &str) -> String {
        format!(
            "host={} port={} user=postgres dbname={db} connect_timeout=5",
            self.socket_dir.display(),
            self.port
        )
    }

    /// A superuser session on `db` (the harness's own connection).
    pub fn superuser(&self, db: &str) -> Result<postgres::Client, String> {
        postgres::Client::connect(&self.superuser_params(db), postgres::NoTls)
            .map_err(|e| pg_err(&format!("connecting to {db} as postgres"), &e))
    }

    /// A URL for `user` on `db` through the UNIX socket.
    pub fn url(&self, user: &str, db: &str) -> String {
        format!(
            "postgresql://{user}@{}:{}/{db}",
            percent_path(&self.socket_dir),
            self.port
        )
    }

    /// A URL for `user` on `db` over loopback TCP (with [`Options::tcp`]).
    pub fn tcp_url(&self, user: &str, db: &str) -> String {
        self.tcp_url_at(std::net::Ipv4Addr::LOCALHOST.into(), user, db)
    }

    /// A URL for `user` on `db` over TCP to `host` (with
    /// [`Cluster::start_in`]: [`network::SERVER_ADDRESS`]).
    pub fn tcp_url_at(&self, host: std::net::IpAddr, user: &str, db: &str) -> String {
        format!("postgresql://{user}@{host}:{}/{db}", self.port)
    }

    /// Creates database `name` as a deployment would (docs/postgresql.md):
    /// roles `<name>_owner` (owns the database, runs migrations) and
    /// `<name>` (the supervisors' login, a member of `airlock_supervisor`),
    /// each with a random password.
    pub fn create_store_database(&self, name: &str) -> Result<StoreDatabase, String> {
        let owner = format!("{name}_owner");
        let owner_password = random_password()?;
        let password = random_password()?;
        let mut su = self.superuser("postgres")?;
        su.batch_execute(&format!(
            "DO $$ BEGIN \
               IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'airlock_supervisor') THEN \
                 CREATE ROLE airlock_supervisor NOLOGIN; END IF; END $$; \
             CREATE ROLE {owner} LOGIN PASSWORD '{owner_password}'; \
             CREATE ROLE {name} LOGIN PASSWORD '{password}' IN ROLE airlock_supervisor;"
        ))
        .map_err(|e| pg_err(&format!("creating the roles of {name}"), &e))?;
        su.batch_execute(&format!("CREATE DATABASE {name} OWNER {owner}"))
            .map_err(|e| pg_err(&format!("creating database {name}"), &e))?;
        Ok(StoreDatabase {
            name: name.to_owned(),
            owner_url: self.url(&owner, name),
            owner_password,
            url: self.url(name, name),
            password,
            role: name.to_owned(),
        })
    }

    /// Stops the server the way `pg_ctl stop -m fast` does (SIGINT) and
    /// waits for it.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                match child.try_wait() {
                    Ok(Some(_)) | Err(_) => break,
                    Ok(None) if Instant::now() > deadline => {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        }
    }

    /// Stops the server abruptly (SIGQUIT: no checkpoint, crash recovery at
    /// the next start), as a crash would.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT);
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same data (after [`Cluster::stop`]
    /// or [`Cluster::crash`]).
    pub fn start_again(&mut self) -> Result<(), String> {
        if self.child.is_some() {
            return Ok(());
        }
        // An immediate stop leaves the socket's lock file behind.
        let _ = std::fs::remove_file(self.socket_dir.join(format!(".s.PGSQL.{}.lock", self.port)));
        self.spawn()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.crash();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn percent_path(p: &Path) -> String {
    let mut out = String::new();
    for b in p.as_os_str().as_encoded_bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(*b as char)
            }
            other => out.push_str(&format!("%{other:02X}")),
        }
    }
    out
}

fn random_password() -> Result<String, String> {
    let mut bytes = [0u8; 16];
    let mut f = std::fs::File::open("/dev/urandom").map_err(|e| err("randomness", e))?;
    std::io::Read::read_exact(&mut f, &mut bytes).map_err(|e| err("randomness", e))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_starts_authenticates_and_stops() {
        let mut c = Cluster::start_with(Options { tcp: true }).unwrap();
        let db = c.create_store_database("airlock").unwrap();
        // The supervisors' role needs its password.
        let without = postgres::Client::connect(
            &format!(
                "host={} port={} user=airlock dbname=airlock",
                c.socket_dir().display(),
                c.port()
            ),
            postgres::NoTls,
        );
        assert!(without.is_err(), "no password must be refused");
        let mut cfg: postgres::Config = db.url.parse().unwrap();
        cfg.password(db.password.as_str());
        let mut client = cfg.connect(postgres::NoTls).unwrap();
        let one: i32 = client.query_one("SELECT 1", &[]).unwrap().get(0);
        assert_eq!(one, 1);
        let mut tcp: postgres::Config = c.tcp_url("airlock", "airlock").parse().unwrap();
        tcp.password(db.password.as_str());
        assert!(tcp.connect(postgres::NoTls).is_ok());
        // Restart on the same data.
        c.crash();
        assert!(client.query_one("SELECT 1", &[]).is_err());
        c.start_again().unwrap();
        let mut again = cfg.connect(postgres::NoTls).unwrap();
        assert!(again.query_one("SELECT 1", &[]).is_ok());
        let pid = c.pid().unwrap();
        drop(c);
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z "))
        );
    }
}
