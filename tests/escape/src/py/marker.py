# A process outside the sandbox, of the executor's uid, with a secret in its
# environment, its argv and its memory. Logs every signal it receives, and
# answers each line the harness writes to its stdin with "sync <line>" in
# the same log: a signal sent before that line was written is handled (and
# logged) before the answer, however loaded the machine is.
import ctypes, json, os, signal, sys, time

tok, log, info = sys.argv[1:4]
buf = ctypes.create_string_buffer(tok.encode())


def on_signal(sig, frame):
    with open(log, "a") as f:
        f.write(f"signal {sig}\n")


for s in range(1, signal.NSIG):
    if s in (signal.SIGKILL, signal.SIGSTOP):
        continue
    try:
        signal.signal(s, on_signal)
    except (OSError, ValueError, RuntimeError):
        pass
# Any process of this uid may trace it (where Yama restricts ptrace), so that
# only the sandbox, not the host's ptrace policy, stands between a probe and
# the marker. EINVAL without Yama.
ctypes.CDLL(None).prctl(0x59616D61, ctypes.c_ulong(-1 & 0xFFFFFFFFFFFFFFFF), 0, 0, 0)
with open(info + ".tmp", "w") as f:
    json.dump({"pid": os.getpid(), "addr": ctypes.addressof(buf), "len": len(tok)}, f)
os.rename(info + ".tmp", info)


def answer(line):
    # Entering a Python function runs the handlers of signals already
    # delivered (the interpreter checks at a function's start), so each is
    # logged before this answer.
    with open(log, "a") as f:
        f.write(f"sync {line.strip()}\n")


while line := sys.stdin.readline():
    answer(line)
while True:
    time.sleep(1)
