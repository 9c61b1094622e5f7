//! Each repository's verification environment as the executor resolved it
//! at start (`airlock_config::Environment::resolve`): the programs its
//! commands may start beside `executor.programs`, their variables, and the
//! read-only paths added to the commands' view.
//!
//! The view is built once, when the spawner starts, so the paths of every
//! repository's environment are in every command's view (read-only, and
//! only root may write them: `resolve` checks that). Programs and
//! variables are per repository. An environment that does not resolve on
//! this host refuses its repository's requests with its code; a `setup`
//! is refused with ENVIRONMENT_INVALID until the executor runs setups.

use crate::error::{Error, Result};
use airlock_config::{Config, EnvironmentError, Resolved};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The environments, by repository name.
#[derive(Debug, Default)]
pub struct Environments {
    by_repository: BTreeMap<String, std::result::Result<Resolved, EnvironmentError>>,
}

impl Environments {
    /// Resolves every registered repository's environment.
    pub fn from_config(config: &Config) -> Environments {
        let by_repository = config
            .repositories
            .iter()
            .filter_map(|r| {
                let env = r.environment.as_ref()?;
                let resolved = env.resolve();
                Some((r.name.clone(), resolved))
            })
            .collect();
        Environments { by_repository }
    }

    /// What each repository's environment came to, for the start-up log.
    pub fn summary(&self) -> Vec<String> {
        self.by_repository
            .iter()
            .map(|(name, r)| match r {
                Ok(res) => format!(
                    "{name}: {} programs, {} paths, {} variables",
                    res.programs.len(),
                    res.paths.len(),
                    res.variables.len()
                ),
                Err(e) => format!("{name}: UNUSABLE, {e} [{}]", e.code.as_str()),
            })
            .collect()
    }

    /// Every usable environment's read-only paths, once each.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths: Vec<PathBuf> = Vec::new();
        for res in self.by_repository.values().flatten() {
            for p in &res.paths {
                if !paths.contains(p) {
                    paths.push(p.clone());
                }
            }
        }
        paths
    }

    /// The environment of `repository`: `None` when it has none, an error
    /// when it has one that is unusable here.
    pub fn for_repository(&self, repository: &str) -> Result<Option<&Resolved>> {
        match self.by_repository.get(repository) {
            None => Ok(None),
            Some(Ok(res)) => Ok(Some(res)),
            Some(Err(e)) => Err(Error::Environment {
                code: e.code,
                message: format!("repository {repository}: {e}"),
            }),
        }
    }
}
