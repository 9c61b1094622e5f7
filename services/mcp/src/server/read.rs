//! The repository readers: list_repositories, resolve_ref, list_files
//! and read_file, each reading the registered repository as the task
//! builder reads it (read-only).

use super::{AirlockMcp, Answer};
use crate::input;
use crate::limits;
use airlock_builder::{Kind, SourceRepo};
use airlock_proto::canonical::sha256_hex;
use airlock_proto::{Code, Error};
use serde_json::{Value, json};

impl AirlockMcp {
    pub(super) fn list_repositories(&self) -> Answer {
        let config = self.config()?;
        let mut repositories = Vec::new();
        for r in config.repositories.iter().take(limits::MAX_REPOSITORIES) {
            let head = SourceRepo::open(&r.path).and_then(|repo| repo.resolve_commit("HEAD"));
            repositories.push(json!({
                "id": r.name,
                "description": r.description,
                "head_commit": head.as_ref().ok(),
                "readable": head.is_ok(),
            }));
        }
        let presets: Vec<Value> = self
            .presets()?
            .preset
            .iter()
            .map(|(name, p)| json!({"name": name, "description": p.description, "commands": p.commands}))
            .collect();
        Ok(json!({
            "repositories": repositories,
            "presets": presets,
            "truncated": config.repositories.len() > limits::MAX_REPOSITORIES,
        }))
    }

    pub(super) fn resolve_ref(&self, a: input::ResolveRef) -> Answer {
        input::revision(&a.reference)?;
        let repo = self.repository(&a.repository)?;
        let commit = repo.resolve_commit(&a.reference)?;
        Ok(json!({"repository": a.repository, "ref": a.reference, "commit": commit}))
    }

    pub(super) fn list_files(&self, a: input::ListFiles) -> Answer {
        input::revision(&a.revision)?;
        let limit = input::size(
            "limit",
            a.limit,
            limits::DEFAULT_FILES_PAGE,
            limits::MAX_FILES_PAGE,
        )?;
        let prefix = match a.prefix.as_deref() {
            None | Some("") => String::new(),
            Some(p) => format!("{}/", input::path(p.trim_end_matches('/'))?),
        };
        if let Some(c) = a.cursor.as_deref() {
            input::path(c)?;
        }
        let repo = self.repository(&a.repository)?;
        let commit = repo.resolve_commit(&a.revision)?;
        let tree = repo.tree(&commit)?;
        let mut entries = tree
            .iter()
            .filter(|(p, _)| p.starts_with(&prefix))
            .filter(|(p, _)| a.cursor.as_deref().is_none_or(|c| p.as_str() > c));
        let mut files = Vec::new();
        let mut last = None;
        for (path, entry) in entries.by_ref().take(limit) {
            files.push(json!({"path": path, "kind": kind_name(entry.kind)}));
            last = Some(path.clone());
        }
        let more = entries.next().is_some();
        Ok(json!({
            "repository": a.repository,
            "commit": commit,
            "files": files,
            "next_cursor": if more { last } else { None },
            "truncated": more,
        }))
    }

    pub(super) fn read_file(&self, a: input::ReadFile) -> Answer {
        input::revision(&a.revision)?;
        input::path(&a.path)?;
        let length = input::size(
            "length",
            a.length,
            limits::DEFAULT_READ_BYTES,
            limits::MAX_READ_BYTES,
        )?;
        let offset = a.offset.unwrap_or(0) as usize;
        let repo = self.repository(&a.repository)?;
        let commit = repo.resolve_commit(&a.revision)?;
        let tree = repo.tree(&commit)?;
        let entry = tree.get(&a.path).ok_or_else(|| {
            Error::with(
                Code::PATH_INVALID,
                format!("{}: no such file at {commit}", a.path),
            )
        })?;
        if !matches!(entry.kind, Kind::File | Kind::Executable) {
            return Err(Error::with(
                Code::PATH_INVALID,
                format!("{}: a {} , not a file", a.path, kind_name(entry.kind)),
            ));
        }
        let bytes = repo.blobs(&[entry.oid.as_str()])?.remove(0);
        let sha256 = sha256_hex(&bytes);
        let size = bytes.len();
        let binary = !airlock_builder::is_text(&bytes);
        if offset > size {
            return Err(Error::with(
                Code::FIELD_BOUNDS_EXCEEDED,
                format!("offset {offset} is past the end ({size} bytes)"),
            ));
        }
        let (content, next) = if binary {
            (None, None)
        } else {
            let text = std::str::from_utf8(&bytes).unwrap_or_default();
            let start = floor_char_boundary(text, offset);
            let end = floor_char_boundary(text, (start + length).min(size));
            let end = if end == start && start < size {
                // A single character longer than `length`: return it whole.
                ceil_char_boundary(text, start + 1)
            } else {
                end
            };
            (
                Some(text[start..end].to_owned()),
                (end < size).then_some(end),
            )
        };
        Ok(json!({
            "repository": a.repository,
            "commit": commit,
            "path": a.path,
            "size": size,
            "sha256": sha256,
            "binary": binary,
            "offset": offset,
            "content": content,
            "next_offset": next,
            "truncated": next.is_some(),
        }))
    }
}

fn kind_name(k: Kind) -> &'static str {
    match k {
        Kind::File => "file",
        Kind::Executable => "executable",
        Kind::Symlink => "symlink",
        Kind::Submodule => "submodule",
    }
}

fn floor_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn ceil_char_boundary(s: &str, mut i: usize) -> usize {
    i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i += 1;
    }
    i
}
