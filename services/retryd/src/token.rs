//! The bearer control token: loaded once from a file, compared in constant time.

use airlock_proto::{Code, Error};
use std::io::Read;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use subtle::ConstantTimeEq;

/// Shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 32;
/// Largest token file read.
const MAX_TOKEN_FILE: u64 = 4096;

/// The owner's control token. Its `Debug` never shows the secret.
pub struct ControlToken(Vec<u8>);

impl std::fmt::Debug for ControlToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ControlToken(<redacted>)")
    }
}

impl ControlToken {
    /// Reads the token from `path`: a regular file (never a symlink, opened
    /// with O_NOFOLLOW), at most 4 KiB, whose trimmed content has at least
    /// 32 characters.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let unavailable = |why: String| {
            Error::with(
                Code::TASK_RETRY_CONTROL_CREDENTIAL_UNAVAILABLE,
                format!("{}: {why}", path.display()),
            )
        };
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| unavailable(e.to_string()))?;
        let meta = file.metadata().map_err(|e| unavailable(e.to_string()))?;
        if !meta.file_type().is_file() {
            return Err(unavailable("not a regular file".into()));
        }
        if meta.len() > MAX_TOKEN_FILE {
            return Err(Error::with(
                Code::TASK_RETRY_CONTROL_CREDENTIAL_INVALID,
                "token file too large",
            ));
        }
        let mut text = String::new();
        file.take(MAX_TOKEN_FILE)
            .read_to_string(&mut text)
            .map_err(|e| unavailable(e.to_string()))?;
        let token = text.trim();
        if token.chars().count() < MIN_TOKEN_LEN {
            return Err(Error::with(
                Code::TASK_RETRY_CONTROL_CREDENTIAL_INVALID,
                format!("the token must have at least {MIN_TOKEN_LEN} characters"),
            ));
        }
        Ok(ControlToken(token.as_bytes().to_vec()))
    }

    /// A redactor that also replaces this token wherever it appears (in a
    /// request path a client sent, for the access log).
    pub fn redactor(&self) -> airlock_proto::redact::Redactor {
        airlock_proto::redact::Redactor::new().with_literal(&String::from_utf8_lossy(&self.0))
    }

    /// True when `header` is exactly `Bearer <token>`. The comparison of the
    /// secret takes the same time wherever the first difference is.
    pub fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(presented) = header.and_then(|h| h.strip_prefix(b"Bearer ")) else {
            return false;
        };
        presented.ct_eq(&self.0).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_only_regular_long_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("t");
        std::fs::write(&good, format!("{}\n", "k".repeat(40))).unwrap();
        let t = ControlToken::load(&good).unwrap();
        assert!(t.accepts(Some(format!("Bearer {}", "k".repeat(40)).as_bytes())));
        assert!(!t.accepts(Some(format!("bearer {}", "k".repeat(40)).as_bytes())));
        assert!(!t.accepts(Some(format!("Bearer {}", "k".repeat(39)).as_bytes())));
        assert!(!t.accepts(Some(format!("Basic {}", "k".repeat(40)).as_bytes())));
        assert!(!t.accepts(None));
        assert!(!format!("{t:?}").contains("kkkk"));

        let short = dir.path().join("s");
        std::fs::write(&short, "short").unwrap();
        assert_eq!(
            ControlToken::load(&short).unwrap_err().code,
            Code::TASK_RETRY_CONTROL_CREDENTIAL_INVALID
        );

        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&good, &link).unwrap();
        assert_eq!(
            ControlToken::load(&link).unwrap_err().code,
            Code::TASK_RETRY_CONTROL_CREDENTIAL_UNAVAILABLE
        );
        assert_eq!(
            ControlToken::load(dir.path()).unwrap_err().code,
            Code::TASK_RETRY_CONTROL_CREDENTIAL_UNAVAILABLE
        );
        assert_eq!(
            ControlToken::load(&dir.path().join("missing"))
                .unwrap_err()
                .code,
            Code::TASK_RETRY_CONTROL_CREDENTIAL_UNAVAILABLE
        );
    }
}
