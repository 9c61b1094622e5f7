//! Settings drop-ins: `airlock.toml.d/*.toml` beside the main file.
//!
//! systemd's convention: the defaults live in the binaries, the shipped
//! `/etc/airlock/airlock.toml` holds only comments, and an administrator's
//! settings go into drop-ins, so that an upgrade never has a changed
//! configuration file to ask about. The drop-ins are read in name order
//! after the main file; a key a later file sets replaces the earlier
//! value, tables are merged key by key, and `[[repository]]` and
//! `[[agent]]` tables are appended. Each file's shape (unknown keys,
//! types) is checked on its own, so a refusal names the file and line
//! that has the key; the rules between keys are checked on the merged
//! whole and named in the last file that sets the key.
//!
//! [`migrated_settings`] turns an earlier release's edited airlock.toml
//! (which wrote every default out) into such a drop-in: the settings that
//! differ from the built-in defaults, and the repository and agent tables.

use std::path::{Path, PathBuf};

use crate::error::{ConfigError, Location};
use crate::source::Source;
use crate::{Config, drop_in_files, read_config_file};

/// Name of the settings drop-in directory beside the configuration file.
pub const SETTINGS_DIR_NAME: &str = "airlock.toml.d";

/// Arrays of tables a drop-in appends to instead of replacing.
const APPENDED: &[&str] = &["repository", "agent"];

/// The settings drop-in directory of the configuration file at `config`
/// (`/etc/airlock/airlock.toml.d` for the default).
pub fn settings_dir(config: &Path) -> PathBuf {
    config
        .parent()
        .unwrap_or(Path::new("."))
        .join(SETTINGS_DIR_NAME)
}

/// One file of the configuration: its path and text.
struct Layer {
    file: PathBuf,
    text: String,
    table: toml::Table,
}

impl Layer {
    fn read(file: &Path, text: String) -> Result<Layer, ConfigError> {
        // The shape on its own first: unknown keys and wrong types are
        // named in this file, at their line.
        Config::parse_shape(&text, file)?;
        let table = table_of(&text, file)?;
        Ok(Layer {
            file: file.to_owned(),
            text,
            table,
        })
    }

    fn count(&self, array: &str) -> usize {
        self.table
            .get(array)
            .and_then(toml::Value::as_array)
            .map_or(0, Vec::len)
    }
}

/// `text` (of `file`, already through [`Config::parse_shape`] or
/// [`Config::parse`]) as a TOML table.
fn table_of(text: &str, file: &Path) -> Result<toml::Table, ConfigError> {
    text.parse::<toml::Table>()
        .map_err(|e| ConfigError::Syntax {
            file: file.to_owned(),
            at: e.span().map(|s| Location::of_offset(text, s.start)),
            message: e.message().trim().replace('\n', "; "),
        })
}

/// Every file a [`Config::load`] of `config` reads, in order: the file,
/// its settings drop-ins, then its repository drop-ins.
pub fn files_read(config: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let mut files = vec![config.to_path_buf()];
    files.extend(drop_in_files(&settings_dir(config))?);
    files.extend(drop_in_files(&crate::drop_in_dir(config))?);
    Ok(files)
}

/// Parses the main file's `text` with the drop-ins of [`settings_dir`]
/// over it; also returns the drop-ins read.
pub(crate) fn parse_layered(
    path: &Path,
    text: &str,
) -> Result<(Config, Vec<PathBuf>), ConfigError> {
    let files = drop_in_files(&settings_dir(path))?;
    if files.is_empty() {
        return Ok((Config::parse(text, path)?, Vec::new()));
    }
    let mut layers = vec![Layer::read(path, text.to_owned())?];
    for file in &files {
        layers.push(Layer::read(file, read_config_file(file)?)?);
    }
    let mut merged = toml::Table::new();
    for layer in &layers {
        merge(&mut merged, layer.table.clone());
    }
    let merged_text = toml::to_string(&merged).map_err(|e| ConfigError::Unacceptable {
        file: path.to_owned(),
        expected: format!("settings that can be merged with {SETTINGS_DIR_NAME}/ ({e})"),
    })?;
    let config = Config::parse(&merged_text, path).map_err(|e| relocate(e, &layers))?;
    Ok((config, files))
}

/// Merges `over` into `base`: tables key by key, the appended arrays of
/// tables extended, every other value replaced.
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (key, value) in over {
        match (base.get_mut(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (Some(toml::Value::Array(b)), toml::Value::Array(o))
                if APPENDED.contains(&key.as_str()) =>
            {
                b.extend(o)
            }
            (_, value) => {
                base.insert(key, value);
            }
        }
    }
}

/// A refusal of the merged whole, named in the file that set the key:
/// for `repository[N]…` and `agent[N]…` the file whose table is the Nth,
/// for any other key the last file that sets it, and the main file
/// (without a place) for a key no file sets.
fn relocate(err: ConfigError, layers: &[Layer]) -> ConfigError {
    let ConfigError::Key { key, problem, .. } = err else {
        return err;
    };
    let (layer, local_key) = owner(&key, layers);
    let src = Source::new(&layer.file, &layer.text);
    let at = src.location_of(&local_key);
    ConfigError::Key {
        file: layer.file.clone(),
        at,
        key: local_key,
        problem,
    }
}

fn owner<'a>(key: &str, layers: &'a [Layer]) -> (&'a Layer, String) {
    for array in APPENDED {
        let Some(rest) = key.strip_prefix(array).and_then(|r| r.strip_prefix('[')) else {
            continue;
        };
        let Some((index, tail)) = rest.split_once(']') else {
            break;
        };
        let Ok(mut index) = index.parse::<usize>() else {
            break;
        };
        for layer in layers {
            let n = layer.count(array);
            if index < n {
                return (layer, format!("{array}[{index}]{tail}"));
            }
            index -= n;
        }
        break;
    }
    let set_in = |layer: &Layer| {
        let mut value = Some(&layer.table);
        let mut parts = key.split('.').peekable();
        while let Some(part) = parts.next() {
            let Some(v) = value.and_then(|t| t.get(part)) else {
                return false;
            };
            if parts.peek().is_none() {
                return true;
            }
            value = v.as_table();
        }
        false
    };
    let layer = layers
        .iter()
        .rev()
        .find(|l| set_in(l))
        .unwrap_or(&layers[0]);
    (layer, key.to_owned())
}

/// The drop-in an earlier release's airlock.toml (`text`, read from
/// `origin`) becomes: every setting whose value differs from the built-in
/// default, and every `[[repository]]` and `[[agent]]` table, under a
/// header naming where it came from. The text must be a configuration
/// this release accepts; a refusal names `origin`.
pub fn migrated_settings(text: &str, origin: &Path) -> Result<Migrated, ConfigError> {
    let before = Config::parse(text, origin)?;
    let mut table = table_of(text, origin)?;
    let defaults = toml::Table::try_from(Config::embedded_default()).unwrap_or_default();
    let mut kept = Vec::new();
    let mut dropped = 0;
    prune(&mut table, &defaults, "", &mut kept, &mut dropped);
    let body = toml::to_string(&table).map_err(|e| ConfigError::Unacceptable {
        file: origin.to_owned(),
        expected: format!("settings that can be written out again ({e})"),
    })?;
    // What the drop-in holds must mean, over the defaults, what the file
    // meant.
    let after = Config::parse(&body, origin)?;
    if before != after {
        return Err(ConfigError::Unacceptable {
            file: origin.to_owned(),
            expected: "settings whose meaning survives the move into a drop-in (this is a bug in airlockctl config migrate)".to_owned(),
        });
    }
    Ok(Migrated {
        text: body,
        kept,
        defaults_dropped: dropped,
    })
}

/// What [`migrated_settings`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Migrated {
    /// The drop-in's TOML (without a header).
    pub text: String,
    /// The dotted keys kept (the settings that differ from the defaults,
    /// and `repository` / `agent` for their tables).
    pub kept: Vec<String>,
    /// How many keys were dropped for holding their default.
    pub defaults_dropped: usize,
}

fn prune(
    table: &mut toml::Table,
    defaults: &toml::Table,
    prefix: &str,
    kept: &mut Vec<String>,
    dropped: &mut usize,
) {
    let keys: Vec<String> = table.keys().cloned().collect();
    for key in keys {
        let dotted = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if prefix.is_empty() && APPENDED.contains(&key.as_str()) {
            kept.push(dotted);
            continue;
        }
        let default = defaults.get(&key);
        let remove = match (table.get_mut(&key), default) {
            (Some(toml::Value::Table(t)), Some(toml::Value::Table(d))) => {
                prune(t, d, &dotted, kept, dropped);
                t.is_empty()
            }
            (Some(value), Some(default)) if value == default => {
                *dropped += 1;
                true
            }
            _ => {
                kept.push(dotted);
                false
            }
        };
        if remove {
            table.remove(&key);
        }
    }
}
