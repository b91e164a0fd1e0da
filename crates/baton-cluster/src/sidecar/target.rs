//! The target server's model-repository extension and readiness, over
//! KServe V2 REST. Calls block: run them in `spawn_blocking`. Each call is
//! bounded by the deadline it is given, so that a server that hangs ends
//! a whole operation (a trial, a switch) at one deadline, not one per call.

use std::time::{Duration, Instant};

use serde_json::Value;

/// How often readiness is asked again while waiting for it.
const READY_POLL: Duration = Duration::from_millis(50);

/// A KServe V2 server with the model-repository extension.
#[derive(Clone)]
pub struct Target {
    base: String,
    token: Option<String>,
    http: ureq::Agent,
    load_timeout: Duration,
}

impl Target {
    /// The server at `base` (`http://HOST:PORT`); `token`, when given, is
    /// sent as a bearer token; a load may take up to `load_timeout`.
    pub fn new(base: &str, token: Option<String>, load_timeout: Duration) -> Target {
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(5)))
            .timeout_global(Some(load_timeout))
            .build()
            .into();
        Target { base: base.trim_end_matches('/').to_owned(), token, http, load_timeout }
    }

    /// The server's base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// How long one load, readiness included, may take.
    pub fn load_timeout(&self) -> Duration {
        self.load_timeout
    }

    /// `POST /v2/repository/models/{model}/load` with `body`; returns once
    /// the server answered 200 (by `until`), else says why.
    pub fn load(&self, model: &str, body: &Value, until: Instant) -> Result<(), String> {
        let url = format!("{}/v2/repository/models/{model}/load", self.base);
        let request = self.http.post(&url).config().timeout_global(Some(left(until, &url)?)).build();
        let mut request = request.header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = request.send(body.to_string()).map_err(|e| format!("POST {url}: {e}"))?;
        answered(response, &format!("the load of model {model}"))
    }

    /// `POST /v2/repository/models/{model}/unload`; returns once the server
    /// answered 200 (it may still be unloading), else says why.
    pub fn unload(&self, model: &str) -> Result<(), String> {
        let url = format!("{}/v2/repository/models/{model}/unload", self.base);
        let mut request = self.http.post(&url).header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = request.send("{}").map_err(|e| format!("POST {url}: {e}"))?;
        answered(response, &format!("the unload of model {model}"))
    }

    /// `GET /v2/models/{model}/versions/{version}`: the version's
    /// metadata, by `until`.
    pub fn metadata(&self, model: &str, version: u64, until: Instant) -> Result<Value, String> {
        let url = format!("{}/v2/models/{model}/versions/{version}", self.base);
        let mut request = self.http.get(&url).config().timeout_global(Some(left(until, &url)?)).build();
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let mut response = request.call().map_err(|e| format!("GET {url}: {e}"))?;
        if response.status().as_u16() != 200 {
            return Err(format!("the server answered {} to the metadata of model {model}", response.status()));
        }
        let text = response.body_mut().read_to_string().map_err(|e| format!("GET {url}: {e}"))?;
        serde_json::from_str(&text).map_err(|e| format!("the metadata of model {model} is not JSON: {e}"))
    }

    /// `POST /v2/models/{model}/versions/{version}/infer` with `body`;
    /// returns once the server answered 200 (by `until`), else says why.
    pub fn infer(&self, model: &str, version: u64, body: &Value, until: Instant) -> Result<(), String> {
        let url = format!("{}/v2/models/{model}/versions/{version}/infer", self.base);
        let request = self.http.post(&url).config().timeout_global(Some(left(until, &url)?)).build();
        let mut request = request.header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let response = request.send(body.to_string()).map_err(|e| format!("POST {url}: {e}"))?;
        answered(response, &format!("an inference request to model {model} version {version}"))
    }

    /// Whether `GET path` answers 200 by `until`.
    fn ok(&self, path: &str, until: Instant) -> bool {
        let url = format!("{}{path}", self.base);
        let Ok(left) = left(until, &url) else { return false };
        let request = self.http.get(&url).config().timeout_global(Some(left)).build();
        request.call().is_ok_and(|r| r.status().as_u16() == 200)
    }

    /// Waits until the model, and its `version`, answer ready, by `until`.
    pub fn wait_ready(&self, model: &str, version: u64, until: Instant) -> Result<(), String> {
        let model_ready = format!("/v2/models/{model}/ready");
        let version_ready = format!("/v2/models/{model}/versions/{version}/ready");
        while !(self.ok(&model_ready, until) && self.ok(&version_ready, until)) {
            if Instant::now() >= until {
                return Err(format!(
                    "model {model} version {version} was not ready within the load timeout ({:?})",
                    self.load_timeout
                ));
            }
            std::thread::sleep(READY_POLL.min(until.saturating_duration_since(Instant::now())));
        }
        Ok(())
    }
}

/// What is left until `until` for a call to `url`; an error once nothing is.
fn left(until: Instant, url: &str) -> Result<Duration, String> {
    let left = until.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(format!("{url}: no time left within the load timeout"));
    }
    Ok(left)
}

/// Ok for a 200, else what the server said (its `error`, or its body, cut
/// to a few kilobytes) to `what`.
fn answered(mut response: ureq::http::Response<ureq::Body>, what: &str) -> Result<(), String> {
    const SAID: u64 = 4096;
    let status = response.status().as_u16();
    if status == 200 {
        return Ok(());
    }
    let text = response.body_mut().with_config().limit(SAID).read_to_string().unwrap_or_default();
    let message = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or(text);
    Err(format!("the server answered {status} to {what}: {}", message.trim_end()))
}

/// Refuses a target URL that carries credentials (`user:password@`): a
/// secret is never taken from the command line, and would show in every
/// error that names the URL. The token goes in a file instead.
pub fn check_url(url: &str) -> Result<(), String> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err("the target URL carries credentials (user:password@): give the target's token in a file with \
                    --target-token-file instead, and the URL without them"
            .into());
    }
    if !(url.starts_with("http://") || url.starts_with("https://")) {
        return Err("the target URL must start with http:// or https://".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_url;

    #[test]
    fn a_target_url_with_credentials_is_refused_without_repeating_them() {
        assert!(check_url("http://127.0.0.1:8000").is_ok());
        assert!(check_url("https://triton.internal:8000/").is_ok());
        assert!(check_url("http://127.0.0.1:8000/path?q=a@b").is_ok(), "an @ past the host is no credential");
        let refused = check_url("http://admin:pa55@127.0.0.1:8000").unwrap_err();
        assert!(refused.contains("--target-token-file") && !refused.contains("pa55"), "{refused}");
        assert!(check_url("ftp://host").is_err());
    }
}
