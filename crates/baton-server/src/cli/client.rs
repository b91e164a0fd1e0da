//! A small blocking HTTP client for the management commands.

use std::io::{BufRead, BufReader};

use anyhow::{Context, bail};
use serde_json::Value;

/// Talks to one server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8000`).
    pub fn new(base: &str) -> Client {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        Client { base: base.trim_end_matches('/').to_owned(), agent }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn read(
        &self,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> anyhow::Result<Value> {
        let mut response = response.with_context(|| format!("cannot reach baton at {}", self.base))?;
        let status = response.status();
        let text = response.body_mut().read_to_string().with_context(|| format!("reading the answer to {path}"))?;
        let body: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if !status.is_success() {
            let message =
                body.get("error").and_then(Value::as_str).map(str::to_owned).unwrap_or_else(|| body.to_string());
            bail!("{message} (HTTP {})", status.as_u16());
        }
        Ok(body)
    }

    /// GET a JSON document.
    pub fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.agent.get(&self.url(path)).call();
        self.read(path, response)
    }

    /// POST a JSON body, read a JSON answer.
    pub fn post_json(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let response =
            self.agent.post(&self.url(path)).header("content-type", "application/json").send(body.to_string());
        self.read(path, response)
    }

    /// Opens the event stream; returns its lines as they arrive.
    pub fn events(&self) -> anyhow::Result<impl BufRead + Send + 'static> {
        let response = self
            .agent
            .get(&self.url("/baton/v1/events"))
            .header("accept", "text/event-stream")
            .call()
            .with_context(|| format!("cannot reach baton at {}", self.base))?;
        if !response.status().is_success() {
            bail!("the server refused the event stream (HTTP {})", response.status().as_u16());
        }
        Ok(BufReader::new(response.into_body().into_reader()))
    }
}
