//! Program policy: which verification commands may run at all. Commands
//! are argv vectors, never shell strings; this is checked before any
//! command of an envelope runs, so a plan with one refused command runs none.
//!
//! - `argv[0]` must be one of `executor.programs`, compared exactly
//!   (absolute paths; no PATH search, no normalisation).
//! - **git**: only global options from [`GIT_SAFE_GLOBAL_OPTIONS`] may
//!   precede the subcommand (so `-c`, `--config-env`, `--exec-path`,
//!   `--git-dir`, `--work-tree`, `-C`, `--namespace`, `-p` are refused); the
//!   subcommand (the first non-option) must be in
//!   `executor.git_read_only_subcommands`; and options after it that run a
//!   program or write a file ([`GIT_REFUSED_OPTIONS`], `-O`, and any
//!   abbreviation of them) are refused.
//!   Refusals are GIT_MUTATION_DENY.
//! - **python3**: `-m MODULE` must name one of `executor.python_modules`
//!   (PYTHON_MODULE_DENY otherwise). `-c CODE` **is allowed**, as in the
//!   seed: a plan can already write a file and run `python3 file.py`, so
//!   refusing `-c` would add no boundary; the boundary is the sandbox every
//!   command runs in (Landlock, seccomp, no network, no credentials), not
//!   the argv. The module allowlist keeps plans to the intended tools
//!   (test runners, compilers) rather than e.g. `pip` or `http.server`.
//! - Any other allowlisted program may take any arguments.

use crate::error::{Error, Result};
use airlock_proto::envelope::Command;
use std::path::PathBuf;

/// Global git options accepted before the subcommand: none of them reads
/// configuration, changes directories or runs a program.
pub const GIT_SAFE_GLOBAL_OPTIONS: &[&str] = &[
    "--no-pager",
    "-P",
    "--no-optional-locks",
    "--no-replace-objects",
    "--literal-pathspecs",
    "--glob-pathspecs",
    "--noglob-pathspecs",
    "--icase-pathspecs",
    "--bare",
];

/// git options refused after the subcommand (global options are refused
/// unless listed in [`GIT_SAFE_GLOBAL_OPTIONS`]): they run a program or
/// write a file. `-O` (grep's pager) is refused as well.
pub const GIT_REFUSED_OPTIONS: &[&str] = &[
    "--open-files-in-pager",
    "--output",
    "--ext-diff",
    "--textconv",
    "--exec",
    "--upload-pack",
    "--receive-pack",
    "--upload-archive",
];

/// The allowlists, from `[executor]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProgramPolicy {
    /// Absolute program paths.
    pub programs: Vec<PathBuf>,
    /// Modules `python3 -m` may run.
    pub python_modules: Vec<String>,
    /// Read-only git subcommands.
    pub git_subcommands: Vec<String>,
}

impl ProgramPolicy {
    /// From the configuration's `[executor]` section.
    pub fn from_config(c: &airlock_config::Executor) -> Self {
        ProgramPolicy {
            programs: c.programs.clone(),
            python_modules: c.python_modules.clone(),
            git_subcommands: c.git_read_only_subcommands.clone(),
        }
    }

    /// Checks one command.
    pub fn check(&self, cmd: &Command) -> Result<()> {
        self.check_with(cmd, &[])
    }

    /// Checks one command of a repository whose environment allows
    /// `extra` programs too (absolute paths, compared exactly).
    pub fn check_with(&self, cmd: &Command, extra: &[PathBuf]) -> Result<()> {
        let program = cmd.argv.first().map(String::as_str).unwrap_or("");
        if !self
            .programs
            .iter()
            .chain(extra)
            .any(|p| p.as_os_str() == program)
        {
            return Err(Error::ProgramDenied {
                label: cmd.label.clone(),
                program: program.to_owned(),
            });
        }
        let name = program.rsplit('/').next().unwrap_or("");
        let args = &cmd.argv[1..];
        if name == "git" {
            self.check_git(&cmd.label, args)
        } else if name.starts_with("python") {
            self.check_python(&cmd.label, args)
        } else {
            Ok(())
        }
    }

    fn check_git(&self, label: &str, args: &[String]) -> Result<()> {
        let deny = |detail: String| Error::GitDenied {
            label: label.to_owned(),
            detail,
        };
        let mut rest = args.iter();
        let sub = loop {
            match rest.next() {
                None => return Err(deny("no subcommand".to_owned())),
                Some(a) if a.starts_with('-') => {
                    if !GIT_SAFE_GLOBAL_OPTIONS.contains(&a.as_str()) {
                        return Err(deny(format!("global option {a:?} is refused")));
                    }
                }
                Some(a) => break a,
            }
        };
        if !self.git_subcommands.iter().any(|s| s == sub) {
            return Err(deny(format!("subcommand {sub:?} is not read-only")));
        }
        for arg in rest {
            if arg == "--" {
                break;
            }
            if refused_git_option(arg) {
                return Err(deny(format!("option {arg:?} is refused")));
            }
        }
        Ok(())
    }

    fn check_python(&self, label: &str, args: &[String]) -> Result<()> {
        let deny = |detail: String| Error::PythonModuleDenied {
            label: label.to_owned(),
            detail,
        };
        let mut i = 0;
        while i < args.len() {
            let arg = &args[i];
            if arg == "-" || !arg.starts_with('-') {
                // A script (or stdin): interpreter options end here.
                return Ok(());
            }
            if arg == "--check-hash-based-pycs" {
                i += 2;
                continue;
            }
            if arg.starts_with("--") {
                // --help, --version and friends take no argument.
                i += 1;
                continue;
            }
            // A cluster of short options, e.g. -Bm, -Wignore, -X dev.
            let flags = &arg.as_bytes()[1..];
            for (j, &flag) in flags.iter().enumerate() {
                let attached = &arg[1 + j + 1..];
                match flag {
                    b'm' => {
                        let module = if attached.is_empty() {
                            args.get(i + 1).map(String::as_str).unwrap_or("")
                        } else {
                            attached
                        };
                        if module.is_empty() {
                            return Err(deny("-m without a module".to_owned()));
                        }
                        if !self.python_modules.iter().any(|m| m == module) {
                            return Err(deny(format!("module {module:?} is not allowlisted")));
                        }
                        // Everything after the module is the module's own argv.
                        return Ok(());
                    }
                    // -c CODE: the rest is the program's argv (allowed, see above).
                    b'c' => return Ok(()),
                    b'W' | b'X' => {
                        if attached.is_empty() {
                            i += 1;
                        }
                        break;
                    }
                    _ => {}
                }
            }
            i += 1;
        }
        Ok(())
    }
}

/// True for an option that runs a program or writes a file, in any
/// spelling git accepts: `--opt`, `--opt=value`, an unambiguous prefix of
/// a long option (git's option parser accepts those), or `-Ovalue`.
fn refused_git_option(arg: &str) -> bool {
    if let Some(long) = arg.strip_prefix("--") {
        let key = long.split_once('=').map_or(long, |(k, _)| k);
        return key.len() >= 2
            && GIT_REFUSED_OPTIONS
                .iter()
                .filter_map(|o| o.strip_prefix("--"))
                .any(|o| o.starts_with(key));
    }
    arg.starts_with("-O")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> ProgramPolicy {
        ProgramPolicy::from_config(&airlock_config::Executor::default())
    }

    fn cmd(argv: &[&str]) -> Command {
        Command {
            label: "t".into(),
            argv: argv.iter().map(|s| (*s).to_owned()).collect(),
            cwd: ".".into(),
            timeout_seconds: 30,
        }
    }

    fn code(argv: &[&str]) -> Option<airlock_proto::Code> {
        policy().check(&cmd(argv)).err().map(|e| e.code())
    }

    use airlock_proto::Code;

    #[test]
    fn programs_must_be_allowlisted_exactly() {
        assert_eq!(code(&["/usr/bin/true"]), None);
        assert_eq!(
            code(&["/bin/sh", "-c", "true"]),
            Some(Code::COMMAND_PROGRAM_DENY)
        );
        assert_eq!(
            code(&["/usr/bin/../bin/true"]),
            Some(Code::COMMAND_PROGRAM_DENY)
        );
        assert_eq!(
            code(&["/usr/bin/curl", "x"]),
            Some(Code::COMMAND_PROGRAM_DENY)
        );
        assert_eq!(code(&["python3", "-V"]), Some(Code::COMMAND_PROGRAM_DENY));
    }

    #[test]
    fn git_only_read_only_subcommands_without_config_options() {
        for ok in [
            &["/usr/bin/git", "status"][..],
            &["/usr/bin/git", "--no-pager", "diff", "--stat"],
            &["/usr/bin/git", "log", "-n", "1", "--", "-c"],
            &["/usr/bin/git", "grep", "-n", "TODO"],
            &["/usr/bin/git", "diff", "--no-index", "-C", "a", "b"],
        ] {
            assert_eq!(code(ok), None, "{ok:?}");
        }
        for bad in [
            &["/usr/bin/git", "push", "origin"][..],
            &["/usr/bin/git", "commit", "-m", "x"],
            &["/usr/bin/git", "update-ref", "refs/heads/main", "x"],
            &["/usr/bin/git", "-c", "core.pager=sh", "log"],
            &["/usr/bin/git", "-ccore.pager=sh", "log"],
            &["/usr/bin/git", "--config-env=core.pager=X", "log"],
            &["/usr/bin/git", "--exec-path=/tmp", "status"],
            &["/usr/bin/git", "--git-dir=/srv/git/x.git", "log"],
            &["/usr/bin/git", "-C", "/", "status"],
            &["/usr/bin/git", "-C/", "status"],
            &["/usr/bin/git", "-p", "log"],
            &["/usr/bin/git", "grep", "-O", "x"],
            &["/usr/bin/git", "grep", "--open-files-in-pager=sh", "x"],
            &["/usr/bin/git", "grep", "--open-files=sh", "x"],
            &["/usr/bin/git", "grep", "-Ovim", "x"],
            &["/usr/bin/git", "diff", "--out=/tmp/x"],
            &["/usr/bin/git", "diff", "--output=/tmp/x"],
            &["/usr/bin/git", "log", "--ext-diff"],
            &["/usr/bin/git"],
            &["/usr/bin/git", "--version"],
        ] {
            assert_eq!(code(bad), Some(Code::GIT_MUTATION_DENY), "{bad:?}");
        }
    }

    #[test]
    fn python_modules_are_allowlisted_and_c_is_allowed() {
        for ok in [
            &["/usr/bin/python3", "-m", "pytest", "-q"][..],
            &["/usr/bin/python3", "-B", "-m", "py_compile", "x.py"],
            &["/usr/bin/python3", "-Bm", "unittest"],
            &["/usr/bin/python3", "-mpytest"],
            &["/usr/bin/python3", "-W", "error", "-m", "compileall", "."],
            &["/usr/bin/python3", "-c", "print(1)"],
            &["/usr/bin/python3", "script.py", "-m", "pip"],
            &["/usr/bin/python3", "-I", "-X", "dev", "-c", "import sys"],
        ] {
            assert_eq!(code(ok), None, "{ok:?}");
        }
        for bad in [
            &["/usr/bin/python3", "-m", "pip", "install", "x"][..],
            &["/usr/bin/python3", "-m", "http.server"],
            &["/usr/bin/python3", "-Im", "venv", "x"],
            &["/usr/bin/python3", "-mpip"],
            &["/usr/bin/python3", "-X", "dev", "-m", "pytest.x"],
            &["/usr/bin/python3", "-m"],
        ] {
            assert_eq!(code(bad), Some(Code::PYTHON_MODULE_DENY), "{bad:?}");
        }
    }
}
