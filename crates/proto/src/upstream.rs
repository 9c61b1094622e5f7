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
    /// UPSTREAM_URL_INVALID.
    pub fn of(url: &str) -> Result<Scheme, Error> {
        let bad = |why: &str| Error::with(Code::UPSTREAM_URL_INVALID, format!("{url:?}: {why}"));
        if url.chars().any(|c| c.is_control() || c.is_whitespace()) {
            return Err(bad("contains whitespace or a control character"));
        }
        if let Some(rest) = url.strip_prefix("ssh://") {
            host_part(rest).ok_or_else(|| bad("no host"))?;
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
            if url.split('/').any(|c| c == "..") {
                return Err(bad("a local path with `..`"));
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
    fn the_sync_kinds_are_the_ones_about_no_task() {
        for kind in UpstreamEvent::SYNC {
            assert!(kind.action().starts_with("UPSTREAM_"), "{kind:?}");
        }
        assert!(!UpstreamEvent::SYNC.contains(&UpstreamEvent::Published));
        assert!(!UpstreamEvent::SYNC.contains(&UpstreamEvent::PublicationPending));
    }
}
