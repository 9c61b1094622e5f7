//! The HTTP surface: two routes, checks in a fixed order, JSON errors.
//!
//! Order for `POST /v1/tasks/{id}/retry-extension`: route → bearer token
//! (401) → Content-Length present, numeric, 1..=64 KiB (413 or 400) before
//! a byte of the body is read → body within its deadline → UTF-8 JSON
//! object (400) → the request's exact field set and values → the store's
//! compare-and-swap transaction, run by the supervisor (`Retry1`). Anything
//! else is 404.

use crate::token::ControlToken;
use airlock_client::Supervisor;
use airlock_proto::Code;
use airlock_proto::limits::MAX_HTTP_BODY_BYTES;
use airlock_proto::retry::RetryExtensionRequest;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Everything a request handler needs.
#[derive(Debug)]
pub struct State {
    /// The supervisor, reached over its Retry1 interface: retryd holds no
    /// database of its own.
    pub supervisor: Supervisor,
    /// The owner's bearer token.
    pub token: ControlToken,
    /// What the access log runs every client-chosen string through (the
    /// token included).
    pub redactor: airlock_proto::redact::Redactor,
    /// The owner authorization id this service was started with.
    pub authorization_id: String,
    /// How long a client may take to send its body.
    pub body_timeout: Duration,
}

/// Outcome of one request, for the access log.
struct Answer {
    status: StatusCode,
    body: Value,
    code: Option<Code>,
}

impl Answer {
    fn ok(status: StatusCode, body: Value) -> Self {
        Answer {
            status,
            body,
            code: None,
        }
    }

    fn refuse(code: Code) -> Self {
        let status =
            StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        Answer {
            status,
            body: json!({ "error": code.as_str() }),
            code: Some(code),
        }
    }
}

/// Serves one request and writes one access-log line (never the token or the body).
pub async fn serve(
    req: Request<Incoming>,
    state: Arc<State>,
    peer: SocketAddr,
) -> Result<Response<Full<Bytes>>, std::convert::Infallible> {
    let started = Instant::now();
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let answer = route(req, &state).await;
    tracing::info!(
        target: "access",
        %peer,
        %method,
        path = %state.redactor.text(&sanitise(&path)),
        status = answer.status.as_u16(),
        code = answer.code.map(|c| c.as_str()).unwrap_or("-"),
        ms = started.elapsed().as_millis() as u64,
        "request"
    );
    let body = serde_json::to_vec(&answer.body).unwrap_or_default();
    let response = Response::builder()
        .status(answer.status)
        .header(CONTENT_TYPE, "application/json")
        .header(CONTENT_LENGTH, body.len())
        .header("cache-control", "no-store")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    Ok(response)
}

/// Keeps log lines printable and short whatever a client sends.
fn sanitise(path: &str) -> String {
    path.chars()
        .take(256)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

fn task_route(path: &str) -> Option<&str> {
    let id = path
        .strip_prefix("/v1/tasks/")?
        .strip_suffix("/retry-extension")?;
    (!id.is_empty() && !id.contains('/')).then_some(id)
}

async fn route(req: Request<Incoming>, state: &State) -> Answer {
    let path = req.uri().path();
    if path == "/health" && req.method() == Method::GET {
        return Answer::ok(
            StatusCode::OK,
            json!({"status": "ok", "service": "airlock-retryd"}),
        );
    }
    let Some(task_id) = task_route(path).map(str::to_owned) else {
        return Answer::refuse(Code::NOT_FOUND);
    };
    if req.method() != Method::POST {
        return Answer::refuse(Code::NOT_FOUND);
    }
    if !state
        .token
        .accepts(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes()))
    {
        return Answer::refuse(Code::UNAUTHORIZED);
    }
    let length = match req.headers().get(CONTENT_LENGTH) {
        None => 0,
        Some(v) => match v.to_str().ok().and_then(|s| s.parse::<u64>().ok()) {
            Some(n) => n,
            None => return Answer::refuse(Code::CONTENT_LENGTH_INVALID),
        },
    };
    if length < 1 || length > MAX_HTTP_BODY_BYTES as u64 {
        return Answer::refuse(Code::REQUEST_SIZE_INVALID);
    }
    let body = Limited::new(req.into_body(), MAX_HTTP_BODY_BYTES);
    let bytes = match tokio::time::timeout(state.body_timeout, body.collect()).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) | Err(_) => return Answer::refuse(Code::REQUEST_INVALID),
    };
    let value: Value = match std::str::from_utf8(&bytes)
        .ok()
        .and_then(|s| serde_json::from_str(s).ok())
    {
        Some(v @ Value::Object(_)) => v,
        _ => return Answer::refuse(Code::REQUEST_INVALID),
    };
    let request = match RetryExtensionRequest::from_value(&value) {
        Ok(r) => r,
        Err(e) => return Answer::refuse(e.code),
    };
    let outcome = state
        .supervisor
        .extend_retry(&task_id, &request, &state.authorization_id)
        .await;
    match outcome {
        Ok(outcome) => {
            let status = if outcome.idempotent {
                StatusCode::OK
            } else {
                StatusCode::CREATED
            };
            Answer::ok(status, serde_json::to_value(outcome).unwrap_or(Value::Null))
        }
        Err(e) => {
            if e.code == Code::RUNTIME_UNAVAILABLE {
                tracing::error!("the supervisor did not answer: {e}");
            }
            Answer::refuse(e.code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_route_matches() {
        assert_eq!(
            task_route("/v1/tasks/task-a/retry-extension"),
            Some("task-a")
        );
        assert_eq!(task_route("/v1/tasks//retry-extension"), None);
        assert_eq!(task_route("/v1/tasks/a/b/retry-extension"), None);
        assert_eq!(task_route("/v1/tasks/a/retry-extension/"), None);
        assert_eq!(task_route("/v2/tasks/a/retry-extension"), None);
        assert_eq!(sanitise("/a\nb"), "/a?b");
    }
}
