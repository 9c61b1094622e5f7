//! `airlockctl status`: who answers, how it authorises, and the queue.

use crate::client::{Client, CtlError};
use crate::output::Ctx;
use serde_json::json;
use std::process::ExitCode;

/// Arguments of `status` (none).
#[derive(Debug, clap::Args)]
pub struct Args {}

const COUNTS: [&str; 6] = [
    "Queued",
    "Running",
    "Verifying",
    "Succeeded",
    "Failed",
    "Cancelled",
];

/// Reads the supervisor's properties.
pub async fn run(ctx: &Ctx, client: &Client, _args: Args) -> Result<ExitCode, CtlError> {
    let owner = client.owner().await?;
    let Some(owner) = owner else {
        return Err(CtlError::from_dbus(
            "org.freedesktop.DBus.Error.NameHasNoOwner",
            Some(format!("{} is not running", crate::client::BUS_NAME)),
        ));
    };
    let authorizer: String = client.property("Authorizer").await?;
    let version: String = client.property("Version").await?;
    let protocol: String = client.property("ProtocolVersion").await?;
    let auto_accept: bool = client.property("AutoAccept").await?;
    let lease_seconds: u32 = client.property("LeaseSeconds").await?;
    let worker_uid: u32 = client.property("WorkerUid").await?;
    let mut counts = Vec::new();
    for name in COUNTS {
        counts.push((name, client.property::<u64>(name).await?));
    }
    let for_tests = authorizer.contains("for-tests");
    if ctx.json {
        let mut tasks = serde_json::Map::new();
        for (name, n) in &counts {
            tasks.insert(name.to_ascii_lowercase(), json!(n));
        }
        ctx.print_json(&json!({
            "bus_name": crate::client::BUS_NAME,
            "unique_name": owner,
            "version": version,
            "protocol_version": protocol,
            "client_protocol_version": airlock_proto::bus::protocol_string(airlock_proto::bus::PROTOCOL_VERSION),
            "authorizer": authorizer,
            "auto_accept": auto_accept,
            "lease_seconds": lease_seconds,
            "worker_uid": worker_uid,
            "tasks": tasks,
        }));
        return Ok(ExitCode::SUCCESS);
    }
    let authorizer_text = if for_tests {
        ctx.paint(
            "1;31",
            &format!("{authorizer} (TEST AUTHORISER: no polkit)"),
        )
    } else {
        authorizer.clone()
    };
    println!(
        "  Supervisor: {} ({owner}), version {version}, protocol {protocol}",
        crate::client::BUS_NAME
    );
    println!("  Authorizer: {authorizer_text}");
    println!(" Auto-accept: {}", if auto_accept { "yes" } else { "no" });
    println!("       Lease: {lease_seconds} s");
    println!("  Worker uid: {worker_uid}");
    let summary: Vec<String> = counts
        .iter()
        .map(|(name, n)| {
            let label = name.to_ascii_lowercase();
            if *n > 0 {
                format!(
                    "{n} {}",
                    ctx.state(&name.to_ascii_uppercase())
                        .replace(&name.to_ascii_uppercase(), &label)
                )
            } else {
                format!("{n} {label}")
            }
        })
        .collect();
    println!("       Tasks: {}", summary.join(", "));
    if for_tests {
        ctx.warn("the supervisor is running with a test authoriser; every Tasks2 call is decided without polkit");
    }
    Ok(ExitCode::SUCCESS)
}
