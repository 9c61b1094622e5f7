//! The executor's file helpers: every generic operation on a directory
//! tree that the tree wing, the dependency layer cache, a setup and a
//! request use — remove, clone, copy, hand over, walk, hash.
//!
//! A leaf: it imports nothing of the crate but its error, so any module
//! may use it without drawing a circle. What knows about an entry, a
//! layer or a workspace lives with that, not here.

use crate::error::{Error, Result};
use rustix::fd::OwnedFd;
use rustix::fs::{Mode, OFlags};
use sha2::{Digest, Sha256};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// A file operation on `path` that failed: the executor's setup error.
pub(crate) fn setup_error(e: impl std::fmt::Display, path: &Path) -> Error {
    Error::Setup {
        path: path.to_owned(),
        detail: e.to_string(),
    }
}

/// Makes the directory `path` (its parent must exist) with `mode`.
pub(crate) fn mkdir(path: &Path, mode: u32) -> Result<()> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(|e| setup_error(e, path))
}

/// Opens the directory `path` (never through a symbolic link) for the
/// `*at` calls beneath it.
pub(crate) fn open_dir(path: &Path) -> Result<OwnedFd> {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| setup_error(std::io::Error::from(e), path))
}

/// Removes a directory tree, making unreadable directories (overlayfs's
/// work directory) readable first; errors are ignored.
pub fn remove_tree(path: &Path) {
    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
        return;
    }
    fn open_up(p: &Path) {
        let Ok(meta) = std::fs::symlink_metadata(p) else {
            return;
        };
        if meta.is_dir() {
            let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
            if let Ok(rd) = std::fs::read_dir(p) {
                for e in rd.flatten() {
                    open_up(&e.path());
                }
            }
        }
    }
    open_up(path);
    let _ = std::fs::remove_dir_all(path);
}

/// Recursively hands a freshly made tree to `uid:gid`, never following a
/// symlink (the tree was just written by the executor itself).
pub fn chown_tree(path: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(path)?;
    std::os::unix::fs::lchown(path, Some(uid), Some(gid))?;
    if meta.is_dir() {
        for entry in std::fs::read_dir(path)? {
            chown_tree(&entry?.path(), uid, gid)?;
        }
    }
    Ok(())
}

/// Calls `f` with every path beneath `dir` and its metadata (links not
/// followed), each directory's entries in name order, a directory after
/// what it holds. The layer digest and the tree cache's stamp walk so.
pub(crate) fn walk(
    dir: &Path,
    f: &mut dyn FnMut(&Path, &std::fs::Metadata) -> Result<()>,
) -> Result<()> {
    let mut names: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| setup_error(e, dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .map_err(|e| setup_error(e, dir))?;
    names.sort();
    for name in names {
        let path = dir.join(name);
        let meta = std::fs::symlink_metadata(&path).map_err(|e| setup_error(e, &path))?;
        if meta.is_dir() {
            walk(&path, f)?;
        }
        f(&path, &meta)?;
    }
    Ok(())
}

/// Copies a cached tree into a fresh workspace (the host view): each file
/// reflinked where the file system can, else copied in the kernel; each
/// symbolic link made again with its target (never followed).
pub(crate) fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    clone_tree(from, to, &mut copy_file)
}

/// Makes `to` a tree of directories (mode 0755) and symbolic links (made
/// again with their targets, never followed) as `from` has them, each
/// regular file made by `file(source, destination)`.
pub(crate) fn clone_tree(
    from: &Path,
    to: &Path,
    file: &mut dyn FnMut(&Path, &Path) -> std::io::Result<()>,
) -> Result<()> {
    mkdir(to, 0o755)?;
    for entry in std::fs::read_dir(from).map_err(|e| setup_error(e, from))? {
        let entry = entry.map_err(|e| setup_error(e, from))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        let ft = entry.file_type().map_err(|e| setup_error(e, &src))?;
        if ft.is_dir() {
            clone_tree(&src, &dst, file)?;
        } else if ft.is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| setup_error(e, &src))?;
            std::os::unix::fs::symlink(&target, &dst).map_err(|e| setup_error(e, &dst))?;
        } else if ft.is_file() {
            file(&src, &dst).map_err(|e| setup_error(e, &src))?;
        }
    }
    Ok(())
}

fn copy_file(src: &Path, dst: &Path) -> std::io::Result<()> {
    let from = std::fs::File::open(src)?;
    let mode = from.metadata()?.permissions().mode() & 0o777;
    let to = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dst)?;
    if rustix::fs::ioctl_ficlone(&to, &from).is_ok() {
        return Ok(());
    }
    let mut from = from;
    let mut to = to;
    std::io::copy(&mut from, &mut to).map(drop)
}

/// Copies `from` into `to` (merging into what is there), symlinks as
/// symlinks: a layer for commands that cannot have it as an overlay.
pub fn copy_into(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to).map_err(|e| setup_error(e, to))?;
    for entry in std::fs::read_dir(from).map_err(|e| setup_error(e, from))? {
        let entry = entry.map_err(|e| setup_error(e, from))?;
        let src = entry.path();
        let dst = to.join(entry.file_name());
        let meta = std::fs::symlink_metadata(&src).map_err(|e| setup_error(e, &src))?;
        if meta.is_dir() {
            copy_into(&src, &dst)?;
        } else if meta.file_type().is_symlink() {
            let target = std::fs::read_link(&src).map_err(|e| setup_error(e, &src))?;
            let _ = std::fs::remove_file(&dst);
            std::os::unix::fs::symlink(&target, &dst).map_err(|e| setup_error(e, &dst))?;
        } else {
            let _ = std::fs::remove_file(&dst);
            std::fs::copy(&src, &dst).map_err(|e| setup_error(e, &dst))?;
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(meta.mode() | 0o200))
                .map_err(|e| setup_error(e, &dst))?;
        }
    }
    Ok(())
}

/// SHA-256 of a file's content, hex.
pub fn file_sha256(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| setup_error(e, path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = f.read(&mut buf).map_err(|e| setup_error(e, path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}
