//! Upstream URLs: which a repository's `upstream.url` may be, and what
//! each reaches. Shared by the configuration (which refuses the others at
//! load) and the worker's transfers.

use crate::{Code, Error};

/// How the upstream is reached, from its URL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `ssh://[user@]host[:port]/path`.
    Ssh,
    /// `https://host[:port]/path`.
    Https,
    /// An absolute path on this host (or `file:///path`).
    Local,
}

impl Scheme {
    /// Classifies `url`; anything else (scp-like `host:path`, `git://`,
    /// `http://`, `ext::`, a relative path, an option) is
    /// UPSTREAM_URL_INVALID, and so is a URL carrying a password (ssh
    /// authenticates with the worker's deploy key, https with its token:
    /// a password in the URL would be stored and shown) and a local path
    /// that is not in normal form (`..`, `.`, an empty component, `/`
    /// itself). The refusal shows the URL without its password.
    pub fn of(url: &str) -> Result<Scheme, Error> {
        let bad = |why: &str| {
            Error::with(
                Code::UPSTREAM_URL_INVALID,
                format!("{:?}: {why}", shown(url)),
            )
        };
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("contains whitespace or a control character"));
        }
        if let Some(rest) = url.strip_prefix("ssh://") {
            host_part(rest).ok_or_else(|| bad("no host"))?;
            if password(url).is_some() {
                return Err(bad(
                    "a password in the URL: the worker authenticates with its deploy key (--credential)",
                ));
            }
            Ok(Scheme::Ssh)
        } else if let Some(rest) = url.strip_prefix("https://") {
            host_part(rest).ok_or_else(|| bad("no host"))?;
            if rest.split('/').next().is_some_and(|h| h.contains('@')) {
                return Err(bad(
                    "credentials in the URL: give the token with --credential instead",
                ));
            }
            Ok(Scheme::Https)
        } else if url.starts_with("file:///") || url.starts_with('/') {
            let path = local_path(url).unwrap_or(url);
            let components: Vec<&str> = path.split('/').skip(1).collect();
            if components.iter().any(|c| matches!(*c, "" | "." | "..")) {
                return Err(bad(
                    "a local path must be absolute and in normal form (no `..`, `.`, `//`, trailing `/`, nor `/` itself)",
                ));
            }
            Ok(Scheme::Local)
        } else {
            Err(bad(
                "not ssh://, https:// or an absolute path (scp-like host:path is not accepted: write ssh://host/path)",
            ))
        }
    }

    /// git's name of the protocol (`protocol.<name>.allow`).
    pub fn protocol(self) -> &'static str {
        match self {
            Scheme::Ssh => "ssh",
            Scheme::Https => "https",
            Scheme::Local => "file",
        }
    }

    /// The TCP port a URL of this scheme connects to (none for a local
    /// path): the one it names, or the scheme's default.
    pub fn port(self, url: &str) -> Option<u16> {
        let rest = url.split_once("://").map(|(_, r)| r)?;
        let default = match self {
            Scheme::Ssh => 22,
            Scheme::Https => 443,
            Scheme::Local => return None,
        };
        let host = host_part(rest)?;
        let host = host.rsplit('@').next().unwrap_or(host);
        let port = match host.strip_prefix('[') {
            Some(v6) => v6.split_once("]:").map(|(_, p)| p),
            None => host.rsplit_once(':').map(|(_, p)| p),
        };
        Some(port.and_then(|p| p.parse().ok()).unwrap_or(default))
    }
}

/// What a refusal may show of `url`: without its password, and an
/// https URL without any userinfo (a token often rides as the user name).
fn shown(url: &str) -> String {
    match url.strip_prefix("https://") {
        Some(rest) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
            format!("https://{host}{path}")
        }
        None => without_password(url),
    }
}

/// The path of a local upstream (`/srv/x.git`, or `file:///srv/x.git`'s
/// `/srv/x.git`); `None` for any other URL.
pub fn local_path(url: &str) -> Option<&str> {
    match url.strip_prefix("file://") {
        Some(path) => path.starts_with('/').then_some(path),
        None => url.starts_with('/').then_some(url),
    }
}

/// The password in `url`'s userinfo (`ssh://user:PASSWORD@host/…`), if
/// it has one: a credential, never shown.
pub fn password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    userinfo.split_once(':').map(|(_, p)| p)
}

/// `url` without the password of its userinfo
/// (`https://user:secret@host/x` is `https://user@host/x`; without a user
/// name, the userinfo goes entirely): what may be shown of it. Every other
/// URL is returned as it is.
pub fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let Some((userinfo, host)) = authority.rsplit_once('@') else {
        return url.to_owned();
    };
    match userinfo.split_once(':') {
        None => url.to_owned(),
        Some(("", _)) => format!("{scheme}://{host}{path}"),
        Some((user, _)) => format!("{scheme}://{user}@{host}{path}"),
    }
}

fn host_part(rest: &str) -> Option<&str> {
    let host = rest.split('/').next()?;
    let bare = host.rsplit('@').next().unwrap_or(host);
    (!bare.is_empty() && !bare.starts_with('-')).then_some(host)
}

/// What the worker tells the supervisor about an upstream, for the event
/// log (`Worker1.ReportUpstream`): a sync that changed refs or failed, a
/// ref the upstream rewrote, a publication waiting for an unreachable
/// upstream, a publication done.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamReport {
    /// The repository.
    pub repository: String,
    /// What happened.
    pub event: UpstreamEvent,
    /// The task, for a publication.
    pub task_id: Option<String>,
    /// The facts (refs and their values, the code and detail of a
    /// failure, the upstream's answer), as a JSON object.
    pub detail: serde_json::Value,
}

/// The kinds of [`UpstreamReport`], each recorded as its own event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UpstreamEvent {
    /// A sync changed refs (`UPSTREAM_SYNCED`).
    Synced,
    /// A sync failed, where the previous one had not (`UPSTREAM_SYNC_FAILED`).
    SyncFailed,
    /// The upstream force-pushed or deleted a branch, and the authority
    /// repository followed it (`UPSTREAM_REF_REWRITTEN`).
    RefRewritten,
    /// A publication is waiting for an unreachable upstream
    /// (`TASK_PUBLICATION_PENDING`).
    PublicationPending,
    /// A task's agent branch is on the upstream (`TASK_PUBLISHED`).
    Published,
}

impl UpstreamEvent {
    /// The kinds a sync reports, about no task (the others are a
    /// publication's, under its task).
    pub const SYNC: [UpstreamEvent; 3] = [
        UpstreamEvent::Synced,
        UpstreamEvent::SyncFailed,
        UpstreamEvent::RefRewritten,
    ];

    /// The event log's action name.
    pub fn action(self) -> &'static str {
        match self {
            UpstreamEvent::Synced => "UPSTREAM_SYNCED",
            UpstreamEvent::SyncFailed => "UPSTREAM_SYNC_FAILED",
            UpstreamEvent::RefRewritten => "UPSTREAM_REF_REWRITTEN",
            UpstreamEvent::PublicationPending => "TASK_PUBLICATION_PENDING",
            UpstreamEvent::Published => "TASK_PUBLISHED",
        }
    }
}

impl UpstreamReport {
    /// Checks the forms serde cannot: a registered-looking repository
    /// name, a task id exactly for a publication, a bounded object.
    pub fn validate(&self) -> Result<(), Error> {
        let bad =
            |why: &str| Error::with(Code::MESSAGE_INVALID, format!("the upstream report: {why}"));
        if !crate::binding::is_repository_name(&self.repository) {
            return Err(bad("repository is not a repository name"));
        }
        let publication = matches!(
            self.event,
            UpstreamEvent::PublicationPending | UpstreamEvent::Published
        );
        match &self.task_id {
            Some(t) if !publication || !crate::binding::is_task_id(t) => {
                return Err(bad("task_id is not a task id, or names a task for a sync"));
            }
            None if publication => return Err(bad("a publication names its task")),
            _ => {}
        }
        if !self.detail.is_object() || self.detail.to_string().len() > 16 * 1024 {
            return Err(bad("detail is not a JSON object of at most 16 KiB"));
        }
        Ok(())
    }
}

/// The schema of [`SyncState`].
pub const SYNC_STATE_SCHEMA: &str = "airlock.upstream-sync.v1";

/// One ref a sync changed.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefChange {
    /// The full ref name.
    pub name: String,
    /// Its value before (`None`: new).
    pub old: Option<String>,
    /// Its value after (`None`: deleted upstream, pruned here).
    pub new: Option<String>,
    /// The new value does not descend from the old one: the upstream was
    /// force-pushed and the ref follows it.
    pub forced: bool,
}

/// What a sync did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncReport {
    /// Every ref that changed, in name order.
    pub changes: Vec<RefChange>,
}

impl SyncReport {
    /// Whether any ref followed a force-push or was pruned.
    pub fn forced(&self) -> impl Iterator<Item = &RefChange> {
        self.changes.iter().filter(|c| c.forced || c.new.is_none())
    }
}

/// What the last sync of a repository did: the worker writes it to
/// `<worker state>/upstream/NAME.json` after each sync, and root's
/// `airlockctl repo show` and `repo sync` read it. The URL is the
/// configured one, which holds no password ([`Scheme::of`] refuses one).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncState {
    /// Always [`SYNC_STATE_SCHEMA`]. A record written before the tag (by a
    /// release of protocol 11.0 or older, whose worker declared the record
    /// itself) has none, and is read as this schema: its fields are these.
    #[serde(default = "sync_state_schema")]
    pub schema: String,
    /// The repository.
    pub repository: String,
    /// The upstream's URL.
    pub url: String,
    /// When the sync finished (unix ms).
    pub finished_at_ms: u64,
    /// The request it answered (`repo sync`'s [`SyncRequest::id`]), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// Its refusal code, when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// What failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// What changed (empty on failure).
    pub report: SyncReport,
    /// The last sync that succeeded (unix ms), this one or earlier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success_ms: Option<u64>,
}

fn sync_state_schema() -> String {
    SYNC_STATE_SCHEMA.to_owned()
}

impl SyncState {
    /// Reads a sync record: a field missing or unknown, or JSON that does
    /// not parse, is `MESSAGE_INVALID`; another schema is `SCHEMA_INVALID`.
    pub fn from_json(bytes: &[u8]) -> Result<SyncState, Error> {
        let state: SyncState = serde_json::from_slice(bytes).map_err(|e| {
            Error::with(
                Code::MESSAGE_INVALID,
                format!("the upstream sync record: {e}"),
            )
        })?;
        if state.schema != SYNC_STATE_SCHEMA {
            return Err(Error::with(
                Code::SCHEMA_INVALID,
                format!(
                    "the upstream sync record has schema {}, not {SYNC_STATE_SCHEMA}",
                    crate::shown::shown(&state.schema)
                ),
            ));
        }
        Ok(state)
    }

    /// The record as the worker writes it (pretty JSON).
    pub fn to_json(&self) -> Result<Vec<u8>, Error> {
        serde_json::to_vec_pretty(self).map_err(|e| Error::with(Code::INTERNAL, e.to_string()))
    }
}

/// `airlockctl repo sync NAME`'s request, `<worker state>/upstream/NAME.request`:
/// only an id, which the worker's [`SyncState::request`] echoes.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncRequest {
    /// Chosen by the requester.
    pub id: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_is_shown_without_its_password() {
        for (url, shown, secret) in [
            (
                "https://user:secret@git.example.org/team/x.git",
                "https://user@git.example.org/team/x.git",
                Some("secret"),
            ),
            (
                "ssh://git:s3cr:et@git.example.org:2222/x.git",
                "ssh://git@git.example.org:2222/x.git",
                Some("s3cr:et"),
            ),
            (
                "https://:token@git.example.org/x",
                "https://git.example.org/x",
                Some("token"),
            ),
            ("https://user:pw@host", "https://user@host", Some("pw")),
            (
                "ssh://git@git.example.org/x.git",
                "ssh://git@git.example.org/x.git",
                None,
            ),
            (
                "https://git.example.org/a@b/x",
                "https://git.example.org/a@b/x",
                None,
            ),
            ("/srv/upstream/x.git", "/srv/upstream/x.git", None),
            (
                "file:///srv/upstream/x.git",
                "file:///srv/upstream/x.git",
                None,
            ),
        ] {
            assert_eq!(without_password(url), shown, "{url}");
            assert_eq!(password(url), secret, "{url}");
            if let Some(secret) = secret {
                assert!(!without_password(url).contains(secret), "{url}");
            }
        }
    }

    #[test]
    fn urls_that_would_store_a_password_or_name_an_odd_path_are_refused_without_echoing_it() {
        for url in [
            "ssh://git:hunter2@git.example.org/team/x.git",
            "ssh://:hunter2@git.example.org/x.git",
            "https://user:hunter2@git.example.org/x.git",
            "https://hunter2@git.example.org/x.git",
            "/",
            "file:///",
            "/srv/up/../etc",
            "/srv/./x.git",
            "/srv//x.git",
            "/srv/x.git/",
            "file://srv/x.git",
            "relative/x.git",
        ] {
            let e = Scheme::of(url).unwrap_err();
            assert_eq!(e.code, Code::UPSTREAM_URL_INVALID, "{url}");
            assert!(!e.to_string().contains("hunter2"), "{url}: {e}");
        }
        assert_eq!(Scheme::of("file:///srv/up/x.git").unwrap(), Scheme::Local);
        assert_eq!(local_path("file:///srv/up/x.git"), Some("/srv/up/x.git"));
        assert_eq!(local_path("/srv/up/x.git"), Some("/srv/up/x.git"));
        assert_eq!(local_path("ssh://h/x"), None);
        assert_eq!(
            Scheme::of("ssh://git@h.example/x.git").unwrap(),
            Scheme::Ssh
        );
    }

    /// A record as the worker of protocol 11.0 wrote it
    /// (`serde_json::to_vec_pretty` of its own struct, no schema).
    const PREVIOUS_RELEASE_OK: &str = r#"{
  "repository": "demo",
  "url": "/srv/upstream/demo.git",
  "finished_at_ms": 1764979200000,
  "request": "00112233aabbccdd",
  "report": {
    "changes": [
      {
        "name": "refs/heads/main",
        "old": "1111111111111111111111111111111111111111",
        "new": "2222222222222222222222222222222222222222",
        "forced": true
      },
      {
        "name": "refs/tags/v1",
        "old": null,
        "new": "3333333333333333333333333333333333333333",
        "forced": false
      }
    ]
  },
  "last_success_ms": 1764979200000
}"#;

    /// A failed sync, as the same release wrote it.
    const PREVIOUS_RELEASE_FAILED: &str = r#"{
  "repository": "demo",
  "url": "ssh://git@git.example.org/team/demo.git",
  "finished_at_ms": 1764979260000,
  "code": "UPSTREAM_UNREACHABLE",
  "detail": "UPSTREAM_UNREACHABLE: connection refused",
  "report": {
    "changes": []
  }
}"#;

    #[test]
    fn a_sync_record_of_the_previous_release_reads_as_this_schema() {
        let ok = SyncState::from_json(PREVIOUS_RELEASE_OK.as_bytes()).unwrap();
        assert_eq!(ok.schema, SYNC_STATE_SCHEMA);
        assert_eq!(ok.request.as_deref(), Some("00112233aabbccdd"));
        assert_eq!(ok.code, None);
        assert_eq!(ok.report.changes.len(), 2);
        assert_eq!(ok.report.forced().count(), 1);
        assert_eq!(ok.report.changes[1].old, None);
        assert_eq!(ok.last_success_ms, Some(1764979200000));
        let failed = SyncState::from_json(PREVIOUS_RELEASE_FAILED.as_bytes()).unwrap();
        assert_eq!(failed.code.as_deref(), Some("UPSTREAM_UNREACHABLE"));
        assert_eq!(failed.request, None);
        assert_eq!(failed.last_success_ms, None);
        assert!(failed.report.changes.is_empty());
        // Written again: the same fields, and the schema.
        let again: serde_json::Value = serde_json::from_slice(&ok.to_json().unwrap()).unwrap();
        let mut before: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE_OK).unwrap();
        before["schema"] = SYNC_STATE_SCHEMA.into();
        assert_eq!(again, before);
        assert_eq!(SyncState::from_json(&ok.to_json().unwrap()).unwrap(), ok);
    }

    #[test]
    fn a_sync_record_is_read_strictly() {
        let mut v: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE_OK).unwrap();
        v["extra"] = 1.into();
        let e = SyncState::from_json(v.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let mut v: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE_OK).unwrap();
        v["report"]["changes"][0]["extra"] = 1.into();
        let e = SyncState::from_json(v.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let mut v: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE_OK).unwrap();
        v.as_object_mut().unwrap().remove("report");
        let e = SyncState::from_json(v.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let mut v: serde_json::Value = serde_json::from_str(PREVIOUS_RELEASE_OK).unwrap();
        v["schema"] = "airlock.upstream-sync.v2".into();
        let e = SyncState::from_json(v.to_string().as_bytes()).unwrap_err();
        assert_eq!(e.code, Code::SCHEMA_INVALID);
        assert!(e.to_string().contains("airlock.upstream-sync.v2"), "{e}");
        let e = SyncState::from_json(b"not json").unwrap_err();
        assert_eq!(e.code, Code::MESSAGE_INVALID);
        let r: SyncRequest = serde_json::from_str(r#"{"id": "00112233aabbccdd"}"#).unwrap();
        assert_eq!(r.id, "00112233aabbccdd");
        assert!(serde_json::from_str::<SyncRequest>(r#"{"id": "x", "y": 1}"#).is_err());
    }

    #[test]
    fn the_sync_kinds_are_the_ones_about_no_task() {
        for kind in UpstreamEvent::SYNC {
            assert!(kind.action().starts_with("UPSTREAM_"), "{kind:?}");
        }
        assert!(!UpstreamEvent::SYNC.contains(&UpstreamEvent::Published));
        assert!(!UpstreamEvent::SYNC.contains(&UpstreamEvent::PublicationPending));
    }
}
