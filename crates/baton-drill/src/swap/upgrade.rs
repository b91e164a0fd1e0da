//! `--swap upgrade`: replaces baton's process under the load with a new
//! one of its executable as on disk (the server never runs a binary a
//! request names). A swap posts
//! `POST /baton/v1/upgrade`, which answers once the new process serves,
//! then waits for the old process to exit: the swap is done, and its window
//! starts to close, only then, so the window covers the old process's
//! drain. The memory sampled follows both processes while both live, then
//! the new one alone.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use serde_json::{Value, json};

use super::action::{Outcome, admin_agent, admin_url};
use crate::args::DrillArgs;
use crate::caller::error_message;
use crate::rss::Followed;
use crate::target::Endpoint;

/// One upgrade's handover, as the drill saw it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Handover {
    /// The process replaced.
    pub old_pid: u32,
    /// The process that serves after it.
    pub new_pid: u32,
    /// From the request to the new process serving (the server's answer), ms.
    pub ready_ms: f64,
    /// From the request to the old process's exit, ms; none when it had
    /// not exited within the swap timeout.
    pub old_exit_ms: Option<f64>,
}

impl Eq for Handover {}

/// A configured upgrade.
pub struct Upgrade {
    url: String,
    token: Option<String>,
    agent: ureq::Agent,
    timeout: Duration,
    followed: Followed,
}

impl Upgrade {
    /// The upgrade the options describe.
    pub fn from_args(args: &DrillArgs, http: &Endpoint, followed: &Followed) -> anyhow::Result<Upgrade> {
        Ok(Upgrade {
            url: admin_url(args, http, "/baton/v1/upgrade"),
            token: baton_protocol::token::client_token(args.token_file.as_deref())?,
            agent: admin_agent(args),
            timeout: args.swap_timeout,
            followed: std::sync::Arc::clone(followed),
        })
    }

    /// Makes one upgrade and waits for the old process to exit.
    pub fn run(&self) -> Outcome {
        let failed = |detail: String| Outcome { ok: false, detail, version: None, handover: None };
        let started = Instant::now();
        let body = json!({ "timeout_s": self.timeout.as_secs().max(1) });
        let mut request = self.agent.post(&self.url).header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let mut response = match request.send(body.to_string()) {
            Ok(response) => response,
            Err(e) => return failed(format!("POST {}: {e}", self.url)),
        };
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().unwrap_or_default();
        if !(200..300).contains(&status) {
            return failed(format!("HTTP {status}: {}", error_message(text.as_bytes())));
        }
        let ready_ms = started.elapsed().as_secs_f64() * 1e3;
        let answer: Value = serde_json::from_str(&text).unwrap_or_default();
        let pid = |key: &str| answer[key].as_u64().and_then(|p| u32::try_from(p).ok());
        let (Some(old_pid), Some(new_pid)) = (pid("old_pid"), pid("new_pid")) else {
            return failed(format!("the upgrade's answer names no old_pid and new_pid: {text}"));
        };
        self.follow(|pids| pids.push(new_pid));
        let limit = started + self.timeout;
        while !gone(old_pid) && Instant::now() < limit {
            std::thread::sleep(Duration::from_millis(2));
        }
        let old_exit_ms = gone(old_pid).then(|| started.elapsed().as_secs_f64() * 1e3);
        if old_exit_ms.is_some() {
            self.follow(|pids| pids.retain(|&p| p != old_pid));
        }
        let detail = match old_exit_ms {
            Some(exit) => format!(
                "pid {old_pid} → {new_pid}: the new process served after {ready_ms:.0} ms, the old one exited after {exit:.0} ms"
            ),
            None => format!("pid {old_pid} → {new_pid}: the old process had not exited after {:?}", self.timeout),
        };
        Outcome {
            ok: old_exit_ms.is_some(),
            detail,
            version: None,
            handover: Some(Handover { old_pid, new_pid, ready_ms, old_exit_ms }),
        }
    }

    fn follow(&self, change: impl FnOnce(&mut Vec<u32>)) {
        change(&mut self.followed.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Whether process `pid` has exited: no longer in `/proc`, or a zombie
/// (it serves nothing, and only its parent can reap it).
pub fn gone(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_or(true, |stat| stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')))
}

/// The pid of the baton server behind `http` (its status's `pid`), for the
/// memory sampled when no --pid is given.
pub fn server_pid(args: &DrillArgs, http: &Endpoint) -> anyhow::Result<u32> {
    server_process(args, http).map(|(pid, _)| pid)
}

/// The server's pid and, when it reports it, when its process started
/// ([`crate::rss::start_time`]), from its status.
pub fn server_process(args: &DrillArgs, http: &Endpoint) -> anyhow::Result<(u32, Option<u64>)> {
    let url = admin_url(args, http, "/baton/v1/status");
    let mut request = admin_agent(args).get(&url);
    if let Some(token) = baton_protocol::token::client_token(args.token_file.as_deref())? {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    let mut response = request.call().with_context(|| format!("GET {url}"))?;
    anyhow::ensure!(
        response.status().is_success(),
        "GET {url} answered HTTP {} (a server that is not baton?)",
        response.status().as_u16()
    );
    let status: Value = serde_json::from_str(&response.body_mut().read_to_string()?)
        .with_context(|| format!("GET {url}: the answer is not JSON"))?;
    let pid = status["pid"]
        .as_u64()
        .and_then(|p| u32::try_from(p).ok())
        .with_context(|| format!("GET {url}: the status names no pid"))?;
    Ok((pid, status["process_started"].as_u64()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_running_process_is_not_gone_and_one_that_exited_is_before_it_is_reaped() {
        assert!(!gone(std::process::id()));
        let mut child = std::process::Command::new("true").spawn().expect("starting true");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !gone(child.id()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Not reaped yet: a zombie.
        assert!(std::path::Path::new(&format!("/proc/{}", child.id())).exists());
        assert!(gone(child.id()));
        child.wait().expect("reaping true");
    }
}
