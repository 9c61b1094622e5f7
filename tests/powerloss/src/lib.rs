//! LazyFS for power-loss tests: a FUSE file system that keeps written
//! data in its own cache until the writer syncs it, and drops everything
//! not yet synced when told to — what a power cut does to the page cache,
//! and what SIGKILL never does.
//!
//! [`LazyFs::mount`] mounts a fresh LazyFS over a directory of its own;
//! [`LazyFs::power_loss`] drops the unsynced data (`lazyfs::clear-cache`
//! on its FIFO). Files keep their names and sizes; their unsynced bytes
//! read back as zeros or are gone, as after a real power loss.
//!
//! The binary comes from `AIRLOCK_LAZYFS`, else `/var/tmp/lazyfs/bin/lazyfs`,
//! else it is built there from `../shared/tools/lazyfs` (what
//! `./scripts/test` does first).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The LazyFS program, built when missing.
pub fn program() -> PathBuf {
    if let Some(p) = std::env::var_os("AIRLOCK_LAZYFS") {
        return PathBuf::from(p);
    }
    let default = PathBuf::from("/var/tmp/lazyfs/bin/lazyfs");
    if default.is_file() {
        return default;
    }
    let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/tools/lazyfs/build.sh");
    let status = Command::new("bash")
        .arg(&build)
        .arg("/var/tmp/lazyfs")
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", build.display()));
    assert!(status.success(), "{} failed", build.display());
    default
}

/// A mounted LazyFS; unmounted when dropped.
#[derive(Debug)]
pub struct LazyFs {
    _dir: tempfile::TempDir,
    mount: PathBuf,
    fifo: PathBuf,
    child: Child,
}

fn mounted(at: &Path) -> bool {
    let target = at.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(target.as_str()))
}

impl LazyFs {
    /// Mounts a new, empty LazyFS (as root: other users may use it, with
    /// the kernel checking modes).
    pub fn mount() -> LazyFs {
        // LazyFS takes `--config-path P` only when P has no "-o" in it,
        // case-blind (it reads such a P as a mount option and falls back to
        // config/default.toml): after "airlock-lazyfs-", one random name in
        // thirty-one began with an o. No '-' in the prefix, none in the
        // random part, so none before any letter.
        let dir = tempfile::Builder::new()
            .prefix("airlock_lazyfs_")
            .tempdir_in("/var/tmp")
            .unwrap();
        let root = dir.path().join("root");
        let mount = dir.path().join("mnt");
        let fifo = dir.path().join("faults.fifo");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&mount).unwrap();
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let config = dir.path().join("lazyfs.toml");
        assert!(
            !config.to_string_lossy().to_lowercase().contains("-o"),
            "LazyFS would not take {} as its configuration",
            config.display()
        );
        std::fs::write(
            &config,
            format!(
                "[faults]\nfifo_path=\"{}\"\n[cache]\napply_eviction=false\n[cache.simple]\ncustom_size=\"2gb\"\nblocks_per_page=1\n[filesystem]\nlog_all_operations=false\nlogfile=\"\"\n",
                fifo.display()
            ),
        )
        .unwrap();
        let log = dir.path().join("lazyfs.log");
        // In the foreground (`-f`): the child is LazyFS itself, so its exit
        // is a failure and dropping this value can stop it. (Without `-f`
        // it forks away once mounted, and the exit of the process started
        // here said nothing.) LazyFS hands libfuse at most ten arguments of
        // its own command line, its name and the mount point among them,
        // and drops the rest without a word (main.cpp, MAX_ARGS): with one
        // `-o` per option, `-f` was the eleventh and LazyFS forked away
        // after all. The options go in one `-o`, so every one is passed.
        let options = format!(
            "allow_other,default_permissions,modules=subdir,subdir={}",
            root.display()
        );
        assert!(
            root.to_str().is_some_and(|r| !r.contains(',')),
            "a comma in {} would split the mount options",
            root.display()
        );
        let spawn = || {
            let err = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .expect("lazyfs log");
            Command::new(program())
                .arg(&mount)
                .arg("--config-path")
                .arg(&config)
                .arg("-o")
                .arg(&options)
                // One request at a time (libfuse's -s). Multi-threaded, LazyFS
                // deadlocked under the power-loss matrix: a write held a
                // cached file's item lock and waited for the cache's lock
                // while an fsync of the same file held the cache's lock and
                // waited for the item (gdb, every FUSE thread in
                // Cache::get_original_inode or Cache::lockItem; every
                // process on the mount in request_wait_answer for 18 min).
                .arg("-s")
                .arg("-f")
                .stdout(Stdio::null())
                .stderr(err)
                .spawn()
                .expect("lazyfs starts")
        };
        // A loaded machine can make LazyFS slow to mount, or make it give
        // up; it is started again (three times at most) rather than the
        // test failing for the harness.
        let mut child = spawn();
        let mut starts = 1;
        let deadline = Instant::now() + Duration::from_secs(90);
        while !mounted(&mount) {
            assert!(
                Instant::now() < deadline,
                "lazyfs did not mount in 90 s ({starts} starts)"
            );
            if let Ok(Some(status)) = child.try_wait() {
                assert!(
                    starts < 3,
                    "lazyfs exited {starts} times before mounting ({status}): {}",
                    String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default())
                );
                child = spawn();
                starts += 1;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        LazyFs {
            _dir: dir,
            mount,
            fifo,
            child,
        }
    }

    /// The mount point: what is written here is lost unless synced.
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// The power loss: every write not yet synced is dropped.
    ///
    /// LazyFS reads its FIFO in its own thread, and two commands written
    /// before it reads them arrive as one line it does not parse. So an
    /// unsynced probe file is written first and one `clear-cache` at a
    /// time is sent until the probe's bytes are gone (sending it again is
    /// harmless: nothing writes meanwhile).
    pub fn power_loss(&self) {
        let probe = self.mount.join(".airlock-power-probe");
        std::fs::write(&probe, b"x").unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        'sent: loop {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .open(&self.fifo)
                .unwrap();
            f.write_all(b"lazyfs::clear-cache\n").unwrap();
            drop(f);
            let resend = Instant::now() + Duration::from_secs(2);
            while std::fs::read(&probe).map(|b| b == b"x").unwrap_or(false) {
                assert!(
                    Instant::now() < deadline,
                    "lazyfs did not clear its cache in 60 s"
                );
                if Instant::now() >= resend {
                    continue 'sent;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            break;
        }
        let _ = std::fs::remove_file(&probe);
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mount)
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
