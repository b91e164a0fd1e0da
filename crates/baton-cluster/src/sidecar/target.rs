//! The target server's model-repository extension and readiness, over
//! KServe V2 REST. Calls block: run them in `spawn_blocking`.

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

    /// `POST /v2/repository/models/{model}/load` with `body`; returns once
    /// the server answered 200, else says why.
    pub fn load(&self, model: &str, body: &Value) -> Result<(), String> {
        let url = format!("{}/v2/repository/models/{model}/load", self.base);
        let mut request = self.http.post(&url).header("content-type", "application/json");
        if let Some(token) = &self.token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let mut response = request.send(body.to_string()).map_err(|e| format!("POST {url}: {e}"))?;
        let status = response.status().as_u16();
        if status == 200 {
            return Ok(());
        }
        let text = response.body_mut().read_to_string().unwrap_or_default();
        let message = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("error").and_then(Value::as_str).map(str::to_owned))
            .unwrap_or(text);
        Err(format!("the server answered {status} to the load of model {model}: {message}"))
    }

    /// Whether `GET path` answers 200.
    fn ok(&self, path: &str) -> bool {
        self.http.get(&format!("{}{path}", self.base)).call().is_ok_and(|r| r.status().as_u16() == 200)
    }

    /// Waits until the model, and its `version`, answer ready, within the
    /// load timeout.
    pub fn wait_ready(&self, model: &str, version: u64) -> Result<(), String> {
        let deadline = Instant::now() + self.load_timeout;
        let model_ready = format!("/v2/models/{model}/ready");
        let version_ready = format!("/v2/models/{model}/versions/{version}/ready");
        while !(self.ok(&model_ready) && self.ok(&version_ready)) {
            if Instant::now() >= deadline {
                return Err(format!(
                    "model {model} version {version} was not ready within {:?} after its load",
                    self.load_timeout
                ));
            }
            std::thread::sleep(READY_POLL);
        }
        Ok(())
    }
}
