//! Reconciliation cases: opened by a worker's `RECONCILIATION_REQUIRED`
//! result, resolved once by an administrator, an adoption settled by the
//! worker's check of the ref (`airlock_proto::reconcile`).

use super::row::{TaskRow, corrupt};
use super::tx::{Backend, Guard, NewCase, NewResolution, Page, Tx};
use super::{Actor, ReadScope, Store, action, audit, check_task_id, not_found};
use crate::error::{StoreError, StoreResult};
use airlock_proto::canonical::to_canonical_string;
use airlock_proto::reconcile::{
    AdoptionCheck, AdoptionReport, BranchFacts, CaseStatus, ReconciliationCase, Resolution,
    ResolveOutcome, ResolveRequest,
};
use airlock_proto::states::Step;
use airlock_proto::task::TaskState;
use airlock_proto::{Code, Error};
use serde_json::{Value, json};

fn parse_case(task_id: &str, text: &str) -> StoreResult<ReconciliationCase> {
    serde_json::from_str(text).map_err(|_| corrupt(task_id, "reconciliation case"))
}

fn save_case(tx: &mut dyn Tx, case: &ReconciliationCase) -> StoreResult<()> {
    let json = airlock_proto::canonical::canonical_of(case)?;
    tx.put_case(&NewCase {
        task_id: &case.task_id,
        attempt: case.attempt,
        status: case.status.as_str(),
        case_json: &json,
    })
}

fn case_not_found(task_id: &str) -> StoreError {
    Error::with(
        Code::RECONCILIATION_NOT_FOUND,
        format!("no reconciliation case for {task_id}"),
    )
    .into()
}

/// Opens the case of the row's attempt inside the transaction that stores
/// its `RECONCILIATION_REQUIRED` result, with the event saying so.
pub(super) fn open_case(
    tx: &mut dyn Tx,
    row: &TaskRow,
    facts: &BranchFacts,
    worker: &Actor,
) -> StoreResult<()> {
    let binding = row.binding()?;
    let now = tx.now();
    let case = ReconciliationCase {
        task_id: row.task_id.clone(),
        attempt: row.attempt,
        repository: binding.repository.clone(),
        branch: binding.target_branch.clone(),
        commit_oid: facts.commit_oid.clone(),
        observed_head: facts.observed_head.clone(),
        base_oid: binding.source_head().to_owned(),
        status: CaseStatus::Open,
        resolution: None,
        last_refusal: None,
        revision: 1,
        opened_at_ms: now,
        updated_at_ms: now,
    };
    save_case(tx, &case)?;
    audit::append_allowed(
        tx,
        &row.task_id,
        worker,
        action::TASK_RECONCILIATION_OPENED,
        json!({
            "attempt": case.attempt,
            "branch": case.branch,
            "commit_oid": case.commit_oid,
            "observed_head": case.observed_head,
        }),
    )
}

impl<B: Backend> Store<B> {
    /// Reconciliation cases in `(task_id, attempt)` order, of tasks after
    /// `after_task_id`, only those in `status` when given; `limit` is
    /// clamped to [`super::MAX_PAGE`].
    pub fn reconciliations(
        &mut self,
        status: Option<CaseStatus>,
        after_task_id: Option<&str>,
        limit: u32,
    ) -> StoreResult<Vec<ReconciliationCase>> {
        self.reconciliations_as(status, after_task_id, limit, &ReadScope::All)
    }

    /// [`Self::reconciliations`] of the tasks `scope` sees only (filtered
    /// by the engine).
    pub fn reconciliations_as(
        &mut self,
        status: Option<CaseStatus>,
        after_task_id: Option<&str>,
        limit: u32,
        scope: &ReadScope,
    ) -> StoreResult<Vec<ReconciliationCase>> {
        let texts = self.write("listing reconciliation cases", &mut |tx| {
            let page = Page::new(after_task_id, limit, scope);
            tx.cases(status.map(CaseStatus::as_str), page)
        })?;
        texts.iter().map(|t| parse_case("a case", t)).collect()
    }

    /// The task's latest reconciliation case (`TASK_ID_INVALID`,
    /// `RECONCILIATION_NOT_FOUND`).
    pub fn reconciliation(&mut self, task_id: &str) -> StoreResult<ReconciliationCase> {
        self.reconciliation_as(task_id, &ReadScope::All)
    }

    /// [`Self::reconciliation`], if `scope` sees the task: the case of a
    /// task outside it is `RECONCILIATION_NOT_FOUND` with the same detail
    /// as that of a task with no case or no task at all.
    pub fn reconciliation_as(
        &mut self,
        task_id: &str,
        scope: &ReadScope,
    ) -> StoreResult<ReconciliationCase> {
        check_task_id(task_id)?;
        let text = self.write("reading a reconciliation case", &mut |tx| {
            if *scope != ReadScope::All {
                let seen = tx.load(task_id)?.map(|row| row.submitter());
                if !scope.sees(seen.flatten().as_ref()) {
                    return Ok(None);
                }
            }
            tx.case_json(task_id, None)
        })?;
        parse_case(task_id, &text.ok_or_else(|| case_not_found(task_id))?)
    }

    /// Resolves the task's latest case, exactly once: `fail` closes it
    /// (the task stays FAILED with `RECONCILIATION_REQUIRED`, the reason in
    /// its verification record); `adopt` marks it `adopting` for the
    /// worker's check of the ref ([`Store::settle_adoption`]).
    ///
    /// Checks, in order (each refusal changes nothing and is audited):
    /// the request re-parsed and naming this task (`MESSAGE_INVALID`); in
    /// one transaction, the task (`TASK_NOT_FOUND`), then the resolution
    /// stored under the key (the same request answers the stored outcome
    /// with `idempotent: true`; another is
    /// `RECONCILIATION_IDEMPOTENCY_CONFLICT`), the case
    /// (`RECONCILIATION_NOT_FOUND`), the case as the admin saw it: attempt,
    /// revision and observed head (`RECONCILIATION_CAS_MISMATCH`), open
    /// (`RECONCILIATION_CLOSED`), the task FAILED (`TASK_STATE_INVALID`:
    /// another attempt runs), and for adopt a head to adopt
    /// (`RECONCILIATION_HEAD_UNRELATED` when the branch is missing).
    pub fn resolve_reconciliation(
        &mut self,
        task_id: &str,
        req: &ResolveRequest,
        actor: &Actor,
    ) -> StoreResult<ResolveOutcome> {
        let result = self.resolve_inner(task_id, req, actor);
        self.audited(
            result,
            Some(task_id),
            actor,
            action::TASK_RECONCILIATION_RESOLVED,
        )
    }

    fn resolve_inner(
        &mut self,
        task_id: &str,
        req: &ResolveRequest,
        actor: &Actor,
    ) -> StoreResult<ResolveOutcome> {
        check_task_id(task_id)?;
        let req = ResolveRequest::from_value(&req.to_value())?;
        if req.task_id != task_id {
            return Err(
                Error::with(Code::MESSAGE_INVALID, "the resolution names another task").into(),
            );
        }
        let request_sha256 = req.request_sha256();
        let reason = airlock_proto::redact::text(&req.reason).into_owned();
        self.write("a resolution", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            if let Some(stored) = tx.resolution(task_id, &req.idempotency_key)? {
                if stored.request_sha256 != request_sha256 {
                    return Err(Error::with(
                        Code::RECONCILIATION_IDEMPOTENCY_CONFLICT,
                        "the idempotency key was used on this task with another resolution",
                    )
                    .into());
                }
                let mut outcome: ResolveOutcome = serde_json::from_str(&stored.outcome_json)
                    .map_err(|_| corrupt(task_id, "resolution"))?;
                outcome.idempotent = true;
                return Ok(outcome);
            }
            let text = tx
                .case_json(task_id, None)?
                .ok_or_else(|| case_not_found(task_id))?;
            let mut case = parse_case(task_id, &text)?;
            if case.attempt != req.expected_attempt
                || case.revision != req.expected_revision
                || case.observed_head != req.expected_observed_head
            {
                return Err(Error::with(
                    Code::RECONCILIATION_CAS_MISMATCH,
                    format!(
                        "the resolution is about attempt {} revision {} head {}; the case is attempt {} revision {} head {}",
                        req.expected_attempt,
                        req.expected_revision,
                        req.expected_observed_head.as_deref().unwrap_or("(missing)"),
                        case.attempt,
                        case.revision,
                        case.observed_head.as_deref().unwrap_or("(missing)"),
                    ),
                )
                .into());
            }
            if case.status != CaseStatus::Open {
                return Err(Error::with(
                    Code::RECONCILIATION_CLOSED,
                    format!("the case is {}", case.status.as_str()),
                )
                .into());
            }
            if row.status() != TaskState::Failed {
                return Err(Error::with(
                    Code::TASK_STATE_INVALID,
                    format!("the task is {}, not FAILED", row.status().as_str()),
                )
                .into());
            }
            if req.resolution == Resolution::Adopt && case.observed_head.is_none() {
                return Err(Error::with(
                    Code::RECONCILIATION_HEAD_UNRELATED,
                    "the branch is missing: there is no head to adopt",
                )
                .into());
            }
            case.resolution = Some(json!({
                "resolution": req.resolution.as_str(),
                "reason": reason,
                "actor": actor.name,
                "idempotency_key": req.idempotency_key,
                "observed_head": case.observed_head,
            }));
            case.last_refusal = None;
            case.revision += 1;
            case.updated_at_ms = tx.now();
            case.status = match req.resolution {
                Resolution::Adopt => CaseStatus::Adopting,
                Resolution::Fail => CaseStatus::Failed,
            };
            save_case(tx, &case)?;
            if req.resolution == Resolution::Fail {
                row.advance(Step::ResolveFail)?;
                row.verification_json = Some(to_canonical_string(&json!({
                    "decision": "RECONCILIATION_FAILED",
                    "reason": reason,
                    "actor": actor.name,
                    "attempt": case.attempt,
                    "code": Code::RECONCILIATION_REQUIRED.as_str(),
                    "result_sha256": row.result_sha256()?,
                }))?);
                row.save(tx, Guard::Revision)?;
            }
            let outcome = ResolveOutcome {
                task_id: task_id.to_owned(),
                attempt: case.attempt,
                resolution: req.resolution,
                idempotency_key: req.idempotency_key.clone(),
                status: case.status,
                revision: case.revision,
                task_state: row.status(),
                idempotent: false,
            };
            let outcome_json = airlock_proto::canonical::canonical_of(&outcome)?;
            tx.insert_resolution(&NewResolution {
                task_id,
                idempotency_key: &req.idempotency_key,
                request_sha256: &request_sha256,
                attempt: i64::from(case.attempt),
                resolution: req.resolution.as_str(),
                outcome_json: &outcome_json,
                actor_name: &actor.name,
            })?;
            audit::append_allowed(
                tx,
                task_id,
                actor,
                action::TASK_RECONCILIATION_RESOLVED,
                json!({
                    "resolution": req.resolution.as_str(),
                    "reason": reason,
                    "attempt": case.attempt,
                    "observed_head": case.observed_head,
                    "status": case.status.as_str(),
                    "case_revision": case.revision,
                    "idempotency_key": req.idempotency_key,
                }),
            )?;
            Ok(outcome)
        })
    }

    /// The oldest-named case an administrator chose to adopt, for the
    /// worker to check against the ref; `None` when none waits. Reading it
    /// changes nothing: two workers may check the same case, and the first
    /// report settles it.
    pub fn take_adoption(&mut self) -> StoreResult<Option<AdoptionCheck>> {
        let texts = self.write("looking for an adoption", &mut |tx| {
            let first = Page::new(None, 1, &ReadScope::All);
            tx.cases(Some(CaseStatus::Adopting.as_str()), first)
        })?;
        let Some(text) = texts.first() else {
            return Ok(None);
        };
        let case = parse_case("a case", text)?;
        let observed_head = case
            .observed_head
            .clone()
            .ok_or_else(|| corrupt(&case.task_id, "adopting case without a head"))?;
        Ok(Some(AdoptionCheck {
            task_id: case.task_id,
            attempt: case.attempt,
            repository: case.repository,
            branch: case.branch,
            observed_head,
            base_oid: case.base_oid,
        }))
    }

    /// Settles an adoption with what the worker found on the ref, in one
    /// transaction. The branch still at the head being adopted, and that
    /// head descending from the task's base: the case closes `adopted`, the
    /// task becomes SUCCEEDED with the head as its commit in the
    /// verification record (event `TASK_RECONCILIATION_ADOPTED`).
    /// Otherwise the case opens again with the head found and the refusal
    /// (`RECONCILIATION_HEAD_MOVED`, `RECONCILIATION_HEAD_UNRELATED`, or
    /// `TASK_STATE_INVALID` when the task is no longer FAILED), recorded as
    /// a denied `TASK_RECONCILIATION_ADOPTED` event in the same
    /// transaction. A report about a case that is no longer adopting that
    /// head (already settled, by this worker or another) changes nothing.
    /// Returns the case as it is now.
    pub fn settle_adoption(
        &mut self,
        report: &AdoptionReport,
        worker: &Actor,
    ) -> StoreResult<ReconciliationCase> {
        let result = self.settle_inner(report, worker);
        self.audited(
            result,
            Some(&report.task_id),
            worker,
            action::TASK_RECONCILIATION_ADOPTED,
        )
    }

    fn settle_inner(
        &mut self,
        report: &AdoptionReport,
        worker: &Actor,
    ) -> StoreResult<ReconciliationCase> {
        report.validate()?;
        let task_id = report.task_id.as_str();
        self.write("an adoption", &mut |tx| {
            let mut row = tx.load(task_id)?.ok_or_else(|| not_found(task_id))?;
            let text = tx
                .case_json(task_id, Some(report.attempt))?
                .ok_or_else(|| case_not_found(task_id))?;
            let mut case = parse_case(task_id, &text)?;
            if case.status != CaseStatus::Adopting
                || case.observed_head.as_deref() != Some(report.checked_head.as_str())
            {
                return Ok(case);
            }
            let refusal = report.refusal().or_else(|| {
                (row.status() != TaskState::Failed).then_some(Code::TASK_STATE_INVALID)
            });
            case.revision += 1;
            case.updated_at_ms = tx.now();
            if let Some(code) = refusal {
                let detail = match code {
                    Code::RECONCILIATION_HEAD_MOVED => format!(
                        "{} moved again: it is at {} instead of {}",
                        case.branch,
                        report.head_now.as_deref().unwrap_or("nothing"),
                        report.checked_head
                    ),
                    Code::RECONCILIATION_HEAD_UNRELATED => format!(
                        "{} does not descend from the task's base {}",
                        report.checked_head, case.base_oid
                    ),
                    _ => format!("the task is {}, not FAILED", row.status().as_str()),
                };
                case.status = CaseStatus::Open;
                case.observed_head = report.head_now.clone();
                case.last_refusal = Some(code.as_str().to_owned());
                save_case(tx, &case)?;
                audit::append_denial(
                    tx,
                    Some(task_id),
                    worker,
                    action::TASK_RECONCILIATION_ADOPTED,
                    code,
                    &detail,
                    Value::Null,
                )?;
                return Ok(case);
            }
            let resolution = case.resolution.clone().unwrap_or_default();
            row.advance(Step::Adopt)?;
            row.verification_json = Some(to_canonical_string(&json!({
                "decision": "ADOPTED",
                "reason": resolution["reason"],
                "actor": resolution["actor"],
                "attempt": case.attempt,
                "commit_oid": report.checked_head,
                "result_sha256": row.result_sha256()?,
            }))?);
            row.save(tx, Guard::Revision)?;
            case.status = CaseStatus::Adopted;
            case.last_refusal = None;
            save_case(tx, &case)?;
            audit::append_allowed(
                tx,
                task_id,
                worker,
                action::TASK_RECONCILIATION_ADOPTED,
                json!({
                    "attempt": case.attempt,
                    "branch": case.branch,
                    "commit_oid": report.checked_head,
                    "state": row.status().as_str(),
                    "revision": row.revision,
                }),
            )?;
            Ok(case)
        })
    }
}
