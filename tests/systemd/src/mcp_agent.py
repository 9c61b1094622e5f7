# The testbed's coding agent: a scripted MCP client (raw JSON-RPC over the
# stdio of /usr/bin/airlock-mcp), run as airlock-agent. Prints one JSON
# object with what it saw. Standard library only.
import json
import subprocess
import sys

proc = subprocess.Popen(
    ["/usr/bin/airlock-mcp"],
    stdin=subprocess.PIPE,
    stdout=subprocess.PIPE,
    stderr=open("/tmp/tb/airlock-mcp.stderr", "w"),
    text=True,
)
next_id = 0
stdout_lines = 0


def request(method, params):
    global next_id, stdout_lines
    next_id += 1
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params}) + "\n")
    proc.stdin.flush()
    while True:
        line = proc.stdout.readline()
        if not line:
            raise SystemExit("airlock-mcp closed stdout")
        stdout_lines += 1
        msg = json.loads(line)
        assert msg["jsonrpc"] == "2.0", line
        if msg.get("id") == next_id and "method" not in msg:
            return msg


def call(tool, args):
    r = request("tools/call", {"name": tool, "arguments": args})["result"]
    assert json.loads(r["content"][0]["text"]) == r["structuredContent"], r
    return r.get("isError", False), r["structuredContent"]


init = request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                              "clientInfo": {"name": "testbed-agent", "version": "1"}})
proc.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}) + "\n")
proc.stdin.flush()
out = {"protocol": init["result"]["protocolVersion"]}
tools = request("tools/list", {})["result"]["tools"]
out["tools"] = [t["name"] for t in tools]
_, repos = call("list_repositories", {})
out["repositories"] = [r["id"] for r in repos["repositories"] if r["readable"]]
out["presets"] = [p["name"] for p in repos["presets"]]
_, base = call("resolve_ref", {"repository": "mul", "ref": "main"})
_, f = call("read_file", {"repository": "mul", "revision": base["commit"], "path": "mul.py"})
out["read"] = f["content"]
patch = "--- a/mul.py\n+++ b/mul.py\n@@ -1,2 +1,2 @@\n def mul(a, b):\n-    return a + b\n+    return a * b\n"
err, p = call("propose_change", {"repository": "mul", "base": base["commit"], "patch": patch,
                                 "presets": ["python-unittest"], "max_attempts": 1,
                                 "idempotency_token": "testbed-mcp-1"})
if err:
    raise SystemExit("propose_change refused: %s" % json.dumps(p))
out["task_id"] = p["task_id"]
task = None
for _ in range(8):
    err, w = call("wait_for_task", {"task_id": p["task_id"], "timeout_seconds": 30})
    if err:
        raise SystemExit("wait_for_task refused: %s" % json.dumps(w))
    task = w["task"]
    if w["finished"]:
        break
out["state"] = task["state"]
out["commit"] = task["commit"]
err, c = call("cancel_task", {"task_id": p["task_id"]})
out["cancel"] = c["error"]["code"] if err else c["state"]
err, c = call("read_file", {"repository": "mul", "revision": "main", "path": "../../etc/shadow"})
out["escape"] = c["error"]["code"] if err else "read"
proc.stdin.close()
out["exit"] = proc.wait(timeout=10)
out["stdout_lines"] = stdout_lines
print(json.dumps(out))
