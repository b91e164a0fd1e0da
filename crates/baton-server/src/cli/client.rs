//! A small blocking HTTP client for the management commands.

use std::io::{BufRead, BufReader};

use anyhow::{Context, bail};
use serde_json::Value;

/// An error answer from the server: its HTTP status, and the message with
/// what to do about it.
#[derive(Debug)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

/// Talks to one server.
pub struct Client {
    base: String,
    agent: ureq::Agent,
    authorization: Option<String>,
}

impl Client {
    /// A client of the server at `base` (e.g. `http://127.0.0.1:8000`).
    pub fn new(base: &str) -> Client {
        let agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        Client { base: base.trim_end_matches('/').to_owned(), agent, authorization: None }
    }

    /// Sends `token` as `Authorization: Bearer <token>` with every request.
    pub fn with_token(mut self, token: Option<String>) -> Client {
        self.authorization = token.map(|t| format!("Bearer {t}"));
        self
    }

    fn get(&self, path: &str) -> ureq::RequestBuilder<ureq::typestate::WithoutBody> {
        let request = self.agent.get(&self.url(path));
        match &self.authorization {
            Some(value) => request.header("authorization", value),
            None => request,
        }
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
            let hint = match body.get("kind").and_then(Value::as_str) {
                Some("unauthorized") => "; give the admin token with --token-file (or BATON_TOKEN_FILE)",
                Some("wrong_listener") => "; point --admin-url (or BATON_ADMIN_URL) at the admin listener",
                _ => "",
            };
            return Err(Refused {
                status: status.as_u16(),
                message: format!("{message} (HTTP {}){hint}", status.as_u16()),
            }
            .into());
        }
        Ok(body)
    }

    /// GET a JSON document.
    pub fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let response = self.get(path).call();
        self.read(path, response)
    }

    /// POST a JSON body, read a JSON answer.
    pub fn post_json(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send_json(ureq::http::Method::POST, path, body)
    }

    /// Sends a JSON body with `method` (POST, PUT, DELETE), reads a JSON answer.
    pub fn send_json(&self, method: ureq::http::Method, path: &str, body: &Value) -> anyhow::Result<Value> {
        let mut request = ureq::http::Request::builder()
            .method(method)
            .uri(self.url(path))
            .header("content-type", "application/json");
        if let Some(value) = &self.authorization {
            request = request.header("authorization", value);
        }
        let request = request.body(body.to_string()).context("building a request")?;
        self.read(path, self.agent.run(request))
    }

    /// Opens the event stream; returns its lines as they arrive.
    pub fn events(&self) -> anyhow::Result<impl BufRead + Send + 'static> {
        let response = self
            .get("/baton/v1/events")
            .header("accept", "text/event-stream")
            .call()
            .with_context(|| format!("cannot reach baton at {}", self.base))?;
        if !response.status().is_success() {
            bail!("the server refused the event stream (HTTP {})", response.status().as_u16());
        }
        Ok(BufReader::new(response.into_body().into_reader()))
    }
}
