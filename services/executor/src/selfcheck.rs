//! The start-up isolation check: the executor refuses to run
//! (EXECUTOR_NOT_ISOLATED, naming the check) unless
//!
//! 1. `environment`: no variable has a secret-looking name (TOKEN, SECRET,
//!    PASSWORD, PASSWD, CREDENTIAL, AUTHORIZATION, PRIVATE_KEY, API_KEY,
//!    APIKEY, ACCESS_KEY, COOKIE) or value (`Bearer …`, `password=…`,
//!    `token: …`, `api_key=…`, a URL with a password, a PEM private key);
//! 2. `credentials`: `/run/credentials` and `$CREDENTIALS_DIRECTORY` are
//!    absent or unreadable (listing one is already a failure), and neither
//!    is a symbolic link, whatever it points at (seed 001's
//!    `CREDENTIAL_MOUNT_SYMLINK`);
//! 3. `network`: the process's network namespace has no interface but `lo`
//!    (asked of the kernel over netlink with `if_nameindex`, which sees the
//!    current namespace; `/sys/class/net` shows the namespace sysfs was
//!    mounted in, which can be another).
//!
//! There is deliberately no way to skip a check; tests run the executor in
//! a fresh network namespace instead.

use crate::error::{Error, Result};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// Substrings of variable names that mark a secret.
pub const SECRET_NAME_PARTS: &[&str] = &[
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "CREDENTIAL",
    "AUTHORIZATION",
    "PRIVATE_KEY",
    "API_KEY",
    "APIKEY",
    "ACCESS_KEY",
    "COOKIE",
];

/// Keys that, followed by `=` or `:` and a value, mark a secret in a value.
const SECRET_VALUE_KEYS: &[&str] = &[
    "password",
    "passwd",
    "secret",
    "token",
    "api_key",
    "api-key",
    "apikey",
    "authorization",
];

/// What the checks found, for the log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Isolation {
    /// Network interfaces seen (only `lo`).
    pub interfaces: Vec<String>,
}

/// Runs every check against the real process state.
pub fn run() -> Result<Isolation> {
    let env: Vec<(OsString, OsString)> = std::env::vars_os().collect();
    check_environment(&env)?;
    let mut dirs = vec![PathBuf::from("/run/credentials")];
    if let Some(d) = std::env::var_os("CREDENTIALS_DIRECTORY") {
        dirs.push(PathBuf::from(d));
    }
    check_credentials(&dirs)?;
    let interfaces = interfaces()?;
    check_network(&interfaces)?;
    Ok(Isolation { interfaces })
}

/// Check 1: names and values of the environment.
pub fn check_environment(env: &[(OsString, OsString)]) -> Result<()> {
    let mut leaked: Vec<String> = Vec::new();
    for (name, value) in env {
        if value.is_empty() {
            continue;
        }
        let upper = name.to_string_lossy().to_ascii_uppercase();
        if SECRET_NAME_PARTS.iter().any(|p| upper.contains(p)) || secret_value(value) {
            leaked.push(name.to_string_lossy().into_owned());
        }
    }
    if leaked.is_empty() {
        return Ok(());
    }
    leaked.sort();
    Err(Error::NotIsolated {
        check: "environment",
        detail: format!("secret-looking variables: {}", leaked.join(", ")),
    })
}

/// True when a value looks like it carries a secret.
pub fn secret_value(value: &OsStr) -> bool {
    let lower = String::from_utf8_lossy(value.as_bytes()).to_ascii_lowercase();
    // "Bearer <token>": a token is one word of at least 8 characters.
    let mut from = 0;
    while let Some(i) = lower[from..].find("bearer ") {
        let after = from + i + "bearer ".len();
        let word = lower[after..].split_whitespace().next().unwrap_or("");
        if word.len() >= 8 {
            return true;
        }
        from = after;
    }
    // key [:=] value
    for key in SECRET_VALUE_KEYS {
        let mut from = 0;
        while let Some(i) = lower[from..].find(key) {
            let after = from + i + key.len();
            let rest = lower[after..].trim_start();
            if let Some(r) = rest.strip_prefix(['=', ':']) {
                if r.trim_start()
                    .chars()
                    .next()
                    .is_some_and(|c| !c.is_whitespace())
                {
                    return true;
                }
            }
            from = after;
        }
    }
    // scheme://user:password@host
    if let Some(i) = lower.find("://") {
        let authority = lower[i + 3..].split(['/', '?', '#']).next().unwrap_or("");
        if let Some((userinfo, _)) = authority.rsplit_once('@') {
            if userinfo.contains(':') {
                return true;
            }
        }
    }
    lower.contains("private key-----")
}

/// Check 2: each credential directory must be absent or unreadable, and
/// never a symbolic link. A link is refused before anything is read
/// through it: one whose target the executor cannot read today (or that
/// points nowhere yet) is one a mount, a chmod or a new file opens
/// tomorrow, and systemd makes these directories, never links.
pub fn check_credentials(dirs: &[PathBuf]) -> Result<()> {
    for dir in dirs {
        if std::fs::symlink_metadata(dir).is_ok_and(|m| m.file_type().is_symlink()) {
            let target = std::fs::read_link(dir)
                .map_or_else(|e| format!("unreadable: {e}"), |t| t.display().to_string());
            return Err(Error::NotIsolated {
                check: "credentials",
                detail: format!(
                    "{} is a symbolic link (to {target}); a credentials directory must not be one",
                    dir.display()
                ),
            });
        }
        match std::fs::read_dir(dir) {
            Ok(_) => {
                return Err(Error::NotIsolated {
                    check: "credentials",
                    detail: format!("{} is readable", dir.display()),
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
            Err(e) => {
                // Not a directory, a loop, …: only a file we cannot read is safe.
                if std::fs::File::open(dir).is_ok() {
                    return Err(Error::NotIsolated {
                        check: "credentials",
                        detail: format!("{} is readable ({e})", dir.display()),
                    });
                }
            }
        }
    }
    Ok(())
}

/// The network interfaces of this process's network namespace: from the
/// kernel over netlink, or, where netlink sockets are not allowed (the
/// systemd unit's RestrictAddressFamilies=AF_UNIX), from
/// `/proc/self/net/dev`, which also shows the reading process's own
/// namespace. When neither answers, the check fails.
pub fn interfaces() -> Result<Vec<String>> {
    match nix::net::if_::if_nameindex() {
        Ok(list) => Ok(list
            .iter()
            .map(|i| i.name().to_string_lossy().into_owned())
            .collect()),
        Err(netlink) => std::fs::read_to_string("/proc/self/net/dev")
            .map_err(|e| e.to_string())
            .and_then(|text| proc_net_dev_names(&text))
            .map_err(|proc| Error::NotIsolated {
                check: "network",
                detail: format!(
                    "cannot list network interfaces (netlink: {netlink}; /proc/self/net/dev: {proc})"
                ),
            }),
    }
}

/// Interface names from the text of `/proc/<pid>/net/dev`: two header
/// lines, then one `name: counters…` line per interface. Anything else is
/// an error, never an empty list.
pub fn proc_net_dev_names(text: &str) -> std::result::Result<Vec<String>, String> {
    let mut lines = text.lines();
    let header = (lines.next(), lines.next());
    if !matches!(header, (Some(a), Some(b)) if a.contains("Receive") && b.contains("face")) {
        return Err("unexpected header".into());
    }
    lines
        .map(|line| match line.split_once(':') {
            Some((name, _)) if !name.trim().is_empty() => Ok(name.trim().to_owned()),
            _ => Err(format!("unexpected line {line:?}")),
        })
        .collect()
}

/// Check 3: no interface but `lo`.
pub fn check_network(interfaces: &[String]) -> Result<()> {
    let others: Vec<&str> = interfaces
        .iter()
        .map(String::as_str)
        .filter(|n| *n != "lo")
        .collect();
    if others.is_empty() {
        Ok(())
    } else {
        Err(Error::NotIsolated {
            check: "network",
            detail: format!("network interfaces other than lo: {}", others.join(", ")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs.iter().map(|(k, v)| (k.into(), v.into())).collect()
    }

    fn refused(pairs: &[(&str, &str)]) -> Option<String> {
        match check_environment(&env(pairs)) {
            Ok(()) => None,
            Err(Error::NotIsolated { check, detail }) => {
                assert_eq!(check, "environment");
                Some(detail)
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn secret_names_are_refused_and_named_without_values() {
        for name in [
            "GITHUB_TOKEN",
            "aws_secret_access_key",
            "DB_PASSWORD",
            "CREDENTIALS_DIRECTORY",
            "HTTP_AUTHORIZATION",
            "SSH_PRIVATE_KEY",
            "OPENAI_API_KEY",
        ] {
            let detail = refused(&[("PATH", "/usr/bin"), (name, "hunter2")]).expect(name);
            assert!(
                detail.contains(name) && !detail.contains("hunter2"),
                "{detail}"
            );
        }
        assert_eq!(refused(&[("GITHUB_TOKEN", "")]), None);
    }

    #[test]
    fn secret_values_are_refused() {
        for value in [
            "Authorization: Bearer abc.def",
            "bearer eyJhbGciOiJIUzI1NiJ9",
            "password=hunter2",
            "db passwd: x",
            "token=abc",
            "api_key = k",
            "https://user:pw@example.invalid/repo.git",
            "-----BEGIN OPENSSH PRIVATE KEY-----",
        ] {
            assert!(refused(&[("HARMLESS", value)]).is_some(), "{value}");
        }
        for value in [
            "/usr/bin:/bin",
            "C.UTF-8",
            "https://example.invalid/a@b",
            "token",
            "password=",
            "the bearer of news",
        ] {
            assert_eq!(refused(&[("HARMLESS", value)]), None, "{value}");
        }
    }

    #[test]
    fn proc_net_dev_lists_every_interface() {
        let text = "Inter-|   Receive                                                |  Transmit\n face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed\n    lo:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0\n  eth0: 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16\n";
        assert_eq!(proc_net_dev_names(text).unwrap(), ["lo", "eth0"]);
        assert!(check_network(&proc_net_dev_names(text).unwrap()).is_err());
        assert!(proc_net_dev_names("").is_err());
        assert!(proc_net_dev_names("garbage\n").is_err());
        let broken = format!(
            "{}\nno colon here\n",
            &text[..text.find("    lo").unwrap() - 1]
        );
        assert!(proc_net_dev_names(&broken).is_err());
    }

    #[test]
    fn the_own_namespace_lists_through_proc_as_through_netlink() {
        let text = std::fs::read_to_string("/proc/self/net/dev").unwrap();
        let mut from_proc = proc_net_dev_names(&text).unwrap();
        let mut from_netlink = interfaces().unwrap();
        from_proc.sort();
        from_netlink.sort();
        assert_eq!(from_proc, from_netlink);
    }

    #[test]
    fn readable_credential_directories_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        std::fs::create_dir(&creds).unwrap();
        let err = check_credentials(&[dir.path().join("absent"), creds.clone()]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::NotIsolated {
                    check: "credentials",
                    ..
                }
            ),
            "{err}"
        );
        assert!(check_credentials(&[dir.path().join("absent")]).is_ok());
    }

    #[test]
    fn a_symlinked_credential_directory_is_refused_wherever_it_points() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::create_dir(&real).unwrap();
        for (name, target) in [
            ("to-a-directory", real.clone()),
            ("dangling", dir.path().join("nowhere")),
            ("to-a-file", dir.path().join("file")),
        ] {
            std::fs::write(dir.path().join("file"), b"x").unwrap();
            let link = dir.path().join(name);
            std::os::unix::fs::symlink(&target, &link).unwrap();
            match check_credentials(std::slice::from_ref(&link)) {
                Err(Error::NotIsolated {
                    check: "credentials",
                    detail,
                }) => assert!(
                    detail.contains("is a symbolic link")
                        && detail.contains(&target.display().to_string()),
                    "{name}: {detail}"
                ),
                other => panic!("{name}: {other:?}"),
            }
        }
    }

    #[test]
    fn only_loopback_is_accepted() {
        assert!(check_network(&["lo".into()]).is_ok());
        assert!(check_network(&[]).is_ok());
        let err = check_network(&["lo".into(), "eth0".into()]).unwrap_err();
        assert_eq!(err.code(), airlock_proto::Code::EXECUTOR_NOT_ISOLATED);
        assert!(err.to_string().contains("eth0"));
    }
}
