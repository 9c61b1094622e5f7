//! Compiles the shipped unit files into airlockctl, so that `doctor`'s
//! hardening verifier checks the running units against exactly what the
//! package installs: every `*.service` and `*.socket` of `units/` (a
//! template such as `airlock-agent@.service` included, once it exists).

use std::fmt::Write as _;
use std::path::PathBuf;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let units = manifest.join("../../units");
    println!("cargo:rerun-if-changed={}", units.display());
    let mut names: Vec<(String, PathBuf)> = std::fs::read_dir(&units)
        .unwrap_or_else(|e| panic!("{}: {e}", units.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_owned();
            (name.ends_with(".service") || name.ends_with(".socket")).then_some((name, p))
        })
        .collect();
    names.sort();
    let mut out = String::from(
        "/// The unit files of `units/` (services and sockets), compiled in by build.rs.\n\
         pub const SHIPPED_UNITS: &[ShippedUnit] = &[\n",
    );
    for (name, path) in &names {
        println!("cargo:rerun-if-changed={}", path.display());
        let path = path.canonicalize().expect("a unit file's path");
        writeln!(
            out,
            "    ShippedUnit {{ name: {name:?}, text: include_str!({:?}) }},",
            path.display().to_string()
        )
        .expect("writing to a string");
    }
    out.push_str("];\n");
    let dest =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it")).join("shipped_units.rs");
    std::fs::write(&dest, out).unwrap_or_else(|e| panic!("{}: {e}", dest.display()));
}
