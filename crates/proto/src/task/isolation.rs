//! The isolation evidence of an attempt's commands: what the executor
//! measured, and what falls short of full confinement.

use super::{Isolation, UNMEASURED};
use crate::error::{Code, Error, Result};

impl Isolation {
    /// Nothing measured (no executor report).
    pub fn unmeasured() -> Self {
        Isolation {
            landlock_abi: None,
            landlock: UNMEASURED.into(),
            seccomp: UNMEASURED.into(),
            namespaces: None,
            view: UNMEASURED.into(),
            uid: None,
            layer: None,
        }
    }

    /// The evidence in an executor's confinement report. A report of no
    /// command (`view` `none`) measured nothing about commands.
    pub fn from_report(r: &crate::bundle::ConfinementReport) -> Self {
        if r.view == "none" {
            return Isolation {
                uid: r.uid,
                ..Isolation::unmeasured()
            };
        }
        let landlock = match r.landlock.as_str() {
            "full" | "degraded" => r.landlock.clone(),
            _ => UNMEASURED.to_owned(),
        };
        let view = match r.view.as_str() {
            "minimal-root" | "host-view" => r.view.clone(),
            _ => UNMEASURED.to_owned(),
        };
        Isolation {
            landlock_abi: (r.landlock_abi > 0).then_some(r.landlock_abi),
            landlock,
            seccomp: if r.seccomp { "enforced" } else { "off" }.into(),
            namespaces: Some(r.namespaces.clone()),
            view,
            uid: r.uid,
            layer: r.layer.clone(),
        }
    }

    /// Why the commands were not fully confined; empty when they were.
    /// Fully confined: Landlock fully enforced at a known ABI, seccomp
    /// enforced, a known filesystem view (the minimal root, or the
    /// host view with every path-based metadata call refused, where user
    /// namespaces are unavailable), and a known uid other than root.
    pub fn gaps(&self) -> Vec<String> {
        let mut gaps = Vec::new();
        match (self.landlock.as_str(), self.landlock_abi) {
            ("full", Some(_)) => {}
            ("degraded", abi) => gaps.push(format!(
                "Landlock degraded (ABI {})",
                abi.map_or_else(|| UNMEASURED.to_owned(), |a| a.to_string())
            )),
            _ => gaps.push("Landlock unmeasured".to_owned()),
        }
        match self.seccomp.as_str() {
            "enforced" => {}
            "off" => gaps.push("seccomp off".to_owned()),
            _ => gaps.push("seccomp unmeasured".to_owned()),
        }
        match self.view.as_str() {
            "minimal-root" | "host-view" => {}
            _ => gaps.push("filesystem view unmeasured".to_owned()),
        }
        if self.namespaces.is_none() {
            gaps.push("namespaces unmeasured".to_owned());
        }
        match self.uid {
            Some(0) => gaps.push("commands ran as root".to_owned()),
            Some(_) => {}
            None => gaps.push("uid unmeasured".to_owned()),
        }
        gaps
    }

    /// True when [`Isolation::gaps`] is empty.
    pub fn fully_confined(&self) -> bool {
        self.gaps().is_empty()
    }

    /// Structural bounds (the values are the executor's words).
    pub(super) fn validate(&self) -> Result<()> {
        let word = |s: &str, allowed: &[&str]| allowed.contains(&s);
        let ok = word(&self.landlock, &["full", "degraded", UNMEASURED])
            && word(&self.seccomp, &["enforced", "off", UNMEASURED])
            && word(&self.view, &["minimal-root", "host-view", UNMEASURED])
            && self
                .namespaces
                .as_ref()
                .is_none_or(|n| n.len() <= 16 && n.iter().all(|s| !s.is_empty() && s.len() <= 16));
        if ok {
            Ok(())
        } else {
            Err(Error::with(Code::MESSAGE_INVALID, "isolation"))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn confined() -> Isolation {
        Isolation::from_report(&crate::bundle::ConfinementReport {
            landlock_abi: 7,
            landlock: "full".into(),
            seccomp: true,
            namespaces: vec!["user".into(), "mnt".into(), "pid".into()],
            uid: Some(992),
            view: "minimal-root".into(),
            layer: None,
        })
    }

    #[test]
    fn isolation_is_full_only_when_every_property_was_measured_at_full_strength() {
        let full = confined();
        assert!(full.fully_confined(), "{:?}", full.gaps());
        let report = |f: &dyn Fn(&mut crate::bundle::ConfinementReport)| {
            let mut r = crate::bundle::ConfinementReport {
                landlock_abi: 7,
                landlock: "full".into(),
                seccomp: true,
                namespaces: vec![],
                uid: Some(992),
                view: "host-view".into(),
                layer: None,
            };
            f(&mut r);
            Isolation::from_report(&r)
        };
        assert!(
            report(&|_| {}).fully_confined(),
            "the host view is a confined mode"
        );
        let gaps = |f: &dyn Fn(&mut crate::bundle::ConfinementReport)| report(f).gaps();
        assert_eq!(
            gaps(&|r| r.landlock = "degraded".into()),
            ["Landlock degraded (ABI 7)"]
        );
        assert_eq!(
            gaps(&|r| r.landlock = "none".into()),
            ["Landlock unmeasured"]
        );
        assert_eq!(gaps(&|r| r.landlock_abi = 0), ["Landlock unmeasured"]);
        assert_eq!(gaps(&|r| r.seccomp = false), ["seccomp off"]);
        assert_eq!(gaps(&|r| r.uid = Some(0)), ["commands ran as root"]);
        assert_eq!(gaps(&|r| r.uid = None), ["uid unmeasured"]);
        assert_eq!(
            gaps(&|r| r.view = "something-new".into()),
            ["filesystem view unmeasured"]
        );
        // No command ran: nothing about commands was measured.
        let none = report(&|r| r.view = "none".into());
        assert!(!none.fully_confined());
        assert_eq!(none.landlock, UNMEASURED);
        assert_eq!(none.seccomp, UNMEASURED);
        // Nothing measured at all is never confined.
        assert_eq!(Isolation::unmeasured().gaps().len(), 5);
    }
}
