//! SSH signatures of governed commits, made in-process.
//!
//! git's own signing would run `ssh-keygen` (a program the hardening
//! forbids) on a key file; here the worker signs the commit's payload
//! itself with the repository's Ed25519 key, in git's SSH signature format
//! (the `SSHSIG` armour, namespace `git`, SHA-512), and writes the commit
//! object with its `gpgsig` header. Ed25519 signatures are deterministic,
//! so the same commit signed again after a crash has the same bytes and
//! the same OID: the ref's compare-and-swap stays a no-op on a replay.
//! `git verify-commit` (with `gpg.ssh.allowedSignersFile`) checks them.

use ssh_key::{Algorithm, HashAlg, LineEnding, PrivateKey};
use std::path::Path;

/// Why a signing key cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub struct SigningError {
    /// The key file.
    pub path: String,
    /// What is wrong.
    pub why: String,
}

/// A repository's signing key and the principal it signs as.
#[derive(Clone)]
pub struct Signer {
    key: PrivateKey,
    principal: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer")
            .field("principal", &self.principal)
            .field("fingerprint", &self.fingerprint())
            .finish_non_exhaustive()
    }
}

impl Signer {
    /// Reads an unencrypted Ed25519 key in OpenSSH format from `path`.
    pub fn load(path: &Path, principal: &str) -> Result<Signer, SigningError> {
        let err = |why: String| SigningError {
            path: path.display().to_string(),
            why,
        };
        let pem = std::fs::read(path).map_err(|e| err(e.to_string()))?;
        Signer::from_openssh(&pem, principal).map_err(|e| err(e.why))
    }

    /// Parses an unencrypted Ed25519 key in OpenSSH format.
    pub fn from_openssh(pem: &[u8], principal: &str) -> Result<Signer, SigningError> {
        let err = |why: &str| SigningError {
            path: "the key".into(),
            why: why.into(),
        };
        let key = PrivateKey::from_openssh(pem)
            .map_err(|_| err("not an OpenSSH private key (ssh-keygen -t ed25519 makes one)"))?;
        if key.is_encrypted() {
            return Err(err(
                "encrypted with a passphrase: the worker signs unattended",
            ));
        }
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(err(
                "not an Ed25519 key: only Ed25519 signs deterministically",
            ));
        }
        if principal.is_empty() || principal.chars().any(|c| c.is_whitespace() || c == ',') {
            return Err(err(
                "the signer's principal is empty or has spaces or commas",
            ));
        }
        Ok(Signer {
            key,
            principal: principal.to_owned(),
        })
    }

    /// The principal (an allowed-signers name, usually an e-mail address).
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// The public key's SHA-256 fingerprint in hex, `sha256:…` (the
    /// digest `ssh-keygen -l` shows in base64; hex, so that no redactor
    /// mistakes it for a secret): the SHA-256 of the key's wire form, as
    /// `awk '{print $2}' KEY.pub | base64 -d | sha256sum` prints it.
    pub fn fingerprint(&self) -> String {
        let fp = self.key.public_key().fingerprint(HashAlg::Sha256);
        let hex: String = fp.as_bytes().iter().map(|b| format!("{b:02x}")).collect();
        format!("sha256:{hex}")
    }

    /// The public key in OpenSSH form (`ssh-ed25519 AAAA…`).
    pub fn public_key(&self) -> String {
        self.key
            .public_key()
            .to_openssh()
            .unwrap_or_default()
            .split(' ')
            .take(2)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The allowed-signers line that verifies this signer's commits.
    pub fn allowed_signers_line(&self) -> String {
        format!(
            "{} namespaces=\"git\" {}",
            self.principal,
            self.public_key()
        )
    }

    /// The commit object `payload` (headers, a blank line, the message)
    /// with its `gpgsig` header, placed after the committer line.
    pub(crate) fn sign_commit(&self, payload: &str) -> Result<String, SigningError> {
        let sig = self
            .key
            .sign("git", HashAlg::Sha512, payload.as_bytes())
            .and_then(|s| s.to_pem(LineEnding::LF))
            .map_err(|e| SigningError {
                path: "the key".into(),
                why: format!("signing failed: {e}"),
            })?;
        let (headers, message) = payload.split_once("\n\n").unwrap_or((payload, ""));
        let armour = sig.trim_end().replace('\n', "\n ");
        Ok(format!("{headers}\ngpgsig {armour}\n\n{message}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh key from OpenSSH's own ssh-keygen.
    fn key(dir: &Path) -> Vec<u8> {
        let path = dir.join("signing");
        let st = std::process::Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "test", "-f"])
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success());
        std::fs::read(path).unwrap()
    }

    #[test]
    fn the_same_payload_signs_to_the_same_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let s = Signer::from_openssh(&key(dir.path()), "agent@example.org").unwrap();
        let payload = "tree 4b825dc642cb6eb9a060e54bf8d69288fbee4904\nauthor a <a@b> 1 +0000\ncommitter a <a@b> 1 +0000\n\nmsg\n";
        let one = s.sign_commit(payload).unwrap();
        assert_eq!(one, s.sign_commit(payload).unwrap());
        assert!(one.contains("\ngpgsig -----BEGIN SSH SIGNATURE-----\n "));
        assert!(one.ends_with("\n\nmsg\n"));
        assert!(s.fingerprint().starts_with("sha256:") && s.fingerprint().len() == 71);
        assert!(
            s.allowed_signers_line()
                .starts_with("agent@example.org namespaces=\"git\" ssh-ed25519 ")
        );
    }

    #[test]
    fn refuses_what_cannot_sign_unattended() {
        let e = Signer::from_openssh(b"not a key", "a@b").unwrap_err();
        assert!(e.why.contains("not an OpenSSH private key"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let e = Signer::from_openssh(&key(dir.path()), "two words").unwrap_err();
        assert!(e.why.contains("principal"), "{e}");
    }
}
