//! The commands that talk to a running server over HTTP: `status`, `load`,
//! `rollback`, `pin`, `unpin`, `rollout`, `events`. The management ones
//! (`load`, `rollback`, `pin`, `unpin`, and every `rollout` but its
//! `status`) go to the admin listener when one is named
//! (`--admin-url`), and every command sends the admin token when one is
//! given (`--token-file`, or `BATON_TOKEN` holding the token).

mod client;
mod fleet;
mod render;
mod render_fleet;
mod render_rollout;
mod rollout;

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::Context;
pub use client::Client;
pub use fleet::{FleetArgs, run as fleet};
pub use rollout::{RolloutArgs, run as rollout};
use serde_json::{Value, json};

/// Options every client command takes.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The server's REST address.
    #[arg(long, env = "BATON_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The REST address of the server's admin listener (`baton serve
    /// --admin-http`), where `load`, `rollback`, `pin`, `unpin` and the
    /// rollout operations go; without it, --url.
    #[arg(long, env = "BATON_ADMIN_URL")]
    pub admin_url: Option<String>,
    /// A file holding the admin token (the server's --admin-token-file).
    /// Without it, the token in BATON_TOKEN, if set.
    #[arg(long, env = "BATON_TOKEN_FILE", value_name = "PATH")]
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

/// `baton status`: one line per model.
pub fn status(target: &Target) -> anyhow::Result<()> {
    let status = target.client()?.get_json("/baton/v1/status")?;
    print!("{}", render::status_table(&status));
    Ok(())
}

/// `baton load NAME [--version V]`: follows the stages as they happen.
pub fn load(target: &Target, model: &str, version: Option<u64>) -> anyhow::Result<()> {
    // The events come from the admin listener too, which serves them.
    let client = target.admin()?;
    // Subscribed before the load starts, so no stage is missed.
    let events = client.events()?;
    let watched = model.to_owned();
    let follower = std::thread::spawn(move || {
        let mut printed = 0;
        for line in events.lines() {
            let Ok(line) = line else { return };
            let Some(data) = line.strip_prefix("data:") else { continue };
            let Ok(event) = serde_json::from_str::<Value>(data.trim()) else { continue };
            if event["model"] == watched.as_str() {
                for text in render::progress(&event, &mut printed) {
                    println!("  {text}");
                }
                let _ = std::io::stdout().flush();
            }
            if event["model"] == watched.as_str() && matches!(event["event"].as_str(), Some("finished" | "failed")) {
                return;
            }
        }
    });
    let body = match version {
        Some(v) => json!({ "version": v }),
        None => json!({}),
    };
    println!("Loading {model}{}…", version.map(|v| format!(" version {v}")).unwrap_or_default());
    let result = client.post_json(&format!("/baton/v1/models/{model}/load"), &body);
    // The follower ends with the load's last event. A load refused before
    // it started (no token, unknown model, another operation running) has
    // none, so it is only waited for when the load ran: it succeeded, or a
    // stage refused the version (422) and the event saying so is coming.
    let ran = match &result {
        Ok(_) => true,
        Err(error) => error.downcast_ref::<client::Refused>().is_some_and(|r| r.status == 422),
    };
    if ran {
        let _ = follower.join();
    }
    let report = result?;
    println!("{}", render::report(&report));
    Ok(())
}

/// `baton rollback NAME`.
pub fn rollback(target: &Target, model: &str) -> anyhow::Result<()> {
    let report = target.admin()?.post_json(&format!("/baton/v1/models/{model}/rollback"), &json!({}))?;
    println!("{}", render::report(&report));
    Ok(())
}

/// `baton pin NAME VERSION`.
pub fn pin(target: &Target, model: &str, version: u64) -> anyhow::Result<()> {
    let path = format!("/baton/v1/models/{model}/pin");
    let answer = target.admin()?.send_json(ureq::http::Method::PUT, &path, &json!({ "version": version }))?;
    println!("{}", render::decision(&answer));
    Ok(())
}

/// `baton unpin NAME`.
pub fn unpin(target: &Target, model: &str) -> anyhow::Result<()> {
    let path = format!("/baton/v1/models/{model}/pin");
    let answer = target.admin()?.send_json(ureq::http::Method::DELETE, &path, &json!({}))?;
    println!("{}", render::decision(&answer));
    Ok(())
}

/// `baton upgrade [--timeout S] [--cold]`.
pub fn upgrade(target: &Target, timeout_s: u64, cold: bool) -> anyhow::Result<()> {
    let body = json!({ "timeout_s": timeout_s, "cold": cold });
    let answer = target.admin()?.post_json("/baton/v1/upgrade", &body)?;
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
