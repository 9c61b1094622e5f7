//! The supervisor's metrics through a real node exporter: Debian's
//! prometheus-node-exporter (in the testbed's root) reads airlock.prom from
//! its textfile-collector directory once the administrator has done what
//! docs/metrics.md says (an ACL for user airlock and a ReadWritePaths=
//! drop-in); the drop-in is removed again afterwards, so the checks after
//! this one see the units as shipped.

use super::SEC;
use crate::Container;
use std::time::{Duration, Instant};

const TEXTFILE_DIR: &str = "/var/lib/prometheus/node-exporter";
const DROP_IN: &str = "/etc/systemd/system/airlock-supervisor.service.d/metrics.conf";

/// What the node exporter serves on its own port, once it shows the
/// supervisor's series: at least one task SUCCEEDED (the demo task), the
/// file read without a scrape error.
pub(super) fn node_exporter_reads_airlock_prom(c: &Container) -> Result<String, String> {
    c.sh_ok(
        &format!(
            "set -e
             test -d {TEXTFILE_DIR}
             systemctl is-active prometheus-node-exporter.service
             setfacl -m u:airlock:rwx {TEXTFILE_DIR}
             mkdir -p \"$(dirname {DROP_IN})\"
             printf '[Service]\\nReadWritePaths={TEXTFILE_DIR}\\n' > {DROP_IN}
             systemctl daemon-reload
             systemctl restart airlock-supervisor.service"
        ),
        120 * SEC,
    )?;
    let result = scrape(c);
    let cleanup = c.sh_ok(
        &format!(
            "rm -f {DROP_IN} {TEXTFILE_DIR}/airlock.prom && rmdir --ignore-fail-on-non-empty \"$(dirname {DROP_IN})\" && systemctl daemon-reload && systemctl restart airlock-supervisor.service"
        ),
        120 * SEC,
    );
    let detail = result?;
    cleanup?;
    Ok(detail)
}

fn scrape(c: &Container) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = String::new();
    while Instant::now() < deadline {
        let out = c.sh(
            "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:9100/metrics\", timeout=10).read().decode())'",
            30 * SEC,
        )?;
        last = out.both();
        let succeeded = last
            .lines()
            .find(|l| l.starts_with("airlock_tasks{state=\"SUCCEEDED\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(n) = succeeded {
            if last
                .lines()
                .any(|l| l.trim() == "node_textfile_scrape_error 1")
            {
                return Err(format!(
                    "the node exporter reports a scrape error:\n{}",
                    errors(&last)
                ));
            }
            if n < 1.0 {
                return Err(format!(
                    "airlock_tasks{{state=\"SUCCEEDED\"}} is {n}, the demo task succeeded"
                ));
            }
            let mode = c.sh_ok(
                &format!("stat -c '%a %U' {TEXTFILE_DIR}/airlock.prom"),
                10 * SEC,
            )?;
            if mode.trim() != "644 airlock" {
                return Err(format!("airlock.prom is {}", mode.trim()));
            }
            let series = last.lines().filter(|l| l.starts_with("airlock_")).count();
            return Ok(format!(
                "{series} airlock_ samples through the node exporter; {n} SUCCEEDED; airlock.prom 0644 airlock"
            ));
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    let journal = c
        .sh(
            "journalctl --no-pager -u airlock-supervisor -n 20 | grep -i metric",
            30 * SEC,
        )
        .map(|o| o.both())
        .unwrap_or_default();
    Err(format!(
        "no airlock_tasks series from the node exporter in 90 s:\n{}\nsupervisor journal:\n{journal}",
        errors(&last)
    ))
}

fn errors(metrics: &str) -> String {
    metrics
        .lines()
        .filter(|l| l.starts_with("node_textfile") || l.starts_with("airlock_tasks"))
        .collect::<Vec<_>>()
        .join("\n")
}
