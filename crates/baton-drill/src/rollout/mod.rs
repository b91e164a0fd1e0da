//! The rollout driver (`--swap rollout`): after the warm-up, starts one
//! rollout through baton's rollout API while the load runs, follows it by
//! the event stream (and the status, as a fallback) until it is promoted,
//! rolled back, aborted or paused, or until --rollout-timeout, then keeps
//! the load going for --tail and stops it. What it saw goes to
//! [`crate::analyze::rollout`].

pub mod events;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use serde_json::{Value, json};

use crate::args::{DrillArgs, RolloutMode};
use crate::caller::error_message;
use crate::record::Live;
use crate::swap::action::{admin_agent, admin_url};
use crate::swap::{Phase, set};
use crate::target::Endpoint;

/// A decision of the rollout, its times in ns since the load started.
#[derive(Clone, Debug, PartialEq)]
pub struct DecisionSeen {
    /// `started`, `advanced`, `held`, `promoted`, `rolled_back`, `paused`, `resumed`, `aborted`.
    pub action: String,
    /// `guards`, `operator` or `restart`.
    pub by: String,
    /// When it was decided.
    pub at: u64,
    /// When the window it judged ended, for a judged window.
    pub window_end: Option<u64>,
    /// The step after it (0-based).
    pub step: u64,
    /// The candidate's share after it, in percent.
    pub weight_percent: f64,
    /// The judged window's verdict (outcome, checks, reason), as the server sent it.
    pub verdict: Value,
    /// The server's sentence.
    pub message: String,
}

/// An operation of the registry that finished (`rollout`, `promote`,
/// `abort`, …): for `abort`, the store that took the candidate's weight to 0.
#[derive(Clone, Debug, PartialEq)]
pub struct OperationSeen {
    /// The operation.
    pub operation: String,
    /// When the server says it finished, ns since the load started.
    pub at: u64,
}

/// What the driver did and saw.
#[derive(Clone, Debug, Default)]
pub struct RolloutRecord {
    /// The start's body.
    pub request: Value,
    /// When the start was sent.
    pub trigger: u64,
    /// When it was answered.
    pub done: u64,
    /// Whether the start succeeded.
    pub ok: bool,
    /// What the server said, or what went wrong.
    pub detail: String,
    /// The stable version, the candidate and the mode, from the status.
    pub stable: Option<u64>,
    /// The candidate.
    pub candidate: Option<u64>,
    /// The mode.
    pub mode: Option<String>,
    /// The rollout's phase when the drill stopped following it.
    pub phase: Option<String>,
    /// When the drill saw it end (promoted, rolled back, aborted, paused).
    pub ended: Option<u64>,
    /// The decisions, oldest first.
    pub decisions: Vec<DecisionSeen>,
    /// Operations of the model that finished while it was followed.
    pub operations: Vec<OperationSeen>,
    /// Why the event stream could not be read, if it could not.
    pub events_error: Option<String>,
}

/// The phases after which a rollout judges no more windows.
pub const ENDED: [&str; 4] = ["promoted", "rolled_back", "aborted", "paused"];

/// How the driver reaches the server.
pub struct Driver {
    start_url: String,
    status_url: String,
    events_url: String,
    token: Option<String>,
    agent: ureq::Agent,
    body: Value,
    model: String,
    warmup: Duration,
    tail: Duration,
    bound: Duration,
    settle: Duration,
    events_bound: Duration,
}

/// The start's body the options describe; only the options given are sent.
pub fn start_body(args: &DrillArgs) -> anyhow::Result<Value> {
    let mut body = serde_json::Map::new();
    if let Some(v) = args.rollout_version {
        body.insert("version".into(), json!(v));
    }
    if let Some(mode) = args.rollout_mode {
        let name = match mode {
            RolloutMode::Canary => "canary",
            RolloutMode::Ab => "ab",
            RolloutMode::Shadow => "shadow",
        };
        body.insert("mode".into(), json!(name));
    }
    if !args.rollout_steps.is_empty() {
        body.insert("steps".into(), json!(args.rollout_steps));
    }
    if let Some(interval) = args.rollout_interval {
        body.insert("interval_ms".into(), json!(interval.as_millis() as u64));
    }
    if let Some(n) = args.rollout_failure_limit {
        body.insert("failure_limit".into(), json!(n));
    }
    if let Some(n) = args.rollout_max_inconclusive {
        body.insert("max_inconclusive".into(), json!(n));
    }
    if let Some(guards) = &args.rollout_guards {
        body.insert("guards".into(), serde_json::from_str(guards).context("--rollout-guards is not JSON")?);
    }
    Ok(Value::Object(body))
}

impl Driver {
    /// The driver the options describe.
    pub fn from_args(args: &DrillArgs, http: &Endpoint) -> anyhow::Result<Driver> {
        let path = format!("/baton/v1/models/{}/rollout", args.model);
        Ok(Driver {
            start_url: admin_url(args, http, &path),
            status_url: http.url(&path),
            events_url: http.url("/baton/v1/events"),
            token: baton_protocol::token::client_token(args.token_file.as_deref())?,
            agent: admin_agent(args),
            body: start_body(args)?,
            model: args.model.clone(),
            warmup: args.warmup,
            tail: args.tail,
            bound: args.rollout_timeout,
            settle: args.swap_timeout.min(Duration::from_secs(10)),
            events_bound: args.duration + args.swap_timeout,
        })
    }

    /// Runs the rollout on a thread; once it ended and the tail is over,
    /// stops the load.
    pub fn spawn(self, live: Arc<Live>, phase: Phase) -> std::thread::JoinHandle<RolloutRecord> {
        std::thread::Builder::new()
            .name("drill-rollout".into())
            .spawn(move || self.drive(&live, &phase))
            .expect("starting the rollout thread")
    }

    fn drive(&self, live: &Arc<Live>, phase: &Phase) -> RolloutRecord {
        let mut record = RolloutRecord { request: self.body.clone(), ..RolloutRecord::default() };
        set(phase, "warm-up".into());
        let stream = events::spawn(self.events_url.clone(), self.model.clone(), self.events_bound, Arc::clone(live));
        // The subscription is in place once the server answered it.
        let connect_by = live.now() + 2_000_000_000;
        while !stream.lock().connected && stream.lock().error.is_none() && live.now() < connect_by {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !crate::swap::wait_until(live, self.warmup.as_nanos() as u64) {
            return record;
        }
        // Drill times from the server's clock (the same machine's).
        let unix_t0 = unix_ns().saturating_sub(live.now());
        set(phase, "rollout: starting".into());
        record.trigger = live.now();
        let started = self.send("POST", &self.start_url, Some(&self.body));
        record.done = live.now();
        match started {
            Ok(answer) => {
                record.ok = true;
                record.detail = answer["rollout"]["message"].as_str().unwrap_or("started").to_owned();
                note_status(&mut record, &answer);
            }
            Err(e) => record.detail = e,
        }
        if record.ok {
            self.follow(&mut record, live, phase, &stream, unix_t0);
        }
        let stream = stream.lock();
        record.events_error = stream.error.clone();
        for seen in &stream.events {
            let at = seen.data["at"].as_f64().map_or(seen.received, |s| drill_ns((s * 1e9) as u64, unix_t0));
            if seen.name == "finished"
                && let Some(operation) = seen.data["report"]["operation"].as_str()
            {
                record.operations.push(OperationSeen { operation: operation.to_owned(), at });
            }
        }
        if record.decisions.is_empty() {
            // No status at the end: the decisions the stream carried.
            record.decisions = stream
                .events
                .iter()
                .filter(|s| s.name == "rollout")
                .filter_map(|s| decision(&s.data["decision"], unix_t0))
                .collect();
        }
        drop(stream);
        set(phase, "tail".into());
        if crate::swap::wait_until(live, record.ended.unwrap_or(record.done) + self.tail.as_nanos() as u64) {
            live.stop.store(true, Ordering::Relaxed);
        }
        record
    }

    /// Follows the rollout until it ends or the bound; then waits (a
    /// little) for the operation that ends it to finish, and reads the
    /// decisions from the final status.
    fn follow(
        &self,
        record: &mut RolloutRecord,
        live: &Live,
        phase: &Phase,
        stream: &baton_core::threads::sync::Lock<events::Stream>,
        unix_t0: u64,
    ) {
        let limit = record.trigger + self.bound.as_nanos() as u64;
        let mut next_poll = 0;
        let mut seen_events = 0;
        while record.ended.is_none() && !live.stopped() && live.now() < limit {
            let ended = {
                let stream = stream.lock();
                let fresh = &stream.events[seen_events.min(stream.events.len())..];
                seen_events = stream.events.len();
                fresh.iter().filter(|s| s.name == "rollout").find_map(|s| {
                    let action = s.data["decision"]["action"].as_str()?;
                    let phase = match action {
                        "paused" | "promoted" | "aborted" | "rolled_back" => action,
                        _ => return None,
                    };
                    Some(phase.to_owned())
                })
            };
            if let Some(ended) = ended {
                record.phase = Some(ended);
                record.ended = Some(live.now());
                break;
            }
            // The status, once a second: it ends the following when the stream cannot.
            if live.now() >= next_poll {
                next_poll = live.now() + 1_000_000_000;
                if let Ok(status) = self.send("GET", &self.status_url, None) {
                    note_status(record, &status);
                    let name = record.phase.clone().unwrap_or_default();
                    set(phase, format!("rollout: {name} at {}%", status["rollout"]["weight_percent"]));
                    if ENDED.contains(&name.as_str()) {
                        record.ended = Some(live.now());
                        break;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if record.ended.is_none() {
            return;
        }
        let operation = match record.phase.as_deref() {
            Some("rolled_back" | "aborted") => Some("abort"),
            Some("promoted") => Some("promote"),
            _ => None,
        };
        if let Some(operation) = operation {
            set(
                phase,
                format!("rollout: {}; waiting for its {operation} to finish", record.phase.as_deref().unwrap_or("")),
            );
            let by = live.now() + self.settle.as_nanos() as u64;
            let finished = || {
                stream.lock().events.iter().any(|s| s.name == "finished" && s.data["report"]["operation"] == operation)
            };
            while !finished() && stream.lock().error.is_none() && live.now() < by && !live.stopped() {
                std::thread::sleep(Duration::from_millis(2));
            }
        }
        if let Ok(status) = self.send("GET", &self.status_url, None) {
            note_status(record, &status);
            record.decisions = status["rollout"]["decisions"]
                .as_array()
                .map(|all| all.iter().filter_map(|d| decision(d, unix_t0)).collect())
                .unwrap_or_default();
        }
    }

    /// Sends a request; the JSON answer of a 2xx, else what went wrong.
    fn send(&self, method: &str, url: &str, body: Option<&Value>) -> Result<Value, String> {
        let result = match body {
            Some(body) => {
                let mut request = self.agent.post(url).header("content-type", "application/json");
                if let Some(token) = &self.token {
                    request = request.header("authorization", format!("Bearer {token}"));
                }
                request.send(body.to_string())
            }
            None => self.agent.get(url).call(),
        };
        let mut response = result.map_err(|e| format!("{method} {url}: {e}"))?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        if !(200..300).contains(&status) {
            return Err(format!("HTTP {status}: {}", error_message(text.as_bytes())));
        }
        serde_json::from_str(&text).map_err(|e| format!("{method} {url}: the answer is not JSON: {e}"))
    }
}

/// Notes the versions, mode and phase an answer of the rollout API names.
fn note_status(record: &mut RolloutRecord, answer: &Value) {
    let rollout = &answer["rollout"];
    record.stable = rollout["stable"].as_u64().or(record.stable);
    record.candidate = rollout["candidate"].as_u64().or(record.candidate);
    record.mode = rollout["mode"].as_str().map(str::to_owned).or(record.mode.take());
    record.phase = rollout["phase"].as_str().map(str::to_owned).or(record.phase.take());
}

/// Nanoseconds since the Unix epoch, now.
fn unix_ns() -> u64 {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

/// A time in ns since the Unix epoch as ns since the load started.
fn drill_ns(unix: u64, unix_t0: u64) -> u64 {
    unix.saturating_sub(unix_t0)
}

/// A decision as the server sends it (status or event), in drill time.
pub fn decision(d: &Value, unix_t0: u64) -> Option<DecisionSeen> {
    let ms = |v: &Value| v.as_u64().map(|ms| drill_ns(ms * 1_000_000, unix_t0));
    Some(DecisionSeen {
        action: d["action"].as_str()?.to_owned(),
        by: d["by"].as_str().unwrap_or_default().to_owned(),
        at: ms(&d["at_ms"])?,
        window_end: ms(&d["window_end_ms"]),
        step: d["step"].as_u64().unwrap_or_default(),
        weight_percent: d["weight_percent"].as_f64().unwrap_or_default(),
        verdict: d["verdict"].clone(),
        message: d["message"].as_str().unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_start_body_holds_only_the_options_given() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            drill: DrillArgs,
        }
        let parse = |args: &[&str]| Cli::parse_from([&["drill", "m", "--swap", "rollout"][..], args].concat()).drill;
        assert_eq!(start_body(&parse(&[])).unwrap(), json!({}));
        let args = parse(&[
            "--rollout-version",
            "2",
            "--rollout-mode",
            "shadow",
            "--rollout-steps",
            "10,50,100",
            "--rollout-interval",
            "2s",
            "--rollout-guards",
            r#"{"max_rel_l2":0.05}"#,
        ]);
        args.check().unwrap();
        assert_eq!(
            start_body(&args).unwrap(),
            json!({"version": 2, "mode": "shadow", "steps": [10.0, 50.0, 100.0], "interval_ms": 2000,
                   "guards": {"max_rel_l2": 0.05}})
        );
        assert!(parse(&["--rollout-guards", "[1]"]).check().is_err());
        assert!(parse(&["--rollout-steps", "0,50"]).check().is_err());
    }

    #[test]
    fn decisions_are_read_in_drill_time() {
        let unix_t0 = 1_700_000_000_000 * 1_000_000;
        let d = json!({"action": "rolled_back", "by": "guards", "at_ms": 1_700_000_000_900u64,
                       "window_end_ms": 1_700_000_000_850u64, "step": 0, "weight_percent": 0.0,
                       "verdict": {"outcome": "fail"}, "message": "rolled back"});
        let seen = decision(&d, unix_t0).unwrap();
        assert_eq!((seen.at, seen.window_end), (900_000_000, Some(850_000_000)));
        assert_eq!((seen.action.as_str(), seen.by.as_str()), ("rolled_back", "guards"));
        assert!(decision(&json!({"at_ms": 1}), unix_t0).is_none(), "no action, no decision");
    }
}
