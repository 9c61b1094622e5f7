//! bench-cache: what an executor restart costs with a full tree cache.
//!
//! Fills a tree cache (the executor's own `TreeCache`, in a directory of
//! the disk under `--dir`) with `--entries` trees of `--files` files each
//! (consecutive commits of one generated repository, one file apart, as
//! `git archive` writes them), then measures, median of `--runs`:
//!
//! - **start-up now**: opening the cache (no entry's files are read);
//! - **first request**: start-up and the first use of one entry (checked
//!   against its seal's stamp: a stat of each path);
//! - **first request after a reboot**: start-up and a full hash of that
//!   entry (what its first use costs when the boot id changed);
//! - **the earlier start-up** (the named baseline): opening the cache and
//!   hashing every entry in full, which every start did before the stamp.
//!
//! It also prints the disk the filled entries take (each blob once, as
//! the blob store keeps it) beside what a copy per entry would take.
//!
//! Target: an executor restart with a full cache serves its first request
//! within 1 s. Prints figures; asserts nothing.

use airlock_executor::apply::CredentialPolicy;
use airlock_executor::tree::extract::ArchiveLimits;
use airlock_executor::tree::{CacheLimits, TreeCache};
use airlock_testkit::git_dir_or_empty as git;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The blocks the files under `dir` take: each inode once (as the disk
/// holds them), and as if every path had its own copy.
fn disk_use(dir: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    fn walk(dir: &Path, seen: &mut std::collections::HashSet<(u64, u64)>, out: &mut (u64, u64)) {
        for entry in std::fs::read_dir(dir).expect("read_dir").flatten() {
            let meta = std::fs::symlink_metadata(entry.path()).expect("stat");
            if meta.is_dir() {
                walk(&entry.path(), seen, out);
            } else if meta.is_file() {
                let blocks = meta.blocks() * 512;
                out.1 += blocks;
                if seen.insert((meta.dev(), meta.ino())) {
                    out.0 += blocks;
                }
            }
        }
    }
    let mut out = (0, 0);
    walk(dir, &mut std::collections::HashSet::new(), &mut out);
    out
}

fn median(mut runs: Vec<Duration>) -> f64 {
    runs.sort();
    runs[runs.len() / 2].as_secs_f64() * 1000.0
}

/// A repository with `files` files on main and `entries - 1` commits after
/// it, each changing one file; the trees and their archives, oldest first.
fn sources(dir: &Path, files: usize, entries: usize) -> Vec<(String, Vec<u8>)> {
    let repo = dir.join("source.git");
    let status = Command::new("git")
        .args(["init", "-q", "--bare", "-b", "main"])
        .arg(&repo)
        .status()
        .expect("git init");
    assert!(status.success());
    let mut stream = airlock_testkit::numbered_blobs(files);
    for c in 0..entries {
        let message = format!("commit {c}\n");
        write!(
            stream,
            "commit refs/heads/main\ncommitter bench <bench@airlock.invalid> {} +0000\ndata {}\n{message}",
            1_700_000_000 + c,
            message.len()
        )
        .unwrap();
        if c == 0 {
            airlock_testkit::numbered_paths(&mut stream, files, "");
        } else {
            let content = format!("changed in commit {c}\n");
            writeln!(stream, "M 100644 inline d0000/f000000.txt").unwrap();
            write!(stream, "data {}\n{content}\n", content.len()).unwrap();
        }
    }
    airlock_testkit::fast_import(&repo, &stream);
    (0..entries)
        .rev()
        .map(|back| {
            let rev = format!("main~{back}");
            let tree = git(&repo, &["rev-parse", &format!("{rev}^{{tree}}")]);
            let out = Command::new("git")
                .arg("--git-dir")
                .arg(&repo)
                .args(["archive", "--format=tar", &rev])
                .output()
                .expect("git archive");
            assert!(out.status.success(), "git archive");
            (tree, out.stdout)
        })
        .collect()
}

fn main() {
    let mut entries = 8usize;
    let mut files = 20_000usize;
    let mut runs = 5usize;
    let mut base = PathBuf::from("/var/tmp");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--entries" => entries = value().parse().expect("--entries N"),
            "--files" => files = value().parse().expect("--files N"),
            "--runs" => runs = value().parse().expect("--runs N"),
            "--dir" => base = PathBuf::from(value()),
            _ => {
                println!(
                    "bench-cache [--entries 8] [--files 20000] [--runs 5] [--dir DIR]\n\nAn executor restart with a full tree cache: start-up, the first request\n(one entry checked against its seal's stamp), the first request after a\nreboot (one entry hashed), beside the earlier start-up that hashed every\nentry. Median of --runs; prints figures, asserts nothing."
                );
                return;
            }
        }
    }
    let dir = tempfile::Builder::new()
        .prefix("airlock-bench-cache-")
        .tempdir_in(&base)
        .expect("a directory");
    let limits = CacheLimits {
        max_entries: entries as u32 + 1,
        max_bytes: 1 << 40,
    };
    let archive = ArchiveLimits {
        max_entries: (files as u64) * 2 + 1000,
        max_file_bytes: 1 << 30,
        max_total_bytes: 1 << 40,
        max_expansion_ratio: 1000,
    };
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let trees = sources(dir.path(), files, entries);
    let (cache, _) = TreeCache::open(&work, limits, None).expect("cache");
    let fill_started = Instant::now();
    for (tree, bytes) in &trees {
        cache
            .fill(tree, bytes, &archive, &CredentialPolicy::default())
            .expect("fill");
    }
    let fill = fill_started.elapsed();
    drop(cache);
    let (disk, as_copies) = disk_use(&work.join("trees"));
    let first = &trees[0].0;
    let time = |f: &dyn Fn()| -> f64 {
        median(
            (0..runs)
                .map(|_| {
                    let t = Instant::now();
                    f();
                    t.elapsed()
                })
                .collect(),
        )
    };
    let start = time(&|| {
        let (c, found) = TreeCache::open(&work, limits, None).expect("open");
        assert_eq!(found.kept.len(), entries);
        drop(c);
    });
    let request = time(&|| {
        let (c, _) = TreeCache::open(&work, limits, None).expect("open");
        assert!(c.get(first).is_some(), "an intact entry is served");
    });
    let after_reboot = time(&|| {
        let (c, _) = TreeCache::open(&work, limits, None).expect("open");
        c.verify(first).expect("intact");
    });
    let earlier = time(&|| {
        let (c, _) = TreeCache::open(&work, limits, None).expect("open");
        for (tree, _) in &trees {
            c.verify(tree).expect("intact");
        }
    });
    println!(
        "tree cache: {entries} entries of {files} files ({} files), filled in {:.1} s; median of {runs}",
        entries * files,
        fill.as_secs_f64()
    );
    println!(
        "disk: {:.1} MiB of blocks, each blob once (the blob store), against {:.1} MiB with a copy per entry ({:.2})",
        disk as f64 / 1048576.0,
        as_copies as f64 / 1048576.0,
        disk as f64 / as_copies as f64
    );
    println!("{:<52} {:>10}", "", "ms");
    println!("{:<52} {start:>10.1}", "start-up now (no entry read)");
    let mark = if request <= 1000.0 {
        "  [<= 1 s] met"
    } else {
        "  [<= 1 s] MISSED"
    };
    println!(
        "{:<52} {request:>10.1}{mark}",
        "start-up and first request (stamp check)"
    );
    println!(
        "{:<52} {after_reboot:>10.1}",
        "start-up and first request after a reboot (hash)"
    );
    println!(
        "{:<52} {earlier:>10.1}",
        "earlier start-up: every entry hashed (baseline)"
    );
    println!(
        "first request now ÷ earlier start-up: {:.3}",
        request / earlier
    );
}
