//! The FUSE side: each request locks the model, calls it, and replies.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, LockOwner,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};

use crate::model::{self, DirEntry, Inode, Kind, Model, NewNode, SetAttr, TimeSet};

/// Zero: after a cut the kernel must ask again for every name and attribute.
const TTL: Duration = Duration::ZERO;
const BLOCK: u64 = 4096;
const FREE_BLOCKS: u64 = (64 << 30) / BLOCK;
const MAX_INODES: u64 = 1 << 24;

/// The model and the open directory listings, under one lock.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) model: Model,
    /// Listings snapshotted at opendir (and at a rewind), so that offsets
    /// stay stable while entries change.
    listings: HashMap<u64, Vec<DirEntry>>,
    next_fh: u64,
}

impl State {
    pub(crate) fn new(model: Model) -> State {
        State {
            model,
            listings: HashMap::new(),
            next_fh: 1,
        }
    }
}

pub(crate) type Shared = Arc<Mutex<State>>;

pub(crate) fn lock(shared: &Shared) -> MutexGuard<'_, State> {
    // A panic in one request must not wedge every later one (and the test's
    // unmount with them).
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) struct Fs {
    pub(crate) shared: Shared,
}

fn errno(e: model::Errno) -> Errno {
    Errno::from_i32(e)
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn attr(ino: u64, i: &Inode) -> FileAttr {
    let size = i.size();
    FileAttr {
        ino: INodeNo(ino),
        size,
        blocks: size.div_ceil(512),
        atime: i.atime,
        mtime: i.mtime,
        ctime: i.ctime,
        crtime: i.ctime,
        kind: file_type(i.kind),
        perm: (i.perm & 0o7777) as u16,
        nlink: i.nlink(),
        uid: i.uid,
        gid: i.gid,
        rdev: i.rdev,
        blksize: BLOCK as u32,
        flags: 0,
    }
}

fn time_set(t: TimeOrNow) -> TimeSet {
    match t {
        TimeOrNow::Now => TimeSet::Now,
        TimeOrNow::SpecificTime(t) => TimeSet::At(t),
    }
}

impl Fs {
    fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.shared)
    }

    /// Creates `parent/name`, opened too when `open`.
    fn make(
        &self,
        parent: INodeNo,
        name: &OsStr,
        node: NewNode,
        open: bool,
    ) -> Result<FileAttr, Errno> {
        let mut s = self.state();
        let ino = s.model.create(parent.0, name, node).map_err(errno)?;
        if open {
            s.model.open(ino).map_err(errno)?;
        }
        Ok(attr(ino, s.model.get(ino).map_err(errno)?))
    }

    fn entry(&self, ino: u64, reply: ReplyEntry) {
        let s = self.state();
        match s.model.get(ino) {
            Ok(i) => reply.entry(&TTL, &attr(ino, i), Generation(0)),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn reply_attr(&self, ino: u64, reply: ReplyAttr) {
        let s = self.state();
        match s.model.get(ino) {
            Ok(i) => reply.attr(&TTL, &attr(ino, i)),
            Err(e) => reply.error(errno(e)),
        }
    }
}

fn empty(r: model::Result<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(errno(e)),
    }
}

fn node(req: &Request, kind: Kind, mode: u32, umask: u32) -> NewNode {
    NewNode {
        kind,
        perm: mode & !umask & 0o7777,
        uid: req.uid(),
        gid: req.gid(),
        rdev: 0,
        target: Default::default(),
    }
}

fn xattr_reply(value: model::Result<&[u8]>, size: u32, reply: ReplyXattr) {
    match value {
        Err(e) => reply.error(errno(e)),
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(v),
    }
}

// fuser requests FUSE_ASYNC_READ, FUSE_BIG_WRITES and FUSE_MAX_PAGES by
// default, and `init` adds nothing: no FUSE_POSIX_LOCKS or FUSE_FLOCK_LOCKS
// (so the kernel keeps fcntl and flock locks itself, as SQLite needs), no
// writeback cache (every write reaches the model when the writer makes it,
// mmap'd pages at writeback or msync), no FUSE_DO_READDIRPLUS.
impl Filesystem for Fs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let found = self.state().model.lookup(parent.0, name);
        match found {
            Ok(ino) => self.entry(ino, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        self.reply_attr(ino.0, reply);
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_set),
            mtime: mtime.map(time_set),
            ctime,
        };
        let r = self.state().model.setattr(ino.0, &set);
        match r {
            Ok(()) => self.reply_attr(ino.0, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let s = self.state();
        match s.model.readlink(ino.0) {
            Ok(t) => reply.data(t.as_encoded_bytes()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let kind = match mode & libc::S_IFMT {
            libc::S_IFREG | 0 => Kind::File,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return reply.error(Errno::EINVAL),
        };
        let mut n = node(req, kind, mode, umask);
        n.rdev = rdev;
        match self.make(parent, name, n, false) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        match self.make(parent, name, node(req, Kind::Dir, mode, umask), false) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.state().model.unlink(parent.0, name), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.state().model.rmdir(parent.0, name), reply);
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let mut n = node(req, Kind::Symlink, 0o777, 0);
        n.target = target.as_os_str().to_owned();
        match self.make(parent, link_name, n, false) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self
            .state()
            .model
            .rename(parent.0, name, newparent.0, newname, flags.bits());
        empty(r, reply);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let r = self.state().model.link(ino.0, newparent.0, newname);
        match r {
            Ok(()) => self.entry(ino.0, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        // Never FOPEN_KEEP_CACHE: each open drops the kernel's cached pages,
        // which a cut may have made stale.
        match self.state().model.open(ino.0) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let s = self.state();
        match s.model.read(ino.0, offset, size) {
            Ok(d) => reply.data(d),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut s = self.state();
        let mut r = s.model.write(ino.0, offset, data);
        // O_SYNC includes O_DSYNC's bit: either makes the write durable now.
        if r.is_ok() && flags.0 & libc::O_DSYNC != 0 {
            r = s.model.fsync(ino.0).map(|()| data.len());
        }
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.state().model.release(ino.0);
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.state().model.fsync(ino.0), reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let mut s = self.state();
        let listing = match s.model.readdir(ino.0) {
            Ok(l) => l,
            Err(e) => return reply.error(errno(e)),
        };
        if let Err(e) = s.model.open(ino.0) {
            return reply.error(errno(e));
        }
        let fh = s.next_fh;
        s.next_fh += 1;
        s.listings.insert(fh, listing);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let mut s = self.state();
        // Offset 0 is a fresh start (rewinddir): list again.
        if offset == 0 || !s.listings.contains_key(&fh.0) {
            match s.model.readdir(ino.0) {
                Ok(l) => {
                    s.listings.insert(fh.0, l);
                }
                Err(e) => return reply.error(errno(e)),
            }
        }
        let listing = &s.listings[&fh.0];
        for (i, e) in listing.iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(e.ino), i as u64 + 1, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        let mut s = self.state();
        s.listings.remove(&fh.0);
        s.model.release(ino.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        empty(self.state().model.fsyncdir(ino.0), reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let used = self.state().model.inode_count();
        let ffree = MAX_INODES.saturating_sub(used);
        reply.statfs(
            2 * FREE_BLOCKS,
            FREE_BLOCKS,
            FREE_BLOCKS,
            MAX_INODES,
            ffree,
            BLOCK as u32,
            255,
            BLOCK as u32,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        empty(
            self.state().model.setxattr(ino.0, name, value, flags),
            reply,
        );
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let s = self.state();
        xattr_reply(s.model.getxattr(ino.0, name), size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let s = self.state();
        match s.model.listxattr(ino.0) {
            Ok(names) => xattr_reply(Ok(&names), size, reply),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(self.state().model.removexattr(ino.0, name), reply);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        // Not sent under default_permissions: the kernel checks modes.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(parent, name, node(req, Kind::File, mode, umask), true) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        empty(
            self.state().model.fallocate(ino.0, offset, length, mode),
            reply,
        );
    }
}
