//! airlock-confine: confine this process, then execute a command.
//!
//! A thin shell around [`airlock_sandbox::run`]: parse, sanitise the
//! inherited descriptors, open the report sink, run, report, exit with the
//! command's status. See `airlock-confine --help` or airlock-confine(1).

#![deny(unsafe_op_in_unsafe_fn)]

mod cli;

use std::fs::File;
use std::io::Write;
use std::os::fd::FromRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::process::exit;

use clap::Parser;

use cli::Cli;

/// Exit status for the helper's own failures.
const EXIT_FAILURE: i32 = 125;

fn main() {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            exit(if e.use_stderr() { EXIT_FAILURE } else { 0 });
        }
    };
    if cli.print_man {
        let _ = std::io::stdout().write_all(&cli::man_page());
        exit(0);
    }
    // Hygiene first: no inherited descriptor but stdio and the report fd.
    if let Err(e) = airlock_sandbox::fds::close_inherited(cli.report_fd.as_slice()) {
        fail(&e.to_string());
    }
    let mut sink = match open_sink(&cli) {
        Ok(sink) => sink,
        Err(e) => fail(&format!("cannot open the report: {e}")),
    };
    let policy = match cli.to_policy() {
        Ok(p) => p,
        Err(e) => fail(&format!("invalid path: {e}")),
    };
    let report = airlock_sandbox::run(&policy, &cli.command);
    if let Some(sink) = sink.as_mut() {
        let mut json = serde_json::to_vec_pretty(&report).expect("a report always serialises");
        json.push(b'\n');
        if let Err(e) = sink.write_all(&json).and_then(|()| sink.flush()) {
            fail(&format!("cannot write the report: {e}"));
        }
    }
    exit(report.exit_status);
}

fn open_sink(cli: &Cli) -> std::io::Result<Option<File>> {
    if let Some(path) = &cli.report {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?;
        return Ok(Some(file));
    }
    let Some(fd) = cli.report_fd else {
        return Ok(None);
    };
    // SAFETY: fcntl(F_GETFD) takes no pointer and only inspects the descriptor table.
    if fd < 3 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        return Err(std::io::Error::other(format!(
            "--report-fd {fd} is not an open descriptor above 2"
        )));
    }
    // The sandboxed command must never inherit it (it could forge a report).
    // SAFETY: F_SETFD with FD_CLOEXEC takes no pointer.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the caller handed this open descriptor (checked above) to us
    // for the report; nothing else in this process uses it.
    Ok(Some(unsafe { File::from_raw_fd(fd) }))
}

fn fail(message: &str) -> ! {
    eprintln!("airlock-confine: {message}");
    exit(EXIT_FAILURE)
}
