//! The file system as plain data, with no FUSE in it: two tables of inodes,
//! `live` (what every operation changes and every read sees) and `durable`
//! (what a power cut leaves), plus what is pending between them.
//!
//! Errors are `errno` values (`libc::E*`); the FUSE glue passes them on.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{OsStr, OsString};
use std::fmt;
use std::ops::AddAssign;
use std::str::FromStr;
use std::time::SystemTime;

/// An `errno` value.
pub type Errno = i32;
/// A model operation's result.
pub type Result<T> = std::result::Result<T, Errno>;

/// The root directory's inode number (FUSE's).
pub const ROOT: u64 = 1;
/// What a torn write keeps is whole up to a multiple of this.
pub const SECTOR: u64 = 4096;
const NAME_MAX: usize = 255;
/// Files live in memory: a sparse multi-terabyte truncate would abort the
/// test process on allocation, so sizes above this are refused (EFBIG).
pub const MAX_FILE_SIZE: u64 = 1 << 34;

/// What a power cut drops.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// LazyFS's model: only file data not yet fsynced is lost.
    Data,
    /// Also namespace operations whose directory was not fsynced.
    Metadata,
    /// As `Metadata`, but unsynced writes keep their sector-aligned prefix.
    Torn,
}

impl Mode {
    /// The mode that drops the most.
    pub const STRICTEST: Mode = Mode::Torn;

    /// The mode's name, as [`FromStr`] reads it.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Data => "data",
            Mode::Metadata => "metadata",
            Mode::Torn => "torn",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        match s {
            "data" => Ok(Mode::Data),
            "metadata" => Ok(Mode::Metadata),
            "torn" => Ok(Mode::Torn),
            other => Err(format!(
                "unknown power-loss mode {other:?} (expected data, metadata or torn)"
            )),
        }
    }
}

/// What power cuts dropped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cut {
    /// Power cuts counted.
    pub cuts: u64,
    /// Files with unsynced data changes whose contents after the cut differ
    /// from what they were just before it (or that are gone).
    pub files_reverted: u64,
    /// Unsynced writes kept as a sector-aligned prefix (torn mode).
    pub writes_torn: u64,
    /// Namespace operations still pending at the cut (metadata and torn modes).
    pub dir_ops_dropped: u64,
}

impl AddAssign for Cut {
    fn add_assign(&mut self, o: Cut) {
        self.cuts += o.cuts;
        self.files_reverted += o.files_reverted;
        self.writes_torn += o.writes_torn;
        self.dir_ops_dropped += o.dir_ops_dropped;
    }
}

/// An inode's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

/// One inode, in either table.
#[derive(Clone, Debug)]
pub struct Inode {
    pub kind: Kind,
    /// Permission bits, setuid, setgid and sticky included (`0o7777`).
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub rdev: u32,
    pub xattrs: BTreeMap<OsString, Vec<u8>>,
    pub data: Vec<u8>,
    pub entries: BTreeMap<OsString, u64>,
    pub target: OsString,
    /// Directory entries naming this inode (the root counts its mount as one).
    links: u32,
    /// Entries of this directory that name directories.
    subdirs: u32,
    /// A directory's parent, for "..".
    parent: u64,
}

impl Inode {
    fn new(node: &NewNode, now: SystemTime) -> Inode {
        Inode {
            kind: node.kind,
            perm: node.perm & 0o7777,
            uid: node.uid,
            gid: node.gid,
            atime: now,
            mtime: now,
            ctime: now,
            rdev: node.rdev,
            xattrs: BTreeMap::new(),
            data: Vec::new(),
            entries: BTreeMap::new(),
            target: node.target.clone(),
            links: 0,
            subdirs: 0,
            parent: 0,
        }
    }

    /// `st_nlink`: names for a file; 2 + subdirectories for a linked
    /// directory, 0 for a removed one.
    pub fn nlink(&self) -> u32 {
        match self.kind {
            Kind::Dir if self.links == 0 => 0,
            Kind::Dir => 2 + self.subdirs,
            _ => self.links,
        }
    }

    /// `st_size`.
    pub fn size(&self) -> u64 {
        match self.kind {
            Kind::File => self.data.len() as u64,
            Kind::Symlink => self.target.len() as u64,
            Kind::Dir => SECTOR,
            _ => 0,
        }
    }

    /// A copy to insert into a table where nothing names it yet.
    fn detached(&self) -> Inode {
        Inode {
            entries: BTreeMap::new(),
            links: 0,
            subdirs: 0,
            parent: 0,
            ..self.clone()
        }
    }

    /// Everything but contents, entries and link counts.
    fn copy_attrs(&mut self, from: &Inode) {
        self.perm = from.perm;
        self.uid = from.uid;
        self.gid = from.gid;
        self.atime = from.atime;
        self.mtime = from.mtime;
        self.ctime = from.ctime;
        self.rdev = from.rdev;
        self.xattrs.clone_from(&from.xattrs);
        self.target.clone_from(&from.target);
    }
}

/// What to create.
#[derive(Clone, Debug)]
pub struct NewNode {
    pub kind: Kind,
    /// Already masked by the umask.
    pub perm: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    /// A symlink's target; empty otherwise.
    pub target: OsString,
}

/// A time in `setattr`.
#[derive(Clone, Copy, Debug)]
pub enum TimeSet {
    Now,
    At(SystemTime),
}

/// The changes of one `setattr`.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<TimeSet>,
    pub mtime: Option<TimeSet>,
    pub ctime: Option<SystemTime>,
}

/// One entry of a directory listing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    pub kind: Kind,
    pub name: OsString,
}

#[derive(Clone, Debug, Default)]
struct Table {
    inodes: BTreeMap<u64, Inode>,
}

impl Table {
    fn get(&self, ino: u64) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(libc::ENOENT)
    }

    fn get_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(libc::ENOENT)
    }

    fn dir(&self, ino: u64) -> Result<&Inode> {
        let i = self.get(ino)?;
        if i.kind == Kind::Dir {
            Ok(i)
        } else {
            Err(libc::ENOTDIR)
        }
    }

    fn file_mut(&mut self, ino: u64) -> Result<&mut Inode> {
        let i = self.get_mut(ino)?;
        match i.kind {
            Kind::File => Ok(i),
            Kind::Dir => Err(libc::EISDIR),
            _ => Err(libc::EINVAL),
        }
    }

    fn child(&self, dir: u64, name: &OsStr) -> Result<u64> {
        self.dir(dir)?
            .entries
            .get(name)
            .copied()
            .ok_or(libc::ENOENT)
    }

    /// Points `dir/name` at `ino`; returns the inode it named before, if
    /// another one (that inode lost a link).
    fn link_entry(&mut self, dir: u64, name: &OsStr, ino: u64) -> Option<u64> {
        let old = self
            .inodes
            .get_mut(&dir)?
            .entries
            .insert(name.to_owned(), ino);
        if old == Some(ino) {
            return None;
        }
        if let Some(old) = old {
            self.lost_entry(dir, old);
        }
        self.gained_entry(dir, ino);
        old
    }

    fn unlink_entry(&mut self, dir: u64, name: &OsStr) -> Option<u64> {
        let old = self.inodes.get_mut(&dir)?.entries.remove(name)?;
        self.lost_entry(dir, old);
        Some(old)
    }

    fn gained_entry(&mut self, dir: u64, ino: u64) {
        let Some(child) = self.inodes.get_mut(&ino) else {
            return;
        };
        child.links += 1;
        if child.kind == Kind::Dir {
            child.parent = dir;
            if let Some(d) = self.inodes.get_mut(&dir) {
                d.subdirs += 1;
            }
        }
    }

    fn lost_entry(&mut self, dir: u64, ino: u64) {
        let Some(child) = self.inodes.get_mut(&ino) else {
            return;
        };
        child.links = child.links.saturating_sub(1);
        if child.kind == Kind::Dir {
            if let Some(d) = self.inodes.get_mut(&dir) {
                d.subdirs = d.subdirs.saturating_sub(1);
            }
        }
    }

    /// Whether `a` is `d` or one of its ancestors.
    fn is_ancestor(&self, a: u64, mut d: u64) -> bool {
        // Bounded: a corrupt parent chain must not hang the file system.
        for _ in 0..=self.inodes.len() {
            if d == a {
                return true;
            }
            if d == ROOT {
                return false;
            }
            match self.inodes.get(&d) {
                Some(i) => d = i.parent,
                None => return false,
            }
        }
        false
    }

    /// Keeps only what the root reaches, then recounts links from the entries.
    fn drop_unreachable(&mut self) {
        let mut seen = BTreeSet::from([ROOT]);
        let mut todo = vec![ROOT];
        while let Some(d) = todo.pop() {
            let Some(dir) = self.inodes.get(&d) else {
                continue;
            };
            for &c in dir.entries.values() {
                if self.inodes.contains_key(&c) && seen.insert(c) {
                    todo.push(c);
                }
            }
        }
        self.inodes.retain(|ino, _| seen.contains(ino));
        let present: BTreeSet<u64> = self.inodes.keys().copied().collect();
        for i in self.inodes.values_mut() {
            i.entries.retain(|_, c| present.contains(c));
        }
        self.recount();
    }

    fn recount(&mut self) {
        let edges: Vec<(u64, u64)> = self
            .inodes
            .iter()
            .flat_map(|(&d, i)| i.entries.values().map(move |&c| (d, c)))
            .collect();
        for i in self.inodes.values_mut() {
            i.links = 0;
            i.subdirs = 0;
        }
        if let Some(root) = self.inodes.get_mut(&ROOT) {
            root.links = 1;
            root.parent = ROOT;
        }
        for (d, c) in edges {
            self.gained_entry(d, c);
        }
    }
}

#[derive(Clone, Debug)]
enum EntryOp {
    Add { dir: u64, name: OsString, ino: u64 },
    Remove { dir: u64, name: OsString, ino: u64 },
}

/// One namespace operation on its way to `durable`.
#[derive(Clone, Debug)]
struct Record {
    /// The directories it changed: an fsyncdir of any of them commits it.
    dirs: Vec<u64>,
    /// The inodes it links or unlinks: earlier records on the same inodes
    /// commit with it.
    children: Vec<u64>,
    ops: Vec<EntryOp>,
    /// The inode it created, as created.
    created: Option<(u64, Inode)>,
}

/// A torn-mode file's unsynced writes, reduced to what a cut would keep of
/// them: each write's aligned prefix laid over the earlier ones, as
/// non-overlapping ranges (applying the prefixes in write order at the cut
/// gives the same bytes, and memory stays bounded by the file's size).
#[derive(Clone, Debug, Default)]
struct TornLog {
    kept: BTreeMap<u64, Vec<u8>>,
    writes: u64,
}

impl TornLog {
    fn keep(&mut self, start: u64, bytes: &[u8]) {
        let end = start + bytes.len() as u64;
        let hit: Vec<u64> = self
            .kept
            .range(..end)
            .rev()
            .take_while(|(k, v)| *k + v.len() as u64 > start)
            .map(|(k, _)| *k)
            .collect();
        for k in hit {
            let Some(v) = self.kept.remove(&k) else {
                continue;
            };
            let v_end = k + v.len() as u64;
            if k < start {
                self.kept.insert(k, v[..(start - k) as usize].to_vec());
            }
            if v_end > end {
                self.kept.insert(end, v[(end - k) as usize..].to_vec());
            }
        }
        self.kept.insert(start, bytes.to_vec());
        self.writes += 1;
    }
}

/// The whole file system.
#[derive(Debug)]
pub struct Model {
    mode: Mode,
    live: Table,
    durable: Table,
    /// Namespace operations not yet durable, in order (metadata, torn).
    pending: Vec<Record>,
    /// Files whose data changed since their last fsync.
    dirty: BTreeSet<u64>,
    torn: BTreeMap<u64, TornLog>,
    /// Open handles (files and directories): an unlinked inode stays live
    /// until its last one is released.
    opens: HashMap<u64, u64>,
    next_ino: u64,
    totals: Cut,
}

fn check_name(name: &OsStr) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(libc::ENAMETOOLONG);
    }
    if name.is_empty() || name == "." || name == ".." {
        return Err(libc::EINVAL);
    }
    Ok(())
}

fn to_usize(n: u64) -> Result<usize> {
    if n > MAX_FILE_SIZE {
        return Err(libc::EFBIG);
    }
    usize::try_from(n).map_err(|_| libc::EFBIG)
}

fn lay_over(data: &mut Vec<u8>, off: u64, bytes: &[u8]) {
    let (start, end) = (off as usize, off as usize + bytes.len());
    if data.len() < end {
        data.resize(end, 0);
    }
    data[start..end].copy_from_slice(bytes);
}

impl Model {
    /// An empty file system: a root directory (0755) owned by `uid`/`gid`.
    pub fn new(mode: Mode, uid: u32, gid: u32) -> Model {
        let root_node = NewNode {
            kind: Kind::Dir,
            perm: 0o755,
            uid,
            gid,
            rdev: 0,
            target: OsString::new(),
        };
        let mut table = Table::default();
        table
            .inodes
            .insert(ROOT, Inode::new(&root_node, SystemTime::now()));
        table.recount();
        Model {
            mode,
            durable: table.clone(),
            live: table,
            pending: Vec::new(),
            dirty: BTreeSet::new(),
            torn: BTreeMap::new(),
            opens: HashMap::new(),
            next_ino: ROOT + 1,
            totals: Cut::default(),
        }
    }

    pub fn totals(&self) -> Cut {
        self.totals
    }

    /// Live inodes, for statfs.
    pub fn inode_count(&self) -> u64 {
        self.live.inodes.len() as u64
    }

    pub fn get(&self, ino: u64) -> Result<&Inode> {
        self.live.get(ino)
    }

    pub fn lookup(&self, parent: u64, name: &OsStr) -> Result<u64> {
        if name.len() > NAME_MAX {
            return Err(libc::ENAMETOOLONG);
        }
        self.live.child(parent, name)
    }

    /// Sends a namespace operation on its way: at once in data mode, else
    /// into the pending log.
    fn log(&mut self, rec: Record) {
        if self.mode == Mode::Data {
            self.apply(vec![rec]);
        } else {
            self.pending.push(rec);
        }
    }

    /// Applies records to `durable` in order, leniently: entries are added
    /// and removed one by one, whatever else `durable` holds.
    fn apply(&mut self, recs: Vec<Record>) {
        let mut orphans = Vec::new();
        for rec in recs {
            for op in &rec.ops {
                match op {
                    EntryOp::Add { dir, name, ino } => {
                        if !self.durable.inodes.contains_key(ino) {
                            match &rec.created {
                                Some((c, snap)) if c == ino => {
                                    self.durable.inodes.insert(*ino, snap.detached());
                                }
                                _ => continue,
                            }
                        }
                        if !self.durable.inodes.contains_key(dir) {
                            // A directory whose own creation is not durable:
                            // it holds the entry, but nothing reaches it.
                            let Ok(live_dir) = self.live.get(*dir) else {
                                continue;
                            };
                            self.durable.inodes.insert(*dir, live_dir.detached());
                        }
                        orphans.extend(self.durable.link_entry(*dir, name, *ino));
                    }
                    EntryOp::Remove { dir, name, ino } => {
                        let names = self
                            .durable
                            .inodes
                            .get(dir)
                            .and_then(|d| d.entries.get(name));
                        if names == Some(ino) {
                            orphans.extend(self.durable.unlink_entry(*dir, name));
                        }
                    }
                }
            }
            if self.mode == Mode::Data {
                for &ino in rec.dirs.iter().chain(&rec.children) {
                    self.attrs_to_durable(ino);
                }
            }
        }
        // Checked after the whole batch: a rename unlinks before it links.
        // An inode whose last durable name went can never get one back (its
        // later operations would have committed this one first), so its
        // copy would only hold memory until the next cut.
        for ino in orphans {
            if ino != ROOT && self.durable.inodes.get(&ino).is_some_and(|i| i.links == 0) {
                self.durable.inodes.remove(&ino);
            }
        }
    }

    fn attrs_to_durable(&mut self, ino: u64) {
        if let (Some(l), Some(d)) = (
            self.live.inodes.get(&ino),
            self.durable.inodes.get_mut(&ino),
        ) {
            d.copy_attrs(l);
        }
    }

    /// An attribute changed: durable at once in data mode, else at the
    /// inode's next fsync.
    fn attr_changed(&mut self, ino: u64) {
        if self.mode == Mode::Data {
            self.attrs_to_durable(ino);
        }
    }

    fn touch_dir(&mut self, dir: u64, now: SystemTime) {
        if let Some(d) = self.live.inodes.get_mut(&dir) {
            d.mtime = now;
            d.ctime = now;
        }
    }

    /// Drops a live inode nothing names and nobody holds open.
    fn maybe_forget(&mut self, ino: u64) {
        let unused = ino != ROOT
            && self.live.inodes.get(&ino).is_some_and(|i| i.links == 0)
            && self.opens.get(&ino).copied().unwrap_or(0) == 0;
        if unused {
            self.live.inodes.remove(&ino);
            self.dirty.remove(&ino);
            self.torn.remove(&ino);
        }
    }

    /// Creates a file, directory, symlink or special file.
    pub fn create(&mut self, parent: u64, name: &OsStr, node: NewNode) -> Result<u64> {
        check_name(name)?;
        let p = self.live.dir(parent)?;
        if p.entries.contains_key(name) {
            return Err(libc::EEXIST);
        }
        let mut node = node;
        node.perm &= 0o7777;
        if p.perm & libc::S_ISGID != 0 {
            let requested_gid = node.gid;
            node.gid = p.gid;
            if node.kind == Kind::Dir {
                node.perm |= libc::S_ISGID;
            } else if node.gid != requested_gid && node.uid != 0 {
                // As inode_init_owner: no setgid file in a group one may not
                // be in (supplementary groups are not seen here).
                node.perm &= !libc::S_ISGID;
            }
        }
        let now = SystemTime::now();
        let ino = self.next_ino;
        self.next_ino += 1;
        let inode = Inode::new(&node, now);
        self.live.inodes.insert(ino, inode.clone());
        self.live.link_entry(parent, name, ino);
        self.touch_dir(parent, now);
        self.log(Record {
            dirs: vec![parent],
            children: vec![ino],
            ops: vec![EntryOp::Add {
                dir: parent,
                name: name.to_owned(),
                ino,
            }],
            created: Some((ino, inode)),
        });
        Ok(ino)
    }

    pub fn link(&mut self, ino: u64, newparent: u64, newname: &OsStr) -> Result<()> {
        check_name(newname)?;
        if self.live.get(ino)?.kind == Kind::Dir {
            return Err(libc::EPERM);
        }
        if self.live.dir(newparent)?.entries.contains_key(newname) {
            return Err(libc::EEXIST);
        }
        let now = SystemTime::now();
        self.live.link_entry(newparent, newname, ino);
        self.live.get_mut(ino)?.ctime = now;
        self.touch_dir(newparent, now);
        self.log(Record {
            dirs: vec![newparent],
            children: vec![ino],
            ops: vec![EntryOp::Add {
                dir: newparent,
                name: newname.to_owned(),
                ino,
            }],
            created: None,
        });
        Ok(())
    }

    pub fn unlink(&mut self, parent: u64, name: &OsStr) -> Result<()> {
        let ino = self.live.child(parent, name)?;
        if self.live.get(ino)?.kind == Kind::Dir {
            return Err(libc::EISDIR);
        }
        self.remove(parent, name, ino)
    }

    pub fn rmdir(&mut self, parent: u64, name: &OsStr) -> Result<()> {
        let ino = self.live.child(parent, name)?;
        let dir = self.live.dir(ino)?;
        if !dir.entries.is_empty() {
            return Err(libc::ENOTEMPTY);
        }
        self.remove(parent, name, ino)
    }

    fn remove(&mut self, parent: u64, name: &OsStr, ino: u64) -> Result<()> {
        let now = SystemTime::now();
        self.live.unlink_entry(parent, name);
        self.live.get_mut(ino)?.ctime = now;
        self.touch_dir(parent, now);
        self.log(Record {
            dirs: vec![parent],
            children: vec![ino],
            ops: vec![EntryOp::Remove {
                dir: parent,
                name: name.to_owned(),
                ino,
            }],
            created: None,
        });
        self.maybe_forget(ino);
        Ok(())
    }

    /// `renameat2`: `flags` takes `RENAME_NOREPLACE` and `RENAME_EXCHANGE`.
    pub fn rename(
        &mut self,
        parent: u64,
        name: &OsStr,
        newparent: u64,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        let known = libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE;
        if flags & !known != 0 || flags == known {
            return Err(libc::EINVAL);
        }
        check_name(newname)?;
        let src = self.live.child(parent, name)?;
        let dst = self.live.dir(newparent)?.entries.get(newname).copied();
        let src_dir = self.live.get(src)?.kind == Kind::Dir;
        let now = SystemTime::now();
        let dirs = if parent == newparent {
            vec![parent]
        } else {
            vec![parent, newparent]
        };

        if flags & libc::RENAME_EXCHANGE != 0 {
            let dst = dst.ok_or(libc::ENOENT)?;
            if dst == src {
                return Ok(());
            }
            let dst_dir = self.live.get(dst)?.kind == Kind::Dir;
            if (src_dir && self.live.is_ancestor(src, newparent))
                || (dst_dir && self.live.is_ancestor(dst, parent))
            {
                return Err(libc::EINVAL);
            }
            self.live.link_entry(parent, name, dst);
            self.live.link_entry(newparent, newname, src);
            for ino in [src, dst] {
                self.live.get_mut(ino)?.ctime = now;
            }
            self.touch_dir(parent, now);
            self.touch_dir(newparent, now);
            self.log(Record {
                dirs,
                children: vec![src, dst],
                ops: vec![
                    EntryOp::Add {
                        dir: parent,
                        name: name.to_owned(),
                        ino: dst,
                    },
                    EntryOp::Add {
                        dir: newparent,
                        name: newname.to_owned(),
                        ino: src,
                    },
                ],
                created: None,
            });
            return Ok(());
        }

        if let Some(dst) = dst {
            if flags & libc::RENAME_NOREPLACE != 0 {
                return Err(libc::EEXIST);
            }
            if dst == src {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            let d = self.live.get(dst)?;
            match (src_dir, d.kind == Kind::Dir) {
                (true, false) => return Err(libc::ENOTDIR),
                (false, true) => return Err(libc::EISDIR),
                (true, true) if !d.entries.is_empty() => return Err(libc::ENOTEMPTY),
                _ => {}
            }
        }
        if src_dir && self.live.is_ancestor(src, newparent) {
            return Err(libc::EINVAL);
        }
        self.live.unlink_entry(parent, name);
        self.live.link_entry(newparent, newname, src);
        self.live.get_mut(src)?.ctime = now;
        if let Some(dst) = dst {
            if let Ok(d) = self.live.get_mut(dst) {
                d.ctime = now;
            }
        }
        self.touch_dir(parent, now);
        self.touch_dir(newparent, now);
        self.log(Record {
            dirs,
            children: std::iter::once(src).chain(dst).collect(),
            ops: vec![
                EntryOp::Remove {
                    dir: parent,
                    name: name.to_owned(),
                    ino: src,
                },
                EntryOp::Add {
                    dir: newparent,
                    name: newname.to_owned(),
                    ino: src,
                },
            ],
            created: None,
        });
        if let Some(dst) = dst {
            self.maybe_forget(dst);
        }
        Ok(())
    }

    pub fn read(&self, ino: u64, off: u64, size: u32) -> Result<&[u8]> {
        let i = self.live.get(ino)?;
        match i.kind {
            Kind::File => {}
            Kind::Dir => return Err(libc::EISDIR),
            _ => return Err(libc::EINVAL),
        }
        let len = i.data.len() as u64;
        let start = off.min(len) as usize;
        let end = off.saturating_add(u64::from(size)).min(len) as usize;
        Ok(&i.data[start..end])
    }

    pub fn write(&mut self, ino: u64, off: u64, bytes: &[u8]) -> Result<usize> {
        let end = off.checked_add(bytes.len() as u64).ok_or(libc::EFBIG)?;
        to_usize(end)?;
        let now = SystemTime::now();
        let f = self.live.file_mut(ino)?;
        lay_over(&mut f.data, off, bytes);
        f.mtime = now;
        f.ctime = now;
        self.dirty.insert(ino);
        if self.mode == Mode::Torn {
            let kept_end = end / SECTOR * SECTOR;
            if kept_end > off {
                let kept = &bytes[..(kept_end - off) as usize];
                self.torn.entry(ino).or_default().keep(off, kept);
            }
        }
        Ok(bytes.len())
    }

    fn resize(&mut self, ino: u64, size: u64, now: SystemTime) -> Result<()> {
        let size = to_usize(size)?;
        let f = self.live.file_mut(ino)?;
        f.data.resize(size, 0);
        f.mtime = now;
        f.ctime = now;
        self.dirty.insert(ino);
        Ok(())
    }

    pub fn setattr(&mut self, ino: u64, set: &SetAttr) -> Result<()> {
        let now = SystemTime::now();
        self.live.get(ino)?;
        if let Some(size) = set.size {
            self.resize(ino, size, now)?;
        }
        let i = self.live.get_mut(ino)?;
        if let Some(mode) = set.mode {
            i.perm = mode & 0o7777;
        }
        if let Some(uid) = set.uid {
            i.uid = uid;
        }
        if let Some(gid) = set.gid {
            i.gid = gid;
        }
        let at = |t: TimeSet| match t {
            TimeSet::Now => now,
            TimeSet::At(t) => t,
        };
        if let Some(t) = set.atime {
            i.atime = at(t);
        }
        if let Some(t) = set.mtime {
            i.mtime = at(t);
        }
        i.ctime = set.ctime.unwrap_or(now);
        self.attr_changed(ino);
        Ok(())
    }

    /// Mode 0 extends the size; `FALLOC_FL_KEEP_SIZE` alone changes nothing
    /// visible (memory is not reserved ahead here).
    pub fn fallocate(&mut self, ino: u64, off: u64, len: u64, mode: i32) -> Result<()> {
        self.live.file_mut(ino)?;
        match mode {
            0 => {
                let end = off.checked_add(len).ok_or(libc::EFBIG)?;
                if end > self.live.get(ino)?.data.len() as u64 {
                    self.resize(ino, end, SystemTime::now())?;
                }
                Ok(())
            }
            libc::FALLOC_FL_KEEP_SIZE => Ok(()),
            _ => Err(libc::EOPNOTSUPP),
        }
    }

    pub fn readlink(&self, ino: u64) -> Result<&OsStr> {
        let i = self.live.get(ino)?;
        if i.kind == Kind::Symlink {
            Ok(&i.target)
        } else {
            Err(libc::EINVAL)
        }
    }

    pub fn setxattr(&mut self, ino: u64, name: &OsStr, value: &[u8], flags: i32) -> Result<()> {
        let i = self.live.get_mut(ino)?;
        let exists = i.xattrs.contains_key(name);
        if flags & libc::XATTR_CREATE != 0 && exists {
            return Err(libc::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && !exists {
            return Err(libc::ENODATA);
        }
        i.xattrs.insert(name.to_owned(), value.to_vec());
        i.ctime = SystemTime::now();
        self.attr_changed(ino);
        Ok(())
    }

    pub fn getxattr(&self, ino: u64, name: &OsStr) -> Result<&[u8]> {
        let i = self.live.get(ino)?;
        i.xattrs.get(name).map(Vec::as_slice).ok_or(libc::ENODATA)
    }

    /// The names, each followed by a NUL, as listxattr(2) returns them.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.live.get(ino)?;
        let mut out = Vec::new();
        for name in i.xattrs.keys() {
            out.extend_from_slice(name.as_encoded_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&mut self, ino: u64, name: &OsStr) -> Result<()> {
        let i = self.live.get_mut(ino)?;
        i.xattrs.remove(name).ok_or(libc::ENODATA)?;
        i.ctime = SystemTime::now();
        self.attr_changed(ino);
        Ok(())
    }

    pub fn open(&mut self, ino: u64) -> Result<()> {
        self.live.get(ino)?;
        *self.opens.entry(ino).or_default() += 1;
        Ok(())
    }

    pub fn release(&mut self, ino: u64) {
        if let Some(n) = self.opens.get_mut(&ino) {
            *n -= 1;
            if *n == 0 {
                self.opens.remove(&ino);
                self.maybe_forget(ino);
            }
        }
    }

    /// A directory listing with "." and "..", in name order.
    pub fn readdir(&self, ino: u64) -> Result<Vec<DirEntry>> {
        let d = self.live.dir(ino)?;
        let parent = if ino == ROOT { ROOT } else { d.parent };
        let mut out = vec![
            DirEntry {
                ino,
                kind: Kind::Dir,
                name: ".".into(),
            },
            DirEntry {
                ino: parent,
                kind: Kind::Dir,
                name: "..".into(),
            },
        ];
        for (name, &c) in &d.entries {
            if let Some(i) = self.live.inodes.get(&c) {
                out.push(DirEntry {
                    ino: c,
                    kind: i.kind,
                    name: name.clone(),
                });
            }
        }
        Ok(out)
    }

    /// fsync or fdatasync: a directory's is its fsyncdir.
    pub fn fsync(&mut self, ino: u64) -> Result<()> {
        if self.live.get(ino)?.kind == Kind::Dir {
            return self.fsyncdir(ino);
        }
        let live = self.live.get(ino)?;
        match self.durable.inodes.get_mut(&ino) {
            Some(d) => {
                d.copy_attrs(live);
                d.data.clone_from(&live.data);
            }
            // Durable before any durable directory names it: a later commit
            // of its name finds it here, contents and all.
            None => {
                self.durable.inodes.insert(ino, live.detached());
            }
        }
        self.dirty.remove(&ino);
        self.torn.remove(&ino);
        Ok(())
    }

    /// fsyncdir: the directory's attributes, and the pending records that
    /// changed it, with every earlier record on the same child inodes.
    pub fn fsyncdir(&mut self, ino: u64) -> Result<()> {
        let live = self.live.dir(ino)?;
        match self.durable.inodes.get_mut(&ino) {
            Some(d) => d.copy_attrs(live),
            None => {
                self.durable.inodes.insert(ino, live.detached());
            }
        }
        let n = self.pending.len();
        let mut marked: Vec<bool> = self.pending.iter().map(|r| r.dirs.contains(&ino)).collect();
        let mut by_child: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, r) in self.pending.iter().enumerate() {
            for &c in &r.children {
                by_child.entry(c).or_default().push(i);
            }
        }
        // Backwards: a record marked here pulls in earlier ones only, which
        // are visited after it.
        for i in (0..n).rev() {
            if !marked[i] {
                continue;
            }
            for c in &self.pending[i].children {
                for &j in &by_child[c] {
                    if j < i {
                        marked[j] = true;
                    }
                }
            }
        }
        let mut committed = Vec::new();
        let mut kept = Vec::new();
        for (r, m) in std::mem::take(&mut self.pending).into_iter().zip(marked) {
            if m { committed.push(r) } else { kept.push(r) }
        }
        self.pending = kept;
        self.apply(committed);
        Ok(())
    }

    /// The power cut: `live` becomes what `durable` holds.
    pub fn power_loss(&mut self) -> Cut {
        let mut cut = Cut {
            cuts: 1,
            dir_ops_dropped: self.pending.len() as u64,
            ..Cut::default()
        };
        self.pending.clear();
        self.durable.drop_unreachable();
        for (ino, log) in std::mem::take(&mut self.torn) {
            let Some(f) = self.durable.inodes.get_mut(&ino) else {
                continue;
            };
            if f.kind != Kind::File {
                continue;
            }
            for (off, bytes) in &log.kept {
                lay_over(&mut f.data, *off, bytes);
            }
            cut.writes_torn += log.writes;
        }
        for ino in std::mem::take(&mut self.dirty) {
            let Some(before) = self.live.inodes.get(&ino) else {
                continue;
            };
            let kept = self
                .durable
                .inodes
                .get(&ino)
                .is_some_and(|d| d.data == before.data);
            if !kept {
                cut.files_reverted += 1;
            }
        }
        self.live = self.durable.clone();
        self.totals += cut;
        cut
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(kind: Kind, perm: u32) -> NewNode {
        NewNode {
            kind,
            perm,
            uid: 0,
            gid: 0,
            rdev: 0,
            target: OsString::new(),
        }
    }

    fn file(m: &mut Model, dir: u64, name: &str) -> u64 {
        m.create(dir, name.as_ref(), node(Kind::File, 0o644))
            .unwrap()
    }

    fn mkdir(m: &mut Model, dir: u64, name: &str) -> u64 {
        m.create(dir, name.as_ref(), node(Kind::Dir, 0o755))
            .unwrap()
    }

    fn look(m: &Model, dir: u64, name: &str) -> Option<u64> {
        m.lookup(dir, name.as_ref()).ok()
    }

    fn data(m: &Model, ino: u64) -> Vec<u8> {
        m.get(ino).unwrap().data.clone()
    }

    /// Checks `live`'s link counts against a recount from its entries.
    fn assert_consistent(m: &Model) {
        let mut t = m.live.clone();
        t.recount();
        for (ino, i) in &m.live.inodes {
            let r = &t.inodes[ino];
            if i.links > 0 {
                assert_eq!((i.links, i.subdirs), (r.links, r.subdirs), "inode {ino}");
            }
        }
    }

    #[test]
    fn modes_parse_and_print() {
        for m in [Mode::Data, Mode::Metadata, Mode::Torn] {
            assert_eq!(m.as_str().parse::<Mode>(), Ok(m));
        }
        assert!("lazy".parse::<Mode>().is_err());
        assert_eq!(Mode::STRICTEST, Mode::Torn);
    }

    #[test]
    fn data_mode_loses_only_unsynced_data() {
        let mut m = Model::new(Mode::Data, 0, 0);
        let a = file(&mut m, ROOT, "a");
        m.write(a, 0, b"lost").unwrap();
        let b = file(&mut m, ROOT, "b");
        m.write(b, 0, b"kept").unwrap();
        m.fsync(b).unwrap();
        m.rename(ROOT, "b".as_ref(), ROOT, "c".as_ref(), 0).unwrap();
        let d = mkdir(&mut m, ROOT, "d");
        let cut = m.power_loss();
        assert_eq!(
            cut,
            Cut {
                cuts: 1,
                files_reverted: 1,
                writes_torn: 0,
                dir_ops_dropped: 0
            }
        );
        assert_eq!(look(&m, ROOT, "a"), Some(a));
        assert!(data(&m, a).is_empty());
        assert_eq!(look(&m, ROOT, "b"), None);
        assert_eq!(data(&m, look(&m, ROOT, "c").unwrap()), b"kept");
        assert_eq!(look(&m, ROOT, "d"), Some(d));
        assert_consistent(&m);
    }

    #[test]
    fn metadata_rename_needs_its_directory_synced() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let t = file(&mut m, ROOT, "tmp");
        m.write(t, 0, b"v1").unwrap();
        m.fsync(t).unwrap();
        m.fsyncdir(ROOT).unwrap();
        m.rename(ROOT, "tmp".as_ref(), ROOT, "db".as_ref(), 0)
            .unwrap();
        assert_eq!(m.power_loss().dir_ops_dropped, 1);
        assert_eq!(look(&m, ROOT, "db"), None);
        assert_eq!(data(&m, look(&m, ROOT, "tmp").unwrap()), b"v1");

        m.rename(ROOT, "tmp".as_ref(), ROOT, "db".as_ref(), 0)
            .unwrap();
        m.fsyncdir(ROOT).unwrap();
        m.power_loss();
        assert_eq!(look(&m, ROOT, "tmp"), None);
        assert_eq!(data(&m, look(&m, ROOT, "db").unwrap()), b"v1");
    }

    #[test]
    fn metadata_unsynced_create_and_rename_vanish_together() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let t = file(&mut m, ROOT, "tmp");
        m.write(t, 0, b"x").unwrap();
        m.fsync(t).unwrap();
        m.rename(ROOT, "tmp".as_ref(), ROOT, "db".as_ref(), 0)
            .unwrap();
        assert_eq!(m.power_loss().dir_ops_dropped, 2);
        assert_eq!(m.readdir(ROOT).unwrap().len(), 2);
        assert_eq!(m.inode_count(), 1);
    }

    #[test]
    fn metadata_directory_needs_its_parent_synced() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let d = mkdir(&mut m, ROOT, "d");
        let f = file(&mut m, d, "f");
        m.write(f, 0, b"data").unwrap();
        m.fsync(f).unwrap();
        m.fsyncdir(d).unwrap();
        m.power_loss();
        assert_eq!(look(&m, ROOT, "d"), None);

        let d = mkdir(&mut m, ROOT, "d");
        let f = file(&mut m, d, "f");
        m.write(f, 0, b"data").unwrap();
        m.fsync(f).unwrap();
        m.fsyncdir(d).unwrap();
        m.fsyncdir(ROOT).unwrap();
        m.power_loss();
        let d2 = look(&m, ROOT, "d").unwrap();
        assert_eq!(d2, d, "inode numbers survive a cut");
        assert_eq!(data(&m, look(&m, d, "f").unwrap()), b"data");
        assert_eq!(m.get(d).unwrap().nlink(), 2);
        assert_eq!(m.get(ROOT).unwrap().nlink(), 3);
    }

    #[test]
    fn metadata_unlink_comes_back_without_sync() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, b"keep").unwrap();
        m.fsync(f).unwrap();
        m.fsyncdir(ROOT).unwrap();
        m.unlink(ROOT, "f".as_ref()).unwrap();
        assert_eq!(look(&m, ROOT, "f"), None);
        m.power_loss();
        assert_eq!(data(&m, look(&m, ROOT, "f").unwrap()), b"keep");
    }

    #[test]
    fn commit_pulls_in_earlier_records_on_the_same_inode() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let a = mkdir(&mut m, ROOT, "a");
        let b = mkdir(&mut m, ROOT, "b");
        m.fsyncdir(ROOT).unwrap();
        let f = file(&mut m, a, "f");
        m.fsync(f).unwrap();
        // f's creation changed only a; moving it to b and syncing b must
        // bring the creation along, but not an unrelated record in a.
        file(&mut m, a, "other");
        m.rename(a, "f".as_ref(), b, "f".as_ref(), 0).unwrap();
        m.fsyncdir(b).unwrap();
        assert_eq!(m.power_loss().dir_ops_dropped, 1);
        assert_eq!(look(&m, b, "f"), Some(f));
        assert_eq!(look(&m, a, "f"), None);
        assert_eq!(look(&m, a, "other"), None);
        assert_consistent(&m);
    }

    #[test]
    fn torn_write_keeps_its_aligned_prefix() {
        let mut m = Model::new(Mode::Torn, 0, 0);
        let f = file(&mut m, ROOT, "f");
        m.fsync(f).unwrap();
        m.fsyncdir(ROOT).unwrap();
        let bytes: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        m.write(f, 0, &bytes).unwrap();
        let g = file(&mut m, ROOT, "g");
        m.fsyncdir(ROOT).unwrap();
        m.write(g, 0, &[7; 100]).unwrap();
        let cut = m.power_loss();
        assert_eq!(cut.writes_torn, 1);
        assert_eq!(cut.files_reverted, 2);
        assert_eq!(data(&m, f), &bytes[..8192]);
        assert!(data(&m, g).is_empty());
    }

    #[test]
    fn torn_writes_apply_in_order_and_unaligned_starts_count() {
        let mut m = Model::new(Mode::Torn, 0, 0);
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, &[1; 12_288]).unwrap();
        m.fsync(f).unwrap();
        m.fsyncdir(ROOT).unwrap();
        m.write(f, 100, &[2; 5000]).unwrap(); // keeps [100, 4096)
        m.write(f, 4000, &[3; 4192]).unwrap(); // keeps [4000, 8192)
        m.write(f, 12_000, &[4; 200]).unwrap(); // ends in a partial sector: nothing
        m.write(f, 0, &[5; 10]).unwrap(); // nothing
        assert_eq!(m.power_loss().writes_torn, 2);
        let d = data(&m, f);
        assert_eq!(d.len(), 12_288);
        assert!(d[..100].iter().all(|&b| b == 1));
        assert!(d[100..4000].iter().all(|&b| b == 2));
        assert!(d[4000..8192].iter().all(|&b| b == 3));
        assert!(d[8192..].iter().all(|&b| b == 1));
    }

    #[test]
    fn torn_log_ranges_do_not_overlap() {
        let mut log = TornLog::default();
        log.keep(0, &[1; 10]);
        log.keep(20, &[2; 10]);
        log.keep(5, &[3; 20]);
        let got: Vec<(u64, usize)> = log.kept.iter().map(|(k, v)| (*k, v.len())).collect();
        assert_eq!(got, vec![(0, 5), (5, 20), (25, 5)]);
        assert_eq!(log.kept[&25], vec![2; 5]);
    }

    #[test]
    fn rename_errors_and_flags() {
        let mut m = Model::new(Mode::Data, 0, 0);
        let d = mkdir(&mut m, ROOT, "d");
        let e = mkdir(&mut m, ROOT, "e");
        let f = file(&mut m, ROOT, "f");
        let g = file(&mut m, d, "g");
        let r = |m: &mut Model, a: &str, b: &str, fl: u32| {
            m.rename(ROOT, a.as_ref(), ROOT, b.as_ref(), fl)
        };
        assert_eq!(r(&mut m, "e", "d", 0), Err(libc::ENOTEMPTY));
        assert_eq!(r(&mut m, "f", "e", 0), Err(libc::EISDIR));
        assert_eq!(r(&mut m, "e", "f", 0), Err(libc::ENOTDIR));
        assert_eq!(
            r(&mut m, "f", "d", libc::RENAME_NOREPLACE),
            Err(libc::EEXIST)
        );
        assert_eq!(
            r(&mut m, "f", "x", libc::RENAME_WHITEOUT),
            Err(libc::EINVAL)
        );
        assert_eq!(
            m.rename(ROOT, "d".as_ref(), d, "sub".as_ref(), 0),
            Err(libc::EINVAL)
        );
        r(&mut m, "f", "d", libc::RENAME_EXCHANGE).unwrap();
        assert_eq!(look(&m, ROOT, "d"), Some(f));
        assert_eq!(look(&m, ROOT, "f"), Some(d));
        assert_eq!(look(&m, d, "g"), Some(g));
        assert_eq!(m.readdir(d).unwrap()[1].ino, ROOT);
        // A directory over an empty one replaces it.
        r(&mut m, "f", "e", 0).unwrap();
        assert_eq!(look(&m, ROOT, "e"), Some(d));
        assert!(m.get(e).is_err());
        assert_eq!(m.get(ROOT).unwrap().nlink(), 3);
        assert_consistent(&m);
        m.power_loss();
        assert_eq!(look(&m, ROOT, "e"), Some(d));
        assert_eq!(look(&m, d, "g"), Some(g));
    }

    #[test]
    fn rmdir_link_and_unlink_rules() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let d = mkdir(&mut m, ROOT, "d");
        let f = file(&mut m, d, "f");
        assert_eq!(m.rmdir(ROOT, "d".as_ref()), Err(libc::ENOTEMPTY));
        assert_eq!(m.unlink(ROOT, "d".as_ref()), Err(libc::EISDIR));
        assert_eq!(m.link(d, ROOT, "d2".as_ref()), Err(libc::EPERM));
        assert_eq!(m.link(f, d, "f".as_ref()), Err(libc::EEXIST));
        m.link(f, ROOT, "h".as_ref()).unwrap();
        assert_eq!(m.get(f).unwrap().nlink(), 2);
        m.unlink(d, "f".as_ref()).unwrap();
        m.rmdir(ROOT, "d".as_ref()).unwrap();
        assert!(m.get(d).is_err());
        assert_eq!(m.get(f).unwrap().nlink(), 1);
        assert_eq!(m.get(ROOT).unwrap().nlink(), 2);
        assert_consistent(&m);
    }

    #[test]
    fn open_unlinked_file_lives_until_release() {
        let mut m = Model::new(Mode::Data, 0, 0);
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, b"abc").unwrap();
        m.open(f).unwrap();
        m.unlink(ROOT, "f".as_ref()).unwrap();
        assert_eq!(m.read(f, 1, 10).unwrap(), b"bc");
        assert_eq!(m.get(f).unwrap().nlink(), 0);
        m.release(f);
        assert!(m.get(f).is_err());
    }

    #[test]
    fn setgid_directories_pass_their_group_on() {
        let mut m = Model::new(Mode::Data, 0, 0);
        let d = m
            .create(ROOT, "d".as_ref(), node(Kind::Dir, 0o2775))
            .unwrap();
        m.setattr(
            d,
            &SetAttr {
                gid: Some(50),
                ..SetAttr::default()
            },
        )
        .unwrap();
        let user = |kind, perm| NewNode {
            kind,
            perm,
            uid: 1000,
            gid: 1000,
            rdev: 0,
            target: OsString::new(),
        };
        let sub = m.create(d, "sub".as_ref(), user(Kind::Dir, 0o755)).unwrap();
        let f = m.create(d, "f".as_ref(), user(Kind::File, 0o2644)).unwrap();
        assert_eq!(
            (m.get(sub).unwrap().gid, m.get(sub).unwrap().perm),
            (50, 0o2755)
        );
        assert_eq!((m.get(f).unwrap().gid, m.get(f).unwrap().perm), (50, 0o644));
        assert_eq!(m.get(f).unwrap().uid, 1000);
    }

    #[test]
    fn xattrs_follow_their_flags() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let f = file(&mut m, ROOT, "f");
        let n: &OsStr = "user.a".as_ref();
        assert_eq!(
            m.setxattr(f, n, b"1", libc::XATTR_REPLACE),
            Err(libc::ENODATA)
        );
        m.setxattr(f, n, b"1", libc::XATTR_CREATE).unwrap();
        assert_eq!(
            m.setxattr(f, n, b"2", libc::XATTR_CREATE),
            Err(libc::EEXIST)
        );
        m.setxattr(f, n, b"22", libc::XATTR_REPLACE).unwrap();
        m.setxattr(f, "user.b".as_ref(), b"", 0).unwrap();
        assert_eq!(m.getxattr(f, n).unwrap(), b"22");
        assert_eq!(m.listxattr(f).unwrap(), b"user.a\0user.b\0");
        m.removexattr(f, n).unwrap();
        assert_eq!(m.removexattr(f, n), Err(libc::ENODATA));
        assert_eq!(m.getxattr(f, n), Err(libc::ENODATA));
    }

    #[test]
    fn attributes_follow_the_mode() {
        for (mode, kept) in [(Mode::Data, 0o600), (Mode::Metadata, 0o644)] {
            let mut m = Model::new(mode, 0, 0);
            let f = file(&mut m, ROOT, "f");
            m.fsync(f).unwrap();
            m.fsyncdir(ROOT).unwrap();
            m.setattr(
                f,
                &SetAttr {
                    mode: Some(0o600),
                    ..SetAttr::default()
                },
            )
            .unwrap();
            m.power_loss();
            assert_eq!(m.get(f).unwrap().perm, kept, "{mode}");
        }
    }

    #[test]
    fn truncate_and_fallocate_are_data() {
        let mut m = Model::new(Mode::Data, 0, 0);
        let f = file(&mut m, ROOT, "f");
        m.write(f, 0, b"12345").unwrap();
        m.fsync(f).unwrap();
        m.setattr(
            f,
            &SetAttr {
                size: Some(2),
                ..SetAttr::default()
            },
        )
        .unwrap();
        m.fallocate(f, 0, 100, libc::FALLOC_FL_KEEP_SIZE).unwrap();
        assert_eq!(data(&m, f), b"12");
        m.fallocate(f, 0, 10, 0).unwrap();
        assert_eq!(data(&m, f).len(), 10);
        assert_eq!(
            m.fallocate(f, 0, 10, libc::FALLOC_FL_PUNCH_HOLE),
            Err(libc::EOPNOTSUPP)
        );
        assert_eq!(m.power_loss().files_reverted, 1);
        assert_eq!(data(&m, f), b"12345");
    }

    #[test]
    fn inode_numbers_are_never_reused() {
        let mut m = Model::new(Mode::Metadata, 0, 0);
        let a = file(&mut m, ROOT, "a");
        m.power_loss();
        let b = file(&mut m, ROOT, "a");
        assert!(b > a);
    }
}
