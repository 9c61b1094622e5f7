//! The daemon's side of one connection, in order:
//!
//! 1. the peer's uid (SO_PEERCRED) is one of `--allow-uid`;
//! 2. the preamble line, within [`PREAMBLE_MAX`] and the head timeout;
//! 3. the request head, within [`HEAD_MAX`] and the same timeout;
//! 4. the session admits one more connection (its limits);
//! 5. the method is CONNECT;
//! 6. the target is one of the preamble's `allow` entries, on a port of
//!    `--connect-port`;
//! 7. the target's route ([`crate::route`]): `direct` and `addresses`
//!    resolve the name here, and every address must pass
//!    [`crate::address::check`] (direct) or lie in the route's ranges (an
//!    IP literal too); `via` leaves the name to the parent proxy (an IP
//!    literal must still be public);
//! 8. connect to a checked address (or CONNECT through the parent, with
//!    its credential), answer 200, splice both ways, metered against the
//!    session's bytes and wall time.
//!
//! A refusal at any step is answered (status, `X-Airlock-Refusal`, the code
//! in the body) and is one audit event ([`crate::audit`], its own
//! `MESSAGE_ID`); so is every tunnel when it closes (its route, address,
//! bytes each way and duration), after a log line when it opens.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use airlock_proto::Code;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadBuf,
};
use tokio::net::{TcpStream, UnixStream};
use tokio::time::Instant;

use crate::address;
use crate::audit::Record;
use crate::refusal;
use crate::route::{self, Parent, Way};
use airlock_proto::egress::{Host, HostPort};
use airlock_proto::egress::{Limits, PREAMBLE_MAX, Preamble};

/// Longest request head (request line and headers).
pub const HEAD_MAX: usize = 8 * 1024;
/// Most headers in a request head.
const MAX_HEADERS: usize = 64;
/// Sessions remembered at once (a session's limits hold for
/// [`SESSION_RETAIN`] past its end, so it cannot start afresh).
const MAX_SESSIONS: usize = 4096;
/// How long a finished session is remembered.
const SESSION_RETAIN: Duration = Duration::from_secs(3600);
/// Addresses of one name tried at most.
const MAX_ADDRESSES: usize = 8;
/// The tracing target of decision lines.
pub const DECISION_TARGET: &str = "airlock_egress::decision";

/// The daemon's settings, from its command line.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Peer uids served.
    pub allow_uids: Vec<u32>,
    /// Ports the proxy connects to (its Landlock grant too).
    pub connect_ports: Vec<u16>,
    /// Time for the preamble and the request head together.
    pub head_timeout: Duration,
    /// Time for name resolution.
    pub resolve_timeout: Duration,
    /// Time for each connect(2), and for a parent proxy's answer.
    pub connect_timeout: Duration,
    /// The administrator's routes (`--config`), credentials read.
    pub routes: route::Config,
}

/// One session's bounds and what it has used.
#[derive(Debug)]
struct Session {
    allow: Vec<HostPort>,
    limits: Limits,
    deadline: Instant,
    bytes: AtomicU64,
    connections: AtomicU32,
    active: AtomicU32,
}

impl Session {
    /// Takes up to `n` bytes of the budget; returns how many it got.
    fn consume(&self, n: u64) -> u64 {
        let max = self.limits.max_bytes;
        let mut got = 0;
        let _ = self
            .bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let new = used.saturating_add(n).min(max);
                got = new - used;
                Some(new)
            });
        got
    }
}

/// The sessions seen, by id.
#[derive(Debug, Default)]
pub struct Sessions {
    map: Mutex<HashMap<String, Arc<Session>>>,
}

/// A connection admitted into a session; leaving drops it from `active`.
#[derive(Debug)]
struct Admitted(Arc<Session>);

impl Drop for Admitted {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Sessions {
    /// Admits one more connection of `p`'s session, or says why not.
    fn admit(&self, p: &Preamble) -> Result<Admitted, (Code, String)> {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        map.retain(|_, s| {
            s.active.load(Ordering::Acquire) > 0 || s.deadline + SESSION_RETAIN > now
        });
        let limit = |m: String| Err((Code::EGRESS_LIMIT_EXCEEDED, m));
        let session = match map.get(&p.session) {
            Some(s) => {
                if s.allow != p.allow || s.limits != p.limits {
                    return Err((
                        Code::EGRESS_PREAMBLE_INVALID,
                        "the session's first connection gave other hosts or limits".into(),
                    ));
                }
                Arc::clone(s)
            }
            None => {
                if map.len() >= MAX_SESSIONS {
                    return limit(format!("{MAX_SESSIONS} sessions are remembered already"));
                }
                let s = Arc::new(Session {
                    allow: p.allow.clone(),
                    limits: p.limits,
                    deadline: now + Duration::from_secs(p.limits.max_seconds),
                    bytes: AtomicU64::new(0),
                    connections: AtomicU32::new(0),
                    active: AtomicU32::new(0),
                });
                map.insert(p.session.clone(), Arc::clone(&s));
                s
            }
        };
        if now >= session.deadline {
            return limit(format!("max_seconds {} elapsed", p.limits.max_seconds));
        }
        if session.bytes.load(Ordering::Acquire) >= p.limits.max_bytes {
            return limit(format!("max_bytes {} used", p.limits.max_bytes));
        }
        if session.connections.load(Ordering::Acquire) >= p.limits.max_connections {
            return limit(format!("max_connections {} made", p.limits.max_connections));
        }
        session.connections.fetch_add(1, Ordering::AcqRel);
        session.active.fetch_add(1, Ordering::AcqRel);
        Ok(Admitted(session))
    }
}

/// A refusal on its way to the client.
struct Refusal {
    code: Code,
    detail: String,
    timed_out: bool,
}

fn refuse(code: Code, detail: impl Into<String>) -> Refusal {
    Refusal {
        code,
        detail: detail.into(),
        timed_out: false,
    }
}

/// Serves one accepted connection to its end.
pub async fn serve(stream: UnixStream, settings: Arc<Settings>, sessions: Arc<Sessions>) {
    let started = Instant::now();
    let mut record = Record::default();
    let mut reader = BufReader::new(stream);
    match establish(&mut reader, &settings, &sessions, &mut record).await {
        Ok((upstream, early, admitted)) => {
            tunnel(reader, upstream, early, admitted, &record, started).await
        }
        Err(r) => {
            record.refused(
                r.code.as_str(),
                &r.detail,
                started.elapsed().as_millis() as u64,
            );
            answer_and_close(reader.into_inner(), &refusal::response(r.code, r.timed_out)).await;
        }
    }
}

/// Steps 1 to 8 up to the connected upstream (and the bytes a parent
/// proxy sent after its answer).
async fn establish(
    reader: &mut BufReader<UnixStream>,
    settings: &Settings,
    sessions: &Sessions,
    record: &mut Record,
) -> Result<(TcpStream, Vec<u8>, Admitted), Refusal> {
    // 1. The peer.
    let uid = reader
        .get_ref()
        .peer_cred()
        .map_err(|e| refuse(Code::EGRESS_PEER_DENIED, format!("SO_PEERCRED: {e}")))?
        .uid();
    record.uid = Some(uid);
    if !settings.allow_uids.contains(&uid) {
        return Err(refuse(
            Code::EGRESS_PEER_DENIED,
            format!("uid {uid} is not served"),
        ));
    }
    // 2 and 3, within one timeout.
    let (preamble, head) = tokio::time::timeout(settings.head_timeout, read_opening(reader))
        .await
        .map_err(|_| {
            refuse(
                Code::EGRESS_REQUEST_INVALID,
                format!(
                    "preamble and request head not sent within {:?}",
                    settings.head_timeout
                ),
            )
        })??;
    record.task_id = preamble.task_id.clone();
    record.session = preamble.session.clone();
    // 4. The session's limits.
    let admitted = sessions
        .admit(&preamble)
        .map_err(|(code, detail)| refuse(code, detail))?;
    // 5. CONNECT only.
    let target = connect_target(&head)?;
    record.target = target.to_string();
    // 6. An allowed entry, on a port the daemon reaches.
    if !preamble.allow.contains(&target) {
        return Err(refuse(
            Code::EGRESS_HOST_NOT_ALLOWED,
            "not in the preamble's allow list",
        ));
    }
    if !settings.connect_ports.contains(&target.port()) {
        return Err(refuse(
            Code::EGRESS_PORT_NOT_ALLOWED,
            format!(
                "the daemon connects to ports {:?} only",
                settings.connect_ports
            ),
        ));
    }
    // 7. The route; resolve here and check every address, unless a
    // parent proxy reaches the name.
    let route = settings.routes.route_for(target.host());
    record.route = route.label();
    let (upstream, early) = match &route.way {
        Way::Via(parent) => {
            if let Host::Ip(ip) = target.host() {
                address::check(*ip).map_err(|f| {
                    refuse(Code::EGRESS_ADDRESS_FORBIDDEN, format!("{ip} is in {f}"))
                })?;
            }
            // 8. CONNECT through the parent.
            via(parent, &target, settings).await?
        }
        way => {
            let addrs = resolve(&target, way, settings).await?;
            // 8. Connect to a checked address, never to the name.
            let upstream = connect(&addrs, settings.connect_timeout).await?;
            (upstream, Vec::new())
        }
    };
    record.resolved = upstream.peer_addr().ok();
    Ok((upstream, early, admitted))
}

/// Reads the preamble line and the request head.
async fn read_opening(reader: &mut BufReader<UnixStream>) -> Result<(Preamble, Vec<u8>), Refusal> {
    let mut line = Vec::new();
    let n = (&mut *reader)
        .take(PREAMBLE_MAX as u64)
        .read_until(b'\n', &mut line)
        .await
        .map_err(|e| refuse(Code::EGRESS_PREAMBLE_INVALID, format!("reading: {e}")))?;
    if n == 0 || line.last() != Some(&b'\n') {
        return Err(refuse(
            Code::EGRESS_PREAMBLE_INVALID,
            format!("no preamble line within {PREAMBLE_MAX} bytes"),
        ));
    }
    let preamble = Preamble::parse_line(&line)
        .map_err(|e| refuse(Code::EGRESS_PREAMBLE_INVALID, e.to_string()))?;
    let mut head = Vec::new();
    loop {
        let left = (HEAD_MAX - head.len()) as u64;
        let n = (&mut *reader)
            .take(left)
            .read_until(b'\n', &mut head)
            .await
            .map_err(|e| refuse(Code::EGRESS_REQUEST_INVALID, format!("reading: {e}")))?;
        if head.ends_with(b"\r\n\r\n") || head == b"\r\n" {
            break;
        }
        if n == 0 || head.len() >= HEAD_MAX {
            return Err(refuse(
                Code::EGRESS_REQUEST_INVALID,
                format!("no complete request head within {HEAD_MAX} bytes"),
            ));
        }
    }
    Ok((preamble, head))
}

/// The CONNECT target of a request head.
fn connect_target(head: &[u8]) -> Result<HostPort, Refusal> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(head) {
        Ok(httparse::Status::Complete(_)) => {}
        Ok(httparse::Status::Partial) => {
            return Err(refuse(
                Code::EGRESS_REQUEST_INVALID,
                "incomplete request head",
            ));
        }
        Err(e) => {
            return Err(refuse(
                Code::EGRESS_REQUEST_INVALID,
                format!("request head: {e}"),
            ));
        }
    }
    let method = req.method.unwrap_or_default();
    if method != "CONNECT" {
        return Err(refuse(
            Code::EGRESS_METHOD_NOT_ALLOWED,
            format!(
                "{:?}: only CONNECT is served",
                method.chars().take(32).collect::<String>()
            ),
        ));
    }
    // HTTP/1.0 or 1.1 (httparse reads no other): Python's http.client,
    // and so pip, sends its CONNECT as HTTP/1.0.
    if !matches!(req.version, Some(0 | 1)) {
        return Err(refuse(Code::EGRESS_REQUEST_INVALID, "not HTTP/1.x"));
    }
    let path = req.path.unwrap_or_default();
    HostPort::parse(path).map_err(|e| refuse(Code::EGRESS_REQUEST_INVALID, e.to_string()))
}

/// The target's addresses, each of which passed its route's check:
/// [`address::check`] (`direct`), or inside the route's ranges.
async fn resolve(
    target: &HostPort,
    way: &Way,
    settings: &Settings,
) -> Result<Vec<SocketAddr>, Refusal> {
    let addrs = lookup(target, settings.resolve_timeout).await?;
    // One forbidden address refuses the whole name: a registry does not
    // resolve into private space, a rebinding attack does.
    for a in &addrs {
        let ip: IpAddr = a.ip();
        match way {
            Way::Addresses(ranges) => {
                if !ranges.iter().any(|r| r.contains(ip)) {
                    return Err(refuse(
                        Code::EGRESS_ADDRESS_FORBIDDEN,
                        format!("{ip} is outside the route's addresses"),
                    ));
                }
            }
            _ => {
                if let Err(f) = address::check(ip) {
                    return Err(refuse(
                        Code::EGRESS_ADDRESS_FORBIDDEN,
                        format!("{ip} is in {f}"),
                    ));
                }
            }
        }
    }
    Ok(addrs)
}

/// The addresses of `target` (an IP literal is its own), without checks.
async fn lookup(target: &HostPort, timeout: Duration) -> Result<Vec<SocketAddr>, Refusal> {
    let port = target.port();
    let addrs: Vec<SocketAddr> = match target.host() {
        Host::Ip(ip) => vec![SocketAddr::new(*ip, port)],
        Host::Name(name) => {
            let found =
                tokio::time::timeout(timeout, tokio::net::lookup_host((name.as_str(), port)))
                    .await
                    .map_err(|_| Refusal {
                        timed_out: true,
                        ..refuse(
                            Code::EGRESS_RESOLVE_FAILED,
                            format!("no answer within {timeout:?}"),
                        )
                    })?
                    .map_err(|e| refuse(Code::EGRESS_RESOLVE_FAILED, e.to_string()))?;
            let mut v: Vec<SocketAddr> = Vec::new();
            for a in found {
                if !v.contains(&a) {
                    v.push(a);
                }
            }
            v
        }
    };
    if addrs.is_empty() {
        return Err(refuse(Code::EGRESS_RESOLVE_FAILED, "no address"));
    }
    Ok(addrs)
}

/// A CONNECT to `target` through the route's parent proxy: its answer's
/// status decides (2xx: the tunnel; 401 or 407: its credential is missing
/// or wrong; 502, 503 or 504: it could not reach the target; anything
/// else: its own policy refused). Returns the connection and any bytes
/// the parent sent after its answer's head.
async fn via(
    parent: &Parent,
    target: &HostPort,
    settings: &Settings,
) -> Result<(TcpStream, Vec<u8>), Refusal> {
    let named = |r: Refusal| Refusal {
        detail: format!("parent proxy {}: {}", parent.proxy, r.detail),
        ..r
    };
    // The administrator named the parent: its addresses are not checked.
    let addrs = lookup(&parent.proxy, settings.resolve_timeout)
        .await
        .map_err(named)?;
    let mut stream = connect(&addrs, settings.connect_timeout)
        .await
        .map_err(named)?;
    let mut request = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(authorization) = parent.authorization() {
        request.push_str(&format!("Proxy-Authorization: {authorization}\r\n"));
    }
    request.push_str("\r\n");
    let exchange = async {
        stream.write_all(request.as_bytes()).await?;
        let mut head = Vec::with_capacity(1024);
        let mut chunk = [0u8; 1024];
        loop {
            if let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") {
                let early = head.split_off(end + 4);
                return Ok::<_, io::Error>((head, early));
            }
            if head.len() >= HEAD_MAX {
                return Err(io::Error::other(format!(
                    "no complete answer within {HEAD_MAX} bytes"
                )));
            }
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::Error::other("closed before its answer"));
            }
            head.extend_from_slice(&chunk[..n]);
        }
    };
    let (head, early) = tokio::time::timeout(settings.connect_timeout, exchange)
        .await
        .map_err(|_| Refusal {
            timed_out: true,
            ..named(refuse(
                Code::EGRESS_CONNECT_FAILED,
                format!("no answer within {:?}", settings.connect_timeout),
            ))
        })?
        .map_err(|e| named(refuse(Code::EGRESS_CONNECT_FAILED, e.to_string())))?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut answer = httparse::Response::new(&mut headers);
    let status = match answer.parse(&head) {
        Ok(httparse::Status::Complete(_)) => answer.code.unwrap_or(0),
        _ => 0,
    };
    match status {
        200..=299 => Ok((stream, early)),
        401 | 407 => Err(named(refuse(
            Code::EGRESS_PARENT_AUTH_FAILED,
            format!(
                "answered {status}: {}",
                if parent.credential.is_some() {
                    "the credential was refused"
                } else {
                    "it asks for a credential and the route gives none"
                }
            ),
        ))),
        502..=504 => Err(Refusal {
            timed_out: status == 504,
            ..named(refuse(
                Code::EGRESS_CONNECT_FAILED,
                format!("answered {status}: it could not reach the target"),
            ))
        }),
        0 => Err(named(refuse(
            Code::EGRESS_PARENT_REFUSED,
            "its answer is not an HTTP/1.x response",
        ))),
        _ => Err(named(refuse(
            Code::EGRESS_PARENT_REFUSED,
            format!("answered {status}"),
        ))),
    }
}

async fn connect(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream, Refusal> {
    let mut last = String::new();
    let mut all_timed_out = true;
    for a in addrs.iter().take(MAX_ADDRESSES) {
        match tokio::time::timeout(timeout, TcpStream::connect(a)).await {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => {
                all_timed_out = false;
                last = format!("{a}: {e}");
            }
            Err(_) => last = format!("{a}: no answer within {timeout:?}"),
        }
    }
    Err(Refusal {
        timed_out: all_timed_out,
        ..refuse(Code::EGRESS_CONNECT_FAILED, last)
    })
}

/// Writes a refusal, then drains what the client still sends for a moment
/// (closing a socket with unread data could make the client lose the
/// answer).
async fn answer_and_close(mut stream: UnixStream, response: &[u8]) {
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(response)).await;
    let _ = stream.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async {
        let mut total = 0usize;
        while total < 64 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// Splices client and upstream, each direction metered against the
/// session.
async fn tunnel(
    reader: BufReader<UnixStream>,
    upstream: TcpStream,
    upstream_early: Vec<u8>,
    admitted: Admitted,
    record: &Record,
    started: Instant,
) {
    let session = Arc::clone(&admitted.0);
    let limit_hit = Arc::new(AtomicBool::new(false));
    // Bytes the client sent after its head, already read into the buffer.
    let early = reader.buffer().to_vec();
    let mut client = Metered::new(reader.into_inner(), &session, &limit_hit);
    let mut upstream = Metered::new(upstream, &session, &limit_hit);
    tracing::info!(
        target: DECISION_TARGET,
        decision = "allowed",
        code = "",
        uid = record.uid,
        task_id = %record.task_id,
        session = %record.session,
        target = %record.target,
        route = %record.route,
        resolved = ?record.resolved,
        bytes = 0u64,
        duration_ms = started.elapsed().as_millis() as u64,
        "egress allowed: {}",
        record.target
    );
    let spliced = async {
        client.inner.write_all(refusal::ESTABLISHED).await?;
        if !upstream_early.is_empty() {
            let got = session.consume(upstream_early.len() as u64) as usize;
            upstream.bytes += got as u64;
            client.inner.write_all(&upstream_early[..got]).await?;
            if got < upstream_early.len() {
                limit_hit.store(true, Ordering::Release);
                return Err(io::Error::other("max_bytes"));
            }
        }
        if !early.is_empty() {
            let got = session.consume(early.len() as u64) as usize;
            client.bytes += got as u64;
            upstream.inner.write_all(&early[..got]).await?;
            if got < early.len() {
                limit_hit.store(true, Ordering::Release);
                return Err(io::Error::other("max_bytes"));
            }
        }
        tokio::io::copy_bidirectional(&mut client, &mut upstream).await
    };
    let outcome = tokio::time::timeout_at(session.deadline, spliced).await;
    let timed_out = outcome.is_err();
    let duration_ms = started.elapsed().as_millis() as u64;
    if timed_out || limit_hit.load(Ordering::Acquire) {
        let detail = if timed_out {
            format!("max_seconds {} elapsed", session.limits.max_seconds)
        } else {
            format!("max_bytes {} used", session.limits.max_bytes)
        };
        record.closed(
            Code::EGRESS_LIMIT_EXCEEDED.as_str(),
            &detail,
            client.bytes,
            upstream.bytes,
            duration_ms,
        );
    } else {
        let error = match &outcome {
            Ok(Err(e)) => e.to_string(),
            _ => String::new(),
        };
        record.closed("", &error, client.bytes, upstream.bytes, duration_ms);
    }
    drop(admitted);
}

/// A stream whose reads draw on its session's byte budget: a read beyond
/// the budget is cut to what is left, and the next fails.
struct Metered<S> {
    inner: S,
    session: Arc<Session>,
    bytes: u64,
    limit_hit: Arc<AtomicBool>,
}

impl<S> Metered<S> {
    fn new(inner: S, session: &Arc<Session>, limit_hit: &Arc<AtomicBool>) -> Metered<S> {
        Metered {
            inner,
            session: Arc::clone(session),
            bytes: 0,
            limit_hit: Arc::clone(limit_hit),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Metered<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.session.bytes.load(Ordering::Acquire) >= this.session.limits.max_bytes {
            this.limit_hit.store(true, Ordering::Release);
            return Poll::Ready(Err(io::Error::other("the session's max_bytes is used")));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let n = (buf.filled().len() - before) as u64;
        if n == 0 {
            return Poll::Ready(Ok(()));
        }
        let got = this.session.consume(n);
        this.bytes += got;
        if got < n {
            // Shrinking what is filled only forgets bytes: always sound.
            buf.set_filled(before + got as usize);
            this.limit_hit.store(true, Ordering::Release);
            if got == 0 {
                return Poll::Ready(Err(io::Error::other("the session's max_bytes is used")));
            }
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Metered<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_target_parses_connect_only() {
        let t = connect_target(b"CONNECT Pkg.Example.org:443 HTTP/1.1\r\nHost: x\r\n\r\n")
            .ok()
            .unwrap();
        assert_eq!(t.to_string(), "pkg.example.org:443");
        // HTTP/1.0, as Python's http.client sends a CONNECT.
        let t = connect_target(b"CONNECT pkg.example.org:443 HTTP/1.0\r\n\r\n")
            .ok()
            .unwrap();
        assert_eq!(t.to_string(), "pkg.example.org:443");
        for (head, code) in [
            (
                &b"GET http://pkg.example.org/ HTTP/1.1\r\n\r\n"[..],
                Code::EGRESS_METHOD_NOT_ALLOWED,
            ),
            (b"POST / HTTP/1.1\r\n\r\n", Code::EGRESS_METHOD_NOT_ALLOWED),
            (
                b"CONNECT a.example HTTP/1.1\r\n\r\n",
                Code::EGRESS_REQUEST_INVALID,
            ),
            (
                b"CONNECT u@a.example:443 HTTP/1.1\r\n\r\n",
                Code::EGRESS_REQUEST_INVALID,
            ),
            (b"\x16\x03\x01\r\n\r\n", Code::EGRESS_REQUEST_INVALID),
        ] {
            let r = connect_target(head).err().unwrap();
            assert_eq!(r.code, code, "{}", String::from_utf8_lossy(head));
        }
    }

    #[test]
    fn sessions_bound_connections_and_refuse_changed_preambles() {
        let sessions = Sessions::default();
        let mut p = Preamble {
            session: "t-1:1".into(),
            task_id: "t-1".into(),
            allow: vec![HostPort::parse("a.example:443").unwrap()],
            limits: Limits {
                max_bytes: 10,
                max_seconds: 60,
                max_connections: 2,
            },
        };
        let a = sessions.admit(&p).unwrap();
        let _b = sessions.admit(&p).unwrap();
        drop(a);
        assert_eq!(
            sessions.admit(&p).unwrap_err().0,
            Code::EGRESS_LIMIT_EXCEEDED
        );
        let s = sessions.map.lock().unwrap().get("t-1:1").cloned().unwrap();
        assert_eq!(s.consume(4), 4);
        assert_eq!(s.consume(10), 6);
        assert_eq!(s.consume(1), 0);
        p.limits.max_connections = 3;
        assert_eq!(
            sessions.admit(&p).unwrap_err().0,
            Code::EGRESS_PREAMBLE_INVALID
        );
    }
}
