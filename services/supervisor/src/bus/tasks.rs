//! `org.airlock.Tasks2`: planners and admins, authorised by polkit (and
//! the same object under its old name `Tasks1` for one release:
//! [`super::tasks_v1`]).
//!
//! Every method enters through [`Shared::enter`] with its row, parses its
//! arguments strictly, acts through [`crate::ops`], and announces a state
//! change with `TaskChanged`.

use super::error::BusError;
use super::{DEFAULT_PAGE, Shared, non_empty, parse_json};
use crate::authz::{Manage, Read, Scope, Submit};
use airlock_proto::bus::Call;
use airlock_proto::bus::tasks as rows;
use airlock_proto::bus::{EventPage, EventRecord, RepositoryList, SubmitReply, TaskPage};
use airlock_proto::plan::PlanRequest;
use airlock_proto::task::{
    Decision, DecisionOutcome, DecisionRequest, TaskState, TaskSubmission, TaskView,
};
use airlock_proto::{Code, Error};
use std::sync::Arc;
use zbus::message::Header;
use zbus::object_server::SignalEmitter;
use zbus::{Connection, interface};

/// The Tasks1 interface object.
#[derive(Debug)]
pub struct Tasks {
    shared: Arc<Shared>,
}

impl Tasks {
    /// The interface over `shared`.
    pub fn new(shared: Arc<Shared>) -> Self {
        Tasks { shared }
    }
}

/// Sends TaskChanged for a change of `task_id` to every connection that
/// may read it ([`super::watchers`]), on Tasks2 and, for the release it is
/// kept, Tasks1; never broadcast. Logs (never fails) on error: the change
/// is already durable and the reply must still go out.
pub(crate) async fn announce(
    shared: &Shared,
    emitter: &SignalEmitter<'_>,
    task_id: &str,
    state: TaskState,
    revision: i64,
) {
    let watchers = shared.watchers.snapshot();
    if watchers.is_empty() {
        return;
    }
    // The submitter is read only when some listener is bound to its own.
    let submitter = if watchers.iter().all(|(_, scope)| scope.is_all()) {
        None
    } else {
        match shared.ops.submitter_of(task_id.to_owned()).await {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!("TaskChanged for {task_id} goes to read-all listeners only: {e}");
                None
            }
        }
    };
    for (name, scope) in watchers {
        if !scope.read_scope().sees(submitter.as_ref()) {
            continue;
        }
        let Ok(to) = zbus::names::BusName::try_from(name) else {
            continue;
        };
        let to = emitter.clone().set_destination(to);
        if let Err(e) = Tasks::task_changed(&to, task_id, state.as_str(), revision).await {
            tracing::warn!("could not send TaskChanged for {task_id}: {e}");
        }
        let v1 = to
            .emit(
                airlock_proto::bus::tasks_v1::INTERFACE,
                rows::TASK_CHANGED,
                &(task_id, state.as_str(), revision),
            )
            .await;
        if let Err(e) = v1 {
            tracing::warn!("could not send Tasks1.TaskChanged for {task_id}: {e}");
        }
    }
}

async fn announce_view(shared: &Shared, emitter: &SignalEmitter<'_>, view: &TaskView) {
    announce(shared, emitter, &view.task_id, view.state, view.revision).await;
}

/// The task id a submission names, read leniently for the audit record of
/// a refusal that happens before the submission is parsed.
fn submitted_task_id(text: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    v.get("binding")?
        .get("task_id")?
        .as_str()
        .map(str::to_owned)
}

/// Refuses a change of task `task_id` by a caller that did not submit it
/// (`auth`'s submitter: its uid and agent) with TASK_NOT_FOUND, as for a
/// task that does not exist, so a refusal tells nothing of another's task.
fn own_task(
    auth: &crate::authz::Authorized<Submit>,
    task_id: &str,
    submitter: Option<&airlock_taskdb::tasks::Submitter>,
) -> Result<(), Error> {
    if submitter == Some(&auth.actor().submitter()) {
        Ok(())
    } else {
        Err(Error::with(Code::TASK_NOT_FOUND, task_id.to_owned()))
    }
}

/// Whether the planner agent `agent` may propose for `repository`.
fn agent_may_propose(agent: &airlock_config::Agent, repository: &str) -> Result<(), Error> {
    if agent.may_propose_for(repository) {
        Ok(())
    } else {
        Err(Error::with(
            Code::AGENT_REPOSITORY_DENIED,
            format!(
                "agent {:?} may propose for {:?} only, not {repository:?}",
                agent.name, agent.repositories
            ),
        ))
    }
}

impl Tasks {
    /// Verify and CancelTask: one decision path, the method fixing which
    /// decisions it takes (CancelTask only `cancel`, Verify every other).
    async fn decide<M: Call<Reply = DecisionOutcome>>(
        &self,
        hdr: &Header<'_>,
        conn: &Connection,
        emitter: &SignalEmitter<'_>,
        task_id: String,
        request: String,
    ) -> Result<String, BusError> {
        let mut call = self
            .shared
            .enter::<M, Manage>(conn, hdr, Some(&task_id))
            .await?;
        // Whatever polkit said: an agent's task is decided by another.
        self.shared.not_own_decision(&mut call, &task_id).await?;
        let cancel = M::METHOD.name == rows::CANCEL_TASK;
        let parsed = parse_json(&request, "the decision").and_then(|v| {
            let req = DecisionRequest::from_value(&v)?;
            if (req.decision == Decision::Cancel) != cancel {
                return Err(Error::with(
                    Code::VERIFICATION_DECISION_INVALID,
                    if cancel {
                        "CancelTask takes the decision cancel"
                    } else {
                        "Verify takes accept, rework or reject"
                    },
                ));
            }
            Ok(req)
        });
        let req = call.checked(parsed).await?;
        let out = self.shared.ops.decide(&call.auth, task_id, req).await?;
        if !out.idempotent {
            announce(&self.shared, emitter, &out.task_id, out.state, out.revision).await;
        }
        call.reply(&out)
    }
}

#[interface(name = "org.airlock.Tasks2")]
impl Tasks {
    /// Submits a task (an `airlock.task.v1` JSON object). Returns
    /// `{"task": <task>, "idempotent": <bool>}`; the same submission again
    /// is an idempotent replay. Needs `org.airlock.tasks.submit`.
    async fn submit_task(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        submission: String,
    ) -> Result<String, BusError> {
        let task_id = submitted_task_id(&submission);
        let mut call = self
            .shared
            .enter::<rows::SubmitTask, Submit>(conn, &hdr, task_id.as_deref())
            .await?;
        // A planner agent's process is named as the agent, and may propose
        // only for its repositories.
        let agent = self.shared.agent_of(&call.caller).await;
        if let Some(a) = &agent {
            call.auth = call.auth.attributed_to_agent(&a.name);
        }
        let parsed = parse_json(&submission, "the submission").and_then(|v| {
            let s = TaskSubmission::from_value(&v)?;
            let registered = self.shared.repositories();
            s.binding
                .check_registered(registered.iter().map(String::as_str))?;
            self.shared
                .check_programs(&s.binding.repository, &s.plan.execution.verification)?;
            if let Some(a) = &agent {
                if !a.may_propose_for(&s.binding.repository) {
                    return Err(airlock_proto::Error::with(
                        airlock_proto::Code::AGENT_REPOSITORY_DENIED,
                        format!(
                            "agent {:?} may propose for {:?} only, not {:?}",
                            a.name, a.repositories, s.binding.repository
                        ),
                    ));
                }
            }
            Ok(s)
        });
        let submission = call.checked(parsed).await?;
        // It follows what it submits (TaskChanged of its own tasks).
        if let Some(scope) = Scope::of_submitter(&call.auth) {
            self.shared
                .watchers
                .watch_unless_known(call.caller.sender(), scope);
        }
        let out = self.shared.ops.submit(&call.auth, submission).await?;
        if !out.idempotent {
            announce_view(&self.shared, &emitter, &out.task).await;
        }
        call.reply(&SubmitReply {
            task: out.task,
            idempotent: out.idempotent,
        })
    }

    /// Replaces a QUEUED task's plan. The plan must name the digest of the
    /// plan it replaces in `expected_previous_plan_digest` (compare and
    /// swap); the stored plan again is an idempotent replay. Returns the
    /// task. Needs `org.airlock.tasks.submit`, and replaces only a task
    /// the caller submitted (TASK_NOT_FOUND for another's) unless it holds
    /// `org.airlock.tasks.read-all`. A planner agent's process is named as
    /// the agent and may replace only the plan of a task it submitted, in
    /// one of its repositories (`AGENT_REPOSITORY_DENIED`).
    async fn replace_plan(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        task_id: String,
        plan: String,
    ) -> Result<String, BusError> {
        let mut call = self
            .shared
            .enter::<rows::ReplacePlan, Submit>(conn, &hdr, Some(&task_id))
            .await?;
        // A planner agent's process is named as the agent. A caller may
        // replace only the plan of a task it may read: its own (an agent's:
        // its own, in one of its repositories), or any with
        // `org.airlock.tasks.read-all` (never an agent). Another's task is
        // TASK_NOT_FOUND, as if it did not exist; checked before the plan
        // is read, and a refusal changes nothing.
        let agent = self.shared.agent_of(&call.caller).await;
        if let Some(a) = &agent {
            call.auth = call.auth.attributed_to_agent(&a.name);
        }
        let all = agent.is_none() && self.shared.gate.may_read_all(&call.caller).await;
        if !all {
            let owned = self
                .shared
                .ops
                .submission_of(&call.auth, task_id.clone())
                .await
                .and_then(|(repository, submitter)| {
                    own_task(&call.auth, &task_id, submitter.as_ref())?;
                    match &agent {
                        Some(a) => agent_may_propose(a, &repository),
                        None => Ok(()),
                    }
                });
            call.checked(owned).await?;
        }
        if let Some(scope) = Scope::of_submitter(&call.auth) {
            self.shared
                .watchers
                .watch_unless_known(call.caller.sender(), scope);
        }
        let parsed = parse_json(&plan, "the plan").and_then(|v| PlanRequest::from_value(&v));
        let plan = call.checked(parsed).await?;
        let before = self
            .shared
            .ops
            .replace_plan(&call.auth, task_id, plan)
            .await?;
        announce_view(&self.shared, &emitter, &before).await;
        call.reply(&before)
    }

    /// One task as JSON. Needs `org.airlock.tasks.read`, and sees only a
    /// task the caller submitted unless it holds
    /// `org.airlock.tasks.read-all`: another's is TASK_NOT_FOUND, as one
    /// that does not exist.
    async fn get_task(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::GetTask, Read>(conn, &hdr, Some(&task_id))
            .await?;
        let scope = self.shared.read_scope(&call).await;
        let view = self.shared.ops.get(&call.auth, &scope, task_id).await?;
        call.reply(&view)
    }

    /// What one task will change and run, as JSON: `{"task_id", "plan_digest",
    /// "execution_digest", "envelope"}`, the envelope as the store keeps it
    /// (its `change_set` and `verification` commands among its fields).
    /// Needs `org.airlock.tasks.read` and is bound as GetTask: another's
    /// task is TASK_NOT_FOUND, as one that does not exist, unless the
    /// caller holds `org.airlock.tasks.read-all`. Not served on Tasks1.
    async fn get_plan(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::GetPlan, Read>(conn, &hdr, Some(&task_id))
            .await?;
        let scope = self.shared.read_scope(&call).await;
        let plan = self.shared.ops.plan(&call.auth, &scope, task_id).await?;
        call.reply(&plan)
    }

    /// Tasks ordered by id: `state` filters (`""` = all), `after_task_id`
    /// pages (`""` = from the start), `limit` 0 means 100 (at most 1000).
    /// Returns `{"tasks": [...], "next_after": <id or null>}`; pass
    /// `next_after` back to get the next page. Needs `org.airlock.tasks.read`;
    /// lists the caller's own tasks only, unless it holds
    /// `org.airlock.tasks.read-all`.
    async fn list_tasks(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        state: String,
        after_task_id: String,
        limit: u32,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::ListTasks, Read>(conn, &hdr, None)
            .await?;
        let state = non_empty(state).map(|s| TaskState::parse(&s)).transpose();
        let state = call.checked(state).await?;
        let limit = if limit == 0 { DEFAULT_PAGE } else { limit };
        let scope = self.shared.read_scope(&call).await;
        let tasks = self
            .shared
            .ops
            .list(&call.auth, &scope, state, non_empty(after_task_id), limit)
            .await?;
        let next_after =
            if tasks.len() as u64 >= u64::from(limit.min(airlock_taskdb::tasks::MAX_PAGE)) {
                tasks.last().map(|t| t.task_id.clone())
            } else {
                None
            };
        call.reply(&TaskPage { tasks, next_after })
    }

    /// The event log in id order, allowed and denied alike: `task_id`
    /// filters (`""` = all tasks), `after_event_id` pages, `limit` 0 means
    /// 100. Returns `{"events": [...], "next_after": <last id or the
    /// argument>}`. Needs `org.airlock.tasks.read`; the events of the
    /// caller's own tasks only, unless it holds `org.airlock.tasks.read-all`.
    async fn list_events(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
        after_event_id: i64,
        limit: u32,
    ) -> Result<String, BusError> {
        let task = non_empty(task_id);
        let call = self
            .shared
            .enter::<rows::ListEvents, Read>(conn, &hdr, task.as_deref())
            .await?;
        let limit = if limit == 0 { DEFAULT_PAGE } else { limit };
        let scope = self.shared.read_scope(&call).await;
        let events = self
            .shared
            .ops
            .events(&call.auth, &scope, task, after_event_id, limit)
            .await?;
        let next_after = events.last().map_or(after_event_id, |e| e.id);
        let events: Vec<EventRecord> = events.iter().map(|e| e.to_record()).collect();
        call.reply(&EventPage { events, next_after })
    }

    /// How many events of one task the caller may read, as JSON:
    /// `{"task_id", "events", "denied", "by_action": {ACTION: n}}`. Needs
    /// `org.airlock.tasks.read` and is bound as ListEvents: another's task
    /// counts none, as a task that does not exist; a malformed id is
    /// TASK_ID_INVALID. Not served on Tasks1.
    async fn count_events(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        task_id: String,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::CountEvents, Read>(conn, &hdr, Some(&task_id))
            .await?;
        let id = if airlock_proto::binding::is_task_id(&task_id) {
            Ok(task_id)
        } else {
            let shown = airlock_proto::shown::shown(&task_id);
            Err(Error::with(Code::TASK_ID_INVALID, shown))
        };
        let task_id = call.checked(id).await?;
        let scope = self.shared.read_scope(&call).await;
        let count = self
            .shared
            .ops
            .count_events(&call.auth, &scope, task_id)
            .await?;
        call.reply(&count)
    }

    /// The registered repositories, by name, as JSON: `{"repositories":
    /// [{"name", "description", "environment", "upstream", "signing",
    /// "last_upstream_event"}, ...]}` — each one's environment as
    /// configured and as resolved when the configuration was read, its
    /// upstream's URL (without a password), publish flag and sync
    /// interval, its signing principal, and the newest sync event of its
    /// upstream in the event log; never a credential or a credential's
    /// path. Needs `org.airlock.tasks.read`; an agent sees the
    /// repositories it may propose for. Not served on Tasks1.
    async fn list_repositories(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
    ) -> Result<String, BusError> {
        let call = self
            .shared
            .enter::<rows::ListRepositories, Read>(conn, &hdr, None)
            .await?;
        let agent = self.shared.agent_of(&call.caller).await;
        let mut listed = self.shared.listings();
        if let Some(agent) = &agent {
            listed.retain(|l| agent.may_propose_for(l.name()));
        }
        listed.sort_by(|a, b| a.name().cmp(b.name()));
        let last = self
            .shared
            .ops
            .last_repository_events(&call.auth, crate::repositories::sync_actions())
            .await?;
        let repositories = listed.iter().map(|l| l.shown(last.get(l.name()))).collect();
        call.reply(&RepositoryList { repositories })
    }

    /// Cancels a task that is not terminal, exactly once: `request` is an
    /// `airlock.task-decision.v1` object with decision `cancel`, the
    /// idempotency key and the revision, attempt and result SHA-256 the
    /// admin saw (compare and swap). Returns the decision's outcome; the
    /// same request again returns the stored one. The reason goes to the
    /// event log. Needs `org.airlock.tasks.manage`.
    async fn cancel_task(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        task_id: String,
        request: String,
    ) -> Result<String, BusError> {
        self.decide::<rows::CancelTask>(&hdr, conn, &emitter, task_id, request)
            .await
    }

    /// Decides on a VERIFYING task, exactly once: `request` is an
    /// `airlock.task-decision.v1` object with decision `accept`, `rework`
    /// or `reject`, a reason, the idempotency key and the revision, attempt
    /// and result SHA-256 the admin saw (compare and swap). Returns the
    /// decision's outcome; the same request again returns the stored one.
    /// Needs `org.airlock.tasks.manage`.
    async fn verify(
        &self,
        #[zbus(header)] hdr: Header<'_>,
        #[zbus(connection)] conn: &Connection,
        #[zbus(signal_emitter)] emitter: SignalEmitter<'_>,
        task_id: String,
        request: String,
    ) -> Result<String, BusError> {
        self.decide::<rows::Verify>(&hdr, conn, &emitter, task_id, request)
            .await
    }

    /// A task changed state (or was created): its id, new state and
    /// revision; sent to each connection that may read the task (one that
    /// made an authorised call), never broadcast. Follow it, then GetTask
    /// for the details.
    #[zbus(signal)]
    async fn task_changed(
        emitter: &SignalEmitter<'_>,
        task_id: &str,
        state: &str,
        revision: i64,
    ) -> zbus::Result<()>;

    /// Who authorises Tasks2 calls: `polkit`, or a test authoriser
    /// (`allow-all-for-tests`, …) that must never be seen in production.
    #[zbus(property(emits_changed_signal = "const"))]
    fn authorizer(&self) -> String {
        self.shared.info.authorizer.clone()
    }

    /// Whether a result whose every verification command passed is accepted
    /// without an admin's decision.
    #[zbus(property(emits_changed_signal = "const"))]
    fn auto_accept(&self) -> bool {
        self.shared.info.auto_accept
    }

    /// Lease lifetime granted by Claim and Renew, in seconds.
    #[zbus(property(emits_changed_signal = "const"))]
    fn lease_seconds(&self) -> u32 {
        self.shared.info.lease_seconds
    }

    /// The unix uid Worker1 is reserved for.
    #[zbus(property(emits_changed_signal = "const"))]
    fn worker_uid(&self) -> u32 {
        self.shared.info.worker_uid
    }

    /// The supervisor's version.
    #[zbus(property(emits_changed_signal = "const"))]
    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_owned()
    }

    /// The bus protocol it speaks, `"major.minor"`
    /// (`airlock_proto::bus::PROTOCOL_VERSION`; docs/protocol.md).
    #[zbus(property(emits_changed_signal = "const"))]
    fn protocol_version(&self) -> String {
        airlock_proto::bus::protocol_string(airlock_proto::bus::PROTOCOL_VERSION)
    }

    /// Tasks QUEUED.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn queued(&self) -> zbus::fdo::Result<u64> {
        self.count(TaskState::Queued).await
    }

    /// Tasks RUNNING.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn running(&self) -> zbus::fdo::Result<u64> {
        self.count(TaskState::Running).await
    }

    /// Tasks VERIFYING.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn verifying(&self) -> zbus::fdo::Result<u64> {
        self.count(TaskState::Verifying).await
    }

    /// Tasks SUCCEEDED.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn succeeded(&self) -> zbus::fdo::Result<u64> {
        self.count(TaskState::Succeeded).await
    }

    /// Tasks FAILED.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn failed(&self) -> zbus::fdo::Result<u64> {
        self.count(TaskState::Failed).await
    }

    /// Tasks CANCELLED.
    #[zbus(property(emits_changed_signal = "false"))]
    async fn cancelled(&self) -> zbus::fdo::Result<u64> {
        self.count(TaskState::Cancelled).await
    }
}

impl Tasks {
    async fn count(&self, state: TaskState) -> zbus::fdo::Result<u64> {
        self.shared
            .ops
            .summary()
            .await
            .map(|s| s.count(state))
            .map_err(|e| zbus::fdo::Error::Failed(e.to_string()))
    }
}
