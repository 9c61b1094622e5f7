//! `airlockctl retry extend TASK_ID`: ask airlock-retryd, the owner's API,
//! for exactly one more attempt on an exhausted, failed task.
//!
//! The compare-and-swap fields are filled from the task as the supervisor
//! shows it now (status, revision, attempt, max_attempts and the SHA-256 of
//! the verification record), so the extension applies only to the state
//! the owner is looking at. The idempotency key is derived from that state:
//! running the same command again after a lost answer replays it instead
//! of asking twice.

use crate::client::{Client, CtlError};
use crate::output::Ctx;
use airlock_proto::Code;
use airlock_proto::canonical::{digest_of, sha256_hex};
use airlock_proto::retry::{RetryExtensionOutcome, RetryExtensionRequest};
use airlock_proto::task::{TaskState, TaskView};
use serde::Deserialize;
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `retry`.
pub type Args = super::Verbs<Action>;

/// `retry` subcommands.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Raise an exhausted FAILED task's max_attempts by one (owner only, via airlock-retryd).
    Extend(ExtendArgs),
}

/// Arguments of `retry extend`.
#[derive(Debug, clap::Args)]
pub struct ExtendArgs {
    /// The task id.
    pub task_id: String,
    /// The retry API [default: http://<retry.listen of the configuration>].
    #[arg(long, value_name = "URL")]
    pub url: Option<String>,
    /// The owner's bearer token file [default: retry.token_file of the configuration].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// The owner authorization id [default: $AIRLOCK_RETRY_AUTHORIZATION_ID,
    /// else retry.authorization_id of the configuration, else
    /// AIRLOCK_RETRY_AUTHORIZATION_ID in /etc/airlock/retryd.env].
    #[arg(long, value_name = "ID")]
    pub authorization_id: Option<String>,
    /// The idempotency key [default: derived from the task's current state].
    #[arg(long, value_name = "KEY")]
    pub idempotency_key: Option<String>,
    /// The configuration file for the defaults above (airlockctl's global
    /// `--config`).
    #[arg(skip = PathBuf::from(airlock_config::DEFAULT_PATH))]
    pub config: PathBuf,
}

/// Runs `retry`.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    match args.action {
        Action::Extend(a) => extend(ctx, client, a).await,
    }
}

fn env_file_value(path: &str, key: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()?.lines().find_map(|l| {
        let (k, v) = l.trim().split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_owned())
    })
}

/// The request, from the task as shown by the supervisor.
pub fn request_for(
    task: &TaskView,
    authorization_id: &str,
    key: Option<&str>,
) -> Result<RetryExtensionRequest, CtlError> {
    let id = &task.task_id;
    let state = task.state.as_str();
    let (attempt, max) = (i64::from(task.attempt), i64::from(task.max_attempts));
    let revision = task.revision;
    if task.state != TaskState::Failed {
        return Err(CtlError::local(
            Code::RETRY_EXTENSION_CAS_MISMATCH,
            format!(
                "{id} is {state}; only a FAILED task whose attempts are used up can be extended"
            ),
        ));
    }
    if attempt != max {
        return Err(CtlError::local(
            Code::RETRY_EXTENSION_NOT_EXHAUSTED,
            format!(
                "{id} has used {attempt} of {max} attempts; it can only be extended when all are used"
            ),
        ));
    }
    let verification = task
        .verification
        .clone()
        .filter(|v| !v.is_null())
        .unwrap_or(json!({}));
    let verification_sha =
        digest_of(&verification).map_err(|e| CtlError::local(e.code, e.to_string()))?;
    let key = match key {
        Some(k) => k.to_owned(),
        None => {
            let tag = sha256_hex(format!("{id}\0{revision}\0{}", max + 1).as_bytes());
            format!("retry-{}-m{}", &tag[..32], max + 1)
        }
    };
    Ok(RetryExtensionRequest {
        expected_status: TaskState::Failed.as_str().to_owned(),
        expected_revision: revision,
        expected_attempt: attempt,
        expected_max_attempts: max,
        next_max_attempts: max + 1,
        previous_verification_sha256: verification_sha,
        authorization_id: authorization_id.to_owned(),
        idempotency_key: key,
    })
}

/// What airlock-retryd answers: the outcome, or a refusal by code.
#[derive(Debug)]
enum Answer {
    /// 200 (a replay) or 201.
    Done(RetryExtensionOutcome),
    /// 4xx or 5xx: `{"error": CODE}`.
    Refused(Option<Code>),
}

/// A refusal's body.
#[derive(Deserialize)]
struct Refusal {
    error: String,
}

async fn extend(ctx: &Ctx, client: &Client, args: ExtendArgs) -> Result<ExitCode, CtlError> {
    let config = if args.config.exists() {
        Some(
            airlock_config::Config::load(&args.config)
                .map_err(|e| CtlError::local(Code::CONFIG_INVALID, e.to_string()))?,
        )
    } else {
        None
    };
    let url = args
        .url
        .clone()
        .or_else(|| {
            config
                .as_ref()
                .map(|c| format!("http://{}", c.retry.listen))
        })
        .unwrap_or_else(|| "http://127.0.0.1:8941".to_owned());
    let token_file = args
        .token_file
        .clone()
        .or_else(|| config.as_ref().map(|c| c.retry.token_file.clone()))
        .unwrap_or_else(|| PathBuf::from("/etc/airlock/retry-control.token"));
    let authorization_id = args
        .authorization_id
        .clone()
        .or_else(|| std::env::var("AIRLOCK_RETRY_AUTHORIZATION_ID").ok())
        .or_else(|| config.as_ref().and_then(|c| c.retry.authorization_id.clone()))
        .or_else(|| env_file_value("/etc/airlock/retryd.env", "AIRLOCK_RETRY_AUTHORIZATION_ID"))
        .ok_or_else(|| {
            CtlError::local(
                Code::TASK_RETRY_AUTHORIZATION_ID_MISSING,
                "no owner authorization id: pass --authorization-id or set AIRLOCK_RETRY_AUTHORIZATION_ID",
            )
        })?;
    let token = std::fs::read_to_string(&token_file)
        .map_err(|e| {
            CtlError::local(
                Code::TASK_RETRY_CONTROL_CREDENTIAL_UNAVAILABLE,
                format!("{}: {e}", token_file.display()),
            )
        })?
        .trim()
        .to_owned();

    let before = client.sup().get_task(&args.task_id).await?;
    let body = request_for(&before, &authorization_id, args.idempotency_key.as_deref())?;
    let endpoint = format!(
        "{}/v1/tasks/{}/retry-extension",
        url.trim_end_matches('/'),
        args.task_id
    );
    let payload = serde_json::to_string(&body).map_err(|e| CtlError::generic(e.to_string()))?;
    let (status, answer) = tokio::task::spawn_blocking(move || post(&endpoint, &token, &payload))
        .await
        .map_err(|e| CtlError::generic(e.to_string()))??;
    let answer = match answer {
        Answer::Done(a) => a,
        Answer::Refused(code) => {
            let code = code.unwrap_or(Code::INTERNAL);
            return Err(CtlError::local(
                code,
                format!("airlock-retryd refused ({status}): {}", code.meaning()),
            ));
        }
    };
    if ctx.json {
        ctx.print_json(&json!({"request": &body, "status": status, "answer": &answer}));
    } else {
        let replay = answer.idempotent;
        println!(
            "{} {}: max_attempts {} → {}, state {} → {}, revision {} → {}{}",
            if replay {
                "Already extended"
            } else {
                "Extended"
            },
            args.task_id,
            before.max_attempts,
            answer.max_attempts,
            before.state.as_str(),
            answer.status,
            before.revision,
            answer.revision,
            if replay {
                " (the same request was applied before; nothing changed now)"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// POSTs the request; returns the status and the answer.
fn post(endpoint: &str, token: &str, body: &str) -> Result<(u16, Answer), CtlError> {
    let agent = ureq::AgentBuilder::new()
        .timeout(std::time::Duration::from_secs(30))
        .build();
    let response = agent
        .post(endpoint)
        .set("Authorization", &format!("Bearer {token}"))
        .set("Content-Type", "application/json")
        .send_string(body);
    let (status, text) = match response {
        Ok(r) => (r.status(), r.into_string().unwrap_or_default()),
        Err(ureq::Error::Status(status, r)) => (status, r.into_string().unwrap_or_default()),
        Err(e) => {
            return Err(CtlError::local(
                Code::RUNTIME_UNAVAILABLE,
                format!("cannot reach {endpoint}: {e}"),
            ));
        }
    };
    if status >= 400 {
        let code = serde_json::from_str::<Refusal>(&text)
            .ok()
            .and_then(|r| Code::from_name(&r.error));
        return Ok((status, Answer::Refused(code)));
    }
    let outcome = airlock_proto::bus::decode::<RetryExtensionOutcome>("retry-extension", &text)
        .map_err(|e| CtlError::local(e.code, format!("airlock-retryd's answer: {e}")))?;
    Ok((status, Answer::Done(outcome)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: &str, attempt: u32, max: u32) -> TaskView {
        let oid = "a".repeat(40);
        serde_json::from_value(json!({
            "task_id": "task-a", "state": state, "attempt": attempt, "max_attempts": max,
            "revision": 7, "lease_epoch": 0, "lease_expires_at_ms": null,
            "binding": {
                "task_id": "task-a", "job_id": "job-a", "repository": "demo",
                "base_oid": oid, "expected_branch_oid": oid, "target_branch": "agent/a",
                "branch_mode": "CREATE_NEW", "generation": 1, "idempotency_key": "key-a-0001",
            },
            "plan_digest": "p", "execution_digest": "e", "result": null, "result_sha256": null,
            "verification": {"decision": "NEEDS_REWORK", "automatic": true},
            "created_at_ms": 0, "updated_at_ms": 0,
        }))
        .unwrap()
    }

    #[test]
    fn fills_the_cas_fields_from_the_task() {
        let r = request_for(&task("FAILED", 3, 3), "owner-id-0001", None).unwrap();
        assert_eq!(r.expected_revision, 7);
        assert_eq!(r.next_max_attempts, 4);
        assert_eq!(
            r.previous_verification_sha256,
            digest_of(&json!({"decision": "NEEDS_REWORK", "automatic": true})).unwrap()
        );
        let again = request_for(&task("FAILED", 3, 3), "owner-id-0001", None).unwrap();
        assert_eq!(
            r.idempotency_key, again.idempotency_key,
            "the key is stable for one state"
        );
        assert!(airlock_proto::binding::is_key(&r.idempotency_key));
        RetryExtensionRequest::from_value(&serde_json::to_value(&r).unwrap()).unwrap();
    }

    #[test]
    fn refuses_locally_what_the_service_would_refuse() {
        assert_eq!(
            request_for(&task("QUEUED", 1, 3), "owner-id-0001", None)
                .unwrap_err()
                .code,
            Some(Code::RETRY_EXTENSION_CAS_MISMATCH)
        );
        assert_eq!(
            request_for(&task("FAILED", 2, 3), "owner-id-0001", None)
                .unwrap_err()
                .code,
            Some(Code::RETRY_EXTENSION_NOT_EXHAUSTED)
        );
    }
}
