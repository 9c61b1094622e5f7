//! Unified diffs, as `git diff` and coding agents write them, applied in
//! memory to the base.
//!
//! Accepted: `diff --git` sections with their extended headers (new and
//! deleted files, renames and copies) and plain `---`/`+++` diffs; text
//! before the first section (a commit message, `git format-patch`'s mail
//! headers) is skipped. Each hunk must match the base exactly (no fuzz); like
//! `git apply`, a hunk may apply a few lines away from where its header
//! says, as long as its context is identical. A symbolic link (mode
//! 120000) is a one-line file whose content is its target, as git writes
//! it. Refused with their own codes: binary patches, mode changes, a file
//! turned into a link or back, and submodules.

use airlock_proto::{Code, Error};

/// One hunk of one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hunk {
    /// First line of the old side (1-based; 0 for an empty old side).
    pub old_start: usize,
    /// First line of the new side.
    pub new_start: usize,
    /// Lines the hunk expects in the base (context and removed), with
    /// their line endings.
    pub old: Vec<String>,
    /// Lines the hunk leaves (context and added), with their line endings.
    pub new: Vec<String>,
    /// The hunk's line in the patch (1-based), for messages.
    pub patch_line: usize,
    /// The `@@ … @@` header, for messages.
    pub header: String,
}

/// What a patch does to one file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FilePatch {
    /// The path in the base (`None` for a new file).
    pub old_path: Option<String>,
    /// The path afterwards (`None` for a deleted file).
    pub new_path: Option<String>,
    /// True for a copy (the old path stays).
    pub copy: bool,
    /// True when the section is a symbolic link's (mode 120000).
    pub symlink: bool,
    /// Its hunks, in order.
    pub hunks: Vec<Hunk>,
    /// Where the section starts in the patch (1-based).
    pub patch_line: usize,
}

impl FilePatch {
    /// The path the messages name.
    pub fn path(&self) -> &str {
        self.new_path
            .as_deref()
            .or(self.old_path.as_deref())
            .unwrap_or("?")
    }
}

fn invalid(line: usize, why: impl std::fmt::Display) -> Error {
    Error::with(Code::PATCH_INVALID, format!("patch line {line}: {why}"))
}

/// `a/x` or `b/x` → `x`; `/dev/null` → None; a trailing tab and time stamp go.
fn header_path(raw: &str, strip: bool) -> Option<String> {
    let raw = raw.split('\t').next().unwrap_or(raw).trim_end_matches('\r');
    let raw = unquote(raw);
    if raw == "/dev/null" {
        return None;
    }
    let stripped = if strip {
        raw.split_once('/')
            .map(|(_, rest)| rest.to_owned())
            .unwrap_or(raw)
    } else {
        raw
    };
    Some(stripped)
}

/// git quotes paths with unusual bytes in C style: "a/x\tb".
fn unquote(raw: &str) -> String {
    let Some(inner) = raw.strip_prefix('"').and_then(|r| r.strip_suffix('"')) else {
        return raw.to_owned();
    };
    let mut bytes = Vec::new();
    let mut chars = inner.bytes().peekable();
    while let Some(b) = chars.next() {
        if b != b'\\' {
            bytes.push(b);
            continue;
        }
        match chars.next() {
            Some(b'n') => bytes.push(b'\n'),
            Some(b't') => bytes.push(b'\t'),
            Some(b'"') => bytes.push(b'"'),
            Some(b'\\') => bytes.push(b'\\'),
            Some(d @ b'0'..=b'7') => {
                let mut v = u32::from(d - b'0');
                for _ in 0..2 {
                    if let Some(n @ b'0'..=b'7') = chars.peek().copied() {
                        v = v * 8 + u32::from(n - b'0');
                        chars.next();
                    }
                }
                bytes.push(v as u8);
            }
            Some(other) => bytes.push(other),
            None => {}
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn parse_range(s: &str, line: usize) -> Result<(usize, usize), Error> {
    let (start, len) = match s.split_once(',') {
        Some((a, b)) => (a, b),
        None => (s, "1"),
    };
    let p = |x: &str| {
        x.parse::<usize>()
            .map_err(|_| invalid(line, format!("bad hunk range {s:?}")))
    };
    Ok((p(start)?, p(len)?))
}

/// A symbolic link's git mode.
const SYMLINK_MODE: &str = "120000";

fn mode_refusal(mode: &str, path: &str, line: usize) -> Option<Error> {
    match mode.trim() {
        "100644" | "100664" => None,
        "100755" => Some(Error::with(
            Code::PROPOSAL_MODE_CHANGE,
            format!("{path}: the patch makes an executable file (patch line {line})"),
        )),
        SYMLINK_MODE => None,
        "160000" => Some(Error::with(
            Code::PROPOSAL_SYMLINK_CHANGE,
            format!("{path}: the patch touches a submodule (patch line {line})"),
        )),
        other => Some(invalid(line, format!("unknown file mode {other:?}"))),
    }
}

/// Parses a unified diff into its file sections.
pub fn parse(text: &str) -> Result<Vec<FilePatch>, Error> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut files: Vec<FilePatch> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i].trim_end_matches(['\n', '\r']);
        let n = i + 1;
        if let Some(rest) = line.strip_prefix("diff --git ") {
            i = git_section(&lines, i, rest, &mut files)?;
        } else if line.starts_with("--- ")
            && lines.get(i + 1).is_some_and(|l| l.starts_with("+++ "))
        {
            let old = header_path(&line[4..], line[4..].starts_with("a/"));
            let plus = lines[i + 1].trim_end_matches(['\n', '\r']);
            let new = header_path(&plus[4..], plus[4..].starts_with("b/"));
            let mut file = FilePatch {
                old_path: old,
                new_path: new,
                copy: false,
                symlink: false,
                hunks: Vec::new(),
                patch_line: n,
            };
            i = hunks(&lines, i + 2, &mut file)?;
            files.push(file);
        } else if line.starts_with("@@ ") {
            return Err(invalid(n, "a hunk outside any file section"));
        } else {
            i += 1;
        }
    }
    if files.is_empty() {
        return Err(invalid(
            1,
            "no file sections (expected `diff --git` or `---`/`+++` lines)",
        ));
    }
    Ok(files)
}

/// One `diff --git` section starting at `lines[start]`; returns the index after it.
fn git_section(
    lines: &[&str],
    start: usize,
    names: &str,
    files: &mut Vec<FilePatch>,
) -> Result<usize, Error> {
    let n = start + 1;
    // "a/x b/x": without renames both halves name the same path.
    let names = names.trim_end_matches(['\n', '\r']);
    let guess = names
        .strip_prefix("a/")
        .and_then(|r| r.split_once(" b/"))
        .map(|(a, b)| (a.to_owned(), b.to_owned()));
    let mut file = FilePatch {
        old_path: guess.as_ref().map(|g| g.0.clone()),
        new_path: guess.as_ref().map(|g| g.1.clone()),
        copy: false,
        symlink: false,
        hunks: Vec::new(),
        patch_line: n,
    };
    let mut old_mode: Option<String> = None;
    let mut i = start + 1;
    while i < lines.len() {
        let line = lines[i].trim_end_matches(['\n', '\r']);
        let ln = i + 1;
        let path = file.path().to_owned();
        if line.starts_with("diff --git ") || line.starts_with("@@ ") {
            break;
        } else if let Some(m) = line.strip_prefix("old mode ") {
            old_mode = Some(m.to_owned());
        } else if let Some(m) = line.strip_prefix("new mode ") {
            if let Some(e) = mode_refusal(m, &path, ln) {
                return Err(e);
            }
            let old = old_mode.as_deref().map(str::trim);
            if old != Some(m.trim()) && (old == Some(SYMLINK_MODE) || m.trim() == SYMLINK_MODE) {
                return Err(Error::with(
                    Code::PROPOSAL_SYMLINK_CHANGE,
                    format!(
                        "{path}: the patch turns a file into a symbolic link or back (patch line {ln})"
                    ),
                ));
            }
            file.symlink |= m.trim() == SYMLINK_MODE;
            if old_mode.as_deref().map(str::trim) != Some(m.trim()) {
                if let Some(e) = old_mode.as_deref().and_then(|o| mode_refusal(o, &path, ln)) {
                    return Err(e);
                }
                return Err(Error::with(
                    Code::PROPOSAL_MODE_CHANGE,
                    format!("{path}: the patch changes the file's mode (patch line {ln})"),
                ));
            }
        } else if let Some(m) = line.strip_prefix("new file mode ") {
            if let Some(e) = mode_refusal(m, &path, ln) {
                return Err(e);
            }
            file.symlink |= m.trim() == SYMLINK_MODE;
            file.old_path = None;
        } else if let Some(m) = line.strip_prefix("deleted file mode ") {
            if let Some(e) = mode_refusal(m, &path, ln) {
                if e.code != Code::PROPOSAL_MODE_CHANGE {
                    return Err(e);
                }
            }
            file.symlink |= m.trim() == SYMLINK_MODE;
            file.new_path = None;
        } else if let Some(p) = line.strip_prefix("index ") {
            if let Some(m) = p.split(' ').nth(1) {
                if let Some(e) = mode_refusal(m, &path, ln) {
                    if e.code != Code::PROPOSAL_MODE_CHANGE {
                        return Err(e);
                    }
                }
                file.symlink |= m.trim() == SYMLINK_MODE;
            }
        } else if let Some(p) = line
            .strip_prefix("rename from ")
            .or_else(|| line.strip_prefix("copy from "))
        {
            file.old_path = Some(unquote(p));
            file.copy = line.starts_with("copy");
        } else if let Some(p) = line
            .strip_prefix("rename to ")
            .or_else(|| line.strip_prefix("copy to "))
        {
            file.new_path = Some(unquote(p));
        } else if line.starts_with("Binary files ") || line == "GIT binary patch" {
            return Err(Error::with(
                Code::PROPOSAL_BINARY_CHANGE,
                format!("{path}: the patch changes a binary file (patch line {ln})"),
            ));
        } else if let Some(minus) = line.strip_prefix("--- ") {
            let plus = lines
                .get(i + 1)
                .map(|l| l.trim_end_matches(['\n', '\r']))
                .and_then(|l| l.strip_prefix("+++ "));
            let Some(plus) = plus else {
                return Err(invalid(ln, "`---` without `+++`"));
            };
            file.old_path = header_path(minus, true);
            file.new_path = header_path(plus, true);
            i += 1;
        } else if line.starts_with("similarity index")
            || line.starts_with("dissimilarity index")
            || line.is_empty()
        {
        } else {
            // Anything else ends the header (e.g. the next mail's text).
            break;
        }
        i += 1;
    }
    if file.old_path.is_none() && file.new_path.is_none() {
        return Err(invalid(n, "cannot tell which file this section changes"));
    }
    let i = hunks(lines, i, &mut file)?;
    files.push(file);
    Ok(i)
}

/// The hunks from `lines[start]` on; returns the index after the last.
fn hunks(lines: &[&str], start: usize, file: &mut FilePatch) -> Result<usize, Error> {
    let mut i = start;
    while i < lines.len() && lines[i].starts_with("@@ ") {
        let header_line = lines[i].trim_end_matches(['\n', '\r']);
        let ln = i + 1;
        let inner = header_line
            .strip_prefix("@@ -")
            .and_then(|r| r.split_once(" @@"))
            .map(|(r, _)| r)
            .ok_or_else(|| invalid(ln, "malformed hunk header"))?;
        let (old_r, new_r) = inner
            .split_once(" +")
            .ok_or_else(|| invalid(ln, "malformed hunk header"))?;
        let (old_start, old_len) = parse_range(old_r, ln)?;
        let (new_start, new_len) = parse_range(new_r, ln)?;
        let mut hunk = Hunk {
            old_start,
            new_start,
            old: Vec::new(),
            new: Vec::new(),
            patch_line: ln,
            header: header_line
                .split(" @@")
                .next()
                .map(|h| format!("{h} @@"))
                .unwrap_or_default(),
        };
        i += 1;
        let (mut old_seen, mut new_seen) = (0, 0);
        while old_seen < old_len || new_seen < new_len {
            let Some(raw) = lines.get(i) else {
                return Err(invalid(ln, format!("{}: the hunk ends early", file.path())));
            };
            // Some tools drop the space of an empty context line.
            let raw = if *raw == "\n" || *raw == "\r\n" {
                " \n"
            } else {
                raw
            };
            let (tag, body) = raw.split_at(1);
            let body = body.to_owned();
            match tag {
                " " => {
                    hunk.old.push(body.clone());
                    hunk.new.push(body);
                    old_seen += 1;
                    new_seen += 1;
                }
                "-" => {
                    hunk.old.push(body);
                    old_seen += 1;
                }
                "+" => {
                    hunk.new.push(body);
                    new_seen += 1;
                }
                "\\" => {}
                _ => {
                    return Err(invalid(
                        i + 1,
                        format!("{}: unexpected line in a hunk", file.path()),
                    ));
                }
            }
            if old_seen > old_len || new_seen > new_len {
                return Err(invalid(
                    i + 1,
                    format!("{}: the hunk is longer than its header says", file.path()),
                ));
            }
            i += 1;
            no_newline(lines, &mut i, tag, &mut hunk);
        }
        file.hunks.push(hunk);
    }
    Ok(i)
}

/// `\ No newline at end of file` after a line: that line has no `\n`.
fn no_newline(lines: &[&str], i: &mut usize, tag: &str, hunk: &mut Hunk) {
    if lines.get(*i).is_some_and(|l| l.starts_with('\\')) {
        let strip = |v: &mut Vec<String>| {
            if let Some(last) = v.last_mut() {
                if last.ends_with('\n') {
                    last.pop();
                }
            }
        };
        match tag {
            "-" => strip(&mut hunk.old),
            "+" => strip(&mut hunk.new),
            _ => {
                strip(&mut hunk.old);
                strip(&mut hunk.new);
            }
        }
        *i += 1;
    }
}

/// How far from its stated line a hunk may be found.
const MAX_OFFSET: usize = 1000;

/// Applies `file`'s hunks to `base` (empty for a new file).
pub fn apply(file: &FilePatch, base: &str) -> Result<String, Error> {
    let lines: Vec<&str> = base.split_inclusive('\n').collect();
    let mut out = String::with_capacity(base.len());
    let mut pos = 0; // next unconsumed base line
    let mut drift: isize = 0; // where hunks were found relative to their headers
    for hunk in &file.hunks {
        let stated = hunk.old_start.saturating_sub(1) as isize + drift;
        let stated = if hunk.old.is_empty() && hunk.old_start > 0 {
            // An insertion "after line N".
            stated + 1
        } else {
            stated
        }
        .max(pos as isize) as usize;
        let fits = |at: usize| {
            at + hunk.old.len() <= lines.len()
                && hunk.old.iter().zip(&lines[at..]).all(|(a, b)| a == b)
        };
        let found = (0..=MAX_OFFSET.min(lines.len())).find_map(|d| {
            [stated.checked_add(d), stated.checked_sub(d)]
                .into_iter()
                .flatten()
                .find(|&at| at >= pos && fits(at))
        });
        let Some(at) = found else {
            return Err(Error::with(
                Code::PATCH_HUNK_FAILED,
                format!(
                    "{}: hunk {} (patch line {}) does not apply at line {} of the base",
                    file.path(),
                    hunk.header,
                    hunk.patch_line,
                    hunk.old_start
                ),
            ));
        };
        drift = at as isize - hunk.old_start.saturating_sub(1) as isize;
        for l in &lines[pos..at] {
            out.push_str(l);
        }
        for l in &hunk.new {
            out.push_str(l);
        }
        pos = at + hunk.old.len();
    }
    for l in &lines[pos..] {
        out.push_str(l);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "one\ntwo\nthree\nfour\nfive\n";

    #[test]
    fn a_git_diff_applies() {
        let patch = "diff --git a/x.txt b/x.txt\nindex 1111111..2222222 100644\n--- a/x.txt\n+++ b/x.txt\n@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n";
        let files = parse(patch).unwrap();
        assert_eq!(files.len(), 1);
        assert_eq!(files[0].old_path.as_deref(), Some("x.txt"));
        assert_eq!(
            apply(&files[0], BASE).unwrap(),
            "one\ntwo\nTHREE\nfour\nfive\n"
        );
    }

    #[test]
    fn a_hunk_a_few_lines_off_still_applies_but_a_wrong_one_names_file_and_line() {
        let moved = "--- a/x.txt\n+++ b/x.txt\n@@ -1,2 +1,2 @@\n four\n-five\n+5\n";
        let f = &parse(moved).unwrap()[0];
        assert_eq!(apply(f, BASE).unwrap(), "one\ntwo\nthree\nfour\n5\n");
        let wrong = "--- a/x.txt\n+++ b/x.txt\n@@ -3,1 +3,1 @@\n-drei\n+3\n";
        let e = apply(&parse(wrong).unwrap()[0], BASE).unwrap_err();
        assert_eq!(e.code, Code::PATCH_HUNK_FAILED);
        let d = e.detail.unwrap();
        assert!(
            d.contains("x.txt") && d.contains("line 3") && d.contains("patch line 3"),
            "{d}"
        );
    }

    #[test]
    fn new_deleted_renamed_and_no_newline_files() {
        let patch = "From abc Mon Sep 17 00:00:00 2001\nSubject: x\n\n---\ndiff --git a/new.py b/new.py\nnew file mode 100644\nindex 0000000..1111111\n--- /dev/null\n+++ b/new.py\n@@ -0,0 +1,2 @@\n+a\n+b\n\\ No newline at end of file\ndiff --git a/old.py b/old.py\ndeleted file mode 100644\nindex 1111111..0000000\n--- a/old.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-x\ndiff --git a/m.py b/n.py\nsimilarity index 100%\nrename from m.py\nrename to n.py\n-- \n2.39.5\n";
        let files = parse(patch).unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[0].old_path, None);
        assert_eq!(apply(&files[0], "").unwrap(), "a\nb");
        assert_eq!(files[1].new_path, None);
        assert_eq!(files[2].old_path.as_deref(), Some("m.py"));
        assert_eq!(files[2].new_path.as_deref(), Some("n.py"));
        assert!(files[2].hunks.is_empty());
    }

    #[test]
    fn a_links_section_is_its_target_as_one_line() {
        let patch = "diff --git a/l b/l\nnew file mode 120000\nindex 0000000..1111111\n--- /dev/null\n+++ b/l\n@@ -0,0 +1 @@\n+docs/README\n\\ No newline at end of file\ndiff --git a/m b/m\nindex 1111111..2222222 120000\n--- a/m\n+++ b/m\n@@ -1 +1 @@\n-old\n\\ No newline at end of file\n+new\n\\ No newline at end of file\n";
        let files = parse(patch).unwrap();
        assert!(files[0].symlink && files[1].symlink);
        assert_eq!(apply(&files[0], "").unwrap(), "docs/README");
        assert_eq!(apply(&files[1], "old").unwrap(), "new");
    }

    #[test]
    fn modes_links_and_binaries_are_refused_with_their_codes() {
        let code = |p: &str| parse(p).unwrap_err().code;
        assert_eq!(
            code("diff --git a/run.sh b/run.sh\nold mode 100644\nnew mode 100755\n"),
            Code::PROPOSAL_MODE_CHANGE
        );
        assert_eq!(
            code(
                "diff --git a/run.sh b/run.sh\nnew file mode 100755\n--- /dev/null\n+++ b/run.sh\n@@ -0,0 +1 @@\n+x\n"
            ),
            Code::PROPOSAL_MODE_CHANGE
        );
        assert_eq!(
            code("diff --git a/l b/l\nold mode 100644\nnew mode 120000\n"),
            Code::PROPOSAL_SYMLINK_CHANGE
        );
        assert_eq!(
            code("diff --git a/s b/s\nnew file mode 160000\nindex 0000000..1111111\n"),
            Code::PROPOSAL_SYMLINK_CHANGE
        );
        assert_eq!(
            code(
                "diff --git a/i.png b/i.png\nindex 1..2 100644\nBinary files a/i.png and b/i.png differ\n"
            ),
            Code::PROPOSAL_BINARY_CHANGE
        );
        assert_eq!(code("hello\n"), Code::PATCH_INVALID);
        assert_eq!(
            code("--- a/x\n+++ b/x\n@@ -1,3 +1,3 @@\n a\n-b\n"),
            Code::PATCH_INVALID
        );
    }

    #[test]
    fn quoted_paths_are_unquoted() {
        assert_eq!(unquote("\"a/x\\ty\""), "a/x\ty");
        assert_eq!(unquote("\"caf\\303\\251\""), "café");
        assert_eq!(
            header_path("b/src/x.py\t2024-01-01", true).as_deref(),
            Some("src/x.py")
        );
    }
}
