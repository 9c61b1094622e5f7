#!/usr/bin/python3
"""The Cockpit page in a real browser, against the testbed's real Cockpit.

Run by src/scenario/cockpit.rs on the host: Debian's Chromium, headless,
in the booted container's network namespace (nsenter -n), driven through
the DevTools protocol over --remote-debugging-pipe (fds 3 and 4, messages
ended by NUL). Users log in through Cockpit's own login page; commands in
the container (airlockctl as root) run through nsenter into all of its
namespaces.

Usage: cockpit_browser.py LEADER_PID OUT_DIR

Prints one line per case, `PASS <case>: <detail>` or `FAIL <case>: <why>`,
and exits 1 when any case failed. Screenshots go to OUT_DIR.
"""

import base64
import hashlib
import json
import os
import subprocess
import sys
import time

LEADER = sys.argv[1]
OUT = sys.argv[2]
URL = "http://127.0.0.1:9090"
PAGE = URL + "/cockpit/@localhost/airlock/index.html"
TASK = "tb-cockpit"
USERS = {"alice": "alice-testbed-pw", "bob": "bob-testbed-pw", "carol": "carol-testbed-pw"}
ADMIN_TASK = "tb-cockpit-admin"
RESULTS = []


def container(script, check=True, timeout=120):
    """Runs `script` with /bin/sh in every namespace of the container."""
    p = subprocess.run(
        ["nsenter", "--target", LEADER, "--all", "/bin/sh", "-c", script],
        capture_output=True, text=True, timeout=timeout,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/root", "LANG": "C.UTF-8"})
    if check and p.returncode != 0:
        raise RuntimeError(f"{script!r} exited {p.returncode}: {p.stdout}{p.stderr}")
    return p.stdout


def task_json(task=TASK):
    return json.loads(container(f"airlockctl --json show {task}"))


def decisions(action, task=TASK):
    """The allowed `action` events of the task, as airlockctl lists them."""
    out = container(f"airlockctl --json events {task}")
    events = [json.loads(line) for line in out.splitlines() if line.strip()]
    return [e for e in events if e.get("action") == action and e.get("outcome") == "allowed"]


class Browser:
    """One Chromium with the DevTools protocol on a pipe."""

    def __init__(self):
        r_cmd, self.w = os.pipe()
        self.r, w_out = os.pipe()
        os.dup2(r_cmd, 100)
        os.dup2(w_out, 101)
        os.close(r_cmd)
        os.close(w_out)

        def fds():
            os.dup2(100, 3)
            os.dup2(101, 4)

        self.proc = subprocess.Popen(
            ["nsenter", "--target", LEADER, "--net", "--",
             "/usr/lib/chromium/chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--remote-debugging-pipe", "--window-size=1280,1000",
             "--user-data-dir=" + os.path.join(OUT, "chromium-profile"), "about:blank"],
            pass_fds=(3, 4, 100, 101), preexec_fn=fds,
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(OUT, "chromium.log"), "w"))
        os.close(100)
        os.close(101)
        self.buf = b""
        self.next_id = 0
        self.events = []

    def _read(self, timeout):
        import select
        ready, _, _ = select.select([self.r], [], [], timeout)
        if not ready:
            return None
        chunk = os.read(self.r, 1 << 20)
        if not chunk:
            raise RuntimeError("the browser closed its pipe")
        self.buf += chunk
        return True

    def _messages(self):
        while b"\0" in self.buf:
            raw, self.buf = self.buf.split(b"\0", 1)
            yield json.loads(raw)

    def send(self, method, params=None, session=None, timeout=30):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.w, json.dumps(msg).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            for m in self._messages():
                if m.get("id") == self.next_id:
                    if "error" in m:
                        raise RuntimeError(f"{method}: {m['error']}")
                    return m.get("result", {})
                self.events.append(m)
            self._read(max(0.0, deadline - time.time()))
        raise RuntimeError(f"{method}: no answer in {timeout} s")

    def pump(self):
        while self._read(0):
            pass
        for m in self._messages():
            self.events.append(m)

    def close(self):
        try:
            self.send("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Tab:
    """One page in its own browser context (its own cookies: its own login)."""

    def __init__(self, browser, name):
        self.b = browser
        self.name = name
        self.mark = 0
        ctx = browser.send("Target.createBrowserContext")["browserContextId"]
        target = browser.send("Target.createTarget", {"url": "about:blank", "browserContextId": ctx})["targetId"]
        self.s = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page.enable", "Runtime.enable", "Log.enable"):
            self.cmd(domain)

    def cmd(self, method, params=None, timeout=30):
        return self.b.send(method, params, self.s, timeout)

    def js(self, expr, timeout=30):
        r = self.cmd("Runtime.evaluate", {"expression": expr, "awaitPromise": True, "returnByValue": True}, timeout)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expr!r}: {r['exceptionDetails'].get('exception', {}).get('description', r['exceptionDetails'])}")
        return r["result"].get("value")

    def wait(self, expr, what, timeout=60):
        deadline = time.time() + timeout
        last = None
        while time.time() < deadline:
            try:
                last = self.js(expr)
                if last:
                    return last
            except RuntimeError as e:
                last = str(e)
            time.sleep(0.25)
        raise RuntimeError(f"{self.name}: {what} not seen in {timeout} s (last: {last!r})")

    def refusal(self, context=""):
        """Waits for the decision panel's refusal; its catalogue code."""
        try:
            return self.wait("(() => { const r = document.querySelector('#decision-outcome .al-refusal'); return r && r.dataset.code; })()", "the refusal", 60)
        except RuntimeError as e:
            shown = self.js("(() => { const o = document.getElementById('decision-outcome'); const n = document.getElementById('notice'); return [o ? o.innerText : null, n && !n.hidden ? n.innerText : null]; })()")
            raise RuntimeError(f"{e}; on the page: outcome {shown[0]!r}, notice {shown[1]!r}{context}")

    def go(self, url):
        self.cmd("Page.navigate", {"url": url})

    def login(self, user, superuser="none"):
        """Logs in through Cockpit's login page. `superuser` is the choice
        Cockpit's login page sends for the user (it keeps the user's last
        one in localStorage): "any" starts administrative access with the
        login password (sudo), "none" is limited access."""
        self.go(URL + "/")
        # The form is in the static page from the start, hidden: Cockpit's
        # login.js shows it (287 and 337 alike) in the step that gives the
        # button its click handler, once its own /cockpit/login probe is
        # answered. A click before that does nothing (seen on a loaded
        # machine), so the form must be shown first.
        self.wait("""(() => { const f = document.getElementById('login');
            const u = document.getElementById('login-user-input');
            return !!f && !f.hidden && !!u && u.offsetParent !== null; })()""",
                  "Cockpit's login form, shown by its login.js")
        self.js(f"localStorage.setItem({json.dumps('superuser:' + user)}, {json.dumps(superuser)})")
        self.js(f"""(() => {{
            document.getElementById('login-user-input').value = {json.dumps(user)};
            document.getElementById('login-password-input').value = {json.dumps(USERS[user])};
            document.getElementById('login-button').click();
        }})()""")
        # The shell replaces the login page once cockpit-ws has a session.
        self.wait("!document.getElementById('login-user-input') || document.getElementById('login-user-input').offsetParent === null",
                  "the shell after logging in as " + user)
        self.wait("document.readyState === 'complete' && !document.getElementById('login')", "the shell loaded", 60)
        # Cockpit's login page asks /cockpit/login before the password is
        # typed and is answered 401: the page's own errors count from here.
        self.b.pump()
        self.mark = len(self.b.events)

    def open(self, route):
        self.go(PAGE + "#" + route)
        self.wait("document.readyState === 'complete' && !!document.getElementById('view')", "the airlock page")

    def click(self, selector):
        """A real mouse click at the element's centre (Input domain)."""
        box = self.js(f"""(() => {{ const e = document.querySelector({json.dumps(selector)});
            if (!e) return null; e.scrollIntoView(); const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        if not box:
            raise RuntimeError(f"{self.name}: no {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.cmd("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 1})
        return box

    def double_click(self, selector):
        box = self.click(selector)
        for kind in ("mousePressed", "mouseReleased"):
            self.cmd("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left", "clickCount": 2})

    def screenshot(self, name):
        data = self.cmd("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True})["data"]
        path = os.path.join(OUT, name)
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
        return path

    def console_errors(self):
        self.b.pump()
        errors = []
        for m in self.b.events[self.mark:]:
            if m.get("sessionId") != self.s:
                continue
            p = m.get("params", {})
            if m.get("method") == "Runtime.exceptionThrown":
                errors.append(p["exceptionDetails"].get("exception", {}).get("description") or p["exceptionDetails"].get("text"))
            elif m.get("method") == "Runtime.consoleAPICalled" and p.get("type") == "error":
                errors.append(" ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args", [])))
            elif m.get("method") == "Log.entryAdded" and p["entry"].get("level") == "error":
                url = p["entry"].get("url", "")
                if url.endswith("favicon.ico"):
                    continue
                if cockpit_shell_gap(p["entry"], url):
                    IGNORED.append(f"{self.name}: {url}")
                    continue
                errors.append(p["entry"].get("text", "") + " " + url)
        return errors


# Cockpit's own shell, not the page: Cockpit 337's shell.css (Debian 13)
# names ./assets/fonts/RedHatText/RedHatTextVF*.woff2 beside
# ../../static/fonts/RedHatText/…, and Debian's cockpit-ws ships only the
# latter (287's, Debian 12, names no such file). The browser uses the next
# source; when it first needs the font, after the login or before, decides
# whether the 404 falls among the page's errors. Exactly such a failed load
# is set aside, and only while the root's Cockpit lacks the file.
SHELL_FONTS = "/cockpit/@localhost/shell/assets/fonts/"
IGNORED = []
_shell_files = {}


def cockpit_shell_gap(entry, url):
    path = url.split("?", 1)[0]
    if not path.startswith(URL + SHELL_FONTS) or not entry.get("text", "").startswith("Failed to load resource"):
        return False
    file = "/usr/share/cockpit/shell/assets/fonts/" + path[len(URL + SHELL_FONTS):]
    if file not in _shell_files:
        _shell_files[file] = container(f"test -e '{file}' && echo present || echo absent").strip()
    return _shell_files[file] == "absent"


def case(name):
    def run(f):
        try:
            detail = f()
            RESULTS.append((True, name, detail or ""))
            print(f"PASS {name}: {detail or ''}", flush=True)
        except Exception as e:  # a case's failure is reported, the rest go on
            RESULTS.append((False, name, str(e)))
            print(f"FAIL {name}: {e}".replace("\n", " | "), flush=True)
        return f
    return run


def main():
    browser = Browser()
    alice = bob = None
    try:
        alice = Tab(browser, "alice")
        alice.login("alice")
        alice.open("/tasks")
        alice.wait("!!document.getElementById('task-rows')", "the task list")

        @case("task list follows a task submitted from airlockctl (TaskChanged, no reload)")
        def _():
            before = alice.js("document.querySelectorAll('#task-rows tr[data-task]').length")
            alice.js("window.__airlockNoReload = true")
            container(f"python3 /tmp/tb/mktask.py {TASK} fix 2 /tmp/tb/{TASK}.json >/dev/null && airlockctl --json submit /tmp/tb/{TASK}.json >/dev/null")
            alice.wait(f"!!document.querySelector('#task-rows tr[data-task=\"{TASK}\"]')", "the new task's row", 60)
            state = alice.wait(f"(() => {{ const r = document.querySelector('#task-rows tr[data-task=\"{TASK}\"]'); return r && r.dataset.state === 'VERIFYING' && r.dataset.state; }})()",
                               "the row moving to VERIFYING", 240)
            if not alice.js("window.__airlockNoReload === true"):
                raise RuntimeError("the page reloaded")
            after = alice.js("document.querySelectorAll('#task-rows tr[data-task]').length")
            return f"{before} rows, then {after}; {TASK} appeared and moved to {state} without a reload"

        @case("task page renders the diff, each verification command, the isolation evidence and the events")
        def _():
            alice.open("/task/" + TASK)
            alice.wait("!!document.getElementById('verification') && !!document.getElementById('diff')", "the task page's sections")
            facts = alice.js("""(() => ({
                adds: document.querySelectorAll('#diff .al-diff-add').length,
                dels: document.querySelectorAll('#diff .al-diff-del').length,
                files: Array.from(document.querySelectorAll('#diff .al-diff-head code'), e => e.textContent),
                commands: Array.from(document.querySelectorAll('#verification tr[data-command]'), r => [r.dataset.command, r.children[1].textContent, r.children[2].textContent]),
                isolation: document.querySelectorAll('#isolation dt').length,
                gaps: document.getElementById('isolation').dataset.gaps,
                events: document.querySelectorAll('#events tbody tr').length,
                revision: document.getElementById('about-revision').textContent,
                result: document.getElementById('about-result').textContent,
            }))()""")
            view = task_json()
            if facts["adds"] < 1 or not facts["files"]:
                raise RuntimeError(f"no diff: {facts}")
            want = [c["label"] for c in view["result"]["verification"]]
            if [c[0] for c in facts["commands"]] != want or any(c[1] != "0" for c in facts["commands"]):
                raise RuntimeError(f"commands {facts['commands']}, the result has {want}")
            if facts["isolation"] < 5 or facts["events"] < 1:
                raise RuntimeError(f"evidence or events missing: {facts}")
            if facts["revision"] != str(view["revision"]) or facts["result"] != view["result_sha256"]:
                raise RuntimeError(f"the decision is about {facts['revision']}/{facts['result']}, the task is at {view['revision']}/{view['result_sha256']}")
            shot = alice.screenshot("cockpit-task.png")
            return f"diff of {facts['files']} (+{facts['adds']} -{facts['dels']}), commands {facts['commands']}, {facts['isolation']} isolation facts ({facts['gaps']} gaps), {facts['events']} events; {shot}"

        @case("a user without the right to decide sees the refusal's code, and nothing changes")
        def _():
            nonlocal bob
            before = task_json()
            bob = Tab(browser, "bob")
            bob.login("bob")
            bob.open("/task/" + TASK)
            bob.wait("!!document.getElementById('decide-accept')", "bob's decision panel")
            bob.click("#decide-accept")
            code = bob.refusal()
            text = bob.js("document.querySelector('#decision-outcome .al-refusal').textContent")
            after = task_json()
            if (after["state"], after["revision"]) != (before["state"], before["revision"]):
                raise RuntimeError(f"the task changed: {before['state']} r{before['revision']} -> {after['state']} r{after['revision']}")
            # polkit's "no" for a remote session (AUTHORIZATION_DENIED), or a
            # challenge the page did not allow (INTERACTIVE_AUTHORIZATION_REQUIRED).
            if code not in ("AUTHORIZATION_DENIED", "INTERACTIVE_AUTHORIZATION_REQUIRED"):
                raise RuntimeError(f"refused with {code}: {text}")
            if decisions("TASK_VERIFIED"):
                raise RuntimeError("a decision was recorded")
            return f"refused {code} ({text.strip()[:160]}); still {after['state']} at revision {after['revision']}"

        @case("administrative access: limited, a sudoer is refused and pointed to it; turned on at login, the decision goes as root")
        def _():
            container(f"python3 /tmp/tb/mktask.py {ADMIN_TASK} fix 2 /tmp/tb/{ADMIN_TASK}.json >/dev/null && airlockctl --json submit /tmp/tb/{ADMIN_TASK}.json >/dev/null")
            deadline = time.time() + 240
            while task_json(ADMIN_TASK)["state"] != "VERIFYING":
                if time.time() > deadline:
                    raise RuntimeError(f"{ADMIN_TASK} did not reach VERIFYING: {task_json(ADMIN_TASK)['state']}")
                time.sleep(0.5)
            before = task_json(ADMIN_TASK)
            limited = Tab(browser, "carol (limited access)")
            limited.login("carol", "none")
            limited.open("/task/" + ADMIN_TASK)
            limited.wait("!!document.getElementById('decide-cancel')", "carol's decision panel")
            limited.click("#decide-cancel")
            code = limited.refusal(f"; the task is {task_json(ADMIN_TASK)['state']}")
            hint = limited.js("document.querySelector('#decision-outcome .al-refusal').textContent")
            if code not in ("AUTHORIZATION_DENIED", "INTERACTIVE_AUTHORIZATION_REQUIRED") or "administrative access" not in hint:
                raise RuntimeError(f"limited: {code}: {hint}")
            if (task_json(ADMIN_TASK)["revision"]) != before["revision"]:
                raise RuntimeError("the limited refusal changed the task")
            errors = limited.console_errors()
            admin = Tab(browser, "carol (administrative access)")
            admin.login("carol", "any")
            admin.open("/task/" + ADMIN_TASK)
            # Cockpit starts the root bridge (sudo, the login password) beside
            # the session; the page reconnects when the permission changes.
            admin.wait("""new Promise(done => { const p = cockpit.permission({ admin: true });
                const f = () => { if (p.allowed) done(true) }; p.addEventListener('changed', f); f();
                setTimeout(() => done(p.allowed === true), 20000) })""", "administrative access", 60)
            admin.open("/task/" + ADMIN_TASK)
            admin.wait("!!document.getElementById('decide-cancel')", "carol's decision panel as an administrator")
            admin.click("#decide-cancel")
            admin.wait("document.querySelector('#task-state .al-state').textContent === 'CANCELLED'", "CANCELLED on the page", 60)
            made = decisions("TASK_CANCELLED", ADMIN_TASK)
            if len(made) != 1:
                raise RuntimeError(f"{len(made)} cancellations: {made}")
            actor = made[0].get("actor")
            if not isinstance(actor, dict) or actor.get("uid") != 0:
                raise RuntimeError(f"cancelled by {actor}, not by root")
            errors += admin.console_errors()
            if errors:
                raise RuntimeError("console errors: " + "; ".join(errors[:5]))
            return f"limited: {code} with the hint; administrative access: CANCELLED once, by {actor}"

        @case("accept from the page decides exactly once (a double click, then a reload)")
        def _():
            alice.open("/task/" + TASK)
            alice.wait("!!document.getElementById('decide-accept')", "alice's decision panel")
            alice.double_click("#decide-accept")
            alice.cmd("Page.reload")
            alice.wait("!!document.getElementById('task-state')", "the task page after the reload")
            alice.wait("document.querySelector('#task-state .al-state').textContent === 'SUCCEEDED'", "SUCCEEDED on the page", 120)
            view = task_json()
            made = decisions("TASK_VERIFIED")
            if view["state"] != "SUCCEEDED" or len(made) != 1:
                raise RuntimeError(f"state {view['state']}, {len(made)} decisions: {made}")
            if alice.js("!!document.getElementById('decide-accept')"):
                raise RuntimeError("the page still offers a decision")
            # The key is airlockctl's (DecisionRequest::about): decide-, the
            # first 32 hex digits of SHA-256 over task, revision seen,
            # decision and reason joined by NUL, then -r<revision seen>.
            key = made[0]["payload"]["idempotency_key"]
            seen = key.rsplit("-r", 1)[-1]
            tag = hashlib.sha256("\0".join([TASK, seen, "accept", made[0]["payload"]["reason"]]).encode()).hexdigest()
            if key != f"decide-{tag[:32]}-r{seen}":
                raise RuntimeError(f"the page's key {key} is not airlockctl's decide-{tag[:32]}-r{seen}")
            return f"one TASK_VERIFIED (event {made[0].get('id')}, key {key}, as airlockctl derives it), the task SUCCEEDED with commit {view['result'].get('commit_oid')}"

        @case("repositories: every registered repository, as airlockctl repo list has them, with environment and upstream")
        def _():
            registered = sorted(r["name"] for r in json.loads(container("airlockctl --json repo list")))
            bob.open("/repositories")
            bob.wait("!!document.getElementById('repositories') || !!document.querySelector('#view .al-refusal')", "the repositories table")
            rows = bob.js("""Array.from(document.querySelectorAll('#repositories tbody tr'), r =>
                [r.dataset.repository, r.children[1].textContent, r.children[2].textContent, r.children[4].textContent])""") or []
            if sorted(r[0] for r in rows) != registered:
                shown = bob.js("document.getElementById('view').innerText") or ""
                raise RuntimeError(f"the page lists {[r[0] for r in rows]}, airlockctl repo list {registered} ({shown[:300]!r})")
            if not all(r[1] and r[2] for r in rows):
                raise RuntimeError(f"environment or upstream missing: {rows}")
            return "; ".join(f"{r[0]}: environment {r[1]!r}, upstream {r[2]!r}, {r[3]} tasks" for r in rows)

        @case("agents: the held agent shows its hold; clear hold and stop/start work from the page")
        def _():
            alice.open("/agents")
            alice.wait("!!document.querySelector('#agents tr[data-agent=\"crashy\"][data-state=\"HELD\"]')", "crashy HELD")
            reason = alice.js("document.querySelector('#agents tr[data-agent=\"crashy\"]').children[4].textContent")
            shot = alice.screenshot("cockpit-agents.png")
            alice.click('#agents tr[data-agent="crashy"] button[data-action="clear-hold"]')
            alice.wait("(() => { const r = document.querySelector('#agents tr[data-agent=\"crashy\"]'); return r && r.dataset.state !== 'HELD'; })()", "crashy no longer HELD", 60)
            cleared = json.loads(container("airlockctl --json agent show crashy"))
            quota = alice.js("document.querySelector('#agents tr[data-agent=\"crashy\"] td.al-quotas').textContent") or ""
            limits = cleared.get("limits") or {}
            if limits.get("tasks_per_hour") != 7 or "tasks this hour 0 / 7" not in quota or "/ 3600" not in quota:
                raise RuntimeError(f"crashy's quotas: page {quota!r}, airlockctl {limits!r}")
            alice.click('#agents tr[data-agent="steady"] button[data-action="stop"]')
            alice.wait("(() => { const r = document.querySelector('#agents tr[data-agent=\"steady\"]'); return r && r.dataset.state === 'STOPPED'; })()", "steady STOPPED", 60)
            alice.click('#agents tr[data-agent="steady"] button[data-action="start"]')
            alice.wait("(() => { const r = document.querySelector('#agents tr[data-agent=\"steady\"]'); return r && r.dataset.state === 'RUNNING'; })()", "steady RUNNING again", 90)
            return f"crashy HELD ({reason}), quotas {quota!r}, cleared (airlockctl: {cleared.get('state')}, {cleared.get('consecutive_failures')} failures); steady stopped and started; {shot}"

        @case("dark theme follows Cockpit's setting; every control is keyboard reachable")
        def _():
            alice.open("/agents")
            alice.wait("!!document.getElementById('agents')", "the agents page")
            alice.js("localStorage.setItem('shell:style', 'dark'); window.dispatchEvent(new CustomEvent('cockpit-style', {detail: {style: 'dark'}}))")
            dark = alice.js("[document.documentElement.classList.contains('pf-theme-dark'), getComputedStyle(document.body).backgroundColor]")
            alice.screenshot("cockpit-agents-dark.png")
            alice.js("localStorage.setItem('shell:style', 'light'); window.dispatchEvent(new CustomEvent('cockpit-style', {detail: {style: 'light'}}))")
            light = alice.js("[document.documentElement.classList.contains('pf-theme-dark'), getComputedStyle(document.body).backgroundColor]")
            if not dark[0] or light[0] or dark[1] == light[1]:
                raise RuntimeError(f"dark {dark}, light {light}")
            wanted = alice.js("document.querySelectorAll('a[href], button, select, textarea').length")
            reached = set()
            alice.js("document.activeElement && document.activeElement.blur()")
            for _ in range(wanted + 5):
                for kind in ("keyDown", "keyUp"):
                    alice.cmd("Input.dispatchKeyEvent", {"type": kind, "key": "Tab", "code": "Tab", "windowsVirtualKeyCode": 9})
                reached.add(alice.js("(() => { const e = document.activeElement; return e ? e.tagName + '#' + (e.id || e.dataset.action || e.textContent.trim()) + '@' + (e.closest('tr') ? e.closest('tr').dataset.agent : '') : ''; })()"))
            controls = alice.js("Array.from(document.querySelectorAll('a[href], button, select, textarea'), e => e.tagName + '#' + (e.id || e.dataset.action || e.textContent.trim()) + '@' + (e.closest('tr') ? e.closest('tr').dataset.agent : ''))")
            missing = [c for c in controls if c not in reached]
            if missing:
                raise RuntimeError(f"not reached by Tab: {missing}")
            return f"dark {dark[1]}, light {light[1]}; all {len(controls)} controls reached by Tab"

        @case("no console errors on the page")
        def _():
            errors = alice.console_errors() + (bob.console_errors() if bob else [])
            if errors:
                raise RuntimeError("; ".join(errors[:10]))
            if IGNORED:
                return f"none (alice and bob); set aside, Cockpit's shell font its package lacks: {'; '.join(sorted(set(IGNORED)))}"
            return "none (alice and bob)"
    finally:
        browser.close()
    return 0 if all(ok for ok, _, _ in RESULTS) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:
        print(f"FAIL browser session: {e}", flush=True)
        sys.exit(1)
