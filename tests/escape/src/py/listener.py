# Listeners the probes try to reach. Every connection or datagram is logged;
# the harness requires the log to stay empty. argv: log ready spec-json.
import json, os, selectors, socket, sys

log, ready, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
sel = selectors.DefaultSelector()
ports = {}


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
        ports[name] = None
        sys.stderr.write(f"listener {name}: {e}\n")
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
        except OSError:
            pass
