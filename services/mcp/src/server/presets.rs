//! The verification presets propose_change may name, from the presets
//! file.

use airlock_proto::{Code, Error};
use serde::Deserialize;
use std::collections::BTreeMap;

/// Verification presets: `[preset.NAME] commands = [...]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Presets {
    /// By name.
    #[serde(default)]
    pub preset: BTreeMap<String, Preset>,
}

/// One preset: command lines split like a shell, never run by one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preset {
    /// The command lines, in order.
    pub commands: Vec<String>,
    /// Each command's time limit.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u32,
    /// For humans (and list_repositories).
    #[serde(default)]
    pub description: Option<String>,
}

fn default_timeout() -> u32 {
    airlock_proto::limits::DEFAULT_COMMAND_TIMEOUT_SECONDS
}

impl Presets {
    /// Reads `path`; a missing file is no presets.
    pub fn load(path: &std::path::Path) -> Result<Presets, Error> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| Error::with(Code::CONFIG_INVALID, format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Presets::default()),
            Err(e) => Err(Error::with(
                Code::CONFIG_INVALID,
                format!("{}: {e}", path.display()),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock_builder::verify_command;

    #[test]
    fn the_packaged_presets_parse_and_their_commands_resolve_with_the_default_programs() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../packaging/mcp.toml");
        let presets = Presets::load(&path).unwrap();
        assert!(!presets.preset.is_empty());
        let programs = airlock_config::Config::default().executor.programs;
        for (name, p) in &presets.preset {
            for line in &p.commands {
                verify_command(line, p.timeout_seconds, &programs)
                    .unwrap_or_else(|e| panic!("preset {name}: {line}: {e}"));
            }
        }
    }
    #[test]
    fn an_unknown_key_in_the_presets_is_a_configuration_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mcp.toml");
        std::fs::write(&path, "[preset.x]\ncommands = [\"true\"]\nshell = true\n").unwrap();
        assert_eq!(Presets::load(&path).unwrap_err().code, Code::CONFIG_INVALID);
        assert!(
            Presets::load(&dir.path().join("absent.toml"))
                .unwrap()
                .preset
                .is_empty()
        );
    }
}
