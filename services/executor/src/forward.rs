//! The setup's one route out: a forwarder from the loopback listener in
//! the setup's network namespace to airlock-egress's UNIX socket.
//!
//! The setup command's sandbox gets a network namespace of its own in
//! which only `lo` exists; its init listens on `127.0.0.1:PORT` there and
//! hands the listener to this process (`airlock_sandbox::Job::network`).
//! The setup's package clients have `HTTPS_PROXY` and its kin pointing at
//! that address. For each connection the forwarder
//! 1. reads the request head (at most [`HEAD_MAX`] bytes, in
//!    [`HEAD_TIMEOUT`]) and notes what it names;
//! 2. connects to the proxy's socket and writes the session's preamble
//!    line, then the head;
//! 3. reads the proxy's answer head, records the decision (the
//!    `X-Airlock-Refusal` code when refused) and passes the answer on;
//! 4. when the tunnel is open, pipes bytes both ways until either side
//!    closes.
//!
//! The forwarder decides nothing: the proxy checks the target against the
//! preamble's list, resolves it, and refuses special addresses. The
//! decisions it records are what the result's layer evidence shows.

use airlock_proto::bundle::EgressDecision;
use airlock_proto::egress::Preamble;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Longest request or answer head passed through.
pub const HEAD_MAX: usize = 16 * 1024;
/// Time a client has to send its head.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(30);
/// Most connections open at once (the proxy bounds the session as well).
pub const MAX_OPEN: usize = 64;
/// Most decisions recorded per setup; beyond them only a refusal with a
/// code not yet recorded is kept (what ends a setup is never dropped).
pub const MAX_RECORDED: usize = 256;
/// Longest [`Forwarder::finish`] waits for connections still waiting for
/// the proxy's answer (each is bounded by its own timeouts as well).
pub const FINISH_WAIT: Duration = Duration::from_secs(90);

/// A running forwarder; [`Forwarder::finish`] stops it and returns what
/// the setup asked for.
#[derive(Debug)]
pub struct Forwarder {
    stop: Arc<AtomicBool>,
    decisions: Arc<Mutex<Vec<EgressDecision>>>,
    /// Connections accepted whose decision is not recorded yet.
    undecided: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Forwarder {
    /// Starts a forwarder to the proxy at `socket` for one setup command;
    /// returns it and the descriptor the job carries to its init.
    pub fn start(socket: &Path, preamble: &Preamble) -> std::io::Result<(Forwarder, OwnedFd)> {
        let line = preamble
            .to_line()
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let (ours, theirs) = UnixStream::pair()?;
        let stop = Arc::new(AtomicBool::new(false));
        let decisions = Arc::new(Mutex::new(Vec::new()));
        let undecided = Arc::new(AtomicUsize::new(0));
        let socket = socket.to_owned();
        let thread = {
            let (stop, decisions, undecided) = (stop.clone(), decisions.clone(), undecided.clone());
            std::thread::Builder::new()
                .name("setup-forwarder".into())
                .spawn(move || {
                    if let Some(listener) = receive_listener(&ours) {
                        serve(listener, &socket, &line, &stop, &decisions, &undecided);
                    }
                })?
        };
        Ok((
            Forwarder {
                stop,
                decisions,
                undecided,
                thread: Some(thread),
            },
            OwnedFd::from(theirs),
        ))
    }

    /// Stops accepting, waits (at most [`FINISH_WAIT`]) for the
    /// connections already accepted to have their answer from the proxy,
    /// and returns the decisions recorded: a refusal the setup did not
    /// wait for is among them.
    pub fn finish(mut self) -> Vec<EgressDecision> {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let deadline = std::time::Instant::now() + FINISH_WAIT;
        while self.undecided.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.decisions.lock().map(|d| d.clone()).unwrap_or_default()
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Waits for the init's listener; `None` when the job ended without one.
fn receive_listener(stream: &UnixStream) -> Option<TcpListener> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    let mut byte = [0u8; 1];
    let mut iov = [std::io::IoSliceMut::new(&mut byte)];
    let mut cmsg = nix::cmsg_space!([std::os::fd::RawFd; 1]);
    let msg = recvmsg::<()>(
        stream.as_raw_fd(),
        &mut iov,
        Some(&mut cmsg),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .ok()?;
    let mut listener = None;
    for c in msg.cmsgs().ok()? {
        if let ControlMessageOwned::ScmRights(fds) = c {
            for fd in fds {
                // SAFETY: the kernel just installed this descriptor for us;
                // nothing else owns it.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                if listener.is_none() {
                    listener = Some(TcpListener::from(owned));
                }
            }
        }
    }
    listener
}

/// Counts a connection as undecided while it lives, or until
/// [`Undecided::decided`].
struct Undecided(Option<Arc<AtomicUsize>>);

impl Undecided {
    fn new(count: &Arc<AtomicUsize>) -> Undecided {
        count.fetch_add(1, Ordering::SeqCst);
        Undecided(Some(count.clone()))
    }

    fn decided(&mut self) {
        if let Some(c) = self.0.take() {
            c.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for Undecided {
    fn drop(&mut self) {
        self.decided();
    }
}

fn serve(
    listener: TcpListener,
    socket: &Path,
    line: &[u8],
    stop: &AtomicBool,
    decisions: &Arc<Mutex<Vec<EgressDecision>>>,
    undecided: &Arc<AtomicUsize>,
) {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    let open = Arc::new(AtomicUsize::new(0));
    while !stop.load(Ordering::SeqCst) {
        let mut fds = [PollFd::new(listener.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::from(100u16)) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let Ok((client, _)) = listener.accept() else {
            continue;
        };
        if open.load(Ordering::SeqCst) >= MAX_OPEN {
            let _ = (&client).write_all(b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
            continue;
        }
        open.fetch_add(1, Ordering::SeqCst);
        let mut pending = Undecided::new(undecided);
        let (socket, line, decisions, open) = (
            socket.to_owned(),
            line.to_vec(),
            decisions.clone(),
            open.clone(),
        );
        let spawned = std::thread::Builder::new()
            .name("setup-tunnel".into())
            .spawn(move || {
                connection(client, &socket, &line, &decisions, &mut pending);
                open.fetch_sub(1, Ordering::SeqCst);
            });
        if spawned.is_err() {
            return;
        }
    }
}

fn record(decisions: &Mutex<Vec<EgressDecision>>, d: EgressDecision) {
    if let Ok(mut v) = decisions.lock() {
        let new_code = d.code.is_some() && !v.iter().any(|r| r.code == d.code);
        if v.len() < MAX_RECORDED || new_code {
            v.push(d);
        }
    }
}

/// Reads until the end of a head (`\r\n\r\n`); returns the bytes read,
/// which may run past the head.
fn read_head(r: &mut impl Read) -> Option<Vec<u8>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        if buf.len() > HEAD_MAX {
            return None;
        }
        let n = r.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Some(buf)
}

/// What a request head names: `host:port` of a CONNECT, else its method
/// and target; bounded.
fn target_of(head: &[u8]) -> String {
    let first = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let first = String::from_utf8_lossy(first);
    let mut words = first.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let mut t = if method == "CONNECT" {
        target.to_owned()
    } else {
        format!("{method} {target}")
    };
    t.retain(|c| !c.is_control());
    if t.len() > 300 {
        let mut cut = 300;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        t.truncate(cut);
    }
    t
}

/// (opened, refusal code) from the proxy's answer head.
fn answer_of(head: &[u8]) -> (bool, Option<String>) {
    let text = String::from_utf8_lossy(head);
    let opened = text.starts_with("HTTP/1.1 200 ");
    let code = text.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("x-airlock-refusal")
            .then(|| value.trim().to_owned())
    });
    (opened, code)
}

fn connection(
    client: TcpStream,
    socket: &PathBuf,
    line: &[u8],
    decisions: &Mutex<Vec<EgressDecision>>,
    pending: &mut Undecided,
) {
    let _ = client.set_read_timeout(Some(HEAD_TIMEOUT));
    let Some(head) = read_head(&mut &client) else {
        return;
    };
    let target = target_of(&head);
    let mut proxy = match UnixStream::connect(socket) {
        Ok(p) => p,
        Err(_) => {
            record(
                decisions,
                EgressDecision {
                    target,
                    allowed: false,
                    code: Some(airlock_proto::Code::SETUP_UNAVAILABLE.as_str().into()),
                },
            );
            let _ = (&client).write_all(
                b"HTTP/1.1 502 Bad Gateway\r\nX-Airlock-Refusal: SETUP_UNAVAILABLE\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
            );
            return;
        }
    };
    if proxy
        .write_all(line)
        .and_then(|()| proxy.write_all(&head))
        .is_err()
    {
        return;
    }
    let _ = proxy.set_read_timeout(Some(HEAD_TIMEOUT + Duration::from_secs(30)));
    let Some(answer) = read_head(&mut proxy) else {
        record(
            decisions,
            EgressDecision {
                target,
                allowed: false,
                code: Some(airlock_proto::Code::EGRESS_CONNECT_FAILED.as_str().into()),
            },
        );
        return;
    };
    let (allowed, code) = answer_of(&answer);
    record(
        decisions,
        EgressDecision {
            target,
            allowed,
            code: if allowed { None } else { code },
        },
    );
    pending.decided();
    if (&client).write_all(&answer).is_err() || !allowed {
        return;
    }
    let _ = client.set_read_timeout(None);
    let _ = proxy.set_read_timeout(None);
    pipe(client, proxy);
}

/// Copies both ways until either side closes, then closes both.
fn pipe(client: TcpStream, proxy: UnixStream) {
    let (Ok(client2), Ok(proxy2)) = (client.try_clone(), proxy.try_clone()) else {
        return;
    };
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut &client2, &mut &proxy2);
        let _ = proxy2.shutdown(Shutdown::Write);
    });
    let _ = std::io::copy(&mut &proxy, &mut &client);
    let _ = client.shutdown(Shutdown::Both);
    let _ = up.join();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heads_are_read_for_their_target_and_answers_for_their_code() {
        assert_eq!(
            target_of(b"CONNECT pkg.example.org:443 HTTP/1.1\r\nHost: x\r\n\r\n"),
            "pkg.example.org:443"
        );
        assert_eq!(
            target_of(b"GET http://a.example/ HTTP/1.1\r\n\r\n"),
            "GET http://a.example/"
        );
        assert_eq!(target_of(&[b'A'; 1000]).len(), 300);
        assert_eq!(
            answer_of(b"HTTP/1.1 200 Connection established\r\n\r\n"),
            (true, None)
        );
        assert_eq!(
            answer_of(
                b"HTTP/1.1 403 Forbidden\r\nX-Airlock-Refusal: EGRESS_HOST_NOT_ALLOWED\r\n\r\n"
            ),
            (false, Some("EGRESS_HOST_NOT_ALLOWED".into()))
        );
        let mut r: &[u8] = b"CONNECT a:1 HTTP/1.1\r\n\r\nextra";
        assert_eq!(
            read_head(&mut r).unwrap(),
            b"CONNECT a:1 HTTP/1.1\r\n\r\nextra"
        );
        let mut short: &[u8] = b"CONNECT a:1";
        assert!(read_head(&mut short).is_none());
    }

    #[test]
    fn a_refusal_is_recorded_beyond_the_bound_once_per_code() {
        let decisions = Mutex::new(Vec::new());
        let decision = |i: usize, code: Option<&str>| EgressDecision {
            target: format!("a{i}.example:443"),
            allowed: code.is_none(),
            code: code.map(str::to_owned),
        };
        for i in 0..MAX_RECORDED + 5 {
            record(&decisions, decision(i, None));
        }
        record(&decisions, decision(1, Some("EGRESS_HOST_NOT_ALLOWED")));
        record(&decisions, decision(2, Some("EGRESS_HOST_NOT_ALLOWED")));
        let kept = decisions.into_inner().unwrap();
        assert_eq!(kept.len(), MAX_RECORDED + 1);
        assert_eq!(
            kept.last().unwrap().code.as_deref(),
            Some("EGRESS_HOST_NOT_ALLOWED")
        );
    }
}
