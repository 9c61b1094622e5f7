//! The minimal root: the whole filesystem a command can see.
//!
//! Built in two stages. Once per spawner ([`Template::build`], in the
//! spawner's own user and mount namespaces): a small tmpfs becomes the
//! spawner's root (the host moves to `/oldroot`), and in it a command root,
//! `/newroot`, is laid out — the system paths bound read-only (the few
//! small files of /etc copied, a snapshot taken then), a `/dev`
//! holding only `null`, `zero`, `full`, `random` and `urandom`, empty
//! mount points for `/proc`, `/tmp` and the read-write directories — then
//! `/newroot` itself is remounted read-only. A spawner that serves many
//! commands then keeps only the paths it needs (the executor's work root)
//! and detaches the host altogether.
//!
//! Per command ([`Template::enter`], in the command's init, pid 1 of its
//! own pid namespace, in a copy of the spawner's mount namespace): the
//! workspace (a bind, or an overlay of a cached tree and the request's
//! upper directory), a fresh tmpfs on `/tmp`, `/proc` of the new pid
//! namespace; then `pivot_root` into `/newroot` and the old root detached.
//! Nothing else exists in the command's view, so no call — chmod, chown,
//! utime and xattrs included, which Landlock does not govern — can name a
//! file outside it.
//!
//! Nothing is ever created inside a bind of a host path: a mount point
//! that would have to be made there is refused instead.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::statvfs::{FsFlags, statvfs};

use crate::error::{Error, Result};
use crate::policy::{DEVICES_RO, DEVICES_RW, SYSTEM_RO};

/// Where the spawner's view keeps the command root.
pub const NEWROOT: &str = "/newroot";
/// Where the host stays reachable while the template is built (and, for a
/// one-shot spawner such as airlock-confine, afterwards).
pub const OLDROOT: &str = "/oldroot";
/// The executor's workspace in every command's view.
pub const WORKSPACE: &str = "/workspace";

/// Size of the spawner's own tmpfs root: directories, empty mount points
/// and the copies of small /etc files.
const SPAWNER_ROOT_SIZE: &str = "size=16m,nr_inodes=4096,mode=0755";

/// Largest /etc file copied into the template (larger ones are bound).
const ETC_COPY_MAX: u64 = 1 << 20;

/// What the command root holds, decided once.
#[derive(Clone, Debug, Default)]
pub struct TemplateSpec {
    /// Bind [`SYSTEM_RO`] read-only (the paths that exist).
    pub system: bool,
    /// More paths bound read-only at the same place.
    pub ro: Vec<PathBuf>,
    /// Mount points for the read-write directories jobs bind (made empty).
    pub mountpoints: Vec<PathBuf>,
    /// A private tmpfs on /tmp per command (and /dev/shm pointing at it).
    pub tmp: bool,
    /// After building, keep only these host paths (bound at the same place
    /// in the spawner's view) and detach the rest of the host; `None`
    /// keeps the whole host under [`OLDROOT`].
    pub keep: Option<Vec<PathBuf>>,
}

/// The built template, in the spawner's view.
#[derive(Clone, Debug)]
pub struct Template {
    /// System and extra read-only paths present in the command's view.
    pub ro_present: Vec<PathBuf>,
    /// Device files present in the view, read-write.
    pub devices_rw: Vec<PathBuf>,
    /// Device files present in the view, read-only.
    pub devices_ro: Vec<PathBuf>,
    /// Per-command tmpfs on /tmp.
    pub tmp: bool,
    /// The host is kept under [`OLDROOT`] (otherwise only `keep` paths).
    host_kept: bool,
    kept: Vec<PathBuf>,
}

/// A read-write directory for one command: `source` (a host path) appears
/// at `target` in the command's view.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bind {
    /// Host path.
    pub source: PathBuf,
    /// Path in the command's view (a mount point of the template).
    pub target: PathBuf,
}

/// An overlay for one command: `lower` (read-only, e.g. a cached tree)
/// under `upper` (the request's changes, written through), at `target`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Overlay {
    /// Host path of the read-only lower directory.
    pub lower: PathBuf,
    /// More read-only host directories stacked above `lower`, the first
    /// uppermost (a dependency layer's workspace part over the tree).
    #[serde(default)]
    pub layers: Vec<PathBuf>,
    /// Host path of the upper directory.
    pub upper: PathBuf,
    /// Host path of overlayfs's work directory (same file system as upper).
    pub work: PathBuf,
    /// Path in the command's view (a mount point of the template).
    pub target: PathBuf,
}

/// A directory mounted beneath the workspace or /tmp once those are in
/// place (its mount point is made if missing): `source` bound read-write,
/// or, with `copy_on_write`, as the read-only lower layer of an overlay
/// whose changes go to that (upper, work) pair.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Nested {
    /// Host path.
    pub source: PathBuf,
    /// Path in the command's view, beneath a mount point or /tmp.
    pub target: PathBuf,
    /// Host paths of overlayfs's upper and work directories.
    pub copy_on_write: Option<(PathBuf, PathBuf)>,
}

/// What [`Template::enter`] mounted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Entered {
    /// /proc of the command's pid namespace.
    pub proc: bool,
    /// A private tmpfs on /tmp.
    pub tmp: bool,
}

fn mount_err<'a>(
    what: &'static str,
    target: &'a Path,
) -> impl FnOnce(nix::errno::Errno) -> Error + 'a {
    move |e| Error::Mount {
        what,
        target: target.to_owned(),
        source: io::Error::from_raw_os_error(e as i32),
    }
}

fn io_err<'a>(what: &'static str, target: &'a Path) -> impl FnOnce(io::Error) -> Error + 'a {
    move |source| Error::Mount {
        what,
        target: target.to_owned(),
        source,
    }
}

/// `/newroot` + an absolute view path.
fn in_newroot(view: &Path) -> PathBuf {
    let mut p = PathBuf::from(NEWROOT);
    p.extend(
        view.components()
            .filter(|c| matches!(c, Component::Normal(_))),
    );
    p
}

/// [`OLDROOT`] + an absolute host path.
fn in_oldroot(host: &Path) -> PathBuf {
    let mut p = PathBuf::from(OLDROOT);
    p.extend(
        host.components()
            .filter(|c| matches!(c, Component::Normal(_))),
    );
    p
}

/// The flags a bind's remount must keep: in a user namespace the kernel
/// refuses to clear flags it locked on the original mount (read-only,
/// nosuid, nodev, noexec, atime).
fn locked_flags(path: &Path) -> MsFlags {
    let Ok(st) = statvfs(path) else {
        return MsFlags::empty();
    };
    let f = st.flags();
    let mut m = MsFlags::empty();
    for (fs, ms) in [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if f.contains(fs) {
            m |= ms;
        }
    }
    m
}

/// Binds `source` onto `target` (recursively when `rec`), then remounts it
/// with `flags` added to the ones the kernel keeps locked.
fn bind(source: &Path, target: &Path, rec: bool, flags: MsFlags) -> Result<()> {
    let mut f = MsFlags::MS_BIND;
    if rec {
        f |= MsFlags::MS_REC;
    }
    mount(Some(source), target, None::<&str>, f, None::<&str>)
        .map_err(mount_err("bind", target))?;
    let keep = locked_flags(target);
    mount(
        None::<&str>,
        target,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags | keep,
        None::<&str>,
    )
    .map_err(mount_err("remount", target))
}

/// Makes the mount point `rel` (relative to `/newroot`) as a directory or
/// an empty file, creating missing parents in the template's tmpfs only.
fn make_mountpoint(target: &Path, dir: bool, bound: &BTreeSet<PathBuf>) -> Result<()> {
    if fs::symlink_metadata(target).is_ok() {
        return Ok(());
    }
    // Refuse to create anything inside a bind of a host path.
    for ancestor in target.ancestors().skip(1) {
        if bound.contains(ancestor) {
            return Err(Error::Mount {
                what: "mount point",
                target: target.to_owned(),
                source: io::Error::other(format!(
                    "it would have to be created inside {}, a read-only bind of the host",
                    ancestor.display()
                )),
            });
        }
    }
    if let Some(parent) = target.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(io_err("mkdir", parent))?;
    }
    if dir {
        fs::DirBuilder::new()
            .mode(0o755)
            .create(target)
            .map_err(io_err("mkdir", target))
    } else {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(target)
            .map(drop)
            .map_err(io_err("create", target))
    }
}

impl Template {
    /// Builds the template. Must run in a mount namespace of this process's
    /// own (made private), with the right to mount (root, or the creator of
    /// the current user namespace). Afterwards this process's root is the
    /// spawner's tmpfs.
    pub fn build(spec: &TemplateSpec) -> Result<Template> {
        // 1. A tmpfs of our own becomes the root; the host moves to /oldroot.
        let base = Path::new("/tmp");
        mount(
            Some("tmpfs"),
            base,
            Some("tmpfs"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            Some(SPAWNER_ROOT_SIZE),
        )
        .map_err(mount_err("tmpfs", base))?;
        let put_old = base.join("oldroot");
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&put_old)
            .map_err(io_err("mkdir", &put_old))?;
        nix::unistd::pivot_root(base, &put_old).map_err(mount_err("pivot_root", base))?;
        nix::unistd::chdir("/").map_err(mount_err("chdir", Path::new("/")))?;

        // 2. /newroot, a mount of its own so that it can become a root.
        let newroot = Path::new(NEWROOT);
        fs::DirBuilder::new()
            .mode(0o755)
            .create(newroot)
            .map_err(io_err("mkdir", newroot))?;
        mount(
            Some(newroot),
            newroot,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .map_err(mount_err("bind", newroot))?;

        // 3. System paths and extra read-only paths: symlinks recreated
        //    (merged /usr), directories and files bound read-only.
        let mut bound: BTreeSet<PathBuf> = BTreeSet::new();
        let mut ro_present = Vec::new();
        let ro_paths: Vec<PathBuf> = spec
            .system
            .then_some(SYSTEM_RO.iter().map(PathBuf::from))
            .into_iter()
            .flatten()
            .chain(spec.ro.iter().cloned())
            .collect();
        let ro_flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        for host in &ro_paths {
            let source = in_oldroot(host);
            let Ok(meta) = fs::symlink_metadata(&source) else {
                if spec.ro.contains(host) {
                    return Err(Error::LandlockPath {
                        path: host.clone(),
                        source: io::Error::from(io::ErrorKind::NotFound),
                    });
                }
                continue;
            };
            let target = in_newroot(host);
            if meta.file_type().is_symlink() {
                if fs::symlink_metadata(&target).is_err() {
                    let link = fs::read_link(&source).map_err(io_err("readlink", &source))?;
                    if let Some(parent) = target.parent() {
                        make_mountpoint(parent, true, &bound)?;
                    }
                    std::os::unix::fs::symlink(&link, &target)
                        .map_err(io_err("symlink", &target))?;
                }
                ro_present.push(host.clone());
                continue;
            }
            // Small files of /etc are copied, not bound: a snapshot taken
            // at start (fewer mounts to copy into every command's
            // namespace), read-only once the template is.
            if spec.system
                && meta.is_file()
                && meta.len() <= ETC_COPY_MAX
                && host.starts_with("/etc/")
                && !spec.ro.contains(host)
            {
                make_mountpoint(&target, false, &bound)?;
                fs::copy(&source, &target).map_err(io_err("copy", &source))?;
                let _ = fs::set_permissions(
                    &target,
                    std::os::unix::fs::PermissionsExt::from_mode(0o444),
                );
                ro_present.push(host.clone());
                continue;
            }
            make_mountpoint(&target, meta.is_dir(), &bound)?;
            bind(&source, &target, meta.is_dir(), ro_flags)?;
            bound.insert(target);
            ro_present.push(host.clone());
        }
        // One Landlock rule for the template's /etc: it holds only the files
        // and directories above.
        if ro_present.iter().any(|p| p.starts_with("/etc/")) {
            ro_present.retain(|p| !p.starts_with("/etc/"));
            ro_present.push("/etc".into());
        }

        // 4. /dev: the five devices, the descriptor links, /dev/shm -> /tmp.
        let mut devices_rw = Vec::new();
        let mut devices_ro = Vec::new();
        let dev_flags = MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC;
        for (list, out) in [(DEVICES_RW, &mut devices_rw), (DEVICES_RO, &mut devices_ro)] {
            for dev in list {
                let host = Path::new(dev);
                let source = in_oldroot(host);
                if fs::metadata(&source).is_err() {
                    continue;
                }
                let target = in_newroot(host);
                make_mountpoint(&target, false, &bound)?;
                bind(&source, &target, false, dev_flags)?;
                bound.insert(target);
                out.push(host.to_owned());
            }
        }
        let dev = in_newroot(Path::new("/dev"));
        make_mountpoint(&dev, true, &bound)?;
        for (name, link) in [
            ("fd", "/proc/self/fd"),
            ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"),
            ("stderr", "/proc/self/fd/2"),
        ] {
            let p = dev.join(name);
            std::os::unix::fs::symlink(link, &p).map_err(io_err("symlink", &p))?;
        }
        if spec.tmp {
            let p = dev.join("shm");
            std::os::unix::fs::symlink("/tmp", &p).map_err(io_err("symlink", &p))?;
        }

        // 5. Mount points for /proc, /tmp and the jobs' directories.
        for p in ["/proc", "/tmp"] {
            make_mountpoint(&in_newroot(Path::new(p)), true, &bound)?;
        }
        let tmp_dir = in_newroot(Path::new("/tmp"));
        let _ = fs::set_permissions(
            &tmp_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o1777),
        );
        for m in &spec.mountpoints {
            make_mountpoint(&in_newroot(m), true, &bound)?;
        }

        // 6. The command root is read-only from now on: a command cannot
        //    change a mode, a timestamp or an entry of it.
        mount(
            None::<&str>,
            newroot,
            None::<&str>,
            MsFlags::MS_REMOUNT
                | MsFlags::MS_BIND
                | MsFlags::MS_RDONLY
                | MsFlags::MS_NOSUID
                | MsFlags::MS_NODEV,
            None::<&str>,
        )
        .map_err(mount_err("remount read-only", newroot))?;

        // 7. What the spawner keeps of the host.
        let mut template = Template {
            ro_present,
            devices_rw,
            devices_ro,
            tmp: spec.tmp,
            host_kept: spec.keep.is_none(),
            kept: Vec::new(),
        };
        if let Some(keep) = &spec.keep {
            for host in keep {
                let target = PathBuf::from("/").join(host.strip_prefix("/").unwrap_or(host));
                fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(&target)
                    .map_err(io_err("mkdir", &target))?;
                bind(
                    &in_oldroot(host),
                    &target,
                    true,
                    MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                )?;
                template.kept.push(host.clone());
            }
            // The host's /proc stays too: the kernel lets a user namespace
            // mount a fresh /proc (each command's) only where a /proc is
            // already fully visible in the mount namespace. Commands never
            // see it (it is outside /newroot).
            let proc = Path::new("/proc");
            fs::DirBuilder::new()
                .mode(0o555)
                .create(proc)
                .map_err(io_err("mkdir", proc))?;
            bind(
                &in_oldroot(proc),
                proc,
                true,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            )?;
            let old = Path::new(OLDROOT);
            umount2(old, MntFlags::MNT_DETACH).map_err(mount_err("detach", old))?;
            fs::remove_dir(old).map_err(io_err("rmdir", old))?;
        }
        Ok(template)
    }

    /// Where a host path is reachable in the spawner's view, or an error
    /// when the spawner no longer sees it.
    pub fn source(&self, host: &Path) -> Result<PathBuf> {
        if self.host_kept {
            return Ok(in_oldroot(host));
        }
        if self.kept.iter().any(|k| host.starts_with(k)) {
            return Ok(host.to_owned());
        }
        Err(Error::Mount {
            what: "source",
            target: host.to_owned(),
            source: io::Error::other("not within the paths the spawner kept"),
        })
    }

    /// In the command's init (pid 1 of its pid namespace, in its own mount
    /// namespace copied from the spawner's): mounts the job's directories,
    /// a private /tmp and /proc, then makes `/newroot` the root.
    pub fn enter(
        &self,
        binds: &[Bind],
        overlay: Option<&Overlay>,
        nested: &[Nested],
        tmp_size: u64,
    ) -> Result<Entered> {
        let mut entered = Entered::default();
        let rw_flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        for b in binds {
            let target = in_newroot(&b.target);
            bind(&self.source(&b.source)?, &target, false, rw_flags)?;
        }
        if let Some(o) = overlay {
            let target = in_newroot(&o.target);
            let mut lower = String::new();
            for layer in o.layers.iter().chain([&o.lower]) {
                lower.push_str(&overlay_path(&self.source(layer)?)?);
                lower.push(':');
            }
            lower.pop();
            let opts = format!(
                "lowerdir={lower},upperdir={},workdir={},userxattr",
                overlay_path(&self.source(&o.upper)?)?,
                overlay_path(&self.source(&o.work)?)?,
            );
            mount(
                Some("overlay"),
                &target,
                Some("overlay"),
                rw_flags,
                Some(opts.as_str()),
            )
            .map_err(mount_err("overlay", &target))?;
        }
        if self.tmp {
            let target = in_newroot(Path::new("/tmp"));
            let opts = format!("size={tmp_size},mode=1777");
            mount(
                Some("tmpfs"),
                &target,
                Some("tmpfs"),
                rw_flags,
                Some(opts.as_str()),
            )
            .map_err(mount_err("tmpfs", &target))?;
            entered.tmp = true;
        }
        for n in nested {
            let target = in_newroot(&n.target);
            std::fs::create_dir_all(&target).map_err(|e| Error::Mount {
                what: "mount point",
                target: target.clone(),
                source: e,
            })?;
            let source = self.source(&n.source)?;
            match &n.copy_on_write {
                None => bind(&source, &target, false, rw_flags)?,
                Some((upper, work)) => {
                    let opts = format!(
                        "lowerdir={},upperdir={},workdir={},userxattr",
                        overlay_path(&source)?,
                        overlay_path(&self.source(upper)?)?,
                        overlay_path(&self.source(work)?)?,
                    );
                    mount(
                        Some("overlay"),
                        &target,
                        Some("overlay"),
                        rw_flags,
                        Some(opts.as_str()),
                    )
                    .map_err(mount_err("overlay", &target))?;
                }
            }
        }
        let proc = in_newroot(Path::new("/proc"));
        entered.proc = mount(
            Some("proc"),
            &proc,
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        )
        .is_ok();
        // pivot_root(".", "."): the old root ends up on top of the new one
        // and is detached at once; no directory for it is needed.
        let newroot = Path::new(NEWROOT);
        nix::unistd::chdir(newroot).map_err(mount_err("chdir", newroot))?;
        nix::unistd::pivot_root(".", ".").map_err(mount_err("pivot_root", newroot))?;
        umount2(".", MntFlags::MNT_DETACH).map_err(mount_err("detach", Path::new("/")))?;
        nix::unistd::chdir("/").map_err(mount_err("chdir", Path::new("/")))?;
        Ok(entered)
    }
}

/// A path for overlayfs's option string, refused when it holds a character
/// the option syntax gives a meaning (`,` `:` `\` `=`) or is not UTF-8.
fn overlay_path(p: &Path) -> Result<String> {
    let s = p.to_str().filter(|s| {
        !s.bytes()
            .any(|b| matches!(b, b',' | b':' | b'\\' | b'=') || b < 0x20)
    });
    s.map(str::to_owned).ok_or_else(|| Error::Mount {
        what: "overlay",
        target: p.to_owned(),
        source: io::Error::other("path not usable in overlayfs options"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn view_paths_are_joined_component_by_component() {
        assert_eq!(
            in_newroot(Path::new("/usr/bin")),
            Path::new("/newroot/usr/bin")
        );
        assert_eq!(
            in_oldroot(Path::new("/srv/ws")),
            Path::new("/oldroot/srv/ws")
        );
    }

    #[test]
    fn overlay_options_refuse_separators() {
        assert!(overlay_path(Path::new("/work/trees/ab/tree")).is_ok());
        for bad in ["/a,b", "/a:b", "/a\\b", "/a=b", "/a\nb"] {
            assert!(overlay_path(Path::new(bad)).is_err(), "{bad}");
        }
    }
}
