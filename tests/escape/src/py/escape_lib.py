"""Shared by every escape probe; runs INSIDE the sandbox.

A probe calls blocked(how) when its attempt failed (exit 1) and escaped(what)
when it reached its goal (exit 0). Anything else (a traceback, another exit
status) is inconclusive and fails the suite as well.

Every failure that is to count as blocked goes through why(): the errno must
be one the probe names (A["errnos"], from the probe table); any other errno
(ENOENT from a wrong fixture path, EINVAL from a malformed argument, a
timeout without an errno, ...) ends the probe as inconclusive (exit 3).
"""
import ctypes
import errno
import json
import os
import sys

A = json.loads(sys.argv[1])
NR = A["nr"]
BLOCKED_BY = A["errnos"]
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def _done(code, line):
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
    os._exit(code)


def blocked(how):
    _done(1, "BLOCKED: " + how)


def escaped(what):
    _done(0, "ESCAPED: " + what)


def inconclusive(what):
    _done(3, "INCONCLUSIVE: " + what)


def planted(what):
    """For probes only the harness can judge: the setup is in place."""
    _done(0, "PLANTED: " + what)


def en(e):
    if e is None:
        return "no errno"
    return errno.errorcode.get(e, str(e))


def why(what, e):
    """`what: ERRNO` when e is an errno that means blocked for this probe;
    otherwise the probe is inconclusive."""
    name = e if isinstance(e, str) else en(e)
    if name not in BLOCKED_BY:
        inconclusive(f"{what}: {name} is not an errno that means blocked here ({', '.join(BLOCKED_BY) or 'none named'})")
    return f"{what}: {name}"


def arg(a):
    if isinstance(a, int):
        return ctypes.c_long(a)
    if isinstance(a, str):
        return ctypes.c_char_p(a.encode())
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return a


def sc(name, *args):
    """Raw system call by name (numbers come from the harness): (ret, errno)."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name]), *[arg(a) for a in args])
    return r, ctypes.get_errno()


def attempt(what, fn):
    """fn() returning is an escape; an OSError is a block, named by errno."""
    try:
        fn()
    except OSError as e:
        blocked(why(what, e.errno))
    escaped(what)


def attempt_all(items):
    """Every (what, fn) must fail; the first that succeeds is an escape."""
    hows = []
    for what, fn in items:
        try:
            fn()
        except OSError as e:
            hows.append(why(what, e.errno))
            continue
        escaped(what)
    blocked("; ".join(hows))


def attempt_sys(what, name, *args):
    """A raw system call: any non-negative return is an escape."""
    r, e = sc(name, *args)
    if r < 0:
        blocked(why(what, e))
    escaped(f"{what} returned {r}")


def links_present(paths):
    """Each path is a symbolic link of the workspace (as the tree has
    it); a probe that follows links it does not find proves nothing."""
    for p in paths:
        try:
            os.readlink(p)
        except OSError as e:
            inconclusive(f"{p} is not a symbolic link of the workspace: {en(e.errno)}")
    return paths


def read(path):
    with open(path, "rb") as f:
        return f.read()


def write(path, data=b"pwned\n"):
    with open(path, "wb") as f:
        f.write(data)


def sysx(name, *args):
    """A raw system call that raises OSError when it fails."""
    r, e = sc(name, *args)
    if r < 0:
        raise OSError(e, en(e))
    return r
