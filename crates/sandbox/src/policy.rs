//! What a sandbox may do: the [`Policy`] the executor builds, and the
//! argv it becomes for `airlock-confine` ([`Policy::to_args`]).

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The uid and gid a root caller's sandbox runs as when the policy names
/// none (`nobody` / `nogroup` on Debian).
pub const NOBODY: u32 = 65534;

/// System paths granted read and execute access when they exist, unless
/// [`Policy::system_ro`] is off. `/etc` is deliberately not granted whole:
/// only the files a dynamic linker, NSS, TLS and Python need, so that
/// `/etc/shadow` and friends stay out of reach even for uid 0.
pub const SYSTEM_RO: &[&str] = &[
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/hosts",
    "/etc/host.conf",
    "/etc/protocols",
    "/etc/services",
    "/etc/mime.types",
    "/etc/ssl",
    "/etc/ca-certificates",
    "/etc/alternatives",
    "/etc/gitconfig",
    "/etc/os-release",
    "/etc/debian_version",
    "/etc/python3",
    "/etc/python3.11",
    "/etc/python3.12",
    "/etc/python3.13",
    "/etc/perl",
    "/sys/devices/system/cpu",
];

/// Device files granted read and write access (not ioctl).
pub const DEVICES_RW: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// Device files granted read access.
pub const DEVICES_RO: &[&str] = &["/dev/random", "/dev/urandom"];

/// The PATH of the sandboxed command.
pub const SANDBOX_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// Resource limits (soft = hard). `None` leaves the inherited limit.
/// Core dumps are always disabled.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// RLIMIT_NPROC: processes (counted per uid, system-wide).
    pub nproc: Option<u64>,
    /// RLIMIT_AS: bytes of address space.
    pub address_space: Option<u64>,
    /// RLIMIT_FSIZE: largest file the command may write, in bytes.
    pub file_size: Option<u64>,
    /// RLIMIT_NOFILE: open file descriptors.
    pub open_files: Option<u64>,
    /// RLIMIT_CPU: CPU seconds.
    pub cpu_seconds: Option<u64>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            nproc: Some(256),
            address_space: Some(8 << 30),
            file_size: Some(1 << 30),
            open_files: Some(1024),
            cpu_seconds: Some(600),
        }
    }
}

/// Everything `airlock-confine` needs to know about one sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Policy {
    /// User id to run as. When the helper runs as root and this is `None`,
    /// [`NOBODY`]. An unprivileged helper can only keep its own uid.
    pub uid: Option<u32>,
    /// Group id to run as; defaults like `uid`.
    pub gid: Option<u32>,
    /// Extra directories or files granted read and execute access.
    pub ro: Vec<PathBuf>,
    /// Directories granted full access (the task workspace).
    pub rw: Vec<PathBuf>,
    /// Working directory of the command, `HOME` of the command; defaults to
    /// the first `rw` directory, else the helper's working directory.
    pub workdir: Option<PathBuf>,
    /// Grant [`SYSTEM_RO`] (read + execute) as well.
    pub system_ro: bool,
    /// Resource limits.
    pub limits: Limits,
    /// Run even when Landlock is not fully enforced (loud warning, recorded).
    pub allow_degraded: bool,
    /// The lowest Landlock ABI that counts as fully enforced.
    pub landlock_min_abi: u8,
    /// Wall-clock limit; the whole sandbox is killed when it passes.
    pub timeout: Option<Duration>,
    /// Extra environment entries on top of the clean environment.
    pub env: Vec<(String, String)>,
    /// Mount private tmpfs on /tmp and /dev/shm when a mount namespace is
    /// available.
    pub private_tmp: bool,
    /// Create namespaces (user, pid, ipc, uts, net, mount) when the kernel
    /// allows. Off, the sandbox relies on Landlock, seccomp and the id
    /// switch alone, and no residency falls back to child subreapers.
    pub namespaces: bool,
    /// Size of the private /tmp in bytes.
    pub tmp_size: u64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            uid: None,
            gid: None,
            ro: Vec::new(),
            rw: Vec::new(),
            workdir: None,
            system_ro: true,
            limits: Limits::default(),
            allow_degraded: false,
            landlock_min_abi: 1,
            timeout: None,
            env: Vec::new(),
            private_tmp: true,
            namespaces: true,
            tmp_size: 256 << 20,
        }
    }
}

/// Highest Landlock ABI this crate knows how to request.
pub const MAX_LANDLOCK_ABI: u8 = 10;

impl Policy {
    /// Strict checks on the policy (the second parsing stage after clap).
    pub fn validate(&self) -> Result<()> {
        for p in self.ro.iter().chain(&self.rw).chain(&self.workdir) {
            check_path(p)?;
        }
        if !(1..=MAX_LANDLOCK_ABI).contains(&self.landlock_min_abi) {
            return Err(Error::Policy(format!(
                "landlock minimum ABI must be 1..={MAX_LANDLOCK_ABI}, not {}",
                self.landlock_min_abi
            )));
        }
        check_env(&self.env)?;
        if self.timeout == Some(Duration::ZERO) {
            return Err(Error::Policy("timeout must be positive".into()));
        }
        let l = &self.limits;
        for (name, v) in [
            ("nproc", l.nproc),
            ("address space", l.address_space),
            ("open files", l.open_files),
            ("cpu", l.cpu_seconds),
        ] {
            if v == Some(0) {
                return Err(Error::Policy(format!("{name} limit must be positive")));
            }
        }
        Ok(())
    }

    /// The working directory the command starts in (and its HOME).
    pub fn effective_workdir(&self) -> Option<&Path> {
        self.workdir
            .as_deref()
            .or(self.rw.first().map(PathBuf::as_path))
    }

    /// The `airlock-confine` options expressing this policy, without the
    /// report options, the `--` and the command. The executor appends
    /// `--report-fd N` (or `--report FILE`), `--` and the argv.
    ///
    /// ```
    /// use airlock_sandbox::Policy;
    /// let policy = Policy { rw: vec!["/srv/ws".into()], ..Policy::default() };
    /// let args = policy.to_args();
    /// assert!(args.windows(2).any(|w| w[0] == "--rw" && w[1] == "/srv/ws"));
    /// ```
    pub fn to_args(&self) -> Vec<OsString> {
        let mut a: Vec<OsString> = Vec::new();
        let mut push = |k: &str, v: OsString| {
            a.push(k.into());
            a.push(v);
        };
        if let Some(uid) = self.uid {
            push("--uid", uid.to_string().into());
        }
        if let Some(gid) = self.gid {
            push("--gid", gid.to_string().into());
        }
        for p in &self.ro {
            push("--ro", p.into());
        }
        for p in &self.rw {
            push("--rw", p.into());
        }
        if let Some(w) = &self.workdir {
            push("--workdir", w.into());
        }
        let l = &self.limits;
        for (flag, v) in [
            ("--limit-nproc", l.nproc),
            ("--limit-as", l.address_space),
            ("--limit-fsize", l.file_size),
            ("--limit-nofile", l.open_files),
            ("--limit-cpu", l.cpu_seconds),
        ] {
            push(
                flag,
                v.map_or_else(|| "unlimited".into(), |n| n.to_string())
                    .into(),
            );
        }
        push(
            "--landlock-min-abi",
            self.landlock_min_abi.to_string().into(),
        );
        if let Some(t) = self.timeout {
            push("--timeout", format!("{}ms", t.as_millis()).into());
        }
        for (k, v) in &self.env {
            push("--env", format!("{k}={v}").into());
        }
        push("--tmp-size", self.tmp_size.to_string().into());
        if !self.system_ro {
            a.push("--no-system-ro".into());
        }
        if !self.private_tmp {
            a.push("--no-private-tmp".into());
        }
        if !self.namespaces {
            a.push("--no-namespaces".into());
        }
        if self.allow_degraded {
            a.push("--allow-degraded".into());
        }
        a
    }
}

/// Environment entries: a shell-safe name and no NUL byte.
pub(crate) fn check_env(env: &[(String, String)]) -> Result<()> {
    for (k, v) in env {
        let key_ok = !k.is_empty()
            && !k.as_bytes()[0].is_ascii_digit()
            && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !key_ok || v.contains('\0') {
            return Err(Error::Policy(format!("invalid environment entry {k:?}")));
        }
    }
    Ok(())
}

/// An absolute path without NUL bytes or `..` components.
pub(crate) fn check_path(p: &Path) -> Result<()> {
    if p.components().any(|c| c == std::path::Component::ParentDir) {
        return Err(Error::Policy(format!("path {} has a '..'", p.display())));
    }
    if !p.is_absolute() {
        return Err(Error::Policy(format!(
            "path {} is not absolute",
            p.display()
        )));
    }
    if p.as_os_str().as_bytes().contains(&0) {
        return Err(Error::Policy("path contains a NUL byte".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_policy_is_valid() {
        Policy::default().validate().unwrap();
    }

    #[test]
    fn relative_paths_are_refused() {
        let p = Policy {
            rw: vec!["ws".into()],
            ..Policy::default()
        };
        assert!(matches!(p.validate(), Err(Error::Policy(_))));
    }

    #[test]
    fn bad_env_keys_are_refused() {
        for k in ["", "A=B", "1X", "A B"] {
            let p = Policy {
                env: vec![(k.into(), "v".into())],
                ..Policy::default()
            };
            assert!(p.validate().is_err(), "{k:?}");
        }
    }

    #[test]
    fn abi_out_of_range_is_refused() {
        for abi in [0, MAX_LANDLOCK_ABI + 1] {
            let p = Policy {
                landlock_min_abi: abi,
                ..Policy::default()
            };
            assert!(p.validate().is_err());
        }
    }

    #[test]
    fn workdir_defaults_to_first_rw() {
        let p = Policy {
            rw: vec!["/a".into(), "/b".into()],
            ..Policy::default()
        };
        assert_eq!(p.effective_workdir(), Some(Path::new("/a")));
    }
}
