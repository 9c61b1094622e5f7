//! airlock-localbus: a private, system-like D-Bus daemon, for airlock-local
//! (which runs the suite without a system bus), the tests and the benchmarks.
//!
//! The bus is a real `dbus-daemon` (Debian package `dbus`) on a unix socket
//! in a temporary directory, with the system bus's default policy (anyone
//! may connect, nobody may own a name or send a method call unless a
//! policy file punches a hole) plus airlock's shipped policy
//! `dbus/org.airlock.Supervisor1.conf`, in which the owner `user="airlock"`
//! is replaced by the user the test runs the supervisor as. So tests
//! exercise the shipped policy, not a permissive stand-in.
//!
//! Owns: a private dbus-daemon with airlock's policy, for airlock-local and
//! the tests.
//! Never: stand in for the system bus in a packaged service: installed
//! systems use the real one.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The shipped bus policy, as installed to `/usr/share/dbus-1/system.d/`.
pub const SHIPPED_POLICY: &str = include_str!("../../../dbus/org.airlock.Supervisor1.conf");

/// The system bus's default policy, trimmed to what matters here.
const SYSTEM_LIKE: &str = r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=@SOCKET@</listen>
  <auth>EXTERNAL</auth>
  <policy context="default">
    <allow user="*"/>
    <deny own="*"/>
    <deny send_type="method_call"/>
    <allow send_type="signal"/>
    <allow send_requested_reply="true" send_type="method_return"/>
    <allow send_requested_reply="true" send_type="error"/>
    <allow receive_type="method_call"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Introspectable"/>
    <allow send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus.Properties"/>
    <deny send_destination="org.freedesktop.DBus" send_interface="org.freedesktop.DBus" send_member="UpdateActivationEnvironment"/>
  </policy>
  <include>@POLICY@</include>
@EXTRA@</busconfig>
"#;

/// A running private bus; killed when dropped.
#[derive(Debug)]
pub struct PrivateBus {
    dir: tempfile::TempDir,
    child: Child,
    address: String,
}

impl PrivateBus {
    /// Starts a bus whose airlock policy lets `root` own the name (tests
    /// run the supervisor as root).
    pub fn start() -> std::io::Result<PrivateBus> {
        PrivateBus::start_with_owner("root")
    }

    /// Starts a bus whose airlock policy lets `owner` own the name.
    pub fn start_with_owner(owner: &str) -> std::io::Result<PrivateBus> {
        PrivateBus::start_with(owner, &[])
    }

    /// Starts a bus whose airlock policy lets `owner` own the name, with
    /// more policy files included (e.g. polkit's own, to run polkitd on it).
    pub fn start_with(owner: &str, extra_policies: &[&Path]) -> std::io::Result<PrivateBus> {
        let dir = tempfile::Builder::new().prefix("airlock-bus-").tempdir()?;
        // Other uids (the tests' unprivileged clients) must reach the socket.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let socket = dir.path().join("system_bus_socket");
        let policy = dir.path().join("org.airlock.Supervisor1.conf");
        std::fs::write(
            &policy,
            SHIPPED_POLICY.replace("user=\"airlock\"", &format!("user=\"{owner}\"")),
        )?;
        let config = dir.path().join("bus.conf");
        std::fs::write(
            &config,
            SYSTEM_LIKE
                .replace("@SOCKET@", &socket.display().to_string())
                .replace("@POLICY@", &policy.display().to_string())
                .replace(
                    "@EXTRA@",
                    &extra_policies
                        .iter()
                        .map(|p| format!("  <include>{}</include>\n", p.display()))
                        .collect::<String>(),
                ),
        )?;
        // The daemon's own complaints (it cannot raise its fd limit in a
        // container) go to a log beside the socket, not into test output.
        let log = std::fs::File::create(dir.path().join("dbus-daemon.log"))?;
        let mut child = Command::new(dbus_daemon())
            .arg(format!("--config-file={}", config.display()))
            .arg("--nofork")
            .arg("--print-address")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()?;
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let address = match rx.recv_timeout(Duration::from_secs(10)) {
            Ok(line) if !line.trim().is_empty() => line.trim().to_owned(),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(std::io::Error::other(
                    "dbus-daemon did not print its address",
                ));
            }
        };
        Ok(PrivateBus {
            dir,
            child,
            address,
        })
    }

    /// The bus address (`unix:path=…,guid=…`), for `DBUS_SYSTEM_BUS_ADDRESS`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// The temporary directory holding the socket and the configuration.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A new client connection to the bus.
    pub async fn connect(&self) -> zbus::Result<zbus::Connection> {
        zbus::connection::Builder::address(self.address())?
            .build()
            .await
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dbus-daemon`, from `AIRLOCK_DBUS_DAEMON` or the standard place.
pub fn dbus_daemon() -> PathBuf {
    std::env::var_os("AIRLOCK_DBUS_DAEMON")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/bin/dbus-daemon"))
}

/// A service binary of the workspace beside the running test or program
/// (`target/<profile>/NAME`), as `cargo build --workspace --bins` leaves it.
pub fn sibling_binary(name: &str) -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = exe.parent().unwrap_or(Path::new("."));
    [dir.join(name), dir.join("..").join(name)]
        .into_iter()
        .find(|p| p.exists())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!(
                    "{name} is not built beside {}; run cargo build --workspace --bins first",
                    exe.display()
                ),
            )
        })
}

/// A real airlock-supervisor process on a [`PrivateBus`], killed when
/// dropped. It uses the local authoriser for the invoking uid (no test
/// switch), and reserves Worker1 and Retry1 for that uid too, so one test
/// process can play every role.
#[derive(Debug)]
pub struct SupervisorProcess {
    child: Child,
}

impl SupervisorProcess {
    /// Starts `binary` on `bus` with the task store `db` and the
    /// configuration file `config`, and waits until it owns its name.
    pub fn start(
        binary: &Path,
        bus: &PrivateBus,
        config: &Path,
        db: &Path,
        extra: &[&str],
    ) -> std::io::Result<SupervisorProcess> {
        SupervisorProcess::start_logging(binary, bus, config, db, extra, Stdio::null())
    }

    /// Like [`SupervisorProcess::start`], its log (stderr) going to `log`.
    pub fn start_logging(
        binary: &Path,
        bus: &PrivateBus,
        config: &Path,
        db: &Path,
        extra: &[&str],
        log: impl Into<Stdio>,
    ) -> std::io::Result<SupervisorProcess> {
        let uid = nix_uid().to_string();
        let child = Command::new(binary)
            .arg("--config")
            .arg(config)
            .arg("--db")
            .arg(db)
            .args(["--bus-address", bus.address()])
            .args(["--authorizer", "local", "--local-user", &uid])
            .args(["--worker-user", &uid, "--retry-user", &uid])
            .args(extra)
            .stdin(Stdio::null())
            .stderr(log.into())
            .spawn()?;
        let mut me = SupervisorProcess { child };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let owned = rt.block_on(async {
            let conn = bus.connect().await.map_err(std::io::Error::other)?;
            let dbus = zbus::fdo::DBusProxy::new(&conn)
                .await
                .map_err(std::io::Error::other)?;
            let name = zbus::names::BusName::try_from("org.airlock.Supervisor1")
                .map_err(std::io::Error::other)?;
            for _ in 0..400 {
                if dbus
                    .name_has_owner(name.clone())
                    .await
                    .map_err(std::io::Error::other)?
                {
                    return Ok::<bool, std::io::Error>(true);
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok(false)
        })?;
        if !owned {
            let status = me.child.try_wait()?;
            return Err(std::io::Error::other(format!(
                "the supervisor did not take its name within 20 s (exit status {status:?})"
            )));
        }
        Ok(me)
    }
}

impl Drop for SupervisorProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn nix_uid() -> u32 {
    // SAFETY: getuid has no preconditions and cannot fail.
    unsafe { libc::getuid() }
}
