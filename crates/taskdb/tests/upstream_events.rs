//! The newest sync event of each repository's upstream
//! (`TaskStore::last_repository_events`, what `Tasks2.ListRepositories`
//! shows): the newest event about no task among the actions asked for,
//! per repository its payload names; an event about a task, an action not
//! asked for, or a payload naming no repository never counts. Every test
//! runs against both engines, which answer the same.

#[path = "tasks_common.rs"]
#[macro_use]
mod common;

use airlock_proto::upstream::{UpstreamEvent, UpstreamReport};
use airlock_taskdb::tasks::EventOutcome;
use common::*;
use serde_json::json;

fn report(repository: &str, event: UpstreamEvent, detail: serde_json::Value) -> UpstreamReport {
    UpstreamReport {
        repository: repository.into(),
        event,
        task_id: None,
        detail,
    }
}

fn sync_actions() -> Vec<&'static str> {
    UpstreamEvent::SYNC.iter().map(|k| k.action()).collect()
}

fn the_newest_sync_event_of_each_repository_is_found(backend: Backend) {
    let mut fx = Fixture::new(backend);
    let actions = sync_actions();
    assert!(
        fx.store
            .last_repository_events(&actions)
            .unwrap()
            .is_empty(),
        "an empty log has none"
    );
    let store = fx.store.as_mut();
    store
        .record_upstream(
            &worker(),
            &report("demo", UpstreamEvent::Synced, json!({"changes": 2})),
        )
        .unwrap();
    store
        .record_upstream(
            &worker(),
            &report(
                "other",
                UpstreamEvent::RefRewritten,
                json!({"ref": "refs/heads/main", "old": "1".repeat(40), "new": "2".repeat(40)}),
            ),
        )
        .unwrap();
    store
        .record_upstream(
            &worker(),
            &report(
                "demo",
                UpstreamEvent::SyncFailed,
                json!({"code": "UPSTREAM_UNREACHABLE", "detail": "no route"}),
            ),
        )
        .unwrap();
    // Later, what must not count: a publication about a task (asked for
    // or not), an event naming no repository, one whose repository is no
    // string, one of an action not asked for.
    store
        .submit(&submission("task-pub", 2), &planner())
        .unwrap();
    store
        .record_upstream(
            &worker(),
            &UpstreamReport {
                task_id: Some("task-pub".into()),
                ..report("demo", UpstreamEvent::Published, json!({"ref": "agent/x"}))
            },
        )
        .unwrap();
    store
        .record_allowed(&worker(), "UPSTREAM_SYNCED", &json!({"changes": 1}))
        .unwrap();
    store
        .record_allowed(&worker(), "UPSTREAM_SYNCED", &json!({"repository": 7}))
        .unwrap();
    store
        .record_allowed(
            &worker(),
            "AGENT_START_REQUESTED",
            &json!({"repository": "demo"}),
        )
        .unwrap();

    let mut with_publications = actions.clone();
    with_publications.push(UpstreamEvent::Published.action());
    for asked in [&actions, &with_publications] {
        let newest = fx.store.last_repository_events(asked).unwrap();
        assert_eq!(
            newest.keys().map(String::as_str).collect::<Vec<_>>(),
            ["demo", "other"],
            "{asked:?}"
        );
        let demo = &newest["demo"];
        assert_eq!(demo.action, "UPSTREAM_SYNC_FAILED", "{asked:?}");
        assert_eq!(demo.task_id, None);
        assert_eq!(demo.outcome, EventOutcome::Allowed);
        assert_eq!(
            demo.payload,
            json!({"repository": "demo",
                   "detail": {"code": "UPSTREAM_UNREACHABLE", "detail": "no route"}})
        );
        let other = &newest["other"];
        assert_eq!(other.action, "UPSTREAM_REF_REWRITTEN");
        assert_eq!(other.payload["detail"]["ref"], "refs/heads/main");
        assert!(other.id < demo.id && other.at_ms <= demo.at_ms);
        // The same rows ListEvents pages through.
        let all = fx.store.events(None, 0, 1000).unwrap();
        assert!(all.contains(demo) && all.contains(other));
    }
    // Only the actions asked for.
    let synced = fx
        .store
        .last_repository_events(&["UPSTREAM_SYNCED"])
        .unwrap();
    assert_eq!(synced.len(), 1);
    assert_eq!(synced["demo"].payload["detail"], json!({"changes": 2}));
    assert!(fx.store.last_repository_events(&[]).unwrap().is_empty());
}

both_backends!(the_newest_sync_event_of_each_repository_is_found);
