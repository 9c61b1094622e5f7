//! The bus contract, checked against the running supervisor:
//!
//! - the object it exports has exactly the interfaces and methods of the
//!   rows of `airlock_proto::bus` (a handler renamed on one side only
//!   fails here), each with its row's signature in and out, and each
//!   refuses a caller without the row's permission with the row's code,
//!   recording the refusal under the row's event;
//! - every operation of `airlock_proto::states::TABLE`, called through the
//!   one client (`airlock-client`) on a task in every state, ends as the
//!   table says: the task moves to one of the states listed, or the call is
//!   refused with exactly the listed code and the task does not change;
//! - every move of task state the store makes meanwhile (each one its one
//!   writer committed, logged by the supervisor's test-build flag
//!   `--debug-transition-log`) is a row of
//!   `airlock_proto::states::TRANSITIONS`, every change a call made is
//!   such a move, a refused call makes none, and a step with no row is
//!   refused;
//!
//! - Verify and CancelTask are exactly-once compare-and-swaps: a stale
//!   revision or attempt, a result the caller did not see, a key reused
//!   for another decision and the wrong decision for the method each end
//!   with their own code and change nothing; an identical replay returns
//!   the stored answer after the task moved on.
//!
//! - `org.airlock.Tasks1`, kept for one release beside `Tasks2`, serves the
//!   3.0–6.1 calls as before, and a client written before protocol 3.0
//!   calling `Verify` with three strings gets `PROTOCOL_VERSION_MISMATCH`
//!   naming `Tasks2.Verify`, not a bare signature error.
//!
//! A real supervisor process on a private dbus-daemon with the shipped bus
//! policy; the local authoriser admits this test's uid, which also plays
//! the worker (Worker1) and airlock-retryd (Retry1).

mod common;

use airlock_client::Supervisor;
use airlock_localbus::{PrivateBus, SupervisorProcess, sibling_binary};
use airlock_proto::Code;
use airlock_proto::bus::{INTERFACES, LeaseRef, OBJECT_PATH, ROWS};
use airlock_proto::retry::RetryExtensionRequest;
use airlock_proto::states::{self, Op, Outcome};
use airlock_proto::task::{
    ClaimGrant, Decision, DecisionOutcome, DecisionRequest, TaskResult, TaskState, TaskView,
};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const OWNER: &str = "owner-contract-20261130";

struct Stack {
    /// Where the supervisor logs the store's moves.
    moves: std::path::PathBuf,
    _dir: tempfile::TempDir,
    bus: PrivateBus,
    _sup: SupervisorProcess,
    client: Supervisor,
    rt: tokio::runtime::Runtime,
}

fn stack() -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("airlock.toml");
    std::fs::write(
        &config,
        format!(
            "[retry]\nauthorization_id = \"{OWNER}\"\n\n[[repository]]\nname = \"demo\"\npath = \"/srv/airlock/demo.git\"\n"
        ),
    )
    .unwrap();
    let bus = PrivateBus::start().expect("dbus-daemon");
    let moves = dir.path().join("moves.log");
    let sup = SupervisorProcess::start(
        &sibling_binary("airlock-supervisor").unwrap(),
        &bus,
        &config,
        &dir.path().join("tasks.sqlite3"),
        &["--debug-transition-log", moves.to_str().unwrap()],
    )
    .expect("the supervisor starts");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt
        .block_on(Supervisor::connect(Some(bus.address())))
        .unwrap();
    Stack {
        moves,
        _dir: dir,
        bus,
        _sup: sup,
        client,
        rt,
    }
}

/// One move the store logged: task, from, step, to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Logged {
    task: String,
    from: TaskState,
    step: String,
    to: TaskState,
}

impl Logged {
    /// The row of the transitions table this move is.
    fn row(&self) -> Option<&'static states::Transition> {
        states::TRANSITIONS.iter().find(|t| {
            t.from == self.from && format!("{:?}", t.step) == self.step && t.to == self.to
        })
    }
}

impl Stack {
    /// Every move the store committed so far, in order.
    fn moves(&self) -> Vec<Logged> {
        let text = std::fs::read_to_string(&self.moves).unwrap_or_default();
        text.lines()
            .map(|l| {
                let f: Vec<&str> = l.split('\t').collect();
                assert_eq!(f.len(), 4, "a move log line: {l:?}");
                Logged {
                    task: f[0].to_owned(),
                    from: TaskState::parse(f[1]).unwrap(),
                    step: f[2].to_owned(),
                    to: TaskState::parse(f[3]).unwrap(),
                }
            })
            .collect()
    }

    fn submit(&self, task: &str) {
        let mut s = common::submission(task);
        s["max_attempts"] = json!(1);
        self.rt.block_on(self.client.submit_task(&s)).unwrap();
    }

    fn claim(&self, task: &str) -> ClaimGrant {
        let grant = self
            .rt
            .block_on(self.client.claim())
            .unwrap()
            .expect("a grant");
        assert_eq!(grant.task_id, task, "the claim took another task");
        grant
    }

    fn result(
        &self,
        grant: &ClaimGrant,
        passed: bool,
        key: &str,
    ) -> Result<(), airlock_proto::Error> {
        let mut v = common::passed_result(&serde_json::to_value(grant).unwrap());
        if !passed {
            v["outcome"] = json!("failed");
            v["commit_oid"] = Value::Null;
            v["failure_code"] = json!("VERIFICATION_FAILED");
            v["verification"][0]["exit_code"] = json!(1);
        }
        let r: TaskResult = serde_json::from_value(v).unwrap();
        self.rt
            .block_on(self.client.submit_result(&LeaseRef::of(grant), key, &r))
            .map(|_| ())
    }

    fn get(&self, task: &str) -> TaskView {
        self.rt.block_on(self.client.get_task(task)).unwrap()
    }

    /// A decision about the task as it is shown now (what airlockctl does).
    fn decide(&self, task: &str, d: Decision) -> Result<DecisionOutcome, airlock_proto::Error> {
        let req = DecisionRequest::about(&self.get(task), d, "contract test", None);
        self.send(&req)
    }

    fn send(&self, req: &DecisionRequest) -> Result<DecisionOutcome, airlock_proto::Error> {
        if req.decision == Decision::Cancel {
            self.rt.block_on(self.client.cancel_task(req))
        } else {
            self.rt.block_on(self.client.verify(req))
        }
    }
}

/// Makes one task in each of `states`; returns each task's id and its last
/// lease. QUEUED must come last, so that every claim here takes the task it
/// means to.
fn tasks_in(
    s: &Stack,
    prefix: &str,
    states: &[&'static str],
) -> Vec<(&'static str, String, Option<ClaimGrant>)> {
    let mut out = Vec::new();
    for &state in states {
        let task = format!("{prefix}-{}", state.to_lowercase());
        s.submit(&task);
        let grant = match state {
            "QUEUED" => None,
            "CANCELLED" => {
                s.decide(&task, Decision::Cancel).unwrap();
                None
            }
            _ => {
                let g = s.claim(&task);
                match state {
                    "VERIFYING" => s.result(&g, true, "result-verifying-0001").unwrap(),
                    "SUCCEEDED" => {
                        s.result(&g, true, "result-succeeded-0001").unwrap();
                        s.decide(&task, Decision::Accept).unwrap();
                    }
                    "FAILED" => s.result(&g, false, "result-failed-0001").unwrap(),
                    _ => {}
                }
                Some(g)
            }
        };
        assert_eq!(s.get(&task).state.as_str(), state, "{task}");
        out.push((state, task, grant));
    }
    out
}

const NOT_QUEUED: &[&str] = &["RUNNING", "VERIFYING", "SUCCEEDED", "FAILED", "CANCELLED"];

fn retry_request(view: &TaskView) -> RetryExtensionRequest {
    // The digest the store compares: of the verification record, `{}` when none.
    let record = view.verification.clone().unwrap_or_else(|| json!({}));
    let sha = airlock_proto::canonical::digest_of(&record).unwrap();
    RetryExtensionRequest::from_value(&json!({
        "expected_status": "FAILED",
        "expected_revision": view.revision,
        "expected_attempt": view.max_attempts,
        "expected_max_attempts": view.max_attempts,
        "next_max_attempts": view.max_attempts + 1,
        "previous_verification_sha256": sha,
        "authorization_id": OWNER,
        "idempotency_key": format!("retry-{}-0001", view.task_id),
    }))
    .unwrap()
}

/// Applies `op` to `task` (state `state`); returns the refusal, if any.
fn apply(
    s: &Stack,
    op: Op,
    task: &str,
    grant: Option<&ClaimGrant>,
) -> Result<(), airlock_proto::Error> {
    let c = &s.client;
    let fake = ClaimGrant {
        task_id: task.to_owned(),
        attempt: 1,
        lease_epoch: 1,
        lease_token: "0".repeat(64),
        lease_expires_at_ms: 0,
        envelope: json!({"execution_digest": "d".repeat(64), "target_branch": format!("agent/{task}")}),
    };
    let lease_grant = grant.unwrap_or(&fake);
    let view = s.get(task);
    match op {
        Op::ReplacePlan => {
            let plan = common::plan(task, 2, Some(&view.plan_digest));
            s.rt.block_on(c.replace_plan(task, &plan)).map(|_| ())
        }
        Op::Cancel => s.decide(task, Decision::Cancel).map(|_| ()),
        Op::Accept => s.decide(task, Decision::Accept).map(|_| ()),
        Op::Rework => s.decide(task, Decision::Rework).map(|_| ()),
        Op::Reject => s.decide(task, Decision::Reject).map(|_| ()),
        Op::Claim => match s.rt.block_on(c.claim())? {
            Some(g) if g.task_id == task => Ok(()),
            Some(g) => panic!("Claim took {} while probing {task}", g.task_id),
            None => Err(airlock_proto::Error::new(Code::TASK_NOT_FOUND)),
        },
        Op::Renew => {
            s.rt.block_on(c.renew(&LeaseRef::of(lease_grant)))
                .map(|_| ())
        }
        Op::Fence => {
            let req = airlock_proto::bus::FenceRequest {
                step: airlock_proto::bus::FenceStep::Ref,
                commit_oid: Some("c".repeat(40)),
                hold_ms: 60_000,
            };
            s.rt.block_on(c.fence(&LeaseRef::of(lease_grant), &req))
                .map(|_| ())
        }
        Op::SubmitPassed => s.result(lease_grant, true, "contract-passed-0001"),
        Op::SubmitFailed => s.result(lease_grant, false, "contract-failed-0001"),
        Op::ExtendRetry => {
            s.rt.block_on(c.extend_retry(task, &retry_request(&view), OWNER))
                .map(|_| ())
        }
    }
}

#[test]
fn every_operation_in_every_state_ends_as_the_state_table_says() {
    let mut checked = 0;
    let mut seen = std::collections::BTreeSet::new();
    for (i, op) in Op::ALL.iter().enumerate() {
        // A stack per operation: a claim must find only the task it probes.
        let s = stack();
        let prefix = format!("op{i}");
        // The QUEUED task is made only after the others were probed: a
        // claim must not find it while a non-QUEUED task is being probed.
        let mut tasks = tasks_in(&s, &prefix, NOT_QUEUED);
        let mut probed = 0;
        while probed < TaskState::ALL.len() {
            if probed == tasks.len() {
                tasks.extend(tasks_in(&s, &prefix, &["QUEUED"]));
            }
            let (state, task, grant) = &tasks[probed];
            probed += 1;
            let state = TaskState::parse(state).unwrap();
            let before = s.get(task);
            let logged_before = s.moves().len();
            let got = apply(&s, *op, task, grant.as_ref());
            let after = s.get(task);
            // The store logs a move when its transaction commits, before
            // the reply; what this call moved is what was logged meanwhile.
            let made: Vec<Logged> = s.moves().split_off(logged_before);
            if after.revision == before.revision {
                assert!(
                    made.is_empty(),
                    "{op:?} in {state:?}: moves without a change: {made:?}"
                );
            } else {
                assert_eq!(made.len(), 1, "{op:?} in {state:?}: {made:?}");
                let m = &made[0];
                assert_eq!(
                    (m.task.as_str(), m.from, m.to),
                    (task.as_str(), before.state, after.state),
                    "{op:?} in {state:?}: the change is not the move logged"
                );
                let row = m
                    .row()
                    .unwrap_or_else(|| panic!("{m:?} is not a transition"));
                assert_eq!(row.step.op(), Some(*op), "{op:?} in {state:?}: {m:?}");
            }
            match states::outcome(*op, state) {
                Outcome::To(allowed, _) => {
                    assert!(got.is_ok(), "{op:?} in {state:?}: refused {:?}", got.err());
                    assert!(
                        allowed.contains(&after.state),
                        "{op:?} in {state:?}: ended {:?}, table says {allowed:?}",
                        after.state
                    );
                }
                Outcome::Refused(code, _) => {
                    let e = got.expect_err(&format!("{op:?} in {state:?} must be refused"));
                    assert_eq!(e.code, code, "{op:?} in {state:?}: {e}");
                    assert_eq!(
                        (after.state, after.revision),
                        (before.state, before.revision),
                        "{op:?} in {state:?}: a refusal changed the task"
                    );
                }
                Outcome::NotClaimed => {
                    assert_eq!(
                        got.map_err(|e| e.code),
                        Err(Code::TASK_NOT_FOUND),
                        "{op:?} in {state:?}: the claim must return no grant"
                    );
                    assert_eq!(after.revision, before.revision, "{op:?} in {state:?}");
                }
            }
            checked += 1;
        }
        // Every move of this stack's runs, the set-up's included, is a row.
        let all = s.moves();
        assert!(!all.is_empty());
        for m in &all {
            assert!(m.row().is_some(), "{m:?} is not in states::TRANSITIONS");
            seen.insert(m.step.clone());
        }
    }
    assert_eq!(checked, Op::ALL.len() * TaskState::ALL.len());
    // The runs made every step of a bus operation but the ones that need
    // auto_accept (off here) or a result failed for good.
    for step in states::Step::ALL {
        let needed = step.op().is_some()
            && !matches!(step, states::Step::AutoAccept | states::Step::SubmitFinal);
        assert_eq!(
            seen.contains(&format!("{step:?}")),
            needed,
            "{step:?}: seen {seen:?}"
        );
    }
}

#[test]
fn a_step_the_transitions_table_lacks_is_refused() {
    // The one rule the store's writer follows: no row, no move.
    for from in TaskState::ALL {
        for step in states::Step::ALL {
            for attempts_left in [true, false] {
                let has_row = states::TRANSITIONS.iter().any(|t| {
                    t.from == *from && t.step == *step && t.attempts.admits(attempts_left)
                });
                match states::next(*from, *step, attempts_left) {
                    Ok(to) => {
                        assert!(has_row, "{step:?} moved {from:?} to {to:?} without a row")
                    }
                    Err(e) => {
                        assert!(!has_row, "{step:?} from {from:?} refused: {e}");
                        assert!(
                            matches!(
                                e.code,
                                Code::TASK_STATE_INVALID | Code::RETRY_EXTENSION_CAS_MISMATCH
                            ),
                            "{step:?} from {from:?}: {e}"
                        );
                    }
                }
            }
        }
    }
    // Over the bus: an accept of a task that was never claimed has no row;
    // it is refused, the task does not change and the store makes no move.
    let s = stack();
    s.submit("norow-a");
    let before = s.get("norow-a");
    let logged = s.moves().len();
    let e = s.decide("norow-a", Decision::Accept).unwrap_err();
    assert_eq!(e.code, Code::TASK_STATE_INVALID, "{e}");
    assert_eq!(s.get("norow-a").revision, before.revision);
    assert_eq!(s.moves().len(), logged, "a refused step made a move");
}

/// One `<method>` of an introspection document: its name, and the
/// signature of its `in` and of its `out` arguments.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Exported {
    name: String,
    input: String,
    output: String,
}

/// The value of attribute `name` in one XML tag's text.
fn attribute<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let at = tag.find(&format!(" {name}=\""))? + name.len() + 3;
    tag[at..].split('"').next()
}

/// `org.airlock.*` interfaces of an introspection document, with their methods.
fn exported(xml: &str) -> BTreeMap<String, Vec<Exported>> {
    let mut out = BTreeMap::new();
    for block in xml.split("<interface name=\"").skip(1) {
        let name = block.split('"').next().unwrap().to_owned();
        let body = block.split("</interface>").next().unwrap();
        if !name.starts_with("org.airlock.") {
            continue;
        }
        let mut methods = Vec::new();
        for m in body.split("<method name=\"").skip(1) {
            let method = m.split('"').next().unwrap().to_owned();
            // A method without arguments is one empty tag.
            let head = m.split('>').next().unwrap();
            let args = if head.ends_with('/') {
                ""
            } else {
                m.split("</method>").next().unwrap()
            };
            let (mut input, mut output) = (String::new(), String::new());
            for arg in args.split("<arg").skip(1) {
                let tag = arg.split("/>").next().unwrap();
                let ty = attribute(tag, "type").expect("an argument's type");
                match attribute(tag, "direction").unwrap_or("in") {
                    "in" => input.push_str(ty),
                    "out" => output.push_str(ty),
                    other => panic!("{name}.{method}: direction {other:?}"),
                }
            }
            methods.push(Exported {
                name: method,
                input,
                output,
            });
        }
        methods.sort();
        out.insert(name, methods);
    }
    out
}

/// A placeholder argument of D-Bus type `c` for dbus-send.
fn placeholder(c: char) -> &'static str {
    match c {
        's' => "string:contract-x",
        'u' => "uint32:0",
        'x' => "int64:0",
        't' => "uint64:0",
        other => panic!("no placeholder for D-Bus type {other:?}"),
    }
}

#[test]
fn every_exported_method_is_its_row_and_enforces_its_permission() {
    let s = stack();
    let xml: String =
        s.rt.block_on(async {
            let reply = s
                .client
                .connection()
                .call_method(
                    Some(airlock_proto::bus::BUS_NAME),
                    OBJECT_PATH,
                    Some("org.freedesktop.DBus.Introspectable"),
                    "Introspect",
                    &(),
                )
                .await?;
            reply.body().deserialize::<String>()
        })
        .unwrap();
    let declared: BTreeMap<String, Vec<Exported>> = ROWS
        .iter()
        .map(|rows| {
            let mut m: Vec<Exported> = rows
                .iter()
                .map(|r| Exported {
                    name: r.name.to_owned(),
                    input: r.input.to_owned(),
                    output: r.output.to_owned(),
                })
                .collect();
            m.sort();
            (rows[0].interface.to_owned(), m)
        })
        .collect();
    assert_eq!(exported(&xml), declared, "the exported object is the rows");
    // INTERFACES, which the protocol lock fingerprints, says the same.
    for (iface, methods) in INTERFACES {
        let names: Vec<&str> = declared[*iface].iter().map(|m| m.name.as_str()).collect();
        let mut listed = methods.to_vec();
        listed.sort();
        assert_eq!(names, listed, "{iface}");
    }

    // A caller with no right at all (not the local users', not the
    // worker's, not retryd's uid): every method refuses it with its row's
    // code, before reading its arguments.
    for row in ROWS.iter().flat_map(|r| r.iter()) {
        let args: Vec<&str> = row.input.chars().map(placeholder).collect();
        let e = common::dbus_send_at(s.bus.address(), common::STRANGER_UID, &row.path(), &args)
            .expect_err(&format!(
                "{} must refuse uid {}",
                row.path(),
                common::STRANGER_UID
            ));
        assert_eq!(
            e.code(),
            Some(row.permission.refusal()),
            "{}: {e:?}",
            row.path()
        );
    }
    // Each refusal is on record under the row's event.
    let events = s.rt.block_on(s.client.list_events("", 0, 1000)).unwrap();
    for row in ROWS.iter().flat_map(|r| r.iter()) {
        let code = row.permission.refusal().as_str();
        assert!(
            events.events.iter().any(|e| {
                Some(e.action.as_str()) == row.event
                    && e.outcome == "denied"
                    && e.code.as_deref() == Some(code)
                    && e.actor["uid"] == json!(common::STRANGER_UID)
            }),
            "{}: no denied {:?} event with {code}",
            row.path(),
            row.event
        );
    }
}

/// The pre-3.0 Verify: task id, decision, reason.
const OLD_VERIFY: [&str; 3] = ["string:tasks1-a", "string:accept", "string:looks right"];

#[test]
fn tasks1_verify_with_three_strings_names_tasks2_not_a_signature_error() {
    use airlock_proto::bus::tasks_v1;
    let s = stack();
    s.submit("tasks1-a");
    let g = s.claim("tasks1-a");
    s.result(&g, true, "result-tasks1-a-0001").unwrap();
    let before = s.get("tasks1-a");
    // dbus-send, as root (allowed every action): a client of the first
    // Tasks1, not of this library.
    let path = format!(
        "{}.{}",
        tasks_v1::INTERFACE,
        airlock_proto::bus::tasks::VERIFY
    );
    let e = common::dbus_send_at(s.bus.address(), 0, &path, &OLD_VERIFY).unwrap_err();
    assert_eq!(e.code(), Some(Code::PROTOCOL_VERSION_MISMATCH), "{e:?}");
    assert_ne!(e.name, "org.freedesktop.zbus.Error", "{e:?}");
    assert!(
        e.message.contains("org.airlock.Tasks2.Verify (ss)") && e.message.contains("before 3.0"),
        "{e:?}"
    );
    // As a stranger too: the shape is answered before anything is read.
    let e = common::dbus_send_at(s.bus.address(), common::STRANGER_UID, &path, &OLD_VERIFY)
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::PROTOCOL_VERSION_MISMATCH), "{e:?}");
    // The same call on Tasks2 is only a call whose arguments are not the
    // row's: MESSAGE_INVALID (an incompatible change still takes a new
    // interface name, so that an old client is told what to call).
    let e = common::dbus_send_at(s.bus.address(), 0, "org.airlock.Tasks2.Verify", &OLD_VERIFY)
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::MESSAGE_INVALID), "{e:?}");
    assert!(e.message.contains("(ss)"), "{e:?}");
    let after = s.get("tasks1-a");
    assert_eq!(
        (after.state, after.revision),
        (before.state, before.revision)
    );
}

/// Calls `org.airlock.Tasks1.<method>` as this library never does now.
fn v1_call<B>(s: &Stack, method: &str, body: &B) -> String
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    s.rt.block_on(async {
        let r = s
            .client
            .connection()
            .call_method(
                Some(airlock_proto::bus::BUS_NAME),
                OBJECT_PATH,
                Some(airlock_proto::bus::tasks_v1::INTERFACE),
                method,
                body,
            )
            .await
            .unwrap_or_else(|e| panic!("Tasks1.{method}: {e}"));
        r.body().deserialize::<String>().unwrap()
    })
}

#[test]
fn tasks1_serves_the_calls_of_protocol_3_to_6_for_one_release() {
    use airlock_proto::bus::tasks_v1;
    let s = stack();
    s.submit("tasks1-b");
    let g = s.claim("tasks1-b");
    s.result(&g, true, "result-tasks1-b-0001").unwrap();
    let seen = s.get("tasks1-b");
    let req = DecisionRequest::about(&seen, Decision::Accept, "via Tasks1", None);
    // Its listeners hear TaskChanged under the old name (the stream lives
    // on this runtime, and unsubscribes on it when dropped).
    let _rt = s.rt.enter();
    let mut changes = s.rt.block_on(async {
        let rule = zbus::MatchRule::builder()
            .msg_type(zbus::message::Type::Signal)
            .interface(tasks_v1::INTERFACE)
            .unwrap()
            .member("TaskChanged")
            .unwrap()
            .build();
        zbus::MessageStream::for_match_rule(rule, s.client.connection(), Some(16))
            .await
            .unwrap()
    });
    let view: TaskView = serde_json::from_str(&v1_call(&s, "GetTask", &("tasks1-b",))).unwrap();
    assert_eq!(view, seen);
    let body = ("tasks1-b", req.to_value().to_string());
    let out: DecisionOutcome = serde_json::from_str(&v1_call(&s, "Verify", &body)).unwrap();
    assert_eq!(out.state, TaskState::Succeeded);
    let heard: (String, String, i64) = s.rt.block_on(async {
        use futures_util::StreamExt;
        let m = tokio::time::timeout(std::time::Duration::from_secs(5), changes.next())
            .await
            .expect("Tasks1.TaskChanged within 5 s")
            .unwrap()
            .unwrap();
        m.body().deserialize().unwrap()
    });
    assert_eq!(heard, ("tasks1-b".into(), "SUCCEEDED".into(), out.revision));
    let conn = s.client.connection().clone();
    // Its properties are Tasks2's.
    let version: String = s.rt.block_on(async {
        let r = conn
            .call_method(
                Some(airlock_proto::bus::BUS_NAME),
                OBJECT_PATH,
                Some("org.freedesktop.DBus.Properties"),
                "Get",
                &(tasks_v1::INTERFACE, "ProtocolVersion"),
            )
            .await
            .unwrap();
        let v: zbus::zvariant::OwnedValue = r.body().deserialize().unwrap();
        String::try_from(v).unwrap()
    });
    assert_eq!(
        version,
        airlock_proto::bus::protocol_string(airlock_proto::bus::PROTOCOL_VERSION)
    );
    // Introspection marks it deprecated, and Tasks2 not.
    let xml: String = s.rt.block_on(async {
        let r = conn
            .call_method(
                Some(airlock_proto::bus::BUS_NAME),
                OBJECT_PATH,
                Some("org.freedesktop.DBus.Introspectable"),
                "Introspect",
                &(),
            )
            .await
            .unwrap();
        r.body().deserialize::<String>().unwrap()
    });
    let v1 = xml
        .split("<interface name=\"org.airlock.Tasks1\">")
        .nth(1)
        .unwrap();
    let v1 = v1.split("</interface>").next().unwrap();
    assert!(v1.contains("org.freedesktop.DBus.Deprecated"), "{v1}");
    let v2 = xml
        .split("<interface name=\"org.airlock.Tasks2\">")
        .nth(1)
        .unwrap();
    assert!(
        !v2.split("</interface>")
            .next()
            .unwrap()
            .contains("Deprecated")
    );
}

#[test]
fn an_older_minor_client_works_and_another_major_is_refused_by_name() {
    use airlock_proto::bus::{PROTOCOL_VERSION, protocol_string};
    let s = stack();
    let (major, minor) = PROTOCOL_VERSION;
    // A client of the same major works, whatever its minor (x.0 has no
    // older minor, so one ahead stands in for it).
    let same_major = if minor >= 1 { minor - 1 } else { minor + 1 };
    let older = s.client.clone().speaking((major, same_major));
    s.rt.block_on(older.list_tasks("", "", 1))
        .expect("a client of the same major works");
    for other in [(major + 1, 0), (major - 1, minor)] {
        let e =
            s.rt.block_on(s.client.clone().speaking(other).list_tasks("", "", 1))
                .unwrap_err();
        assert_eq!(e.code, Code::PROTOCOL_VERSION_MISMATCH, "{e}");
        let text = e.to_string();
        assert!(
            text.contains(&protocol_string(other))
                && text.contains(&protocol_string(PROTOCOL_VERSION)),
            "{text}"
        );
    }
}

#[test]
fn decisions_over_the_bus_are_exactly_once_compare_and_swaps() {
    let s = stack();
    s.submit("dec-a");
    let g = s.claim("dec-a");
    s.result(&g, true, "result-dec-a-0001").unwrap();
    let seen = s.get("dec-a");
    assert_eq!(seen.state, TaskState::Verifying);
    assert!(
        seen.result_sha256.is_some(),
        "a shown result has its SHA-256"
    );
    let good = DecisionRequest::about(&seen, Decision::Accept, "contract test", None);

    let refused = |req: &DecisionRequest, code: Code| {
        let e = s.send(req).expect_err(&format!("{code:?}"));
        assert_eq!(e.code, code, "{e}");
        let now = s.get("dec-a");
        assert_eq!(
            (now.state, now.revision),
            (seen.state, seen.revision),
            "{code:?}"
        );
    };
    let mut stale = good.clone();
    stale.expected_revision -= 1;
    refused(&stale, Code::DECISION_CAS_MISMATCH);
    let mut older = good.clone();
    older.expected_attempt = 0;
    refused(&older, Code::DECISION_CAS_MISMATCH);
    let mut unseen = good.clone();
    unseen.expected_result_sha256 = Some("0".repeat(64));
    refused(&unseen, Code::DECISION_RESULT_DRIFT);
    let mut cancel_by_verify = good.clone();
    cancel_by_verify.decision = Decision::Cancel;
    let e =
        s.rt.block_on(s.client.verify(&cancel_by_verify))
            .unwrap_err();
    assert_eq!(e.code, Code::VERIFICATION_DECISION_INVALID);
    let e = s.rt.block_on(s.client.cancel_task(&good)).unwrap_err();
    assert_eq!(e.code, Code::VERIFICATION_DECISION_INVALID);
    // A malformed request: the schema, then a field with its own code.
    let raw = |body: Value| -> airlock_proto::Error {
        s.rt.block_on(async {
            let r = s
                .client
                .connection()
                .call_method(
                    Some(airlock_proto::bus::BUS_NAME),
                    OBJECT_PATH,
                    Some(airlock_proto::bus::tasks::INTERFACE),
                    airlock_proto::bus::tasks::VERIFY,
                    &("dec-a", body.to_string()),
                )
                .await;
            airlock_client::from_zbus(r.unwrap_err())
        })
    };
    let mut v = good.to_value();
    v["schema"] = json!("airlock.task-decision.v0");
    assert_eq!(raw(v).code, Code::SCHEMA_INVALID);
    let mut v = good.to_value();
    v["expected_result_sha256"] = json!("abc");
    assert_eq!(raw(v).code, Code::RESULT_SHA256_INVALID);
    let mut v = good.to_value();
    v["idempotency_key"] = json!("x");
    assert_eq!(raw(v).code, Code::IDEMPOTENCY_KEY_INVALID);
    let mut v = good.to_value();
    v.as_object_mut().unwrap().remove("expected_attempt");
    assert_eq!(raw(v).code, Code::MESSAGE_INVALID);

    let first = s.send(&good).unwrap();
    assert!(!first.idempotent);
    assert_eq!(first.state, TaskState::Succeeded);
    let after = s.get("dec-a");
    let replay = s.send(&good).unwrap();
    assert!(replay.idempotent, "an identical replay is marked as one");
    assert_eq!(
        DecisionOutcome {
            idempotent: false,
            ..replay
        },
        first,
        "an identical replay returns the stored answer"
    );
    assert_eq!(
        s.get("dec-a").revision,
        after.revision,
        "a replay changes nothing"
    );
    let mut other = good.clone();
    other.decision = Decision::Reject;
    let e = s.send(&other).unwrap_err();
    assert_eq!(e.code, Code::DECISION_IDEMPOTENCY_CONFLICT);
    assert_eq!(s.get("dec-a").state, TaskState::Succeeded);
}

#[test]
fn every_agents1_method_answers_through_the_client() {
    // No agent configured: the list is empty and each agent method names
    // the unknown agent with AGENT_NOT_FOUND (tests/agents.rs runs real
    // agents through the same methods).
    let s = stack();
    let list = s.rt.block_on(s.client.list_agents()).unwrap();
    assert!(list.agents.is_empty());
    let sup = &s.client;
    for outcome in [
        s.rt.block_on(sup.get_agent("nope")),
        s.rt.block_on(sup.start_agent("nope")),
        s.rt.block_on(sup.stop_agent("nope")),
        s.rt.block_on(sup.clear_hold("nope")),
    ] {
        assert_eq!(outcome.unwrap_err().code, Code::AGENT_NOT_FOUND);
    }
    let limits = s.rt.block_on(sup.get_agent_limits("nope"));
    assert_eq!(limits.unwrap_err().code, Code::AGENT_NOT_FOUND);
}

/// The rows a test called, each checked as it was.
#[derive(Default)]
struct Called(std::collections::BTreeSet<String>);

impl Called {
    /// `got`, the answer of `interface.name` called with its declared
    /// types, is the row's reply (decoded strictly as its reply type).
    fn answered<T: std::fmt::Debug>(
        &mut self,
        interface: &str,
        name: &str,
        got: Result<T, airlock_proto::Error>,
    ) -> T {
        let row = airlock_proto::bus::row(interface, name).expect("a row");
        self.0.insert(row.path());
        got.unwrap_or_else(|e| panic!("{} with its declared types: {e}", row.path()))
    }

    /// `got` is the refusal `code`: the row answers, and this stack has
    /// nothing it could act on (no agent is configured here).
    fn refused<T: std::fmt::Debug>(
        &mut self,
        interface: &str,
        name: &str,
        got: Result<T, airlock_proto::Error>,
        code: Code,
    ) {
        let row = airlock_proto::bus::row(interface, name).expect("a row");
        self.0.insert(row.path());
        assert_eq!(got.map_err(|e| e.code).err(), Some(code), "{}", row.path());
    }
}

/// Calls `org.airlock.Tasks1.<method>` with `body` and decodes the reply
/// as the Tasks2 row's reply type `T` (the rows are the same).
fn v1<T: serde::de::DeserializeOwned, B>(
    s: &Stack,
    method: &str,
    body: &B,
) -> Result<T, airlock_proto::Error>
where
    B: serde::Serialize + zbus::zvariant::DynamicType,
{
    airlock_proto::bus::decode(method, &v1_call(s, method, body))
}

/// The shapes of arguments a row does not take: one fewer, one more, and
/// each argument of another type.
fn other_shapes(input: &str) -> Vec<String> {
    let mut out = vec![format!("{input}s")];
    if !input.is_empty() {
        out.push(input[..input.len() - 1].to_owned());
    }
    for (i, c) in input.char_indices() {
        let other = if c == 's' { 'u' } else { 's' };
        out.push(format!("{}{other}{}", &input[..i], &input[i + 1..]));
    }
    out.sort();
    out.dedup();
    out.retain(|s| s != input);
    out
}

/// Every task's (id, state, revision), and the allowed events: what a
/// refused call must not change.
fn state_of(s: &Stack) -> (Vec<(String, TaskState, i64)>, usize) {
    let tasks = s.rt.block_on(s.client.list_tasks("", "", 1000)).unwrap();
    let events = s.rt.block_on(s.client.list_events("", 0, 1000)).unwrap();
    (
        tasks
            .tasks
            .iter()
            .map(|t| (t.task_id.clone(), t.state, t.revision))
            .collect(),
        events
            .events
            .iter()
            .filter(|e| e.outcome == "allowed")
            .count(),
    )
}

/// Issue 41, item 3. Every row, called through the client with its
/// declared types, answers its reply (decoded strictly as the row's reply
/// type; `Worker1.ReportUpstream`, whose reply is empty, included); the
/// same row called with arguments of another shape — one missing, one too
/// many, one of another type — is refused with a code of the catalogue
/// (`MESSAGE_INVALID`; Tasks1's retired `Verify (sss)`:
/// `PROTOCOL_VERSION_MISMATCH`), never the bus library's own error,
/// whoever calls; the refusal is on record under the row's event, and
/// nothing changes. Rows come from the table: a row this test does not
/// call with its declared types fails it.
#[test]
fn every_row_answers_its_reply_through_the_client_and_other_arguments_a_catalogue_code() {
    use airlock_proto::bus::{FenceRequest, FenceStep, agents, reconcile, retry, tasks, worker};
    use airlock_proto::reconcile::{AdoptionReport, Resolution, ResolveRequest};
    let s = stack();
    let c = &s.client;
    let rt = &s.rt;
    let mut called = Called::default();
    let (t2, t1) = (tasks::INTERFACE, airlock_proto::bus::tasks_v1::INTERFACE);

    // Submit, read and replace: on Tasks2 through the client, on Tasks1
    // with the same bodies.
    let mut sub = common::submission("rows-a");
    sub["max_attempts"] = json!(1);
    let a = called.answered(t2, tasks::SUBMIT_TASK, rt.block_on(c.submit_task(&sub)));
    assert_eq!(a.task.task_id, "rows-a");
    let mut sub = common::submission("rows-b");
    sub["max_attempts"] = json!(1);
    let b: airlock_proto::bus::SubmitReply = called.answered(
        t1,
        tasks::SUBMIT_TASK,
        v1(&s, tasks::SUBMIT_TASK, &(sub.to_string(),)),
    );
    assert_eq!(b.task.task_id, "rows-b");
    called.answered(t2, tasks::GET_TASK, rt.block_on(c.get_task("rows-a")));
    let _: TaskView = called.answered(t1, tasks::GET_TASK, v1(&s, tasks::GET_TASK, &("rows-b",)));
    called.answered(t2, tasks::GET_PLAN, rt.block_on(c.get_plan("rows-a")));
    called.answered(t2, tasks::LIST_TASKS, rt.block_on(c.list_tasks("", "", 10)));
    let _: airlock_proto::bus::TaskPage = called.answered(
        t1,
        tasks::LIST_TASKS,
        v1(&s, tasks::LIST_TASKS, &("", "", 10u32)),
    );
    called.answered(
        t2,
        tasks::LIST_EVENTS,
        rt.block_on(c.list_events("", 0, 10)),
    );
    let _: airlock_proto::bus::EventPage = called.answered(
        t1,
        tasks::LIST_EVENTS,
        v1(&s, tasks::LIST_EVENTS, &("", 0i64, 10u32)),
    );
    called.answered(
        t2,
        tasks::LIST_REPOSITORIES,
        rt.block_on(c.list_repositories()),
    );
    let count = called.answered(
        t2,
        tasks::COUNT_EVENTS,
        rt.block_on(c.count_events("rows-a")),
    );
    assert_eq!(count.by_action.get("TASK_SUBMITTED"), Some(&1));
    let plan = common::plan("rows-a", 2, Some(&a.task.plan_digest));
    called.answered(
        t2,
        tasks::REPLACE_PLAN,
        rt.block_on(c.replace_plan("rows-a", &plan)),
    );
    let plan = common::plan("rows-b", 2, Some(&b.task.plan_digest));
    let _: TaskView = called.answered(
        t1,
        tasks::REPLACE_PLAN,
        v1(&s, tasks::REPLACE_PLAN, &("rows-b", plan.to_string())),
    );
    // Cancel: rows-b on Tasks1, rows-c on Tasks2.
    let req = DecisionRequest::about(&s.get("rows-b"), Decision::Cancel, "rows", None);
    let _: DecisionOutcome = called.answered(
        t1,
        tasks::CANCEL_TASK,
        v1(
            &s,
            tasks::CANCEL_TASK,
            &("rows-b", req.to_value().to_string()),
        ),
    );
    s.submit("rows-c");
    let req = DecisionRequest::about(&s.get("rows-c"), Decision::Cancel, "rows", None);
    called.answered(t2, tasks::CANCEL_TASK, rt.block_on(c.cancel_task(&req)));

    // An attempt of rows-a, through every Worker1 method of a lease, and
    // a decision on its result.
    let w = worker::INTERFACE;
    let grant = called
        .answered(w, worker::CLAIM, rt.block_on(c.claim()))
        .expect("rows-a is queued");
    assert_eq!(grant.task_id, "rows-a");
    let lease = LeaseRef::of(&grant);
    called.answered(w, worker::RENEW, rt.block_on(c.renew(&lease)));
    let fence = FenceRequest {
        step: FenceStep::Ref,
        commit_oid: Some("c".repeat(40)),
        hold_ms: 60_000,
    };
    called.answered(w, worker::FENCE, rt.block_on(c.fence(&lease, &fence)));
    let release = FenceRequest {
        step: FenceStep::Release,
        commit_oid: None,
        hold_ms: 0,
    };
    rt.block_on(c.fence(&lease, &release)).unwrap();
    let passed: TaskResult = serde_json::from_value(common::passed_result(
        &serde_json::to_value(&grant).unwrap(),
    ))
    .unwrap();
    called.answered(
        w,
        worker::SUBMIT_RESULT,
        rt.block_on(c.submit_result(&lease, "rows-a-result-0001", &passed)),
    );
    let req = DecisionRequest::about(&s.get("rows-a"), Decision::Accept, "rows", None);
    let out = called.answered(t2, tasks::VERIFY, rt.block_on(c.verify(&req)));
    assert_eq!(out.state, TaskState::Succeeded);
    // Tasks1's Verify, on rows-d.
    s.submit("rows-d");
    let g = s.claim("rows-d");
    s.result(&g, true, "rows-d-result-0001").unwrap();
    let req = DecisionRequest::about(&s.get("rows-d"), Decision::Accept, "rows", None);
    let out: DecisionOutcome = called.answered(
        t1,
        tasks::VERIFY,
        v1(&s, tasks::VERIFY, &("rows-d", req.to_value().to_string())),
    );
    assert_eq!(out.state, TaskState::Succeeded);

    // A case (rows-f's branch moved), resolved by adoption and settled.
    let r = reconcile::INTERFACE;
    s.submit("rows-f");
    let g = s.claim("rows-f");
    let mut moved = common::passed_result(&serde_json::to_value(&g).unwrap());
    moved["outcome"] = json!("failed");
    moved["commit_oid"] = Value::Null;
    moved["exec_result_sha256"] = Value::Null;
    moved["verification"] = json!([]);
    moved["failure_code"] = json!("RECONCILIATION_REQUIRED");
    moved["reconciliation"] =
        json!({"commit_oid": "1".repeat(40), "observed_head": "2".repeat(40)});
    let moved: TaskResult = serde_json::from_value(moved).unwrap();
    rt.block_on(c.submit_result(&LeaseRef::of(&g), "rows-f-result-0001", &moved))
        .unwrap();
    called.answered(
        r,
        reconcile::LIST_RECONCILIATIONS,
        rt.block_on(c.list_reconciliations("", "", 10)),
    );
    let case = called.answered(
        r,
        reconcile::GET_RECONCILIATION,
        rt.block_on(c.get_reconciliation("rows-f")),
    );
    let req = ResolveRequest::about(&case, Resolution::Adopt, "rows", None);
    called.answered(
        r,
        reconcile::RESOLVE_RECONCILIATION,
        rt.block_on(c.resolve_reconciliation(&req)),
    );
    let check = called
        .answered(w, worker::TAKE_ADOPTION, rt.block_on(c.take_adoption()))
        .expect("the adoption waits");
    let report = AdoptionReport {
        task_id: check.task_id.clone(),
        attempt: check.attempt,
        checked_head: check.observed_head.clone(),
        head_now: Some(check.observed_head.clone()),
        descends: true,
    };
    called.answered(
        w,
        worker::SETTLE_ADOPTION,
        rt.block_on(c.settle_adoption(&report)),
    );

    // An upstream fact: an empty reply, read as the row says.
    let upstream: airlock_proto::upstream::UpstreamReport = serde_json::from_value(
        json!({"repository": "demo", "event": "synced", "task_id": null, "detail": {"changes": 1}}),
    )
    .unwrap();
    let () = called.answered(
        w,
        worker::REPORT_UPSTREAM,
        rt.block_on(c.report_upstream(&upstream)),
    );

    // One more attempt for an exhausted task (last: it queues it again).
    s.submit("rows-e");
    let g = s.claim("rows-e");
    s.result(&g, false, "rows-e-result-0001").unwrap();
    called.answered(
        retry::INTERFACE,
        retry::EXTEND_RETRY,
        rt.block_on(c.extend_retry("rows-e", &retry_request(&s.get("rows-e")), OWNER)),
    );

    // Agents1: no agent is configured here (tests/agents.rs runs real
    // ones through the same methods).
    let ag = agents::INTERFACE;
    called.answered(ag, agents::LIST_AGENTS, rt.block_on(c.list_agents()));
    for (name, got) in [
        (agents::GET_AGENT, rt.block_on(c.get_agent("nope"))),
        (agents::START_AGENT, rt.block_on(c.start_agent("nope"))),
        (agents::STOP_AGENT, rt.block_on(c.stop_agent("nope"))),
        (agents::CLEAR_HOLD, rt.block_on(c.clear_hold("nope"))),
    ] {
        called.refused(ag, name, got, Code::AGENT_NOT_FOUND);
    }
    called.refused(
        ag,
        agents::GET_AGENT_LIMITS,
        rt.block_on(c.get_agent_limits("nope")),
        Code::AGENT_NOT_FOUND,
    );
    let got = rt.block_on(c.cancel_agent_queued("nope", "rows"));
    match got {
        Ok(out) => {
            called.answered(ag, agents::CANCEL_QUEUED, Ok::<_, airlock_proto::Error>(()));
            assert!(out.cancelled.is_empty());
        }
        Err(e) => called.refused(
            ag,
            agents::CANCEL_QUEUED,
            Err::<(), _>(e),
            Code::AGENT_NOT_FOUND,
        ),
    }

    let every: std::collections::BTreeSet<String> = ROWS
        .iter()
        .flat_map(|r| r.iter())
        .map(|r| r.path())
        .collect();
    let missed: Vec<&String> = every.difference(&called.0).collect();
    assert!(
        missed.is_empty(),
        "rows not called with their declared types: {missed:?}"
    );

    // Now every row with arguments of every other shape, as this test's
    // uid (which may call every method) and as a stranger.
    let before = state_of(&s);
    let events_before = rt
        .block_on(c.list_events("", 0, 1000))
        .unwrap()
        .events
        .len();
    let mut refused = 0;
    for row in ROWS.iter().flat_map(|r| r.iter()) {
        for shape in other_shapes(row.input) {
            let retired = row.interface == airlock_proto::bus::tasks_v1::INTERFACE
                && airlock_proto::bus::tasks_v1::RETIRED
                    .iter()
                    .any(|r| r.name == row.name && r.input == shape);
            let code = if retired {
                Code::PROTOCOL_VERSION_MISMATCH
            } else {
                Code::MESSAGE_INVALID
            };
            let got = rt.block_on(async {
                let conn = c.connection();
                let dest = Some(airlock_proto::bus::BUS_NAME);
                match common::arguments(&shape, "rows-a") {
                    None => {
                        conn.call_method(dest, OBJECT_PATH, Some(row.interface), row.name, &())
                            .await
                    }
                    Some(args) => {
                        conn.call_method(dest, OBJECT_PATH, Some(row.interface), row.name, &args)
                            .await
                    }
                }
            });
            let e = got.expect_err(&format!("{} ({shape})", row.path()));
            match &e {
                zbus::Error::MethodError(name, message, _) => {
                    assert_eq!(
                        name.as_str(),
                        code.dbus_error_name(),
                        "{} ({shape}): {message:?}",
                        row.path()
                    );
                }
                other => panic!("{} ({shape}): {other}", row.path()),
            }
            assert_eq!(airlock_client::from_zbus(e).code, code);
            refused += 1;
        }
    }
    assert_eq!(state_of(&s), before, "a refused call changed something");
    // Each is on record, under its row's event, naming the row.
    let events = rt.block_on(c.list_events("", 0, 1000)).unwrap().events;
    assert_eq!(
        events.len(),
        events_before + refused,
        "one record per refusal"
    );
    for row in ROWS.iter().flat_map(|r| r.iter()) {
        assert!(
            events[events_before..].iter().any(|e| {
                Some(e.action.as_str()) == row.event
                    && e.outcome == "denied"
                    && e.code.as_deref() == Some("MESSAGE_INVALID")
                    && e.payload["detail"]
                        .as_str()
                        .is_some_and(|d| d.contains(&row.path()))
            }),
            "{}: no record of its refusal",
            row.path()
        );
    }
    // A stranger is answered the same, before it is authorised.
    for row in ROWS.iter().flat_map(|r| r.iter()) {
        let shape = format!("{}s", row.input);
        let args: Vec<&str> = shape.chars().map(placeholder).collect();
        let e = common::dbus_send_at(s.bus.address(), common::STRANGER_UID, &row.path(), &args)
            .expect_err(&row.path());
        let retired = row.interface == airlock_proto::bus::tasks_v1::INTERFACE
            && airlock_proto::bus::tasks_v1::RETIRED
                .iter()
                .any(|r| r.name == row.name && r.input == shape);
        let code = if retired {
            Code::PROTOCOL_VERSION_MISMATCH
        } else {
            Code::MESSAGE_INVALID
        };
        assert_eq!(e.code(), Some(code), "{} ({shape}): {e:?}", row.path());
    }
    assert_eq!(state_of(&s), before, "a refused call changed something");
}
