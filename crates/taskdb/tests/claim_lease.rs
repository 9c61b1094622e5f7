//! Claims, lease renewal, expiry and the monotonic store clock.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::Code;
use airlock_proto::bus::{FenceRequest, FenceStep};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::limits::MAX_FENCE_MS;
use airlock_proto::task::{Outcome, TaskState};
use airlock_taskdb::tasks::{ActorKind, EventOutcome, MAX_LEASE_MS, action};
use common::*;
use serde_json::json;

fn a_claim_starts_an_attempt_under_a_fresh_lease(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 3);
    let grant = fx.claim();
    assert_eq!(grant.task_id, "task-a");
    assert_eq!((grant.attempt, grant.lease_epoch), (1, 1));
    assert_eq!(grant.lease_expires_at_ms, T0 + LEASE);
    assert_eq!(grant.lease_token.len(), 64, "256 bits, hex");
    assert!(grant.lease_token.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(grant.envelope["task_id"], json!("task-a"));

    let v = fx.store.get("task-a").unwrap();
    assert_eq!(
        (v.state, v.attempt, v.lease_epoch),
        (TaskState::Running, 1, 1)
    );
    assert_eq!(v.revision, t.revision + 1);
    assert_eq!(v.lease_expires_at_ms, Some(T0 + LEASE));

    // Only the token's SHA-256 is stored, and the token appears nowhere.
    let row = fx.row("SELECT claimed_by, lease_token_hash FROM tasks");
    assert_eq!(
        row,
        texts(&["worker-1", &sha256_hex(grant.lease_token.as_bytes())])
    );
    let everything: String = fx
        .rows("SELECT payload_json FROM events")
        .into_iter()
        .flatten()
        .flatten()
        .collect();
    assert!(!everything.is_empty());
    assert!(!everything.contains(&grant.lease_token));
    let e = fx.store.events(Some("task-a"), 0, 10).unwrap();
    let last = e.last().unwrap();
    assert_eq!(last.action, action::TASK_CLAIMED);
    assert_eq!(last.actor.kind, ActorKind::Worker);
    assert_eq!(last.payload["lease_epoch"], json!(1));

    // Nothing else to claim.
    let events = fx.last_event_id();
    assert!(fx.store.claim(&worker(), LEASE).unwrap().is_none());
    assert_eq!(fx.last_event_id(), events, "an empty claim appends nothing");
}

fn tokens_differ_between_claims(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    fx.submit("task-b", 1);
    let a = fx.claim();
    let b = fx.claim();
    assert_ne!(a.lease_token, b.lease_token);
    assert_eq!(
        (a.task_id.as_str(), b.task_id.as_str()),
        ("task-a", "task-b")
    );
}

fn claims_take_the_oldest_queued_task_with_attempts_left(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-z", 1);
    fx.clock.advance(1);
    fx.submit("task-a", 2);
    let g = fx.claim();
    assert_eq!(g.task_id, "task-z");
    // A task requeued by rework keeps its place in line.
    fx.finish(&g, Outcome::Failed, false);
    let g = fx.claim();
    assert_eq!(g.task_id, "task-a");
    fx.finish(&g, Outcome::Failed, false);
    let g = fx.claim();
    assert_eq!((g.task_id.as_str(), g.attempt), ("task-a", 2));
    fx.finish(&g, Outcome::Failed, false);
    assert!(fx.store.claim(&worker(), LEASE).unwrap().is_none());
    let s = fx.store.summary().unwrap();
    assert_eq!(s.failed, 2);
}

fn claim_refuses_unbounded_leases(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 1);
    for bad in [0, -1, MAX_LEASE_MS + 1, i64::MAX] {
        fx.refused(
            "task-a",
            Code::FIELD_BOUNDS_EXCEEDED,
            action::TASK_CLAIMED,
            None,
            |s| s.claim(&worker(), bad),
        );
    }
    assert!(fx.store.claim(&worker(), MAX_LEASE_MS).unwrap().is_some());
}

fn renew_extends_from_now(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let t = fx.submit("task-a", 1);
    let g = fx.claim();
    fx.clock.advance(10_000);
    let exp = fx
        .store
        .renew("task-a", g.lease_epoch, &g.lease_token, 30_000, &worker())
        .unwrap();
    assert_eq!(exp, T0 + 10_000 + 30_000);
    let v = fx.store.get("task-a").unwrap();
    assert_eq!(v.lease_expires_at_ms, Some(exp));
    assert_eq!(v.revision, t.revision + 2);
    let e = fx.store.events(Some("task-a"), 0, 10).unwrap();
    assert_eq!(e.last().unwrap().action, action::TASK_LEASE_RENEWED);
    assert_eq!(e.last().unwrap().payload["lease_expires_at_ms"], json!(exp));
    // Just before the new expiry it still renews; at it, it does not.
    fx.clock.set(exp - 1);
    let exp2 = fx
        .store
        .renew("task-a", g.lease_epoch, &g.lease_token, 1, &worker())
        .unwrap();
    assert_eq!(exp2, exp);
    fx.clock.set(exp2);
    fx.refused(
        "task-a",
        Code::LEASE_EXPIRED,
        action::TASK_LEASE_RENEWED,
        Some("task-a"),
        |s| s.renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker()),
    );
}

fn renew_refusals(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 3);
    let a = action::TASK_LEASE_RENEWED;
    // Not RUNNING.
    fx.refused("task-a", Code::TASK_STATE_INVALID, a, Some("task-a"), |s| {
        s.renew("task-a", 0, "", LEASE, &worker())
    });
    let old = fx.claim();
    fx.clock.advance(LEASE);
    fx.store.sweep_expired().unwrap();
    let g = fx.claim();
    assert_eq!(g.lease_epoch, 2);
    fx.refused("task-a", Code::LEASE_EPOCH_STALE, a, Some("task-a"), |s| {
        s.renew(
            "task-a",
            old.lease_epoch,
            &old.lease_token,
            LEASE,
            &worker(),
        )
    });
    fx.refused("task-a", Code::LEASE_INVALID, a, Some("task-a"), |s| {
        s.renew("task-a", g.lease_epoch, &old.lease_token, LEASE, &worker())
    });
    fx.refused("task-a", Code::LEASE_INVALID, a, Some("task-a"), |s| {
        s.renew(
            "task-a",
            g.lease_epoch + 1,
            &g.lease_token,
            LEASE,
            &worker(),
        )
    });
    fx.refused("task-a", Code::LEASE_INVALID, a, Some("task-a"), |s| {
        s.renew(
            "task-a",
            g.lease_epoch,
            &g.lease_token.to_uppercase(),
            LEASE,
            &worker(),
        )
    });
    fx.refused(
        "task-a",
        Code::FIELD_BOUNDS_EXCEEDED,
        a,
        Some("task-a"),
        |s| s.renew("task-a", g.lease_epoch, &g.lease_token, 0, &worker()),
    );
    fx.refused("task-zz", Code::TASK_NOT_FOUND, a, Some("task-zz"), |s| {
        s.renew("task-zz", 1, &g.lease_token, LEASE, &worker())
    });
    fx.refused("task-a", Code::TASK_ID_INVALID, a, None, |s| {
        s.renew("-x", 1, &g.lease_token, LEASE, &worker())
    });
    assert!(
        fx.store
            .renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker())
            .is_ok()
    );
}

fn sweeping_requeues_with_attempts_left_and_fails_without(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    fx.submit("task-b", 1);
    fx.submit("task-c", 1);
    let ga = fx.claim();
    let gb = fx.claim();
    fx.clock.advance(LEASE / 2);
    let gc = fx.claim(); // expires later
    assert!(fx.store.sweep_expired().unwrap().is_empty());
    fx.clock.advance(LEASE / 2); // exactly at a's and b's expiry
    let swept = fx.store.sweep_expired().unwrap();
    assert_eq!(
        swept,
        vec![
            ("task-a".to_owned(), TaskState::Queued),
            ("task-b".to_owned(), TaskState::Failed)
        ]
    );
    let a = fx.store.get("task-a").unwrap();
    assert_eq!(
        (a.state, a.attempt, a.lease_expires_at_ms),
        (TaskState::Queued, 1, None)
    );
    assert_eq!(a.verification, None);
    let b = fx.store.get("task-b").unwrap();
    assert_eq!(
        (b.state, b.attempt, b.max_attempts),
        (TaskState::Failed, 1, 1)
    );
    let ver = b.verification.unwrap();
    assert_eq!(ver["decision"], json!("LEASE_EXPIRED"));
    assert_eq!(ver["lease_epoch"], json!(gb.lease_epoch));
    // The claim is kept as history, the lease is gone.
    let row = fx.row(
        "SELECT claimed_by, lease_token_hash, lease_expires_at, verification_json \
         FROM tasks WHERE task_id = 'task-b'",
    );
    assert_eq!(row[..3], [Some("worker-1".into()), None, None]);
    // Stored as canonical JSON, whichever engine wrote it.
    let stored = row[3].clone().unwrap();
    assert_eq!(
        airlock_proto::canonical::to_canonical_string(
            &serde_json::from_str::<serde_json::Value>(&stored).unwrap()
        )
        .unwrap(),
        stored
    );
    let e = fx.store.events(Some("task-b"), 0, 10).unwrap();
    let last = e.last().unwrap();
    assert_eq!(
        (last.action.as_str(), last.outcome),
        (action::TASK_LEASE_EXPIRED, EventOutcome::Allowed)
    );
    assert_eq!(last.actor.kind, ActorKind::System);
    // The expired holders are shut out; c's lease still stands.
    fx.refused(
        "task-a",
        Code::TASK_STATE_INVALID,
        action::TASK_LEASE_RENEWED,
        Some("task-a"),
        |s| s.renew("task-a", ga.lease_epoch, &ga.lease_token, LEASE, &worker()),
    );
    fx.store
        .renew("task-c", gc.lease_epoch, &gc.lease_token, LEASE, &worker())
        .unwrap();
    // task-a is claimable again, as attempt 2 under epoch 2.
    let g = fx.claim();
    assert_eq!(
        (g.task_id.as_str(), g.attempt, g.lease_epoch),
        ("task-a", 2, 2)
    );
}

fn rewinding_the_wall_clock_never_extends_a_lease(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let g = fx.claim();
    // Time passes beyond the expiry and the store sees it (a refused renew
    // is enough: its denial record moves the high-water mark).
    fx.clock.set(T0 + LEASE + 5);
    fx.refused(
        "task-a",
        Code::LEASE_EXPIRED,
        action::TASK_LEASE_RENEWED,
        Some("task-a"),
        |s| s.renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker()),
    );
    // Someone sets the wall clock back an hour: the lease stays expired,
    // for this store and for a fresh one on the same file.
    fx.clock.set(T0 - 3_600_000);
    assert_eq!(fx.store.now_ms().unwrap(), T0 + LEASE + 5);
    fx.refused(
        "task-a",
        Code::LEASE_EXPIRED,
        action::TASK_LEASE_RENEWED,
        Some("task-a"),
        |s| s.renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker()),
    );
    let mut other = fx.reopen();
    assert_eq!(
        other
            .renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker())
            .unwrap_err()
            .code(),
        Code::LEASE_EXPIRED
    );
    assert_eq!(
        other.sweep_expired().unwrap(),
        vec![("task-a".to_owned(), TaskState::Queued)]
    );
    // A claim made while the clock is behind is leased from the high-water
    // mark, not from the rewound clock, and events are stamped with it.
    let g2 = fx.claim();
    assert_eq!(g2.lease_expires_at_ms, T0 + LEASE + 5 + LEASE);
    let e = fx.store.events(Some("task-a"), 0, 100).unwrap();
    assert!(e.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
    assert_eq!(e.last().unwrap().at_ms, T0 + LEASE + 5);
}

fn a_successful_mutation_moves_the_high_water_mark(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.clock.set(T0 + 500);
    fx.submit("task-a", 1);
    fx.clock.set(T0);
    assert_eq!(fx.store.now_ms().unwrap(), T0 + 500);
    let g = fx.claim();
    assert_eq!(g.lease_expires_at_ms, T0 + 500 + LEASE);
    // Reads do not move it.
    fx.clock.set(T0 + 10_000);
    fx.store.get("task-a").unwrap();
    fx.clock.set(T0);
    assert_eq!(fx.store.now_ms().unwrap(), T0 + 500);
}

/// Issue 24: the wall clock stepped by hours between events. A rewind
/// neither extends a lease nor stalls store time (it goes on at the
/// monotonic clock's rate from this store's last write); a forward step is
/// taken as it is, so a lease ends early by at most the step — the bound
/// wall-clock timestamps in a shared database allow (docs/privsep/messages.md).
fn wall_clock_steps_of_hours_between_events_leave_lease_expiry_bounded(backend: Backend) {
    const HOURS_3: i64 = 3 * 3_600_000;
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 5);

    // Back 3 h while a lease runs: it still ends after LEASE of real time.
    let g = fx.claim();
    assert_eq!(g.lease_expires_at_ms, T0 + LEASE);
    fx.clock.elapse(1_000);
    fx.clock.advance(-HOURS_3);
    assert_eq!(fx.store.now_ms().unwrap(), T0 + 1_000, "store time goes on");
    // a renewal under the rewound clock extends from store time
    let exp = fx
        .store
        .renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker())
        .unwrap();
    assert_eq!(exp, T0 + 1_000 + LEASE);
    fx.clock.elapse(LEASE / 2);
    fx.clock.advance(HOURS_3); // forward again, to where the wall was
    fx.clock.advance(-HOURS_3); // and back
    fx.clock.elapse(LEASE / 2 - 1);
    assert!(fx.store.sweep_expired().unwrap().is_empty(), "ended early");
    fx.clock.elapse(1);
    assert_eq!(
        fx.store.sweep_expired().unwrap(),
        vec![("task-a".to_owned(), TaskState::Queued)],
        "a rewind extended the lease"
    );
    let resumed = T0 + 1_000 + LEASE;
    assert_eq!(fx.store.now_ms().unwrap(), resumed);

    // Forward 3 h past store time: the lease ends at once, early by LEASE,
    // which is less than the step.
    let g = fx.claim();
    assert_eq!(g.lease_expires_at_ms, resumed + LEASE);
    fx.clock.set(resumed + HOURS_3);
    assert_eq!(fx.store.now_ms().unwrap(), resumed + HOURS_3);
    assert_eq!(
        fx.store.sweep_expired().unwrap(),
        vec![("task-a".to_owned(), TaskState::Queued)]
    );

    // Back 3 h (the step corrected): store time does not go back, and the
    // next lease lasts LEASE of real time, no longer.
    fx.clock.advance(-HOURS_3);
    let later = resumed + HOURS_3;
    assert_eq!(fx.store.now_ms().unwrap(), later);
    let g = fx.claim();
    assert_eq!(g.lease_expires_at_ms, later + LEASE);
    fx.clock.elapse(LEASE - 1);
    assert!(fx.store.sweep_expired().unwrap().is_empty(), "ended early");
    fx.clock.elapse(1);
    assert_eq!(
        fx.store.sweep_expired().unwrap(),
        vec![("task-a".to_owned(), TaskState::Queued)],
        "a rewind extended the lease"
    );
    let e = fx.store.events(Some("task-a"), 0, 100).unwrap();
    assert!(e.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
}

fn fence(step: FenceStep, hold_ms: u64) -> FenceRequest {
    FenceRequest {
        step,
        commit_oid: (step != FenceStep::Release).then(|| "c".repeat(40)),
        hold_ms,
    }
}

fn a_fence_holds_off_the_cancel_and_the_expiry_until_it_ends(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let g = fx.claim();
    let hold = 3 * LEASE;
    let grant = fx
        .store
        .fence(
            "task-a",
            g.lease_epoch,
            &g.lease_token,
            &fence(FenceStep::Ref, hold as u64),
            &worker(),
        )
        .unwrap();
    assert_eq!(grant.fenced_until_ms, Some(T0 + hold));
    assert_eq!(
        grant.lease_expires_at_ms,
        T0 + hold,
        "the lease lasts the fence"
    );
    let e = fx.store.events(Some("task-a"), 0, 10).unwrap();
    let last = e.last().unwrap();
    assert_eq!(
        (last.action.as_str(), last.outcome),
        (action::TASK_FENCED, EventOutcome::Allowed)
    );
    assert_eq!(last.payload["step"], json!("ref"));

    // A cancel while it stands is refused and changes nothing.
    fx.refused(
        "task-a",
        Code::TASK_COMMITTING,
        action::TASK_CANCELLED,
        Some("task-a"),
        |s| s.cancel("task-a", "stop", &admin()).map(|_| ()),
    );
    // A renewal keeps the lease at least until the fence ends.
    let renewed = fx
        .store
        .renew("task-a", g.lease_epoch, &g.lease_token, LEASE, &worker())
        .unwrap();
    assert_eq!(renewed, T0 + hold);
    // Past the lease the fence alone keeps the task its holder's.
    fx.clock.advance(2 * LEASE);
    assert!(fx.store.sweep_expired().unwrap().is_empty());
    assert_eq!(fx.store.get("task-a").unwrap().state, TaskState::Running);

    // Released, the task may be cancelled at once; the holder is fenced off.
    let released = fx
        .store
        .fence(
            "task-a",
            g.lease_epoch,
            &g.lease_token,
            &fence(FenceStep::Release, 0),
            &worker(),
        )
        .unwrap();
    assert_eq!(released.fenced_until_ms, None);
    let v = fx.store.cancel("task-a", "stop", &admin()).unwrap();
    assert_eq!(v.state, TaskState::Cancelled);
    fx.refused(
        "task-a",
        Code::TASK_STATE_INVALID,
        action::TASK_FENCED,
        Some("task-a"),
        |s| {
            s.fence(
                "task-a",
                g.lease_epoch,
                &g.lease_token,
                &fence(FenceStep::Ref, 1000),
                &worker(),
            )
        },
    );
}

fn a_fence_that_ends_by_itself_lets_the_lease_expire(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let g = fx.claim();
    fx.store
        .fence(
            "task-a",
            g.lease_epoch,
            &g.lease_token,
            &fence(FenceStep::Push, 2 * LEASE as u64),
            &worker(),
        )
        .unwrap();
    fx.clock.advance(LEASE);
    assert!(fx.store.sweep_expired().unwrap().is_empty());
    fx.clock.advance(LEASE);
    let swept = fx.store.sweep_expired().unwrap();
    assert_eq!(swept, vec![("task-a".to_owned(), TaskState::Queued)]);
    // Requeued, the task holds no fence: a cancel goes through.
    let v = fx.store.cancel("task-a", "stop", &admin()).unwrap();
    assert_eq!(v.state, TaskState::Cancelled);
}

fn fence_refusals(backend: Backend) {
    let mut fx = Fixture::new(backend);
    fx.submit("task-a", 2);
    let g = fx.claim();
    let cases: [(FenceRequest, u64, &str, Code); 5] = [
        (
            fence(FenceStep::Ref, 0),
            g.lease_epoch,
            &g.lease_token,
            Code::FIELD_BOUNDS_EXCEEDED,
        ),
        (
            fence(FenceStep::Push, MAX_FENCE_MS + 1),
            g.lease_epoch,
            &g.lease_token,
            Code::FIELD_BOUNDS_EXCEEDED,
        ),
        (
            FenceRequest {
                commit_oid: Some("not-an-oid".into()),
                ..fence(FenceStep::Ref, 1000)
            },
            g.lease_epoch,
            &g.lease_token,
            Code::MESSAGE_INVALID,
        ),
        (
            fence(FenceStep::Ref, 1000),
            g.lease_epoch,
            &"0".repeat(64),
            Code::LEASE_INVALID,
        ),
        (
            fence(FenceStep::Ref, 1000),
            g.lease_epoch + 1,
            &g.lease_token,
            Code::LEASE_INVALID,
        ),
    ];
    for (req, epoch, token, code) in cases {
        fx.refused("task-a", code, action::TASK_FENCED, Some("task-a"), |s| {
            s.fence("task-a", epoch, token, &req, &worker())
        });
    }
    // A lease that has expired is never revived by a fence.
    fx.clock.advance(LEASE);
    fx.refused(
        "task-a",
        Code::LEASE_EXPIRED,
        action::TASK_FENCED,
        Some("task-a"),
        |s| {
            s.fence(
                "task-a",
                g.lease_epoch,
                &g.lease_token,
                &fence(FenceStep::Ref, 1000),
                &worker(),
            )
        },
    );
}

both_backends!(
    a_claim_starts_an_attempt_under_a_fresh_lease,
    tokens_differ_between_claims,
    claims_take_the_oldest_queued_task_with_attempts_left,
    claim_refuses_unbounded_leases,
    renew_extends_from_now,
    renew_refusals,
    sweeping_requeues_with_attempts_left_and_fails_without,
    rewinding_the_wall_clock_never_extends_a_lease,
    a_successful_mutation_moves_the_high_water_mark,
    wall_clock_steps_of_hours_between_events_leave_lease_expiry_bounded,
    a_fence_holds_off_the_cancel_and_the_expiry_until_it_ends,
    a_fence_that_ends_by_itself_lets_the_lease_expire,
    fence_refusals,
);
