//! docs/configuration.md is generated from `airlock_config::KEYS`; this test
//! fails when the file differs from what the table says, and rewrites it when
//! `UPDATE_DOCS=1` is set.

use std::fmt::Write as _;
use std::path::Path;

use airlock_config::{DEFAULT_PATH, KEYS, Kind, MAX_CONFIG_BYTES, RULES};

const DOC: &str = "docs/configuration.md";

fn render() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crates/config/src/keys.rs by crates/config/tests/docs.rs.\n     Do not edit by hand: change the table, then run\n     UPDATE_DOCS=1 cargo test -p airlock-config --test docs -->\n\n",
    );
    out.push_str("# Configuration reference\n\n");
    let _ = write!(
        out,
        "Every airlock service reads `{DEFAULT_PATH}`, parsed by the `airlock-config` crate. \
         A fully commented example with every default is `packaging/airlock.toml`.\n\n\
         - Every key has a default except inside `[[repository]]` and `[[agent]]`: a \
         file with only repository tables (or an empty file, which registers no \
         repository and runs no agent) is valid.\n\
         - Unknown keys are errors. So are values of the wrong type, out of range, or \
         breaking one of the rules between keys below. The service does not start; the \
         error names the file, the line and column when known, the dotted key \
         (`executor.limits.processes`, `repository[1].path`) and what was expected, \
         and carries the code `CONFIG_INVALID`.\n\
         - The file must be a regular file, at most {MAX_CONFIG_BYTES} bytes of UTF-8, \
         that neither its group nor other users can write (fix: `chmod g-w,o-w FILE`), \
         owned by root (fix: `chown root FILE`). One exception: a service that does not \
         run as root also accepts a file owned by its own uid (airlock-local run by an \
         unprivileged developer writes its configuration as that user). The same holds \
         for every drop-in below.\n\
         - Neither the file nor a drop-in may lie inside a registered repository (its \
         canonical path under a repository's path, canonicalized where it exists): \
         whoever may write the repository could rewrite the configuration that governs \
         it. Fix: move it out of the repository. Checked once the drop-ins are read, at \
         start and on reload.\n\
         - Repositories may also be registered one per file in `repositories.d/` beside \
         the file (`/etc/airlock/repositories.d/NAME.toml`, what `airlockctl repo add` \
         writes): one `[[repository]]` table named like the file and nothing else, read \
         like the main file; a name or path registered twice is refused. The supervisor \
         and the worker read them at start and again on SIGHUP (`systemctl reload`).\n\
         - Settings go best into drop-ins in `airlock.toml.d/` beside the file \
         (`/etc/airlock/airlock.toml.d/*.toml`), so that the file itself stays as the \
         package installs it (comments only: every default lives in the binaries) and an \
         upgrade never finds it edited. They are read in name order after the file, once, \
         at start: a key a later file sets replaces the earlier value, tables merge key by \
         key, and `[[repository]]` and `[[agent]]` tables add up (the supervisor re-reads \
         the `[[agent]]` tables of all of them on SIGHUP). Each drop-in's keys and types \
         are checked on its own, naming it; the rules between keys are checked on the \
         merged whole and name the last file that sets the key. `airlockctl config \
         show` prints the merged configuration with every default and the files it \
         came from; `airlockctl config migrate` turns an earlier release's edited file \
         into such a drop-in (the package's upgrade runs it).\n\
         - Parsing opens no other file: whether a repository path is a bare repository, \
         or a user exists, is checked by the service that uses it.\n\
         - This page describes what each key is for. The services that act on most of \
         them (supervisor, worker, executor, retryd) are still being built; see the \
         README for what exists today.\n\n\
         Rules between keys, checked after every key passed on its own:\n\n"
    );
    for rule in RULES {
        let _ = writeln!(out, "- {rule}");
    }
    for spec in KEYS {
        match spec.kind {
            Kind::Table => {
                let _ = write!(out, "\n## `[{}]`\n\n{}\n", spec.key, spec.meaning);
                continue;
            }
            Kind::Tables => {
                let _ = write!(out, "\n## `[[{}]]`\n\n{}\n", spec.key, spec.meaning);
                continue;
            }
            _ => {}
        }
        let default = match (spec.default, spec.required) {
            (Some(d), _) => format!("`{d}`"),
            (None, true) => "required".to_owned(),
            (None, false) => "unset".to_owned(),
        };
        let _ = write!(
            out,
            "\n### `{}`\n\n- default: {default}\n- expected: {}\n\n{}\n",
            spec.key,
            spec.kind.describe(),
            spec.meaning
        );
    }
    out
}

#[test]
fn configuration_reference_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(DOC);
    let wanted = render();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &wanted).expect("write docs/configuration.md");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == wanted,
        "{DOC} is out of date with crates/config/src/keys.rs.\n\
         Regenerate it with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-config --test docs\n"
    );
}

const ENVIRONMENTS_DOC: &str = "docs/environments.md";

fn render_environments() -> String {
    use airlock_config::{ENVIRONMENT_EXAMPLES, ENVIRONMENT_KEYS};
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from crates/config/src/environment.rs by crates/config/tests/docs.rs.\n     Do not edit by hand: change the table, then run\n     UPDATE_DOCS=1 cargo test -p airlock-config --test docs -->\n\n",
    );
    out.push_str("# Verification environments\n\n");
    out.push_str(
        "A repository's commands run in the executor's sandbox, which shows them the \
         system's read-only paths and nothing else, and starts only `executor.programs`. \
         A project whose toolchain or test tools live elsewhere (a virtual environment, \
         a toolchain under /opt) gets them from its **verification environment**: \
         read-only paths added to the commands' view, the programs its commands may \
         start, and their variables. It is the administrator's, never the planner's.\n\n\
         - Give it with `airlockctl repo add NAME --from PATH --environment FILE`, or \
         `airlock-local up --repo NAME=PATH --environment NAME=FILE`. FILE holds one \
         `[environment]` table; it is checked on this host first, then written into the \
         repository's registration (`[repository.environment]` in \
         `repositories.d/NAME.toml`). `airlockctl repo show NAME` shows it as this host \
         resolves it.\n\
         - Where it is enforced: the supervisor refuses a submission naming a program the \
         repository may not start (COMMAND_PROGRAM_DENY, at SubmitTask); the executor \
         checks the same again, and a policy refusal ends the task at once (never \
         retried). `airlockctl propose --verify 'python3 -m pytest'` resolves a bare name \
         in the environment's programs first.\n\
         - The executor builds its commands' view once, at start: the paths of every \
         repository's environment are in every command's view (read-only; each is a \
         directory only root may write, checked with ENVIRONMENT_PATH_UNSAFE). Programs \
         and variables are per repository. The executor resolves the environments when \
         it starts: `repo add --environment` asks systemd to restart it, beside \
         reloading the supervisor and the worker.\n\
         - **The setup: dependencies, fetched once per lockfile.** When the environment \
         has an `[environment.setup]`, the executor first computes the dependency \
         layer's key: SHA-256 over the whole environment and the content of every file \
         of the task's tree (with its change applied) that an `inputs` glob matches. A \
         layer with that key in the layer cache (`<work>/layers`, bounded by \
         `executor.layer_cache_mib`, verified against its seal when first used) is \
         used as it is: no setup runs, nothing is fetched. Otherwise the setup commands \
         run, in order, in the executor's sandbox (its uid, Landlock, seccomp, the \
         minimal root, no credentials) on a workspace holding only the inputs; HOME is \
         the command's private /tmp, and each `~/…` output is kept from it. Their \
         network namespace holds only `lo`, on which the executor's forwarder listens \
         (`127.0.0.1:3128`, set as `HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, their lower-case \
         forms and npm's own names; `NO_PROXY` empty); the forwarder's only peer is \
         airlock-egress, which opens a tunnel only to an `egress` entry, resolved by \
         itself to public addresses only unless the administrator's route for that \
         host says otherwise: `addresses` (the ranges an internal mirror's name may \
         resolve to) or `via` a parent proxy with its credential, in \
         `/etc/airlock/egress.toml`, never in an environment ([privsep/egress.md]\
         (privsep/egress.md#routes-the-administrators-way-out)). A \
         setup without `egress` entries has no network at all.\n\
         - Verification reads the layer: workspace outputs (`node_modules`) as the \
         read-only lower layer of the workspace's overlay, HOME outputs \
         (`~/.cargo/registry`) as copy-on-write overlays under the command's HOME (a copy \
         where overlays cannot be mounted). Verification itself has no network. The \
         task's isolation evidence names the layer: its key and digest, its size, \
         whether it was reused, each setup command's evidence and every connection the \
         setup asked for (`airlockctl show TASK --json`, `result.isolation.layer`).\n\
         - A setup command that fails ends the attempt with SETUP_FAILED and its \
         redacted output tail; a connection the proxy refused because configuration \
         does not allow it (EGRESS_HOST_NOT_ALLOWED, EGRESS_PORT_NOT_ALLOWED, \
         EGRESS_ADDRESS_FORBIDDEN, EGRESS_METHOD_NOT_ALLOWED; a route's parent proxy \
         refusing the proxy's credential, EGRESS_PARENT_AUTH_FAILED, or the connection, \
         EGRESS_PARENT_REFUSED) ends the task at once with \
         that code, whatever the setup command's exit status (a command that ignores \
         the refusal and exits 0 seals no layer), as does SETUP_UNAVAILABLE (an executor whose commands get the host view: setups \
         need the minimal root's network namespace).\n\n",
    );
    out.push_str("## Keys\n");
    for k in ENVIRONMENT_KEYS {
        let _ = write!(
            out,
            "\n### `{}`\n\n- default: `{}`\n- expected: {}\n\n{}\n",
            k.key, k.default, k.accepts, k.meaning
        );
    }
    out.push_str("\n## Examples\n\nRegistry host names are placeholders.\n");
    for (what, text) in ENVIRONMENT_EXAMPLES {
        let _ = write!(out, "\n### {what}\n\n```toml\n{text}```\n");
    }
    out
}

#[test]
fn environments_reference_is_current() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(ENVIRONMENTS_DOC);
    let wanted = render_environments();
    if std::env::var_os("UPDATE_DOCS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &wanted).expect("write docs/environments.md");
        return;
    }
    let actual = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        actual == wanted,
        "{ENVIRONMENTS_DOC} is out of date with crates/config/src/environment.rs.\n\
         Regenerate it with:\n\n    UPDATE_DOCS=1 cargo test -p airlock-config --test docs\n"
    );
}
