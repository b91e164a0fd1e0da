//! The commands that talk to a running server over HTTP: `status`, `load`,
//! `rollback`, `events`.

mod client;
mod render;

use std::io::{BufRead, Write};

use anyhow::Context;
pub use client::Client;
use serde_json::{Value, json};

/// Options every client command takes.
#[derive(clap::Args, Debug)]
pub struct Target {
    /// The server's REST address.
    #[arg(long, env = "BATON_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
}

/// `baton status`: one line per model.
pub fn status(target: &Target) -> anyhow::Result<()> {
    let status = Client::new(&target.url).get_json("/baton/v1/status")?;
    print!("{}", render::status_table(&status));
    Ok(())
}

/// `baton load NAME [--version V]`: follows the stages as they happen.
pub fn load(target: &Target, model: &str, version: Option<u64>) -> anyhow::Result<()> {
    let client = Client::new(&target.url);
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
    let _ = follower.join();
    let report = result?;
    println!("{}", render::report(&report));
    Ok(())
}

/// `baton rollback NAME`.
pub fn rollback(target: &Target, model: &str) -> anyhow::Result<()> {
    let report = Client::new(&target.url).post_json(&format!("/baton/v1/models/{model}/rollback"), &json!({}))?;
    println!("{}", render::report(&report));
    Ok(())
}

/// `baton events`: one line per event until the server closes the stream.
pub fn events(target: &Target, as_json: bool) -> anyhow::Result<()> {
    let stream = Client::new(&target.url).events()?;
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
