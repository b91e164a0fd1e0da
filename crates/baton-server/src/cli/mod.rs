//! The commands that talk to a running server over HTTP: `status`, `list`,
//! `load`, `rollback`, `pin`, `unpin`, `unload`, `retire`, `rollout`,
//! `events`, `upgrade`. The management ones (`load`, `rollback`, `pin`,
//! `unpin`, `unload`, `retire`, `upgrade`, and every `rollout` but its
//! `status`) go to the admin listener when one is named
//! (`--admin-url`), and every command sends the admin token when one is
//! given (`--token-file`, or `BATON_TOKEN` holding the token).

mod client;
mod fleet;
mod operations;
mod render;
mod render_fleet;
mod render_rollout;
mod render_status;
mod rollout;

use std::io::BufRead;
use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
pub use client::Client;
pub use fleet::{FleetArgs, run as fleet};
pub use operations::{load, pin, retire, rollback, unload, unpin};
pub use rollout::{RolloutArgs, run as rollout};
use serde_json::{Value, json};

/// Options every client command takes (global: a command with
/// subcommands, `rollout`, takes them before or after its action).
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The server's REST address.
    #[arg(long, env = "BATON_URL", default_value = "http://127.0.0.1:8000", global = true)]
    pub url: String,
    /// The REST address of the server's admin listener (`baton serve
    /// --admin-http`), where `load`, `rollback`, `pin`, `unpin`, `unload`,
    /// `retire`, `upgrade` and the rollout operations go; without it, --url.
    #[arg(long, env = "BATON_ADMIN_URL", global = true)]
    pub admin_url: Option<String>,
    /// A file holding the admin token (the server's --admin-token-file).
    /// Without it, the token in BATON_TOKEN, if set.
    #[arg(long, env = "BATON_TOKEN_FILE", value_name = "PATH", global = true)]
    pub token_file: Option<PathBuf>,
}

impl Target {
    fn token(&self) -> anyhow::Result<Option<String>> {
        Ok(baton_protocol::token::client_token(self.token_file.as_deref())?)
    }

    /// A client of the inference address, for reads.
    fn client(&self) -> anyhow::Result<Client> {
        Ok(Client::new(&self.url).with_token(self.token()?))
    }

    /// A client of the address that serves management operations.
    fn admin(&self) -> anyhow::Result<Client> {
        Ok(Client::new(self.admin_url.as_deref().unwrap_or(&self.url)).with_token(self.token()?))
    }
}

/// `baton status [MODEL] [--json]`.
pub fn status(target: &Target, model: Option<&str>, as_json: bool) -> anyhow::Result<()> {
    let client = target.client()?;
    let status = client.get_json("/baton/v1/status")?;
    if let Some(model) = model
        && !status["models"].as_array().into_iter().flatten().any(|m| m["name"] == model)
    {
        // A model the repository has but nothing touched has a status too.
        if let Ok(one) = client.get_json(&format!("/baton/v1/models/{model}/status")) {
            let mut status = status;
            status["models"] = json!([one]);
            return print_status(&status, Some(model), as_json);
        }
        let names: Vec<&str> =
            status["models"].as_array().into_iter().flatten().filter_map(|m| m["name"].as_str()).collect();
        anyhow::bail!(
            "the server knows no model '{model}'; it has: {}",
            if names.is_empty() { "none".to_owned() } else { names.join(", ") }
        );
    }
    print_status(&status, model, as_json)
}

fn print_status(status: &Value, model: Option<&str>, as_json: bool) -> anyhow::Result<()> {
    match (as_json, model) {
        (true, None) => println!("{status}"),
        (true, Some(model)) => {
            let one = status["models"].as_array().into_iter().flatten().find(|m| m["name"] == model);
            println!("{}", one.cloned().unwrap_or_default());
        }
        (false, _) => print!("{}", render_status::view(status, model)),
    }
    Ok(())
}

/// `baton list [--json]`: the repository's models and versions, with the
/// state of each (`POST /v2/repository/index`).
pub fn list(target: &Target, as_json: bool) -> anyhow::Result<()> {
    let index = target.client()?.post_json("/v2/repository/index", &json!({}))?;
    if as_json {
        println!("{index}");
        return Ok(());
    }
    let mut rows = vec![["MODEL", "VERSION", "STATE", "REASON"].map(str::to_owned).to_vec()];
    for row in index.as_array().into_iter().flatten() {
        let cell = |k: &str| row[k].as_str().filter(|s| !s.is_empty()).unwrap_or("-").to_owned();
        rows.push(vec![cell("name"), cell("version"), cell("state"), cell("reason")]);
    }
    match rows.len() {
        1 => println!("The repository has no models."),
        _ => print!("{}", render_status::table(&rows)),
    }
    Ok(())
}

/// `baton upgrade [--timeout 10m] [--cold] [--json]`.
pub fn upgrade(target: &Target, timeout: std::time::Duration, cold: bool, as_json: bool) -> anyhow::Result<()> {
    let timeout_s = timeout.as_secs();
    anyhow::ensure!(
        (1..=86_400).contains(&timeout_s) && timeout.subsec_nanos() == 0,
        "--timeout is whole seconds from 1s to 24h (86400s)"
    );
    let body = json!({ "timeout_s": timeout_s, "cold": cold });
    let answer = target.admin()?.post_json("/baton/v1/upgrade", &body)?;
    if as_json {
        println!("{answer}");
        return Ok(());
    }
    if !cold {
        println!(
            "Upgraded: process {} serves in place of {} (handover {} ms).",
            answer["new_pid"], answer["old_pid"], answer["took_ms"]
        );
        return Ok(());
    }
    // The new process loads once the old one has exited: follow it.
    println!("Process {} drains and exits; process {} loads then.", answer["old_pid"], answer["new_pid"]);
    let started = std::time::Instant::now();
    let client = target.client()?;
    loop {
        if let Ok(status) = client.get_json("/baton/v1/status")
            && status["pid"] == answer["new_pid"]
            && status["ready"] == true
        {
            println!("Upgraded: process {} serves ({} ms).", answer["new_pid"], started.elapsed().as_millis());
            return Ok(());
        }
        anyhow::ensure!(
            started.elapsed() < std::time::Duration::from_secs(timeout_s),
            "process {} was not ready within {timeout_s} s; see its log",
            answer["new_pid"]
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `baton events`: one line per event until the server closes the stream.
pub fn events(target: &Target, as_json: bool) -> anyhow::Result<()> {
    let stream = target.client()?.events()?;
    let mut out = std::io::stdout().lock();
    for line in stream.lines() {
        let line = line.context("reading the event stream")?;
        let Some(data) = line.strip_prefix("data:") else { continue };
        let event: Value = serde_json::from_str(data.trim()).context("an event that is not JSON")?;
        let text = if as_json { event.to_string() } else { render::event_line(&event) };
        writeln!(out, "{text}")?;
        out.flush()?;
    }
    Ok(())
}
