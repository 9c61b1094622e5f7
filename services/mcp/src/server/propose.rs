//! propose_change: the change and its verification commands, checked
//! here as the supervisor will check them, built into a task and
//! submitted as this user.

use super::{AirlockMcp, Answer};
use crate::input::{self, FileContent};
use crate::text;
use airlock_builder::{Changes, Proposal, label_of, verify_command};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::envelope::Command;
use airlock_proto::task::TaskView;
use airlock_proto::{Code, Error};
use serde_json::{Value, json};
use std::path::PathBuf;

impl AirlockMcp {
    pub(super) async fn propose_change(&self, a: input::ProposeChange) -> Answer {
        input::revision(&a.base)?;
        a.check_bounds()?;
        for f in a.files.iter().flatten() {
            input::path(&f.path)?;
        }
        for l in a.symlinks.iter().flatten() {
            input::path(&l.path)?;
        }
        for p in a.delete.iter().flatten() {
            input::path(p)?;
        }
        if let Some(patch) = &a.patch {
            for file in airlock_builder::patch::parse(patch)? {
                for p in [&file.old_path, &file.new_path].into_iter().flatten() {
                    input::path(p)?;
                }
            }
        }
        let has_files = a.files.as_ref().is_some_and(|f| !f.is_empty())
            || a.symlinks.as_ref().is_some_and(|l| !l.is_empty())
            || a.delete.as_ref().is_some_and(|d| !d.is_empty());
        if a.patch.is_some() == has_files {
            return Err(Error::with(
                Code::MESSAGE_INVALID,
                "give either patch or files/symlinks/delete",
            ));
        }
        if let Some(b) = &a.branch {
            input::revision(b)?;
        }
        let config = self.config()?;
        // The executor refuses credential-like paths the administrator did
        // not allow; with none allowed, say so now rather than after a run.
        if config.executor.allow_credential_paths.is_empty() {
            let mut paths: Vec<String> = a.files.iter().flatten().map(|f| f.path.clone()).collect();
            paths.extend(a.symlinks.iter().flatten().map(|l| l.path.clone()));
            paths.extend(a.delete.iter().flatten().cloned());
            if let Some(patch) = &a.patch {
                for file in airlock_builder::patch::parse(patch)? {
                    paths.extend(file.old_path.into_iter().chain(file.new_path));
                }
            }
            if let Some(p) = paths
                .iter()
                .find(|p| airlock_proto::path::is_credential_path(p))
            {
                return Err(Error::with(
                    Code::CREDENTIAL_PATH_DENIED,
                    format!(
                        "{p}: a credential-like path (executor.allow_credential_paths allows none)"
                    ),
                ));
            }
        }
        // The repository's environment's programs first, then the executor's.
        let programs = airlock_config::ProgramTable::from_config(&config)
            .for_repository(&a.repository)
            .map_err(|e| Error::with(e.code, format!("repository {}: {e}", a.repository)))?;
        let verification = self.verification(&a, &programs)?;
        // The same token from the same user names the same task; its
        // arguments' digest is the binding's idempotency key, so other
        // arguments under the same token are a conflict.
        let digest = sha256_hex(
            airlock_proto::canonical::to_canonical_string(
                &serde_json::to_value(&a)
                    .map_err(|e| Error::with(Code::INTERNAL, e.to_string()))?,
            )?
            .as_bytes(),
        );
        let uid = self.inner.uid;
        let task_id = match a.idempotency_token.as_deref() {
            Some(token) => {
                input::idempotency_token(token)?;
                let id = sha256_hex(format!("airlock-mcp\0{uid}\0{token}").as_bytes());
                format!("m-{}", &id[..24])
            }
            None => airlock_builder::new_task_id()?,
        };
        // Unique per task (the supervisor refuses a key reused by another
        // task), and a function of the arguments (a replay is recognised).
        let key = sha256_hex(format!("airlock-mcp\0{uid}\0{task_id}\0{digest}").as_bytes());
        let key = format!("mcp-{}", &key[..40]);
        let task_id = Some(task_id);
        let sup = self.supervisor().await?;
        if let (Some(id), Some(_)) = (&task_id, &a.idempotency_token) {
            match sup.get_task(id).await {
                Ok(task) => {
                    self.submitted_by_me(&task)?;
                    if task.binding.idempotency_key != key {
                        return Err(Error::with(
                            Code::TASK_IDEMPOTENCY_CONFLICT,
                            format!("the token was used for task {id} with other arguments"),
                        ));
                    }
                    return Ok(proposed(&task, None, true));
                }
                Err(e) if e.code == Code::TASK_NOT_FOUND => {}
                Err(e) => return Err(e),
            }
        }
        let repo = self.repository(&a.repository)?;
        let mut proposal = Proposal::new(&a.repository, &a.base);
        proposal.task_id = task_id;
        proposal.branch = a.branch.clone();
        proposal.verification = verification;
        if let Some(n) = a.max_attempts {
            proposal.max_attempts = n;
        }
        let write: Vec<(String, String)> = a
            .files
            .iter()
            .flatten()
            .map(|FileContent { path, content }| (path.clone(), content.clone()))
            .collect();
        let link: Vec<(String, String)> = a
            .symlinks
            .iter()
            .flatten()
            .map(|l| (l.path.clone(), l.target.clone()))
            .collect();
        let delete = a.delete.clone().unwrap_or_default();
        let changes = match &a.patch {
            Some(p) => Changes::Patch(p),
            None => Changes::Files {
                write: &write,
                link: &link,
                delete: &delete,
            },
        };
        let mut built = proposal.build(&repo, changes)?;
        built.task["binding"]["idempotency_key"] = json!(key);
        // The supervisor's checks again, on the document as sent.
        airlock_proto::task::TaskSubmission::from_value(&built.task)?;
        let reply = sup.submit_task(&built.task).await?;
        let changes: Vec<Value> = built
            .edits
            .iter()
            .map(|e| json!({"path": e.path(), "change": e.verb()}))
            .collect();
        Ok(proposed(&reply.task, Some(changes), reply.idempotent))
    }

    /// The commands: argv lists as given (a bare program name looked up
    /// in the executor's programs), then the presets by name.
    fn verification(
        &self,
        a: &input::ProposeChange,
        programs: &[PathBuf],
    ) -> Result<Vec<Command>, Error> {
        let mut commands = Vec::new();
        for v in a.verification.iter().flatten() {
            let timeout = v
                .timeout_seconds
                .unwrap_or(airlock_proto::limits::DEFAULT_COMMAND_TIMEOUT_SECONDS);
            let mut argv = v.argv.clone();
            let first = argv.first().cloned().unwrap_or_default();
            if first.is_empty() || first.starts_with('-') {
                return Err(Error::with(
                    Code::COMMAND_INVALID,
                    format!("{first:?} is not a program"),
                ));
            }
            // verify_command resolves the program and checks the timeout.
            let resolved = verify_command(&shell_quote(&first), timeout, programs)?;
            argv[0] = resolved.argv[0].clone();
            let label = label_of(&text::clean(&argv.join(" "), 256).0);
            commands.push(Command {
                label: if label.is_empty() {
                    "command".into()
                } else {
                    label
                },
                argv,
                cwd: ".".into(),
                timeout_seconds: timeout,
            });
        }
        let names = a.presets.clone().unwrap_or_default();
        if !names.is_empty() {
            let presets = self.presets()?;
            for name in names {
                let preset = presets.preset.get(&name).ok_or_else(|| {
                    Error::with(
                        Code::COMMAND_INVALID,
                        format!(
                            "no verification preset {name:?} (configured: {})",
                            presets
                                .preset
                                .keys()
                                .cloned()
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    )
                })?;
                for line in &preset.commands {
                    commands.push(verify_command(line, preset.timeout_seconds, programs)?);
                }
            }
        }
        if commands.is_empty() {
            return Err(Error::with(
                Code::COMMAND_INVALID,
                "no verification: give verification commands or presets",
            ));
        }
        Ok(commands)
    }
}

/// `s` with its shell-significant characters quoted, so one argv element
/// stays one word for [`verify_command`].
fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn proposed(task: &TaskView, changes: Option<Vec<Value>>, idempotent: bool) -> Value {
    json!({
        "task_id": task.task_id,
        "state": task.state.as_str(),
        "repository": task.binding.repository,
        "base_commit": task.binding.base_oid,
        "source_commit": task.binding.expected_branch_oid,
        "target_branch": task.binding.target_branch,
        "changes": changes.unwrap_or_default(),
        "idempotent": idempotent,
        "next_step": "call wait_for_task with this task_id",
    })
}
