//! How results reach the user: JSON for scripts, aligned tables for
//! people, colour only on a terminal and never with `NO_COLOR`.

use crate::client::CtlError;
use serde_json::{Value, json};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;

/// Output settings for one invocation.
#[derive(Clone, Copy, Debug)]
pub struct Ctx {
    /// `--json`.
    pub json: bool,
    /// Colour stdout.
    pub colour: bool,
    /// Colour stderr.
    pub colour_err: bool,
}

/// Whether `NO_COLOR` forbids colour (set and not empty, per no-color.org).
fn no_color() -> bool {
    std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty())
}

impl Ctx {
    /// Settings from the environment.
    pub fn new(json: bool) -> Self {
        Ctx {
            json,
            colour: !json && !no_color() && std::io::stdout().is_terminal(),
            colour_err: !no_color() && std::io::stderr().is_terminal(),
        }
    }

    /// Prints a reply (or any serialisable value) as JSON on one line,
    /// its keys in order.
    pub fn print_json<T: serde::Serialize + ?Sized>(&self, v: &T) {
        println!("{}", serde_json::to_value(v).unwrap_or(Value::Null));
    }

    /// Wraps `text` in an SGR colour when colouring stdout.
    pub fn paint(&self, sgr: &str, text: &str) -> String {
        paint(self.colour, sgr, text)
    }

    /// A task state, coloured by meaning.
    pub fn state(&self, state: &str) -> String {
        self.paint(state_sgr(state), state)
    }

    /// Prints a warning on stderr.
    pub fn warn(&self, text: &str) {
        eprintln!("{} {text}", paint(self.colour_err, "1;33", "warning:"));
    }

    /// Reports `err` on stderr and returns its exit status.
    pub fn fail(&self, err: &CtlError) -> ExitCode {
        if self.json {
            let v = json!({"error": {
                "code": err.code.map(|c| c.as_str()),
                "dbus_error": err.dbus_error,
                "message": err.message,
                "exit_code": err.exit_code,
            }});
            eprintln!("{v}");
        } else {
            eprintln!(
                "{} {}: {}",
                paint(self.colour_err, "1;31", "error:"),
                paint(self.colour_err, "1", &err.label()),
                err.message
            );
            if let Some(hint) = err.hint() {
                eprintln!("{} {hint}", paint(self.colour_err, "2", "hint:"));
            }
        }
        ExitCode::from(err.exit_code)
    }
}

fn paint(on: bool, sgr: &str, text: &str) -> String {
    if on {
        format!("\x1b[{sgr}m{text}\x1b[0m")
    } else {
        text.to_owned()
    }
}

fn state_sgr(state: &str) -> &'static str {
    match state {
        "QUEUED" => "36",
        "RUNNING" => "34",
        "VERIFYING" => "33",
        "SUCCEEDED" => "32",
        "FAILED" => "31",
        "CANCELLED" => "35",
        _ => "0",
    }
}

/// `s` without its colour escape sequences (`ESC … m`).
fn plain(s: &str) -> String {
    let mut out = String::new();
    let mut in_escape = false;
    for c in s.chars() {
        match (in_escape, c) {
            (false, '\x1b') => in_escape = true,
            (true, 'm') => in_escape = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

/// Visible width of a cell (escape sequences do not count).
fn width(s: &str) -> usize {
    plain(s).chars().count()
}

/// Renders rows under a header, columns padded to the widest cell.
pub fn table(ctx: &Ctx, header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(width(cell));
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                out.push_str(&" ".repeat(widths[i] - width(cell) + 2));
            }
        }
        out.push('\n');
    };
    line(
        header.iter().map(|h| ctx.paint("1", h)).collect::<Vec<_>>(),
        &mut out,
    );
    for row in rows {
        line(row.clone(), &mut out);
    }
    out
}

/// Writes `text` to stdout, ignoring a closed pipe (`| head`).
pub fn emit(text: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SSZ` (UTC).
pub fn time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (H. Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// A JSON field as display text (`-` when absent).
pub fn text(v: &Value) -> String {
    match v {
        Value::Null => "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// An optional JSON field as display text (`-` when absent).
pub fn text_opt(v: Option<&Value>) -> String {
    v.map_or_else(|| "-".to_owned(), text)
}

/// A value as display text: its JSON form, a string unquoted (an enum
/// shows as it crosses the bus: `passed`, `CREATE_NEW`).
pub fn wire<T: serde::Serialize + ?Sized>(v: &T) -> String {
    text(&serde_json::to_value(v).unwrap_or(Value::Null))
}

/// An optional value as display text (`-` when absent).
pub fn or_dash<T: std::fmt::Display>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// Optional unix ms as a time (`-` when absent).
pub fn time_opt(ms: Option<i64>) -> String {
    ms.map(time).unwrap_or_else(|| "-".to_owned())
}

/// Optional unsigned unix ms as a time (`-` when absent).
pub fn time_u(ms: Option<u64>) -> String {
    time_opt(ms.and_then(|ms| i64::try_from(ms).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_utc() {
        assert_eq!(time(0), "1970-01-01 00:00:00Z");
        assert_eq!(time(951_782_400_000), "2000-02-29 00:00:00Z");
        assert_eq!(time(1_700_000_000_123), "2023-11-14 22:13:20Z");
    }

    #[test]
    fn tables_align_without_counting_colour() {
        let ctx = Ctx {
            json: false,
            colour: true,
            colour_err: false,
        };
        let t = table(
            &ctx,
            &["A", "B"],
            &[
                vec![ctx.state("QUEUED"), "x".into()],
                vec!["yy".into(), "z".into()],
            ],
        );
        let shown: Vec<String> = t.lines().map(plain).collect();
        assert_eq!(shown, ["A       B", "QUEUED  x", "yy      z"]);
    }
}
