//! seccomp, the last confinement step: compiles [`crate::seccomp_policy`]
//! into BPF with seccompiler and installs it, with the
//! [`UNIX_PATH_RULES`](crate::seccomp_policy::UNIX_PATH_RULES) when
//! Landlock does not confine pathname UNIX sockets. Three filters are stacked:
//! the EPERM rules, the ENOSYS rules (clone3), and on x86-64 one that
//! refuses x32-numbered calls. seccompiler's prologue kills the process
//! on a foreign architecture (e.g. 32-bit `int 0x80` calls).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

use crate::error::{Error, Result};
use crate::seccomp_policy::{Deny, Extras, Rule, When, active, active_with};

fn arch() -> Result<TargetArch> {
    TargetArch::try_from(std::env::consts::ARCH).map_err(|e| Error::Seccomp(e.to_string()))
}

fn err(e: seccompiler::BackendError) -> Error {
    Error::Seccomp(e.to_string())
}

/// The seccompiler rules of one row (several for a bit mask: one per bit).
fn rules_for(when: When) -> Result<Vec<SeccompRule>> {
    let cond = |arg: u8, len, op, value| SeccompCondition::new(arg, len, op, value).map_err(err);
    let rule = |c| SeccompRule::new(vec![c]).map_err(err);
    Ok(match when {
        When::Always => Vec::new(),
        When::ArgNe { arg, value } => {
            vec![rule(cond(
                arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Ne,
                u64::from(value),
            )?)?]
        }
        When::ArgMaskedEq { arg, mask, value } => {
            vec![rule(cond(
                arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::MaskedEq(u64::from(mask)),
                u64::from(value),
            )?)?]
        }
        When::ArgEq { arg, value } => {
            vec![rule(cond(
                arg,
                SeccompCmpArgLen::Dword,
                SeccompCmpOp::Eq,
                u64::from(value),
            )?)?]
        }
        When::ArgNotIn { arg, values } => vec![
            SeccompRule::new(
                values
                    .iter()
                    .map(|v| {
                        cond(
                            arg,
                            SeccompCmpArgLen::Dword,
                            SeccompCmpOp::Ne,
                            u64::from(*v),
                        )
                    })
                    .collect::<Result<Vec<_>>>()?,
            )
            .map_err(err)?,
        ],
        When::ArgNonZero { arg } => {
            vec![rule(cond(
                arg,
                SeccompCmpArgLen::Qword,
                SeccompCmpOp::Ne,
                0,
            )?)?]
        }
        When::ArgAnyBit { arg, mask } => (0..64)
            .map(|b| 1u64 << b)
            .filter(|bit| mask & bit != 0)
            .map(|bit| {
                rule(cond(
                    arg,
                    SeccompCmpArgLen::Qword,
                    SeccompCmpOp::MaskedEq(bit),
                    bit,
                )?)
            })
            .collect::<Result<_>>()?,
    })
}

/// Compiles the policy into the BPF programs to install, in order;
/// `unix_paths` adds the rows that keep pathname UNIX sockets out of reach.
pub fn compile(unix_paths: bool) -> Result<Vec<BpfProgram>> {
    compile_rules(&active(unix_paths).collect::<Vec<_>>())
}

/// Compiles any set of rows of the policy's form (a daemon's role uses a
/// subset of [`crate::seccomp_policy::RULES`]) into the BPF programs to
/// install, in order. Calls not listed are allowed.
pub fn compile_rules(rules: &[&Rule]) -> Result<Vec<BpfProgram>> {
    let mut programs = Vec::new();
    for (deny, errno) in [(Deny::Eperm, libc::EPERM), (Deny::Enosys, libc::ENOSYS)] {
        let mut map: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
        for r in rules.iter().filter(|r| r.deny == deny) {
            // An empty rule list matches every invocation, so an
            // unconditional row makes argument rows of that call moot.
            let entry = map.entry(r.nr).or_default();
            if !rules.iter().any(|o| o.nr == r.nr && o.when == When::Always) {
                entry.extend(rules_for(r.when)?);
            }
        }
        let filter = SeccompFilter::new(
            map,
            SeccompAction::Allow,
            SeccompAction::Errno(errno as u32),
            arch()?,
        )
        .map_err(err)?;
        programs.push(BpfProgram::try_from(filter).map_err(err)?);
    }
    if cfg!(target_arch = "x86_64") {
        programs.push(x32_filter());
    }
    Ok(programs)
}

/// Refuses every x32-numbered call with ENOSYS (x86-64 only).
fn x32_filter() -> BpfProgram {
    use seccompiler::sock_filter;
    const LD_W_ABS: u16 = 0x20;
    const JEQ_K: u16 = 0x15;
    const JGE_K: u16 = 0x35;
    const RET_K: u16 = 0x06;
    const AUDIT_ARCH_X86_64: u32 = 62 | 0x8000_0000 | 0x4000_0000;
    const RET_ALLOW: u32 = 0x7fff_0000;
    const RET_ERRNO: u32 = 0x0005_0000;
    let ins = |code, jt, jf, k| sock_filter { code, jt, jf, k };
    vec![
        ins(LD_W_ABS, 0, 0, 4), // seccomp_data.arch
        ins(JEQ_K, 0, 3, AUDIT_ARCH_X86_64),
        ins(LD_W_ABS, 0, 0, 0), // seccomp_data.nr
        ins(JGE_K, 0, 1, crate::seccomp_policy::X32_SYSCALL_BIT),
        ins(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32),
        ins(RET_K, 0, 0, RET_ALLOW),
    ]
}

/// Compiles the command policy with `extras` (see [`Extras`]).
pub fn compile_with(extras: Extras) -> Result<Vec<BpfProgram>> {
    compile_rules(&active_with(extras).collect::<Vec<_>>())
}

/// Installs already compiled programs on the calling thread (no_new_privs
/// must be set): one seccomp(2) call each, no allocation.
pub fn install_programs(programs: &[BpfProgram]) -> Result<()> {
    for program in programs {
        seccompiler::apply_filter(program).map_err(|e| Error::Seccomp(e.to_string()))?;
    }
    Ok(())
}

/// Installs the filters on the calling thread (no_new_privs must be set).
/// `unix_paths`: see [`compile`].
pub fn install(unix_paths: bool) -> Result<()> {
    install_rules(&active(unix_paths).collect::<Vec<_>>())
}

/// Installs the filters compiled from `rules` on the calling thread
/// (no_new_privs must be set); threads it starts later inherit them.
pub fn install_rules(rules: &[&Rule]) -> Result<()> {
    for program in compile_rules(rules)? {
        seccompiler::apply_filter(&program).map_err(|e| Error::Seccomp(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_compiles_within_bpf_limits() {
        for unix_paths in [false, true] {
            let programs = compile(unix_paths).unwrap();
            assert!(programs.len() >= 2);
            for p in &programs {
                assert!(!p.is_empty() && p.len() < 4096, "{}", p.len());
            }
        }
        assert!(compile(true).unwrap()[0].len() > compile(false).unwrap()[0].len());
    }
}
