//! A source capture: the bounds and consistency of what it returned.

use super::Capture;
use crate::error::{Code, Error, Result};

impl Capture {
    /// Bounds and consistency: a tree id, at most
    /// [`MAX_CAPTURE_PATHS`](crate::limits::MAX_CAPTURE_PATHS) valid paths
    /// in strict path order, a present file's content hashing to its
    /// digest, an absent one carrying none, and at most
    /// [`MAX_CAPTURE_BYTES`](crate::limits::MAX_CAPTURE_BYTES) of content
    /// in all (`FILE_TOO_LARGE` beyond).
    pub fn validate(&self) -> Result<()> {
        use base64::Engine;
        let bad = |why: String| Err(Error::with(Code::MESSAGE_INVALID, why));
        if !crate::binding::is_oid(&self.source_tree) {
            return bad("capture source_tree".into());
        }
        if self.captured_in_attempt == 0 {
            return bad("captured_in_attempt starts at 1".into());
        }
        for w in &self.withheld {
            crate::path::check_relative_path(w)?;
        }
        if self.withheld.windows(2).any(|w| w[0] >= w[1])
            || self.files.iter().any(|f| self.withheld.contains(&f.path))
        {
            return bad("withheld paths are unordered or also captured".into());
        }
        if self.files.len() + self.withheld.len() > crate::limits::MAX_CAPTURE_PATHS
            || self.source_signals.len() > crate::limits::MAX_SOURCE_SIGNALS
        {
            return Err(Error::with(Code::FIELD_BOUNDS_EXCEEDED, "capture"));
        }
        let mut total = 0usize;
        let mut previous: Option<&str> = None;
        for f in &self.files {
            crate::path::check_relative_path(&f.path)?;
            if previous.is_some_and(|p| p >= f.path.as_str()) {
                return bad("captured files are not in strict path order".into());
            }
            previous = Some(&f.path);
            match (f.present, &f.sha256, &f.content_b64) {
                (true, Some(sha), Some(b64)) => {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(b64)
                        .map_err(|e| {
                            Error::with(Code::MESSAGE_INVALID, format!("{}: {e}", f.path))
                        })?;
                    if crate::canonical::sha256_hex(&bytes) != *sha {
                        return bad(format!("{}: content does not match its digest", f.path));
                    }
                    total += bytes.len();
                }
                (false, None, None) if !f.executable => {}
                _ => return bad(format!("{}: present, digest and content disagree", f.path)),
            }
        }
        if total > crate::limits::MAX_CAPTURE_BYTES {
            return Err(Error::with(
                Code::FILE_TOO_LARGE,
                format!(
                    "captured files hold {total} bytes, limit {}",
                    crate::limits::MAX_CAPTURE_BYTES
                ),
            ));
        }
        Ok(())
    }
}
