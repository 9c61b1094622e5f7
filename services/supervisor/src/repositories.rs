//! The registered repositories as `Tasks2.ListRepositories` shows them.
//!
//! A [`Listing`] is made from the configuration's `[[repository]]` table
//! when the supervisor reads it (at start, and on each reload): its
//! environment resolved then, as the supervisor checks submissions
//! against it. What it keeps to show is what `airlockctl repo show --json`
//! says of the repository that is no credential: never a credential file
//! (they are the worker's), never the upstream's user, push options or
//! host keys, and its URL without a password. The one secret a
//! configuration can hold here, a password in the URL's userinfo, is kept
//! only to redact it from the event details shown beside it.

use airlock_config::Repository;
use airlock_proto::bus::{
    EnvironmentProblem, RepositoryEnvironment, RepositorySigning, RepositoryUpstream,
    RepositoryView, UpstreamEventView,
};
use airlock_proto::redact::Redactor;
use airlock_proto::upstream::{UpstreamEvent, password, without_password};
use airlock_taskdb::tasks::Event;
use serde_json::Value;

/// The event log's actions whose newest per repository is shown: what a
/// sync reports, about no task.
pub fn sync_actions() -> Vec<&'static str> {
    UpstreamEvent::SYNC.iter().map(|k| k.action()).collect()
}

/// One registered repository, ready to be listed.
#[derive(Clone, PartialEq, Eq)]
pub struct Listing {
    view: RepositoryView,
    /// The password in the upstream's URL, never shown.
    secret: Option<String>,
}

impl std::fmt::Debug for Listing {
    /// Never shows the secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listing")
            .field("view", &self.view)
            .finish_non_exhaustive()
    }
}

impl Listing {
    /// `r` as it is listed, its environment resolved on this host now.
    pub fn of(r: &Repository) -> Listing {
        let environment = r.environment.as_ref().map(|env| {
            let configured = serde_json::to_value(env).unwrap_or(Value::Null);
            match env.resolve() {
                Ok(res) => RepositoryEnvironment {
                    configured,
                    resolved: Some(serde_json::to_value(res).unwrap_or(Value::Null)),
                    problem: None,
                },
                Err(e) => RepositoryEnvironment {
                    configured,
                    resolved: None,
                    problem: Some(EnvironmentProblem {
                        code: e.code.as_str().to_owned(),
                        key: e.key,
                        message: e.problem,
                    }),
                },
            }
        });
        let upstream = r.upstream.as_ref().map(|up| RepositoryUpstream {
            url: without_password(&up.url),
            publish: up.publish,
            sync_interval_seconds: up.sync_interval_seconds,
        });
        Listing {
            view: RepositoryView {
                name: r.name.clone(),
                description: r.description.clone(),
                environment,
                upstream,
                signing: r.signing.as_ref().map(|s| RepositorySigning {
                    principal: s.principal.clone(),
                }),
                last_upstream_event: None,
            },
            secret: r
                .upstream
                .as_ref()
                .and_then(|up| password(&up.url))
                .filter(|p| !p.is_empty())
                .map(str::to_owned),
        }
    }

    /// The name tasks use.
    pub fn name(&self) -> &str {
        &self.view.name
    }

    /// What ListRepositories shows, with `last` as its newest sync event
    /// (the URL's password, if any, scrubbed from its detail).
    pub fn shown(&self, last: Option<&Event>) -> RepositoryView {
        let mut view = self.view.clone();
        view.last_upstream_event = last.map(|e| {
            // Redacted when it was recorded; again here, with the one
            // literal secret the store never knew.
            let redactor = self
                .secret
                .as_deref()
                .map_or_else(Redactor::new, |s| Redactor::new().with_literal(s));
            UpstreamEventView {
                id: e.id,
                action: e.action.clone(),
                outcome: e.outcome.as_str().to_owned(),
                at_ms: e.at_ms,
                detail: redactor.value(e.payload.get("detail").unwrap_or(&Value::Null)),
            }
        });
        view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_taskdb::tasks::{Actor, EventOutcome};
    use serde_json::json;

    fn repository(url: &str) -> Repository {
        let text = format!(
            "[[repository]]\nname = \"demo\"\npath = \"/srv/git/demo.git\"\n\
             description = \"the demo\"\n\
             [repository.upstream]\nurl = \"{url}\"\npublish = false\n\
             host_keys = [\"git.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKey\"]\n\
             push_options = [\"ci.skip\"]\n\
             [repository.signing]\nprincipal = \"agent@example.org\"\n"
        );
        airlock_config::Config::parse(&text, std::path::Path::new("t.toml"))
            .unwrap()
            .repositories
            .remove(0)
    }

    #[test]
    fn a_listing_shows_no_credential() {
        // The configuration refuses a password in the URL
        // (UPSTREAM_URL_INVALID); were one given all the same, the
        // listing would not show it.
        let mut r = repository("ssh://git@git.example.org/x.git");
        r.upstream.as_mut().unwrap().url = "ssh://git:hunter2hunter2@git.example.org/x.git".into();
        let l = Listing::of(&r);
        let failed = Event {
            id: 9,
            task_id: None,
            at_ms: 1000,
            actor: Actor::worker(Some(65534), "worker"),
            action: "UPSTREAM_SYNC_FAILED".into(),
            outcome: EventOutcome::Allowed,
            code: None,
            payload: json!({"repository": "demo", "detail": {
                "code": "UPSTREAM_AUTH_FAILED",
                "detail": "git fetch: ssh://git:hunter2hunter2@git.example.org/x.git refused",
                "seen hunter2hunter2": ["hunter2hunter2 again"],
            }}),
        };
        let shown = l.shown(Some(&failed));
        let text = serde_json::to_string(&shown).unwrap();
        assert!(!text.contains("hunter2"), "{text}");
        assert!(!format!("{l:?}").contains("hunter2"));
        assert!(
            !text.contains("ci.skip") && !text.contains("AAAAC3"),
            "{text}"
        );
        assert!(!text.contains("upstream-demo") && !text.contains("signing-demo"));
        let upstream = shown.upstream.as_ref().unwrap();
        assert_eq!(upstream.url, "ssh://git@git.example.org/x.git");
        assert!(!upstream.publish);
        assert_eq!(upstream.sync_interval_seconds, 300);
        assert_eq!(shown.signing.unwrap().principal, "agent@example.org");
        let event = shown.last_upstream_event.unwrap();
        assert_eq!(
            (event.id, event.action.as_str(), event.outcome.as_str()),
            (9, "UPSTREAM_SYNC_FAILED", "allowed")
        );
        assert_eq!(event.detail["code"], "UPSTREAM_AUTH_FAILED");
        assert_eq!(
            event.detail["detail"],
            "git fetch: ssh://git:[REDACTED:url-password]@git.example.org/x.git refused"
        );
        assert_eq!(
            event.detail["seen [REDACTED:literal]"],
            json!(["[REDACTED:literal] again"])
        );
        assert_eq!(l.shown(None).last_upstream_event, None);
    }

    #[test]
    fn an_https_url_with_a_password_is_refused_before_it_could_be_listed() {
        let text = "[[repository]]\nname = \"demo\"\npath = \"/srv/git/demo.git\"\n\
                    [repository.upstream]\nurl = \"https://user:secret@git.example.org/x.git\"\n";
        let e = airlock_config::Config::parse(text, std::path::Path::new("t.toml")).unwrap_err();
        let e = e.to_string();
        assert!(
            e.contains("repository[0].upstream.url") && e.contains("no credentials"),
            "{e}"
        );
        // Were one given all the same, its listing would not show it.
        let mut r = repository("ssh://git@git.example.org/x.git");
        r.upstream.as_mut().unwrap().url = "https://user:secret@git.example.org/x.git".into();
        let shown = serde_json::to_string(&Listing::of(&r).shown(None)).unwrap();
        assert!(!shown.contains("secret"), "{shown}");
        assert!(
            shown.contains("\"https://user@git.example.org/x.git\""),
            "{shown}"
        );
    }
}
