//! The daemon binary on a temporary UNIX socket, driven by real clients.
//! Refusals are shown on loopback targets only; the positive cases reach a
//! package registry whose host:port the package client itself names at run
//! time (no registry is named here), through a route whose addresses are
//! learnt at run time, or through a real parent proxy (tinyproxy) on
//! loopback with basic authentication.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use airlock_egress::{HostPort, Limits, Preamble};

/// A running daemon; killed (by its pid) when dropped.
struct Daemon {
    child: Child,
    socket: PathBuf,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Daemon {
    fn start(extra: &[&str]) -> Daemon {
        Daemon::start_with(extra, None, None)
    }

    /// With a routes file (`--config`) and a credentials directory.
    fn start_with(extra: &[&str], routes: Option<&str>, credentials: Option<&Path>) -> Daemon {
        let dir = tempfile::tempdir().unwrap();
        // Traversable by the other uid of `a_peer_of_another_uid_is_refused`.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711)).unwrap();
        let socket = dir.path().join("egress.sock");
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_airlock-egress"));
        if let Some(text) = routes {
            let file = dir.path().join("egress.toml");
            std::fs::write(&file, text).unwrap();
            cmd.arg("--config").arg(file);
        }
        if let Some(dir) = credentials {
            cmd.env("CREDENTIALS_DIRECTORY", dir);
        }
        let child = cmd
            .arg("--socket")
            .arg(&socket)
            .args(["--allow-uid", "0"])
            .args(extra)
            .env("AIRLOCK_LOG", "info")
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let d = Daemon {
            child,
            socket,
            log,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !d.log().contains("lockdown airlock-egress") {
            assert!(
                Instant::now() < deadline,
                "daemon did not start: {}",
                d.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits for a log line containing every one of `parts`.
    fn wait_log(&self, parts: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log();
            if let Some(line) = log.lines().find(|l| parts.iter().all(|p| l.contains(p))) {
                return line.to_owned();
            }
            assert!(
                Instant::now() < deadline,
                "no line with {parts:?} in:\n{log}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.socket).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// One connection: `opening` written, the whole answer read.
    fn exchange(&self, opening: &[u8]) -> String {
        let mut s = self.connect();
        s.write_all(opening).unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).unwrap();
        String::from_utf8_lossy(&out).into_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn preamble(session: &str, allow: &[&str], limits: Limits) -> Vec<u8> {
    Preamble {
        session: session.into(),
        task_id: "task-egress-1".into(),
        allow: allow.iter().map(|a| HostPort::parse(a).unwrap()).collect(),
        limits,
    }
    .to_line()
    .unwrap()
}

fn limits() -> Limits {
    Limits {
        max_bytes: 1 << 20,
        max_seconds: 60,
        max_connections: 100,
    }
}

fn connect_head(target: &str) -> Vec<u8> {
    format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").into_bytes()
}

fn opening(preamble: &[u8], head: &[u8]) -> Vec<u8> {
    [preamble, head].concat()
}

/// Asserts the answer is a refusal with `status` and `code`.
fn assert_refused(answer: &str, status: u16, code: &str) {
    assert!(
        answer.starts_with(&format!("HTTP/1.1 {status} ")),
        "wanted {status} {code}, got:\n{answer}"
    );
    assert!(
        answer.contains(&format!("\r\nX-Airlock-Refusal: {code}\r\n")),
        "{answer}"
    );
    let body = answer.split_once("\r\n\r\n").unwrap().1;
    assert!(body.starts_with(&format!("{code}: ")), "{answer}");
}

#[test]
fn a_host_not_listed_is_refused() {
    let d = Daemon::start(&[]);
    let p = preamble("s-a:1", &["allowed.example.invalid:443"], limits());
    let answer = d.exchange(&opening(&p, &connect_head("other.example.invalid:443")));
    assert_refused(&answer, 403, "EGRESS_HOST_NOT_ALLOWED");
    // Same host, another port.
    let answer = d.exchange(&opening(&p, &connect_head("allowed.example.invalid:8443")));
    assert_refused(&answer, 403, "EGRESS_HOST_NOT_ALLOWED");
    let line = d.wait_log(&["EGRESS_HOST_NOT_ALLOWED", "other.example.invalid:443"]);
    assert!(
        line.contains("task-egress-1") && line.contains("s-a:1"),
        "{line}"
    );
}

#[test]
fn an_allowed_entry_on_loopback_is_refused_and_never_reached() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let port_arg = port.to_string();
    let d = Daemon::start(&["--connect-port", &port_arg]);
    for (i, target) in [
        format!("localhost:{port}"),
        format!("127.0.0.1:{port}"),
        format!("[::1]:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("0.0.0.0:{port}"),
    ]
    .iter()
    .enumerate()
    {
        let p = preamble(&format!("s-b:{i}"), &[target], limits());
        let answer = d.exchange(&opening(&p, &connect_head(target)));
        assert_refused(&answer, 403, "EGRESS_ADDRESS_FORBIDDEN");
    }
    let line = d.wait_log(&["EGRESS_ADDRESS_FORBIDDEN", &format!("localhost:{port}")]);
    assert!(line.contains("loopback"), "{line}");
    listener.set_nonblocking(true).unwrap();
    let accepted = listener.accept();
    assert_eq!(
        accepted.map(|_| ()).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock,
        "the loopback listener accepted a connection"
    );
}

#[test]
fn a_port_the_daemon_does_not_reach_is_refused() {
    let d = Daemon::start(&[]);
    let p = preamble("s-port:1", &["127.0.0.1:8080"], limits());
    let answer = d.exchange(&opening(&p, &connect_head("127.0.0.1:8080")));
    assert_refused(&answer, 403, "EGRESS_PORT_NOT_ALLOWED");
}

#[test]
fn plain_http_is_refused_with_405() {
    let d = Daemon::start(&[]);
    let p = preamble("s-c:1", &["allowed.example.invalid:443"], limits());
    let head = b"GET http://allowed.example.invalid:443/simple/ HTTP/1.1\r\nHost: allowed.example.invalid\r\n\r\n";
    let answer = d.exchange(&opening(&p, head));
    assert_refused(&answer, 405, "EGRESS_METHOD_NOT_ALLOWED");
    assert!(answer.contains("\r\nAllow: CONNECT\r\n"), "{answer}");
    d.wait_log(&["EGRESS_METHOD_NOT_ALLOWED", "s-c:1"]);
}

#[test]
fn a_wrong_preamble_is_refused() {
    let d = Daemon::start(&[]);
    let good = String::from_utf8(preamble("s-d:1", &["a.example.invalid:443"], limits())).unwrap();
    let head = connect_head("a.example.invalid:443");
    for bad in [
        good.replacen('{', "{\"extra\":true,", 1),
        good.replace("a.example.invalid:443", "*.example.invalid:443"),
        good.replace("\"max_connections\":100", "\"max_connections\":0"),
        "CONNECT a.example.invalid:443 HTTP/1.1\n".to_owned(),
        "{}\n".to_owned(),
    ] {
        let answer = d.exchange(&opening(bad.as_bytes(), &head));
        assert_refused(&answer, 400, "EGRESS_PREAMBLE_INVALID");
    }
    // A line longer than the bound.
    let long = vec![b' '; airlock_egress::PREAMBLE_MAX + 10];
    let answer = d.exchange(&long);
    assert_refused(&answer, 400, "EGRESS_PREAMBLE_INVALID");
    // A session's later connection may not change its hosts or limits.
    let first = preamble("s-d:2", &["a.example.invalid:443"], limits());
    let answer = d.exchange(&opening(&first, &connect_head("b.example.invalid:443")));
    assert_refused(&answer, 403, "EGRESS_HOST_NOT_ALLOWED");
    let widened = preamble(
        "s-d:2",
        &["a.example.invalid:443", "b.example.invalid:443"],
        limits(),
    );
    let answer = d.exchange(&opening(&widened, &connect_head("b.example.invalid:443")));
    assert_refused(&answer, 400, "EGRESS_PREAMBLE_INVALID");
}

#[test]
fn a_slow_client_is_cut_off() {
    let d = Daemon::start(&["--head-timeout", "1"]);
    let mut s = d.connect();
    s.write_all(b"{\"session\":").unwrap();
    let started = Instant::now();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_refused(&out, 400, "EGRESS_REQUEST_INVALID");
}

#[test]
fn a_peer_of_another_uid_is_refused() {
    let d = Daemon::start(&["--group", "nogroup"]);
    let p = preamble("s-e:1", &["a.example.invalid:443"], limits());
    let script = "import socket, sys\n\
                  s = socket.socket(socket.AF_UNIX)\n\
                  s.settimeout(20)\n\
                  s.connect(sys.argv[1])\n\
                  s.sendall(sys.argv[2].encode())\n\
                  data = b''\n\
                  while True:\n\
                  \x20   b = s.recv(4096)\n\
                  \x20   if not b: break\n\
                  \x20   data += b\n\
                  sys.stdout.write(data.decode())\n";
    let out = Command::new("/usr/bin/python3")
        .arg("-c")
        .arg(script)
        .arg(&d.socket)
        .arg(String::from_utf8(opening(&p, &connect_head("a.example.invalid:443"))).unwrap())
        .uid(65534)
        .gid(65534)
        .current_dir("/")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer = String::from_utf8(out.stdout).unwrap();
    assert_refused(&answer, 403, "EGRESS_PEER_DENIED");
    let line = d.wait_log(&["EGRESS_PEER_DENIED"]);
    assert!(line.contains("65534"), "{line}");
}

#[test]
fn connections_beyond_the_session_limit_are_refused() {
    let d = Daemon::start(&[]);
    let one = Limits {
        max_connections: 2,
        ..limits()
    };
    let p = preamble("s-f:1", &["a.example.invalid:443"], one);
    for _ in 0..2 {
        let answer = d.exchange(&opening(&p, &connect_head("b.example.invalid:443")));
        assert_refused(&answer, 403, "EGRESS_HOST_NOT_ALLOWED");
    }
    let answer = d.exchange(&opening(&p, &connect_head("b.example.invalid:443")));
    assert_refused(&answer, 403, "EGRESS_LIMIT_EXCEEDED");
    let line = d.wait_log(&["EGRESS_LIMIT_EXCEEDED", "s-f:1"]);
    assert!(line.contains("max_connections 2"), "{line}");
    // Another session has its own count.
    let q = preamble("s-f:2", &["a.example.invalid:443"], one);
    let answer = d.exchange(&opening(&q, &connect_head("b.example.invalid:443")));
    assert_refused(&answer, 403, "EGRESS_HOST_NOT_ALLOWED");
}

/// A CONNECT proxy on loopback that records each target and answers 502.
fn recording_proxy() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = Arc::clone(&seen);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && head.len() < 8192 {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let line = String::from_utf8_lossy(&head);
            let mut words = line.split_whitespace();
            if let (Some("CONNECT"), Some(target)) = (words.next(), words.next()) {
                record.lock().unwrap().push(target.to_owned());
            }
            let _ = conn.write_all(
                b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    (port, seen)
}

/// The host:port pip asks its proxy for first.
fn registry_from_pip(scratch: &Path) -> HostPort {
    let (port, seen) = recording_proxy();
    let proxy = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new("python3");
    cmd.args([
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--no-cache-dir",
        "--disable-pip-version-check",
        "--retries",
        "0",
        "--timeout",
        "10",
        "-d",
    ])
    .arg(scratch)
    .arg("six")
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    for var in ["HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"] {
        cmd.env(var, &proxy).env(var.to_lowercase(), &proxy);
    }
    cmd.env_remove("NO_PROXY").env_remove("no_proxy");
    let status = cmd.status().expect("python3 -m pip runs");
    assert!(!status.success(), "pip succeeded without its proxy");
    let targets = seen.lock().unwrap().clone();
    let first = targets.first().expect("pip asked its proxy for a CONNECT");
    HostPort::parse(first).unwrap()
}

/// A minimal TLS 1.2 ClientHello for `host`.
fn client_hello(host: &str) -> Vec<u8> {
    fn u16be(n: usize) -> [u8; 2] {
        (n as u16).to_be_bytes()
    }
    let mut ext = Vec::new();
    // server_name
    let name = host.as_bytes();
    let mut sni = vec![0u8];
    sni.extend(u16be(name.len()));
    sni.extend(name);
    let mut list = u16be(sni.len()).to_vec();
    list.extend(sni);
    ext.extend([0, 0]);
    ext.extend(u16be(list.len()));
    ext.extend(list);
    // supported_groups: x25519, secp256r1, secp384r1
    ext.extend([0, 0x0a, 0, 8, 0, 6, 0, 0x1d, 0, 0x17, 0, 0x18]);
    // ec_point_formats: uncompressed
    ext.extend([0, 0x0b, 0, 2, 1, 0]);
    // signature_algorithms
    let sigs = [
        0x04, 0x03, 0x05, 0x03, 0x06, 0x03, 0x08, 0x04, 0x08, 0x05, 0x08, 0x06, 0x04, 0x01, 0x05,
        0x01, 0x06, 0x01,
    ];
    ext.extend([0, 0x0d]);
    ext.extend(u16be(sigs.len() + 2));
    ext.extend(u16be(sigs.len()));
    ext.extend(sigs);
    let suites: [u8; 20] = [
        0xc0, 0x2b, 0xc0, 0x2f, 0xc0, 0x2c, 0xc0, 0x30, 0xcc, 0xa9, 0xcc, 0xa8, 0x00, 0x9c, 0x00,
        0x9d, 0x00, 0x2f, 0x00, 0x35,
    ];
    let mut body = vec![0x03, 0x03];
    body.extend([0x5a; 32]);
    body.push(0); // no session id
    body.extend(u16be(suites.len()));
    body.extend(suites);
    body.extend([1, 0]); // null compression
    body.extend(u16be(ext.len()));
    body.extend(ext);
    let mut hs = vec![1, 0];
    hs.extend(u16be(body.len()));
    hs.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend(u16be(hs.len()));
    record.extend(hs);
    record
}

/// Opens a tunnel to `target` and shows the registry answering a TLS
/// hello through it; returns the daemon's `closed` line.
fn assert_tls_through(d: &Daemon, session: &str, target: &HostPort) -> String {
    let host = target.host().to_string();
    let p = preamble(session, &[&target.to_string()], limits());
    let mut s = d.connect();
    s.write_all(&opening(&p, &connect_head(&target.to_string())))
        .unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let mut got = vec![0u8; established.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(established),
        "{}",
        d.log()
    );
    s.write_all(&client_hello(&host)).unwrap();
    let mut first = [0u8; 1];
    s.read_exact(&mut first).unwrap();
    assert_eq!(
        first[0], 0x16,
        "the server answers with a TLS handshake record"
    );
    drop(s);
    d.wait_log(&["airlock_outcome=\"closed\"", session])
}

#[test]
fn an_allowed_registry_is_tunnelled_through_a_route_of_its_addresses() {
    let scratch = tempfile::tempdir().unwrap();
    let registry = registry_from_pip(scratch.path());
    let host = registry.host().to_string();
    let port = registry.port().to_string();
    let target = registry.to_string();
    // Direct (no route): public addresses only. Where this machine's
    // resolver answers from a refused range, the registry is refused.
    let resolved = airlock_testkit::addresses(&target);
    assert!(!resolved.is_empty(), "{target} does not resolve");
    let d = Daemon::start(&["--connect-port", &port]);
    let p = preamble("s-g:0", &[&target], limits());
    if resolved
        .iter()
        .any(|ip| airlock_egress::address::check(*ip).is_err())
    {
        let answer = d.exchange(&opening(&p, &connect_head(&target)));
        assert_refused(&answer, 403, "EGRESS_ADDRESS_FORBIDDEN");
        let line = d.wait_log(&["EGRESS_ADDRESS_FORBIDDEN", "s-g:0"]);
        assert!(
            line.contains("airlock_egress_route=direct (no route)"),
            "{line}"
        );
    }
    drop(d);
    // A route listing the addresses the name resolves to here, learnt now.
    let routes = airlock_testkit::address_routes(std::slice::from_ref(&target));
    let d = Daemon::start_with(&["--connect-port", &port], Some(&routes), None);
    let line = assert_tls_through(&d, "s-g:1", &registry);
    assert!(line.contains(&target), "{line}");
    assert!(
        line.contains(&format!("airlock_egress_route=addresses {host}")),
        "{line}"
    );
    let allowed = d.wait_log(&["decision=\"allowed\"", "s-g:1"]);
    assert!(allowed.contains("resolved=Some("), "{allowed}");

    // The same registry with a budget smaller than the hello: cut off.
    let established = b"HTTP/1.1 200 Connection established\r\n\r\n";
    let tiny = Limits {
        max_bytes: 64,
        ..limits()
    };
    let p = preamble("s-g:2", &[&target], tiny);
    let mut s = d.connect();
    s.write_all(&opening(&p, &connect_head(&target))).unwrap();
    let mut got = vec![0u8; established.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, established);
    s.write_all(&client_hello(&host)).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    let line = d.wait_log(&["EGRESS_LIMIT_EXCEEDED", "s-g:2"]);
    assert!(line.contains("airlock_egress_bytes_up=64"), "{line}");
    // Its budget is used: the next connection is refused.
    let answer = d.exchange(&opening(&p, &connect_head(&target)));
    assert_refused(&answer, 403, "EGRESS_LIMIT_EXCEEDED");
}

/// A loopback listener that counts what it accepts.
fn counting_listener() -> (u16, Arc<Mutex<usize>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(Mutex::new(0usize));
    let c = Arc::clone(&count);
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            *c.lock().unwrap() += 1;
            let _ = conn.write_all(b"hello from the mirror\n");
        }
    });
    (port, count)
}

#[test]
fn a_route_s_addresses_admit_its_name_and_nothing_outside_them() {
    let (port, accepted) = counting_listener();
    let port_arg = port.to_string();
    let target = format!("localhost:{port}");
    // A mirror on this host: loopback listed one address at a time.
    let routes = "[[route]]\nhost = \"localhost\"\naddresses = [\"127.0.0.1\", \"::1\"]\n\n\
                  [[route]]\nhost = \"*.mirror.example.invalid\"\naddresses = [\"10.0.0.0/8\"]\n";
    let d = Daemon::start_with(&["--connect-port", &port_arg], Some(routes), None);
    let warning = d.wait_log(&["route localhost lets tunnels reach 127.0.0.1 (loopback)"]);
    assert!(warning.contains("WARN"), "{warning}");
    d.wait_log(&["route: addresses localhost"]);
    let p = preamble("s-r:1", &[&target], limits());
    let mut s = d.connect();
    s.write_all(&opening(&p, &connect_head(&target))).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    drop(s);
    assert!(
        answer.starts_with("HTTP/1.1 200 Connection established\r\n\r\nhello from the mirror"),
        "{answer}\n{}",
        d.log()
    );
    let line = d.wait_log(&["airlock_outcome=\"closed\"", "s-r:1"]);
    assert!(
        line.contains("airlock_egress_route=addresses localhost"),
        "{line}"
    );
    // The audit event of the tunnel: its MESSAGE_ID, the task, the address
    // reached and the bytes each way.
    assert!(
        line.contains(&format!("message_id=\"{}\"", airlock_egress::audit::TUNNEL)),
        "{line}"
    );
    assert!(line.contains("airlock_task_id=task-egress-1"), "{line}");
    assert!(
        line.contains("airlock_egress_resolved=127.0.0.1:"),
        "{line}"
    );
    assert!(line.contains("airlock_egress_bytes_up=0 "), "{line}");
    assert!(
        line.contains(&format!(
            "airlock_egress_bytes_down={} ",
            "hello from the mirror\n".len()
        )),
        "{line}"
    );
    assert!(line.contains("airlock_egress_duration_ms="), "{line}");
    assert_eq!(*accepted.lock().unwrap(), 1);
    // The literal, which no route names, is still direct: refused.
    let literal = format!("127.0.0.1:{port}");
    let p = preamble("s-r:2", &[&literal], limits());
    let answer = d.exchange(&opening(&p, &connect_head(&literal)));
    assert_refused(&answer, 403, "EGRESS_ADDRESS_FORBIDDEN");
    drop(d);
    // A route whose ranges do not hold what the name resolves to.
    let routes =
        "[[route]]\nhost = \"localhost\"\naddresses = [\"10.1.0.0/16\", \"192.168.5.5\"]\n";
    let d = Daemon::start_with(&["--connect-port", &port_arg], Some(routes), None);
    let p = preamble("s-r:3", &[&target], limits());
    let answer = d.exchange(&opening(&p, &connect_head(&target)));
    assert_refused(&answer, 403, "EGRESS_ADDRESS_FORBIDDEN");
    let line = d.wait_log(&["EGRESS_ADDRESS_FORBIDDEN", "s-r:3"]);
    assert!(line.contains("outside the route's addresses"), "{line}");
    assert!(
        line.contains(&format!(
            "message_id=\"{}\"",
            airlock_egress::audit::REFUSED
        )),
        "{line}"
    );
    assert_eq!(*accepted.lock().unwrap(), 1, "the listener was reached");
}

#[test]
fn a_configuration_that_does_not_hold_stops_the_daemon_before_it_serves() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("egress.sock");
    for (routes, part) in [
        (
            "[[route]]\nhost = \"localhost\"\naddresses = [\"127.0.0.0/8\"]\n",
            "list each one on its own",
        ),
        (
            "[[route]]\nhost = \"*\"\naddresses = [\"0.0.0.0/0\"]\n",
            "unspecified",
        ),
        (
            "[[route]]\nhost = \"*\"\nvia = \"http://127.0.0.1:3128\"\ncredential = \"parent\"\n",
            "CREDENTIALS_DIRECTORY",
        ),
        ("[[route]]\nhost = \"*\"\n", "exactly one of"),
    ] {
        let file = dir.path().join("egress.toml");
        std::fs::write(&file, routes).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_airlock-egress"))
            .arg("--socket")
            .arg(&socket)
            .args(["--allow-uid", "0", "--config"])
            .arg(&file)
            .env_remove("CREDENTIALS_DIRECTORY")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{routes}: started");
        assert!(
            err.contains("CONFIG_INVALID") && err.contains(part),
            "{routes}: {err}"
        );
        assert!(!socket.exists(), "{routes}: the socket was bound");
    }
}

#[test]
fn tunnels_go_through_a_parent_proxy_with_its_credential() {
    let scratch = tempfile::tempdir().unwrap();
    let registry = registry_from_pip(scratch.path());
    let target = registry.to_string();
    let port = registry.port().to_string();
    let parent = airlock_testkit::ParentProxy::start("airlock", "parent-s3cret");
    let creds = tempfile::tempdir().unwrap();
    std::fs::write(creds.path().join("parent"), "airlock:parent-s3cret\n").unwrap();
    std::fs::write(creds.path().join("wrong"), "airlock:not-the-password\n").unwrap();
    let targets = [target.clone()];
    let routes = airlock_testkit::via_routes(&targets, parent.port, Some("parent"));
    let d = Daemon::start_with(
        &["--connect-port", &port],
        Some(&routes),
        Some(creds.path()),
    );
    let line = assert_tls_through(&d, "s-v:1", &registry);
    let via = format!("airlock_egress_route=via 127.0.0.1:{} ", parent.port);
    assert!(line.contains(&via), "{line}");
    assert!(
        parent.log().contains(&format!("CONNECT {target}")),
        "the parent proxy made no CONNECT: {}",
        parent.log()
    );
    // Nothing of the credential in the daemon's log.
    assert!(!d.log().contains("parent-s3cret"), "{}", d.log());
    assert!(
        !d.log().contains("YWlybG9jazpwYXJlbnQtczNjcmV0"),
        "{}",
        d.log()
    );
    drop(d);
    // A wrong credential, and none: refused with their own code.
    for credential in [Some("wrong"), None] {
        let routes = airlock_testkit::via_routes(&targets, parent.port, credential);
        let d = Daemon::start_with(
            &["--connect-port", &port],
            Some(&routes),
            Some(creds.path()),
        );
        let p = preamble("s-v:2", &[&target], limits());
        let answer = d.exchange(&opening(&p, &connect_head(&target)));
        assert_refused(&answer, 403, "EGRESS_PARENT_AUTH_FAILED");
        let line = d.wait_log(&["EGRESS_PARENT_AUTH_FAILED", "s-v:2"]);
        assert!(line.contains(&via), "{line}");
        assert!(!d.log().contains("not-the-password"), "{}", d.log());
    }
    // An IP literal through the parent must still be public.
    let routes = format!(
        "[[route]]\nhost = \"*\"\nvia = \"http://127.0.0.1:{}\"\ncredential = \"parent\"\n",
        parent.port
    );
    let d = Daemon::start_with(
        &["--connect-port", &port],
        Some(&routes),
        Some(creds.path()),
    );
    let literal = format!("10.0.0.1:{port}");
    let p = preamble("s-v:3", &[&literal], limits());
    let answer = d.exchange(&opening(&p, &connect_head(&literal)));
    assert_refused(&answer, 403, "EGRESS_ADDRESS_FORBIDDEN");
    assert!(
        !parent.log().contains("CONNECT 10.0.0.1"),
        "{}",
        parent.log()
    );
}
