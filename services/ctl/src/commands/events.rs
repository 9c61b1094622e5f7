//! `airlockctl events [ID] [--since WHEN] [--follow]`: the audit log. With
//! `--json`, one JSON object per line (an event as the supervisor keeps it,
//! plus `at`, its time in RFC 3339), for a log pipeline. `events ID
//! --count`: how many of the task's events there are, by action.

use super::submit::task_changes;
use crate::client::{Client, CtlError};
use crate::output::{Ctx, emit, or_dash, table, text, text_opt, time};
use crate::view::{Actor, Payload};
use airlock_proto::bus::EventRecord;
use futures_util::StreamExt;
use std::process::ExitCode;
use std::time::Duration;

/// Arguments of `events`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only this task's events.
    pub task_id: Option<String>,

    /// Keep printing new events as they are recorded (Ctrl-C to stop).
    #[arg(long, short = 'f')]
    pub follow: bool,

    /// Only events after this event id.
    #[arg(long, value_name = "ID", default_value_t = 0)]
    pub after: i64,

    /// At most this many events (default: all; with --follow, the backlog only).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,

    /// Only events recorded at or after WHEN: an RFC 3339 time
    /// ("2026-11-30T05:00:00Z", "2026-11-30 05:00:00" is UTC) or a duration
    /// ago ("15m", "2h", "7days").
    #[arg(long, value_name = "WHEN", value_parser = parse_since)]
    pub since: Option<i64>,

    /// Count the task's events instead of showing them: how many you may
    /// read, how many were denied, and how many of each action.
    #[arg(long, requires = "task_id", conflicts_with_all = ["follow", "after", "limit", "since"])]
    pub count: bool,
}

/// `--since` as unix milliseconds.
fn parse_since(s: &str) -> Result<i64, String> {
    let at = match humantime::parse_duration(s) {
        Ok(ago) => std::time::SystemTime::now()
            .checked_sub(ago)
            .ok_or_else(|| format!("{s:?} reaches before 1970"))?,
        Err(_) => humantime::parse_rfc3339_weak(s).map_err(|e| {
            format!("{s:?} is neither an RFC 3339 time nor a duration like 2h: {e}")
        })?,
    };
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{s:?} is before 1970"))?
        .as_millis();
    i64::try_from(ms).map_err(|_| format!("{s:?} is too far ahead"))
}

/// Page size asked of the supervisor.
const PAGE: u32 = 500;
/// With --follow, how often to look even without a signal (denials change no task).
const FOLLOW_POLL: Duration = Duration::from_secs(1);

/// Fetches events after `after`, at most `limit`; returns them and the new cursor.
async fn fetch(
    client: &Client,
    task: &str,
    mut after: i64,
    limit: Option<u32>,
) -> Result<(Vec<EventRecord>, i64), CtlError> {
    let mut events = Vec::new();
    loop {
        let want = match limit {
            Some(l) => (l as usize).saturating_sub(events.len()).min(PAGE as usize) as u32,
            None => PAGE,
        };
        if want == 0 {
            break;
        }
        let page = client.sup().list_events(task, after, want).await?;
        after = page.next_after;
        let n = page.events.len();
        events.extend(page.events);
        if n < want as usize {
            break;
        }
    }
    Ok((events, after))
}

fn row(ctx: &Ctx, e: &EventRecord) -> Vec<String> {
    let outcome = if e.outcome == "denied" {
        ctx.paint("31", &e.outcome)
    } else {
        e.outcome.clone()
    };
    let payload = Payload::of(&e.payload);
    let detail = match payload.detail.or(payload.reason) {
        Some(d) => text(&d),
        None => payload.state.as_ref().map(text).unwrap_or_default(),
    };
    let actor = Actor::of(&e.actor);
    vec![
        e.id.to_string(),
        time(e.at_ms),
        or_dash(e.task_id.as_deref()),
        format!(
            "{} {}",
            text_opt(actor.kind.as_ref()),
            text_opt(actor.name.as_ref())
        ),
        e.action.clone(),
        outcome,
        or_dash(e.code.as_deref()),
        detail,
    ]
}

/// An event as `--json` prints it: as the supervisor keeps it, plus `at`,
/// its time in RFC 3339.
#[derive(serde::Serialize)]
struct Line<'a> {
    #[serde(flatten)]
    event: &'a EventRecord,
    #[serde(skip_serializing_if = "Option::is_none")]
    at: Option<String>,
}

const HEADER: [&str; 8] = [
    "ID", "TIME", "TASK", "ACTOR", "ACTION", "OUTCOME", "CODE", "DETAIL",
];

fn print(ctx: &Ctx, events: &[EventRecord], header: bool) {
    if ctx.json {
        for e in events {
            let at = u64::try_from(e.at_ms).ok().map(|ms| {
                let at = std::time::UNIX_EPOCH + Duration::from_millis(ms);
                humantime::format_rfc3339_millis(at).to_string()
            });
            ctx.print_json(&Line { event: e, at });
        }
        return;
    }
    if events.is_empty() {
        return;
    }
    let rows: Vec<Vec<String>> = events.iter().map(|e| row(ctx, e)).collect();
    let rendered = table(ctx, &HEADER, &rows);
    if header {
        emit(&rendered);
    } else {
        // Following: no header again, and columns only as wide as this batch.
        emit(
            &rendered
                .lines()
                .skip(1)
                .map(|l| format!("{l}\n"))
                .collect::<String>(),
        );
    }
}

/// `--count`: the task's events by action.
async fn count(ctx: &Ctx, client: &Client, task: &str) -> Result<ExitCode, CtlError> {
    let count = client.sup().count_events(task).await?;
    if ctx.json {
        ctx.print_json(&count);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{}: {} event(s), {} denied",
        count.task_id, count.events, count.denied
    );
    let rows: Vec<Vec<String>> = count
        .by_action
        .iter()
        .map(|(action, n)| vec![action.clone(), n.to_string()])
        .collect();
    if !rows.is_empty() {
        emit(&table(ctx, &["ACTION", "EVENTS"], &rows));
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the log, and follows it when asked.
pub async fn run(ctx: &Ctx, client: &Client, args: Args) -> Result<ExitCode, CtlError> {
    let task = args.task_id.clone().unwrap_or_default();
    if args.count {
        return count(ctx, client, &task).await;
    }
    let mut changes = if args.follow {
        Some(task_changes(client, args.task_id.as_deref()).await?)
    } else {
        None
    };
    let since = args.since.unwrap_or(i64::MIN);
    let recent = |events: Vec<EventRecord>| -> Vec<EventRecord> {
        events.into_iter().filter(|e| e.at_ms >= since).collect()
    };
    // With --since the limit counts the events that qualify.
    let fetch_limit = if args.since.is_some() {
        None
    } else {
        args.limit
    };
    let (events, mut after) = fetch(client, &task, args.after, fetch_limit).await?;
    let mut events = recent(events);
    if let Some(limit) = args.limit {
        events.truncate(limit as usize);
    }
    if events.is_empty() && !args.follow && !ctx.json {
        println!("No events.");
    }
    print(ctx, &events, true);
    let Some(changes) = changes.as_mut() else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut header = events.is_empty();
    loop {
        tokio::select! {
            _ = changes.next() => {}
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
        let (events, next) = fetch(client, &task, after, None).await?;
        after = next;
        let events = recent(events);
        print(ctx, &events, header);
        if !events.is_empty() {
            header = false;
        }
    }
}
