// airlock's Cockpit page: tasks, decisions, agents, repositories and
// reconciliation cases, over org.airlock.Supervisor1 on the system bus.
//
// Every call goes through cockpit.dbus as the logged-in user (as root only
// when the user turned on Cockpit's administrative access), and polkit
// decides each one in the supervisor: the page holds no privilege of its
// own, reads no file and opens no other connection. Tasks follow the
// supervisor's TaskChanged signal (sent to a connection once it has made an
// authorised read) and agents AgentChanged; there is no polling loop.
//
// Decisions are the ones airlockctl sends: an airlock.task-decision.v1 body
// naming the revision, attempt and result SHA-256 on screen (compare and
// swap), with the idempotency key derived as airlockctl derives it, so a
// double click, a second tab and a reload all make the same request and the
// supervisor records one decision.
"use strict";

const BUS_NAME = "org.airlock.Supervisor1";
const OBJECT_PATH = "/org/airlock/Supervisor1";
const TASKS = "org.airlock.Tasks2";
const AGENTS = "org.airlock.Agents1";
const RECONCILE = "org.airlock.Reconcile1";
const ERROR_PREFIX = "org.airlock.Error.";
const PENDING_KEY = "airlock:pending-decision:";
const TERMINAL = ["SUCCEEDED", "FAILED", "CANCELLED"];
const STATES = ["QUEUED", "RUNNING", "VERIFYING", "SUCCEEDED", "FAILED", "CANCELLED"];

// The connection to the supervisor: through Cockpit's root bridge when the
// user has turned on administrative access ("try"), as the user otherwise.
let bus = null;
const admin = cockpit.permission({ admin: true });

const state = {
    tasks: new Map(), // task id -> TaskView
    listed: false,
    agents: new Map(),
    refusals: new Map(), // task id -> the last refused decision {revision, decision, error}
    filter: { state: "", repository: "", agent: "" },
};

// ---------------------------------------------------------------------------
// Small helpers.

function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
        if (v === undefined || v === null || v === false) continue;
        if (k === "class") node.className = v;
        else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
        else if (k === "text") node.textContent = v;
        else node.setAttribute(k, v === true ? "" : String(v));
    }
    for (const c of children.flat(Infinity)) {
        if (c === undefined || c === null || c === false) continue;
        node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
}

function time(ms) {
    if (ms === undefined || ms === null) return "-";
    return new Date(Number(ms)).toLocaleString();
}

function seconds(ms) {
    return (Number(ms) / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
}

// A refusal as its catalogue code and message.
function refusal(err) {
    const name = (err && err.name) || "";
    let code = name;
    if (name.startsWith(ERROR_PREFIX)) code = name.slice(ERROR_PREFIX.length);
    // The two catalogue codes the supervisor sends under D-Bus's own names.
    else if (name === "org.freedesktop.DBus.Error.InteractiveAuthorizationRequired")
        code = "INTERACTIVE_AUTHORIZATION_REQUIRED";
    else if (name === "org.freedesktop.DBus.Error.AccessDenied")
        code = "AUTHORIZATION_DENIED";
    else if (!name) code = (err && err.problem) || "ERROR";
    return { code, message: (err && err.message) || cockpit.message(err) };
}

function showNotice(kind, text, extra) {
    const n = document.getElementById("notice");
    n.replaceChildren(el("span", { class: "al-notice-text", text }), extra || "");
    n.className = "al-notice al-notice-" + kind;
    n.hidden = false;
}

function clearNotice() {
    document.getElementById("notice").hidden = true;
}

// A refusal on screen: its code, its message, and for an authorisation
// refusal Cockpit's own way to more rights (administrative access).
function refusalBox(err, what) {
    const r = refusal(err);
    const box = el("div", { class: "al-refusal", role: "alert", "data-code": r.code },
                   el("strong", { class: "al-code", text: r.code }), " ",
                   el("span", { text: (what ? what + ": " : "") + r.message }));
    const auth = ["INTERACTIVE_AUTHORIZATION_REQUIRED", "NOT_AUTHORIZED", "AUTHORIZATION_DENIED"];
    if (auth.includes(r.code)) {
        if (admin.allowed === false)
            box.append(el("p", { class: "al-hint" },
                          "This needs rights your account does not have. If it is an administrator's, ",
                          "turn on administrative access in Cockpit's top bar (",
                          el("em", { text: "Limited access" }), ") and try again."));
        else
            box.append(el("p", { class: "al-hint", text: "polkit refused this account the action." }));
    }
    return box;
}

// Every call without D-Bus's interactive-authorization flag (flags ""):
// polkit then answers at once — a challenge comes back as
// INTERACTIVE_AUTHORIZATION_REQUIRED, with the hint to turn on Cockpit's
// administrative access — instead of holding the call open for a polkit
// agent the page cannot show.
async function call(iface, method, args) {
    const reply = await bus.call(OBJECT_PATH, iface, method, args, { flags: "" });
    return reply.length ? reply[0] : undefined;
}

async function callJson(iface, method, args) {
    return JSON.parse(await call(iface, method, args));
}

// A request's tag: SHA-256 of `text` where the browser offers it (a secure
// context: HTTPS or localhost); elsewhere 16 random bytes, which keeps the
// key unique, and the pending request in sessionStorage keeps it stable
// across a reload.
async function requestTag(text) {
    const hex = bytes => Array.from(new Uint8Array(bytes), b => b.toString(16).padStart(2, "0")).join("");
    if (window.crypto && crypto.subtle)
        return hex(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(text)));
    return hex(crypto.getRandomValues(new Uint8Array(16)));
}

function parseResult(view) {
    return view && view.result && typeof view.result === "object" ? view.result : null;
}

function agentOf(view) {
    const s = view.submitter || {};
    if (s.agent) return s.agent;
    return "";
}

function submitterText(view) {
    const s = view.submitter;
    if (!s) return "-";
    if (s.agent) return "agent " + s.agent;
    return s.uid === null || s.uid === undefined ? "-" : "uid " + s.uid;
}

function stateBadge(s) {
    return el("span", { class: "al-state al-state-" + String(s).toLowerCase(), text: s });
}

// ---------------------------------------------------------------------------
// Tasks: the list, kept live by TaskChanged.

async function loadTasks() {
    const all = new Map();
    let after = "";
    for (let page = 0; page < 50; page++) {
        const reply = await callJson(TASKS, "ListTasks", ["", after, 1000]);
        for (const t of reply.tasks) all.set(t.task_id, t);
        if (!reply.next_after) break;
        after = reply.next_after;
    }
    state.tasks = all;
    state.listed = true;
}

async function taskChanged(taskId) {
    try {
        const view = await callJson(TASKS, "GetTask", [taskId]);
        state.tasks.set(view.task_id, view);
    } catch (e) {
        if (refusal(e).code === "TASK_NOT_FOUND") state.tasks.delete(taskId);
        else return;
    }
    const route = currentRoute();
    if (route[0] === "tasks") renderTaskRows();
    else if (route[0] === "task" && route[1] === taskId) renderTask(taskId, { quiet: true });
    else if (route[0] === "repositories") renderRepositories();
}

function filteredTasks() {
    const f = state.filter;
    return Array.from(state.tasks.values())
            .filter(t => !f.state || t.state === f.state)
            .filter(t => !f.repository || t.binding.repository === f.repository)
            .filter(t => !f.agent || agentOf(t) === f.agent)
            .sort((a, b) => b.created_at_ms - a.created_at_ms || (a.task_id < b.task_id ? 1 : -1));
}

function select(id, label, values, current, onchange) {
    const s = el("select", { id, onchange: e => onchange(e.target.value) },
                 el("option", { value: "", text: "all" }),
                 values.map(v => el("option", { value: v, selected: v === current, text: v })));
    return el("label", { class: "al-filter" }, label + " ", s);
}

async function renderTasks() {
    const view = document.getElementById("view");
    if (!state.listed) {
        view.replaceChildren(el("p", { class: "al-loading", text: "Loading tasks…" }));
        try {
            await loadTasks();
        } catch (e) {
            view.replaceChildren(refusalBox(e, "ListTasks"));
            return;
        }
    }
    const repos = [...new Set(Array.from(state.tasks.values(), t => t.binding.repository))].sort();
    const agents = [...new Set(Array.from(state.tasks.values(), agentOf).filter(Boolean))].sort();
    const f = state.filter;
    const rerender = () => renderTasks();
    view.replaceChildren(
        el("h2", { text: "Tasks" }),
        el("div", { class: "al-filters" },
           select("filter-state", "State", STATES, f.state, v => { f.state = v; rerender() }),
           select("filter-repository", "Repository", repos, f.repository, v => { f.repository = v; rerender() }),
           select("filter-agent", "Agent", agents, f.agent, v => { f.agent = v; rerender() })),
        el("table", { class: "al-table", id: "tasks" },
           el("thead", {}, el("tr", {}, ["Task", "State", "Repository", "Branch", "Submitter", "Attempt", "Updated"]
                   .map(h => el("th", { scope: "col", text: h })))),
           el("tbody", { id: "task-rows" })));
    renderTaskRows();
}

function renderTaskRows() {
    const body = document.getElementById("task-rows");
    if (!body) return;
    const rows = filteredTasks().map(t => el("tr", { "data-task": t.task_id, "data-state": t.state },
        el("td", {}, el("a", { href: "#/task/" + encodeURIComponent(t.task_id), text: t.task_id })),
        el("td", {}, stateBadge(t.state)),
        el("td", { text: t.binding.repository }),
        el("td", { text: t.binding.target_branch }),
        el("td", { text: submitterText(t) }),
        el("td", { text: t.attempt + " of " + t.max_attempts }),
        el("td", { text: time(t.updated_at_ms) })));
    if (!rows.length)
        rows.push(el("tr", {}, el("td", { colspan: 7, class: "al-empty", text: "No tasks." })));
    body.replaceChildren(...rows);
}

// ---------------------------------------------------------------------------
// One task.

function diffOf(change) {
    const lines = [];
    const push = (cls, text) => {
        for (const line of String(text).replace(/\n$/, "").split("\n"))
            lines.push(el("span", { class: "al-diff-" + cls, text: (cls === "add" ? "+" : cls === "del" ? "-" : " ") + line + "\n" }));
    };
    const head = el("div", { class: "al-diff-head" },
                    el("code", { text: change.path }), " ",
                    el("span", { class: "al-op", text: change.operation.replace(/_/g, " ") }),
                    change.expected_sha256 ? el("span", { class: "al-guard", title: "the file must have this SHA-256 before the change", text: " expects " + change.expected_sha256.slice(0, 12) }) : "");
    switch (change.operation) {
    case "replace_text":
        lines.push(el("span", { class: "al-diff-hunk", text: "@@ " + change.count + " occurrence(s) @@\n" }));
        push("del", change.old);
        push("add", change.new);
        break;
    case "write_file":
        push("add", change.content);
        break;
    case "write_symlink":
        push("add", "symbolic link -> " + change.target);
        break;
    case "delete_file":
        push("del", "(deleted)");
        break;
    default:
        push("ctx", JSON.stringify(change));
    }
    return el("div", { class: "al-diff" }, head, el("pre", { class: "al-diff-body" }, lines));
}

function renderPlan(plan) {
    const env = plan.envelope || {};
    const changes = env.change_set || [];
    const commands = env.verification || [];
    return el("section", { class: "al-card", id: "plan" },
        el("h3", { text: "Plan" }),
        el("dl", { class: "al-facts" },
           el("dt", { text: "Action" }), el("dd", { text: env.action || "-" }),
           el("dt", { text: "Plan digest" }), el("dd", {}, el("code", { text: plan.plan_digest })),
           el("dt", { text: "Commands" }), el("dd", {}, commands.length
               ? el("ul", {}, commands.map(c => el("li", {}, el("strong", { text: c.label }), " ", el("code", { text: (c.argv || []).join(" ") }), " in ", el("code", { text: c.cwd || "." }), " (at most " + c.timeout_seconds + " s)")))
               : "none")),
        el("h3", { text: "Changes" }),
        changes.length ? el("div", { id: "diff" }, changes.map(diffOf)) : el("p", { text: "No changes (a source capture)." }),
        env.capture_paths && env.capture_paths.length ? el("p", {}, "Captures: ", el("code", { text: env.capture_paths.join(", ") })) : "");
}

function renderVerification(result) {
    const rows = (result.verification || []).map(c => {
        const passed = c.exit_code === 0 && !c.timed_out;
        return [
            el("tr", { class: passed ? "al-pass" : "al-fail", "data-command": c.label },
                el("td", { text: c.label }),
                el("td", { text: c.timed_out ? "timed out" : c.exit_code === null || c.exit_code === undefined ? "-" : c.exit_code }),
                el("td", { text: seconds(c.duration_ms) }),
                el("td", { text: passed ? "passed" : "failed" })),
            (c.stdout_tail || c.stderr_tail)
                ? el("tr", { class: "al-tail-row" }, el("td", { colspan: 4 },
                    c.stdout_tail ? el("details", { open: !passed }, el("summary", { text: "standard output (tail, redacted)" }), el("pre", { class: "al-tail", text: c.stdout_tail })) : "",
                    c.stderr_tail ? el("details", { open: !passed }, el("summary", { text: "standard error (tail, redacted)" }), el("pre", { class: "al-tail", text: c.stderr_tail })) : ""))
                : ""
        ];
    });
    return el("section", { class: "al-card", id: "verification" },
        el("h3", { text: "Verification" }),
        rows.length
            ? el("table", { class: "al-table" },
                 el("thead", {}, el("tr", {}, ["Command", "Exit code", "Duration", ""].map(h => el("th", { scope: "col", text: h })))),
                 el("tbody", {}, rows))
            : el("p", { text: "No command ran." }));
}

// The isolation evidence: each property, a gap (not measured, not
// enforced) marked as one.
function renderIsolation(result) {
    const iso = result.isolation;
    if (!iso) return el("section", { class: "al-card", id: "isolation" }, el("h3", { text: "Isolation" }), el("p", { class: "al-gap", text: "No isolation evidence in this result." }));
    const gap = v => v === undefined || v === null || v === "unmeasured" || v === "" || (Array.isArray(v) && !v.length);
    const facts = [
        ["Landlock", iso.landlock + (iso.landlock_abi ? " (ABI " + iso.landlock_abi + ")" : ""), gap(iso.landlock) || !/enforced|full/i.test(iso.landlock)],
        ["seccomp", iso.seccomp, gap(iso.seccomp) || !/enforced|filter/i.test(iso.seccomp)],
        ["Namespaces", (iso.namespaces || []).join(", ") || "unmeasured", gap(iso.namespaces)],
        ["View", iso.view, gap(iso.view)],
        ["User", iso.uid === null || iso.uid === undefined ? "unmeasured" : "uid " + iso.uid, iso.uid === null || iso.uid === undefined || iso.uid === 0],
    ];
    if (iso.layer)
        facts.push(["Environment layer", iso.layer.key + " (" + (iso.layer.reused ? "reused" : "built") + ", " + iso.layer.bytes + " bytes)", false]);
    const gaps = facts.filter(f => f[2]).length;
    return el("section", { class: "al-card", id: "isolation", "data-gaps": gaps },
        el("h3", { text: "Isolation" }),
        gaps ? el("p", { class: "al-gap", text: gaps + " gap(s) in the evidence: highlighted below." }) : "",
        el("dl", { class: "al-facts" }, facts.map(([k, v, g]) => [
            el("dt", { text: k }), el("dd", { class: g ? "al-gap" : "", text: v })])),
        iso.layer && iso.layer.egress && iso.layer.egress.length
            ? el("details", {}, el("summary", { text: "Egress during environment setup" }),
                 el("ul", {}, iso.layer.egress.map(d => el("li", { class: d.allowed ? "" : "al-gap", text: (d.allowed ? "allowed " : "refused ") + d.target }))))
            : "");
}

function renderEvents(events) {
    return el("section", { class: "al-card", id: "events" },
        el("h3", { text: "Events" }),
        el("table", { class: "al-table" },
           el("thead", {}, el("tr", {}, ["#", "Time", "Action", "Actor", "Outcome"].map(h => el("th", { scope: "col", text: h })))),
           el("tbody", {}, events.map(e => el("tr", { "data-action": e.action, "data-outcome": e.outcome },
               el("td", { text: e.id }),
               el("td", { text: time(e.at_ms) }),
               el("td", { text: e.action }),
               el("td", { text: e.actor && typeof e.actor === "object" ? (e.actor.name || e.actor.kind || "") : String(e.actor || "") }),
               el("td", { class: e.outcome === "allowed" ? "" : "al-gap", text: e.outcome + (e.code ? " " + e.code : "") }))))));
}

async function loadEvents(taskId) {
    const events = [];
    let after = 0;
    for (let page = 0; page < 20; page++) {
        const reply = await callJson(TASKS, "ListEvents", [taskId, after, 1000]);
        events.push(...reply.events);
        if (reply.events.length < 1000) break;
        after = reply.next_after;
    }
    return events;
}

// An exactly-once request's idempotency key, as airlockctl derives it:
// `prefix`-<the first 32 hex digits of the tag of `parts`>-r<revision>.
async function requestKey(prefix, parts, revision) {
    const tag = await requestTag(parts.join("\0"));
    return prefix + "-" + tag.slice(0, 32) + "-r" + revision;
}

// The request airlockctl sends for `decision` about `view` as shown.
async function decisionRequest(view, decision, reason) {
    reason = reason.trim();
    return {
        schema: "airlock.task-decision.v1",
        task_id: view.task_id,
        decision,
        reason,
        idempotency_key: await requestKey("decide", [view.task_id, view.revision, decision, reason], view.revision),
        expected_revision: view.revision,
        expected_attempt: view.attempt,
        expected_result_sha256: view.result_sha256 === undefined ? null : view.result_sha256,
    };
}

let inflight = null;

// Sends a decision once: the request is kept in sessionStorage until the
// supervisor answers, so a reload in between sends the same request again
// (an idempotent replay), never a second decision.
async function sendDecision(request) {
    if (inflight) return inflight;
    const method = request.decision === "cancel" ? "CancelTask" : "Verify";
    sessionStorage.setItem(PENDING_KEY + request.task_id, JSON.stringify(request));
    inflight = (async () => {
        try {
            const out = await callJson(TASKS, method, [request.task_id, JSON.stringify(request)]);
            sessionStorage.removeItem(PENDING_KEY + request.task_id);
            showNotice("ok", (out.idempotent ? "Already decided: " : "Decided: ") + out.decision + " of " + out.task_id + " (now " + (out.state || "") + ")");
            return out;
        } catch (e) {
            const r = refusal(e);
            // A refusal is an answer too: nothing was decided.
            if (r.code !== "disconnected" && r.code !== "timeout") sessionStorage.removeItem(PENDING_KEY + request.task_id);
            throw e;
        } finally {
            inflight = null;
        }
    })();
    return inflight;
}

function decisionPanel(view) {
    const canVerify = view.state === "VERIFYING";
    const canCancel = !TERMINAL.includes(view.state);
    if (!canVerify && !canCancel) return "";
    const reason = el("textarea", { id: "decision-reason", rows: 2, "aria-label": "Reason", placeholder: "Why (kept in the event log)" });
    const out = el("div", { id: "decision-outcome", "aria-live": "polite" });
    // A refusal stays on screen while the task is as it was: the list's
    // signals re-render the page, and a refusal changed nothing.
    const last = state.refusals.get(view.task_id);
    if (last && last.revision === view.revision) out.append(refusalBox(last.error, last.decision));
    const buttons = [];
    const decide = decision => async () => {
        const text = reason.value.trim() || ("decided in Cockpit: " + decision);
        buttons.forEach(b => { b.disabled = true });
        out.replaceChildren(el("span", { class: "al-loading", text: "Deciding…" }));
        try {
            await sendDecision(await decisionRequest(view, decision, text));
            state.refusals.delete(view.task_id);
            out.replaceChildren();
        } catch (e) {
            state.refusals.set(view.task_id, { revision: view.revision, decision, error: e });
            // The page may have been drawn again meanwhile (a signal):
            // the refusal goes to the panel on screen.
            (document.getElementById("decision-outcome") || out).replaceChildren(refusalBox(e, decision));
            buttons.forEach(b => { b.disabled = false });
            return;
        }
        await taskChanged(view.task_id);
    };
    if (canVerify) {
        buttons.push(el("button", { class: "al-button al-primary", id: "decide-accept", onclick: decide("accept") }, "Accept"));
        buttons.push(el("button", { class: "al-button", id: "decide-rework", onclick: decide("rework") }, "Rework"));
        buttons.push(el("button", { class: "al-button al-danger", id: "decide-reject", onclick: decide("reject") }, "Reject"));
    }
    if (canCancel)
        buttons.push(el("button", { class: "al-button al-danger", id: "decide-cancel", onclick: decide("cancel") }, "Cancel task"));
    return el("section", { class: "al-card", id: "decision" },
        el("h3", { text: "Decision" }),
        el("p", { class: "al-about" }, "About revision ", el("strong", { id: "about-revision", text: view.revision }),
           ", attempt ", el("strong", { id: "about-attempt", text: view.attempt }),
           ", result ", el("code", { id: "about-result", text: view.result_sha256 || "none" }),
           ": if the task changed since, the supervisor refuses the decision and nothing happens."),
        reason, el("div", { class: "al-buttons" }, buttons), out);
}

async function renderTask(taskId, opts) {
    const view = document.getElementById("view");
    if (!(opts && opts.quiet)) view.replaceChildren(el("p", { class: "al-loading", text: "Loading " + taskId + "…" }));
    let task, plan, events;
    try {
        task = await callJson(TASKS, "GetTask", [taskId]);
    } catch (e) {
        view.replaceChildren(el("p", {}, el("a", { href: "#/tasks", text: "← Tasks" })), refusalBox(e, "GetTask " + taskId));
        return;
    }
    state.tasks.set(task.task_id, task);
    const [planOut, eventsOut] = await Promise.allSettled([callJson(TASKS, "GetPlan", [taskId]), loadEvents(taskId)]);
    plan = planOut.status === "fulfilled" ? renderPlan(planOut.value) : el("section", { class: "al-card", id: "plan" }, el("h3", { text: "Plan" }), refusalBox(planOut.reason, "GetPlan"));
    events = eventsOut.status === "fulfilled" ? renderEvents(eventsOut.value) : el("section", { class: "al-card", id: "events" }, refusalBox(eventsOut.reason, "ListEvents"));
    const result = parseResult(task);
    const b = task.binding;
    const v = task.verification && typeof task.verification === "object" ? task.verification : null;
    if (currentRoute()[1] !== taskId) return;
    view.replaceChildren(
        el("p", {}, el("a", { href: "#/tasks", text: "← Tasks" })),
        el("h2", {}, "Task ", el("code", { id: "task-id", text: task.task_id }), " ", el("span", { id: "task-state" }, stateBadge(task.state))),
        el("section", { class: "al-card", id: "summary" },
           el("dl", { class: "al-facts" },
              el("dt", { text: "Repository" }), el("dd", { text: b.repository }),
              el("dt", { text: "Target branch" }), el("dd", { text: b.target_branch + " (" + b.branch_mode + ")" }),
              el("dt", { text: "Base" }), el("dd", {}, el("code", { text: b.base_oid })),
              el("dt", { text: "Attempt" }), el("dd", { text: task.attempt + " of " + task.max_attempts }),
              el("dt", { text: "Revision" }), el("dd", { text: task.revision }),
              el("dt", { text: "Submitter" }), el("dd", { text: submitterText(task) }),
              el("dt", { text: "Result" }), el("dd", {}, result
                  ? [result.outcome, result.commit_oid ? [", commit ", el("code", { id: "commit", text: result.commit_oid })] : "", result.failure_code ? [", ", el("strong", { class: "al-code", text: result.failure_code })] : ""]
                  : "none yet"),
              v ? [el("dt", { text: "Decision" }), el("dd", { id: "verification-record", text: [v.decision, v.reason].filter(Boolean).join(": ") })] : "",
              el("dt", { text: "Updated" }), el("dd", { text: time(task.updated_at_ms) }))),
        decisionPanel(task),
        plan,
        result ? renderVerification(result) : "",
        result ? renderIsolation(result) : "",
        events);
}

// A decision the page sent but whose answer a reload cut off: send the very
// same request again (an idempotent replay answers the stored outcome).
async function resumePending() {
    for (let i = 0; i < sessionStorage.length; i++) {
        const k = sessionStorage.key(i);
        if (!k || !k.startsWith(PENDING_KEY)) continue;
        try {
            await sendDecision(JSON.parse(sessionStorage.getItem(k)));
        } catch (e) {
            showNotice("error", "A decision sent before the reload: " + refusal(e).code + ": " + refusal(e).message);
        }
    }
}

// ---------------------------------------------------------------------------
// Agents.

async function renderAgents() {
    const view = document.getElementById("view");
    let agents;
    try {
        agents = (await callJson(AGENTS, "ListAgents", [])).agents;
    } catch (e) {
        view.replaceChildren(el("h2", { text: "Agents" }), refusalBox(e, "ListAgents"));
        return;
    }
    state.agents = new Map(agents.map(a => [a.name, a]));
    // Each agent's quotas and use (GetAgentLimits, protocol 12.0): a
    // supervisor that cannot answer (older, or the caller may not read
    // them) leaves the cell "-", the rest of the page as it was.
    const limits = new Map(await Promise.all(agents.map(a =>
        callJson(AGENTS, "GetAgentLimits", [a.name]).then(l => [a.name, l], () => [a.name, null]))));
    const out = el("div", { id: "agent-outcome", "aria-live": "polite" });
    const act = (method, name) => async ev => {
        ev.target.disabled = true;
        try {
            await callJson(AGENTS, method, [name]);
            out.replaceChildren();
        } catch (e) {
            out.replaceChildren(refusalBox(e, method + " " + name));
        }
        await renderAgents().then(() => document.getElementById("agent-outcome").replaceWith(out));
    };
    view.replaceChildren(
        el("h2", { text: "Agents" }),
        out,
        el("table", { class: "al-table", id: "agents" },
           el("thead", {}, el("tr", {}, ["Agent", "State", "Failures", "Next start", "Hold reason", "Repositories", "Quotas (used / limit)", ""].map(h => el("th", { scope: "col", text: h })))),
           el("tbody", {}, agents.length ? agents.map(a => el("tr", { "data-agent": a.name, "data-state": a.state },
               el("td", { text: a.name }),
               el("td", {}, stateBadge(a.state)),
               el("td", { text: a.consecutive_failures }),
               el("td", { text: time(a.next_start_at_ms) }),
               el("td", { class: a.hold_reason ? "al-gap" : "", text: a.hold_reason || "-" }),
               el("td", { text: (a.repositories || []).join(", ") || "all" }),
               el("td", { class: "al-quotas", text: quotas(limits.get(a.name)) }),
               el("td", { class: "al-buttons" },
                  el("button", { class: "al-button", "data-action": "start", onclick: act("StartAgent", a.name) }, "Start"),
                  el("button", { class: "al-button", "data-action": "stop", onclick: act("StopAgent", a.name) }, "Stop"),
                  a.state === "HELD" ? el("button", { class: "al-button al-primary", "data-action": "clear-hold", onclick: act("ClearHold", a.name) }, "Clear hold") : "")))
               : el("tr", {}, el("td", { colspan: 8, class: "al-empty", text: "No agents configured." })))));
}

// One agent's quotas as the cell shows them: each of tasks per hour, CPU
// seconds per day and running tasks as "used / limit" ("no limit" for 0),
// as `airlockctl agent show` prints them.
function quotas(l) {
    if (!l) return "-";
    const u = l.usage || {};
    const of = (used, limit) => used + " / " + (limit ? limit : "no limit");
    return [
        "tasks this hour " + of(u.tasks_last_hour || 0, l.tasks_per_hour),
        "CPU s today " + of(Math.floor((u.cpu_ms_last_day || 0) / 1000), l.cpu_seconds_per_day),
        "running " + of(u.running || 0, l.max_running),
    ].join("; ");
}

// ---------------------------------------------------------------------------
// Repositories: those the tasks this account may read name, with their
// latest upstream facts where a result carries them.

// The registered repositories (ListRepositories: each one's environment,
// upstream, signer and newest sync), with the counts of the tasks this
// account may read.
async function renderRepositories() {
    const view = document.getElementById("view");
    let listed;
    try {
        [listed] = await Promise.all([callJson(TASKS, "ListRepositories", []), state.listed ? null : loadTasks()]);
    } catch (e) {
        view.replaceChildren(el("h2", { text: "Repositories" }), refusalBox(e, "ListRepositories"));
        return;
    }
    const counts = new Map();
    for (const t of state.tasks.values()) {
        const c = counts.get(t.binding.repository) || { tasks: 0, open: 0, last: null };
        c.tasks++;
        if (!TERMINAL.includes(t.state)) c.open++;
        if (!c.last || t.updated_at_ms > c.last.updated_at_ms) c.last = t;
        counts.set(t.binding.repository, c);
    }
    const environment = r => {
        const e = r.environment;
        if (!e) return el("td", { text: "system programs only" });
        if (e.problem)
            return el("td", { class: "al-gap" }, el("strong", { class: "al-code", text: e.problem.code }), " " + e.problem.key + ": " + e.problem.message);
        const facts = Object.entries(e.configured || {}).map(([k, v]) => k + " " + (typeof v === "string" ? v : JSON.stringify(v)));
        return el("td", {}, el("code", { text: facts.join("; ") || "configured" }));
    };
    const upstream = r => {
        const u = r.upstream;
        if (!u) return el("td", { text: "none" });
        const ev = r.last_upstream_event;
        return el("td", {},
            el("code", { text: u.url }),
            " (" + (u.publish ? "publishes agent branches" : "followed only") + (u.sync_interval_seconds ? ", every " + u.sync_interval_seconds + " s" : "") + ")",
            ev ? el("div", { class: ev.action === "UPSTREAM_SYNC_FAILED" ? "al-gap" : "al-hint" },
                   el("strong", { text: ev.action }), " " + time(ev.at_ms) + (ev.detail && ev.detail.code ? ": " + ev.detail.code : ""))
               : el("div", { class: "al-hint", text: "no sync recorded yet" }));
    };
    view.replaceChildren(
        el("h2", { text: "Repositories" }),
        listed.repositories.length
            ? el("table", { class: "al-table", id: "repositories" },
                 el("thead", {}, el("tr", {}, ["Repository", "Environment", "Upstream", "Signed by", "Tasks", "Open", "Latest"].map(h => el("th", { scope: "col", text: h })))),
                 el("tbody", {}, listed.repositories.map(r => {
                     const c = counts.get(r.name) || { tasks: 0, open: 0, last: null };
                     return el("tr", { "data-repository": r.name },
                         el("td", {}, el("strong", { text: r.name }), r.description ? el("div", { class: "al-hint", text: r.description }) : ""),
                         environment(r),
                         upstream(r),
                         el("td", { text: r.signing ? r.signing.principal : "not signed" }),
                         el("td", { text: c.tasks }),
                         el("td", { text: c.open }),
                         el("td", {}, c.last ? [el("a", { href: "#/task/" + encodeURIComponent(c.last.task_id), text: c.last.task_id }), " ", stateBadge(c.last.state)] : "-"));
                 })))
            : el("p", { text: "No repository is registered (airlockctl repo add)." }));
}

// ---------------------------------------------------------------------------
// Reconciliation cases.

async function resolveRequest(c, resolution, reason) {
    reason = reason.trim();
    return {
        schema: "airlock.reconciliation-resolution.v1",
        task_id: c.task_id,
        resolution,
        reason,
        idempotency_key: await requestKey("resolve", [c.task_id, c.attempt, c.revision, resolution, reason], c.revision),
        expected_attempt: c.attempt,
        expected_revision: c.revision,
        expected_observed_head: c.observed_head === undefined ? null : c.observed_head,
    };
}

async function renderReconciliation() {
    const view = document.getElementById("view");
    let cases;
    try {
        cases = (await callJson(RECONCILE, "ListReconciliations", ["", "", 0])).cases;
    } catch (e) {
        view.replaceChildren(el("h2", { text: "Reconciliation" }), refusalBox(e, "ListReconciliations"));
        return;
    }
    const out = el("div", { id: "reconcile-outcome", "aria-live": "polite" });
    const resolve = (c, resolution) => async ev => {
        ev.target.disabled = true;
        try {
            const req = await resolveRequest(c, resolution, "resolved in Cockpit: " + resolution);
            await callJson(RECONCILE, "ResolveReconciliation", [c.task_id, JSON.stringify(req)]);
            await renderReconciliation();
        } catch (e) {
            out.replaceChildren(refusalBox(e, "ResolveReconciliation " + c.task_id));
            ev.target.disabled = false;
        }
    };
    view.replaceChildren(
        el("h2", { text: "Reconciliation" }),
        el("p", { class: "al-hint", text: "A case opens when an attempt's branch moved behind the worker's back: adopt the head it found, or fail the task." }),
        out,
        el("table", { class: "al-table", id: "cases" },
           el("thead", {}, el("tr", {}, ["Task", "Status", "Repository", "Branch", "Commit", "Observed head", "Opened", ""].map(h => el("th", { scope: "col", text: h })))),
           el("tbody", {}, (cases || []).length ? cases.map(c => el("tr", { "data-task": c.task_id, "data-status": c.status },
               el("td", {}, el("a", { href: "#/task/" + encodeURIComponent(c.task_id), text: c.task_id })),
               el("td", {}, stateBadge(c.status)),
               el("td", { text: c.repository }),
               el("td", { text: c.branch }),
               el("td", {}, el("code", { text: c.commit_oid.slice(0, 12) })),
               el("td", {}, el("code", { text: c.observed_head ? c.observed_head.slice(0, 12) : "none" })),
               el("td", { text: time(c.opened_at_ms) }),
               el("td", { class: "al-buttons" }, c.status === "OPEN" ? [
                   el("button", { class: "al-button", onclick: resolve(c, "adopt") }, "Adopt"),
                   el("button", { class: "al-button al-danger", onclick: resolve(c, "fail") }, "Fail task")] : (c.last_refusal || ""))))
               : el("tr", {}, el("td", { colspan: 8, class: "al-empty", text: "No reconciliation cases." })))));
}

// ---------------------------------------------------------------------------
// Routing, theme, start.

function currentRoute() {
    const path = cockpit.location.path;
    if (!path.length) return ["tasks"];
    return path.map(decodeURIComponent);
}

function route() {
    const r = currentRoute();
    for (const t of ["tasks", "agents", "repositories", "reconciliation"]) {
        const tab = document.getElementById("tab-" + t);
        const on = r[0] === t || (t === "tasks" && r[0] === "task");
        tab.classList.toggle("al-active", on);
        if (on) tab.setAttribute("aria-current", "page");
        else tab.removeAttribute("aria-current");
    }
    clearNotice();
    switch (r[0]) {
    case "task": return renderTask(r[1]);
    case "agents": return renderAgents();
    case "repositories": return renderRepositories();
    case "reconciliation": return renderReconciliation();
    default: return renderTasks();
    }
}

// Cockpit's theme: the shell keeps the choice in localStorage
// ("shell:style": auto, light or dark) and tells pages of a change.
function applyTheme(style) {
    style = style || localStorage.getItem("shell:style") || "auto";
    const dark = style === "dark" || (style === "auto" && window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches);
    document.documentElement.classList.toggle("pf-theme-dark", dark);
}

function connect() {
    const b = cockpit.dbus(BUS_NAME, { bus: "system", superuser: "try" });
    b.subscribe({ path: OBJECT_PATH, interface: TASKS, member: "TaskChanged" },
                (path, iface, signal, args) => taskChanged(args[0]));
    b.subscribe({ path: OBJECT_PATH, interface: AGENTS, member: "AgentChanged" },
                () => { if (currentRoute()[0] === "agents") renderAgents() });
    b.addEventListener("close", (ev, options) => {
        document.getElementById("connection").textContent = "Disconnected from the system bus: " + cockpit.message(options);
    });
    bus = b;
}

function start() {
    applyTheme();
    window.addEventListener("storage", e => { if (e.key === "shell:style") applyTheme(e.newValue) });
    window.addEventListener("cockpit-style", e => applyTheme(e.detail && e.detail.style));
    if (window.matchMedia) window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", () => applyTheme());
    // Links inside the page go through cockpit.location, so the shell's
    // address bar follows.
    document.addEventListener("click", ev => {
        const a = ev.target.closest && ev.target.closest("a[href^='#/']");
        if (!a) return;
        ev.preventDefault();
        cockpit.location.go(a.getAttribute("href").slice(1));
    });
    // A change of administrative access makes Cockpit reload the page
    // (cockpit.permission), so the connection opened here is on the
    // bridge that applies for the page's life.
    connect();
    cockpit.addEventListener("locationchanged", route);
    document.getElementById("connection").textContent = "";
    resumePending().finally(route);
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
