//! The agent host: airlock-local (root) serves `org.airlock.AgentHost1`
//! on the suite's bus, so that the supervisor — confined, without the
//! right to become another user or to execute programs — drives the
//! process driver exactly as it drives systemd on an installed system.
//! Agents run as `airlock-agent` (when airlock-local runs as root and
//! that user exists; else as `nobody`), each in a cgroup of its own that
//! airlock-local makes ([`airlock_agents::cgroup`]: what its processes
//! cannot leave, by which the supervisor recognises them and the host
//! stops them all) and its own process group, with the bus address in its
//! environment. As root a cgroup is required (no agent starts without
//! one); otherwise one is used when the system lets the caller make it.

use crate::layout::Ids;
use airlock_agents::host::{AgentHost, serve};
use airlock_agents::process::{Identity, ProcessDriver};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The user agents run as: `airlock-agent` when airlock-local runs as
/// root and that user exists, else `nobody` as root, else the caller.
pub fn agent_user(ids: &Ids) -> String {
    if !ids.separated {
        return ids.name(ids.admin);
    }
    if Identity::lookup("airlock-agent").is_ok() {
        "airlock-agent".to_owned()
    } else {
        "nobody".to_owned()
    }
}

/// Lets the agents' user read the authority repositories: `repos/` gets
/// the group `airlock-readers` (or the agents' user's own group), as
/// `/srv/airlock` on an installed system; the repositories in it are
/// world-readable below it (git's modes), the worker their only writer.
pub fn share_repositories(repos: &std::path::Path, ids: &Ids) -> Result<(), String> {
    if !ids.separated {
        return Ok(());
    }
    let group = match nix::unistd::Group::from_name("airlock-readers") {
        Ok(Some(g)) => g.gid,
        _ => {
            Identity::lookup(&agent_user(ids))
                .map_err(|e| e.to_string())?
                .gid
        }
    };
    nix::unistd::chown(
        repos,
        Some(nix::unistd::Uid::from_raw(ids.worker.uid)),
        Some(group),
    )
    .map_err(|e| format!("{}: {e}", repos.display()))?;
    std::fs::set_permissions(repos, std::os::unix::fs::PermissionsExt::from_mode(0o2750))
        .map_err(|e| format!("{}: {e}", repos.display()))
}

/// The host's thread, with its own runtime; stopped when dropped: after
/// the supervisor drained the agents, every agent left is stopped and
/// every process left in the agents' cgroups killed, then the cgroups are
/// removed (each leader's parent-death signal, SIGKILL with the thread, is
/// the last resort).
#[derive(Debug)]
pub struct HostThread {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HostThread {
    /// Serves `agents` on the bus at `address` to the supervisor's uid,
    /// keeping their logs and credentials under `runtime`.
    pub fn start(
        address: &str,
        agents: Vec<airlock_config::Agent>,
        ids: &Ids,
        runtime: PathBuf,
    ) -> Result<HostThread, String> {
        let identity = if ids.separated {
            Some(Identity::lookup(&agent_user(ids)).map_err(|e| e.to_string())?)
        } else {
            None
        };
        let env = vec![("DBUS_SYSTEM_BUS_ADDRESS".to_owned(), address.to_owned())];
        let mut driver = ProcessDriver::new(identity, runtime, env).map_err(|e| e.to_string())?;
        match airlock_agents::cgroup::Tree::create() {
            Ok(tree) => driver = driver.with_cgroups(tree),
            Err(e) if ids.separated => return Err(format!("agents: {e}")),
            Err(e) => eprintln!(
                "airlock-local: WARNING: agents run without a cgroup of their own ({e}): a process an agent starts in a session of its own is not recognised or stopped as the agent's."
            ),
        }
        let driver = Arc::new(driver);
        let on_stop = Arc::clone(&driver);
        let supervisor_uid = ids.supervisor.uid;
        let address = address.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        // A thread of its own that lives as long as the suite: the agents'
        // parent-death signal follows the thread that started them.
        let thread = std::thread::Builder::new()
            .name("agent-host".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                rt.block_on(async move {
                    let conn = match zbus::connection::Builder::address(address.as_str()) {
                        Ok(b) => b.build().await,
                        Err(e) => Err(e),
                    };
                    let conn = match conn {
                        Ok(c) => c,
                        Err(e) => {
                            let _ = ready_tx.send(Err(format!("agent host: {e}")));
                            return;
                        }
                    };
                    let host = AgentHost::new(driver, agents, supervisor_uid);
                    if let Err(e) = serve(&conn, host).await {
                        let _ = ready_tx.send(Err(format!("agent host: {e}")));
                        return;
                    }
                    let _ = ready_tx.send(Ok(()));
                    let _ = stop_rx.await;
                    on_stop.shutdown().await;
                });
            })
            .map_err(|e| e.to_string())?;
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .map_err(|e| format!("agent host did not start: {e}"))??;
        Ok(HostThread {
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }
}

impl Drop for HostThread {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
