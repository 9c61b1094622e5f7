# Listeners the probes try to reach. Every connection or datagram is logged;
# the harness requires the log to stay empty (in the sandboxed modes; the
# control run must reach them). A listener named dns_udp also answers A
# queries with 127.0.0.1, so that a resolution can succeed in the control.
# A listener that cannot bind is fatal: no port-9 fallback. argv: log ready
# spec-json.
import json, os, selectors, socket, sys

log, ready, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sel = selectors.DefaultSelector()
ports = {}


def dns_answer(q):
    """A reply to a DNS query: A records get 127.0.0.1, others no data."""
    end = 12
    while end < len(q) and q[end] != 0:
        end += q[end] + 1
    end += 5
    question, qtype = q[12:end], q[end - 4:end - 2]
    answer = b""
    if qtype == b"\x00\x01":
        answer = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x3c\x00\x04" + socket.inet_aton("127.0.0.1")
    count = b"\x00\x01" if answer else b"\x00\x00"
    return q[:2] + b"\x81\x80\x00\x01" + count + b"\x00\x00\x00\x00" + question + answer


def note(what):
    with open(log, "a") as f:
        f.write(what + "\n")


for name, (kind, addr) in spec.items():
    try:
        if kind in ("tcp4", "udp4", "tcp6", "udp6"):
            fam = socket.AF_INET6 if kind.endswith("6") else socket.AF_INET
            typ = socket.SOCK_STREAM if kind.startswith("tcp") else socket.SOCK_DGRAM
            s = socket.socket(fam, typ)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(tuple(addr))
            ports[name] = s.getsockname()[1]
        else:
            typ = socket.SOCK_STREAM if kind == "unix" else socket.SOCK_DGRAM
            s = socket.socket(socket.AF_UNIX, typ)
            s.bind(addr if not addr.startswith("@") else "\0" + addr[1:])
            if not addr.startswith("@"):
                os.chmod(addr, 0o777)
            ports[name] = 0
        if typ == socket.SOCK_STREAM:
            s.listen(16)
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ, (name, typ))
    except OSError as e:
        sys.stderr.write(f"listener {name}: {e}\n")
        sys.exit(f"listener {name} ({kind} {addr}) failed: {e}")
with open(ready + ".tmp", "w") as f:
    json.dump(ports, f)
os.rename(ready + ".tmp", ready)
while True:
    for key, _ in sel.select():
        name, typ = key.data
        try:
            if typ == socket.SOCK_STREAM:
                c, peer = key.fileobj.accept()
                note(f"{name}: connection from {peer!r}")
                c.close()
            else:
                data, peer = key.fileobj.recvfrom(512)
                note(f"{name}: datagram {data[:64]!r} from {peer!r}")
                if name == "dns_udp" and len(data) > 12:
                    key.fileobj.sendto(dns_answer(data), peer)
        except OSError:
            pass
