//! baton's event stream (`GET /baton/v1/events`, Server-Sent Events),
//! read on a thread of its own while a rollout runs: every event of the
//! drilled model, with when the drill received it.

use std::io::BufRead;
use std::sync::Arc;
use std::time::Duration;

use baton_core::threads::sync::Lock;
use serde_json::Value;

use crate::record::Live;

/// One event of the model, as the server sent it.
#[derive(Clone, Debug)]
pub struct Seen {
    /// The SSE event name: `rollout`, `finished`, `transition`, …
    pub name: String,
    /// The event's JSON.
    pub data: Value,
    /// When the drill read it, ns since the load started.
    pub received: u64,
}

/// What the reader collected so far.
#[derive(Default)]
pub struct Stream {
    /// Set once the server answered the subscription (it is then in place).
    pub connected: bool,
    /// The model's events in the order they came.
    pub events: Vec<Seen>,
    /// Why the stream could not be read, if it could not.
    pub error: Option<String>,
}

/// Assembles SSE lines into events.
#[derive(Default)]
pub struct Parser {
    name: String,
    data: String,
}

impl Parser {
    /// Feeds one line (without its line ending); returns an event (name,
    /// data) at the blank line that ends it.
    pub fn line(&mut self, line: &str) -> Option<(String, String)> {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            let name = std::mem::take(&mut self.name);
            let data = std::mem::take(&mut self.data);
            return (!data.is_empty()).then(|| (if name.is_empty() { "message".into() } else { name }, data));
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => self.name = value.to_owned(),
            "data" => {
                if !self.data.is_empty() {
                    self.data.push('\n');
                }
                self.data.push_str(value);
            }
            _ => {}
        }
        None
    }
}

/// Reads the event stream at `url` on a thread, keeping `model`'s events.
/// The thread ends with the stream, at `bound` at the latest; nobody
/// waits for it.
pub fn spawn(url: String, model: String, bound: Duration, live: Arc<Live>) -> Arc<Lock<Stream>> {
    let stream = Arc::new(Lock::new(Stream::default()));
    let shared = Arc::clone(&stream);
    let started = std::thread::Builder::new().name("drill-events".into()).spawn(move || {
        if let Err(error) = read(&url, &model, bound, &live, &shared) {
            shared.lock().error = Some(error);
        }
    });
    if let Err(e) = started {
        stream.lock().error = Some(format!("starting the event reader: {e}"));
    }
    stream
}

fn read(url: &str, model: &str, bound: Duration, live: &Live, stream: &Lock<Stream>) -> Result<(), String> {
    let agent: ureq::Agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(bound)).build().into();
    let response =
        agent.get(url).header("accept", "text/event-stream").call().map_err(|e| format!("GET {url}: {e}"))?;
    if !response.status().is_success() {
        return Err(format!("GET {url}: HTTP {}", response.status().as_u16()));
    }
    stream.lock().connected = true;
    let mut reader = std::io::BufReader::new(response.into_body().into_reader());
    let mut parser = Parser::default();
    let mut line = String::new();
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => return Ok(()),
            Ok(_) => {}
            Err(_) if live.stopped() => return Ok(()),
            Err(e) => return Err(format!("reading {url}: {e}")),
        }
        let Some((name, data)) = parser.line(line.trim_end_matches('\n')) else { continue };
        let Ok(data) = serde_json::from_str::<Value>(&data) else { continue };
        if data["model"] == model {
            stream.lock().events.push(Seen { name, data, received: live.now() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_assembled_from_lines() {
        let mut p = Parser::default();
        let mut got = Vec::new();
        for line in [": keep-alive", "", "event: rollout", "data: {\"a\":", "data: 1}", "", "data: x\r", "\r"] {
            got.extend(p.line(line));
        }
        assert_eq!(got, [("rollout".into(), "{\"a\":\n1}".into()), ("message".into(), "x".into())]);
    }
}
