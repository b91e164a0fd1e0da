//! The metric guards' source in baton's server: the operator's Prometheus,
//! asked over its HTTP API (`GET /api/v1/query`) with a timeout.
//!
//! A reading is one finite number or a sentence saying why there is none.
//! Everything else (Prometheus down or slow, a query it refuses, no series,
//! several series, NaN or an infinity) is that sentence, which the guard
//! turns into an inconclusive check, never a pass.

use std::time::Duration;

use baton_core::rollout::metric::MetricSource;
use serde_json::Value;

/// How long one query may take by default before its reading is "did not
/// answer" (`--prometheus-timeout`).
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// A Prometheus server's query API.
#[derive(Debug)]
pub struct Prometheus {
    /// The query API's URL, credentials and query string included.
    url: String,
    /// How the Prometheus is named in readings and logs: the URL without
    /// its credentials and query.
    shown: String,
    /// What must never appear in a reading: the credentials and the query.
    secrets: Vec<String>,
    timeout: Duration,
    agent: ureq::Agent,
}

impl Prometheus {
    /// The Prometheus at `base`, e.g. `http://127.0.0.1:9090` (or with
    /// credentials, `http://user:password@host:9090`, sent as basic
    /// authentication), each query given `timeout`. Refused, without
    /// repeating the URL, when it is not an `http://` or `https://` URL
    /// with a host.
    pub fn new(base: &str, timeout: Duration) -> Result<Prometheus, String> {
        let uri: axum::http::Uri =
            base.parse().map_err(|_| "--prometheus-url is not a URL (http://host:port)".to_owned())?;
        let (Some(scheme), Some(authority)) = (uri.scheme_str(), uri.authority()) else {
            return Err("--prometheus-url needs a scheme and a host, as in http://127.0.0.1:9090".to_owned());
        };
        if !matches!(scheme, "http" | "https") {
            return Err(format!("--prometheus-url must be an http:// or https:// URL, not {scheme}://"));
        }
        let host = authority.as_str().rsplit_once('@').map_or(authority.as_str(), |(_, host)| host);
        let path = uri.path().trim_end_matches('/');
        let shown = format!("{scheme}://{host}{path}");
        let mut secrets = Vec::new();
        if let Some((userinfo, _)) = authority.as_str().rsplit_once('@') {
            secrets.push(userinfo.to_owned());
            secrets.extend(userinfo.split(':').filter(|part| part.len() >= 3).map(str::to_owned));
        }
        if let Some(query) = uri.query() {
            secrets.push(query.to_owned());
            secrets.extend(query.split(['&', '=']).filter(|part| part.len() >= 3).map(str::to_owned));
        }
        let agent =
            ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(timeout)).build().into();
        let query = uri.query().map_or_else(String::new, |query| format!("?{query}"));
        let url = format!("{scheme}://{}{path}/api/v1/query{query}", authority.as_str());
        Ok(Prometheus { url, shown, secrets, timeout, agent })
    }

    /// How this Prometheus is named in readings and logs: its URL without
    /// credentials or query string.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// `text` with every credential and query part of the URL blanked out:
    /// an error from the HTTP client may quote the URL.
    fn scrub(&self, text: &str) -> String {
        let mut text = text.replace(&self.url, &self.shown);
        for secret in &self.secrets {
            text = text.replace(secret.as_str(), "…");
        }
        text
    }

    /// Why a query got no answer, in words that name no secret.
    fn unanswered(&self, error: &ureq::Error) -> String {
        let why = match error {
            ureq::Error::Timeout(_) => format!("no answer within {} ms", self.timeout.as_millis()),
            ureq::Error::HostNotFound => "its host was not found".to_owned(),
            ureq::Error::ConnectionFailed => "the connection failed".to_owned(),
            ureq::Error::Io(e) => e.kind().to_string(),
            other => self.scrub(&other.to_string()),
        };
        format!("Prometheus at {} did not answer: {why}", self.shown)
    }
}

impl MetricSource for Prometheus {
    fn read(&self, query: &str) -> Result<f64, String> {
        let answer = self.agent.get(&self.url).query("query", query).call();
        let mut response = answer.map_err(|e| self.unanswered(&e))?;
        let status = response.status().as_u16();
        let text = response.body_mut().with_config().limit(1 << 20).read_to_string().map_err(|e| {
            format!("Prometheus at {} did not answer whole: {}", self.shown, self.scrub(&e.to_string()))
        })?;
        let body: Value = serde_json::from_str(&text)
            .map_err(|_| format!("Prometheus at {} answered HTTP {status} with no JSON", self.shown))?;
        if body["status"] != "success" {
            let error = body["error"].as_str().unwrap_or("no reason given");
            return Err(format!("Prometheus refused the query `{query}` (HTTP {status}): {}", self.scrub(error)));
        }
        one_number(&body["data"]).map_err(|why| format!("the query `{query}` {why}"))
    }
}

/// The one finite number of a query's `data`: a scalar, or a vector of
/// exactly one sample.
fn one_number(data: &Value) -> Result<f64, String> {
    let sample = match data["resultType"].as_str() {
        Some("scalar") => &data["result"],
        Some("vector") => match data["result"].as_array().map(Vec::as_slice) {
            Some([one]) => &one["value"],
            Some([]) => return Err("gave no series: no data".to_owned()),
            Some(many) => {
                return Err(format!("gave {} series where one is needed; aggregate them (sum, avg)", many.len()));
            }
            None => return Err("gave a vector that is not a list".to_owned()),
        },
        Some(other) => return Err(format!("gave a {other}, where one number is needed")),
        None => return Err("gave no result type".to_owned()),
    };
    let text = sample[1].as_str().ok_or("gave a sample without a value")?;
    // Prometheus writes NaN and infinities as "NaN", "+Inf", "-Inf".
    let value: f64 = text.parse().map_err(|_| format!("gave '{text}', not a number"))?;
    if value.is_finite() { Ok(value) } else { Err(format!("gave {text}, not a finite number")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_url_is_shown_without_its_credentials_or_query() {
        let p = Prometheus::new("http://user:s3cret@prom.example:9090/sub/?token=abc123", QUERY_TIMEOUT).unwrap();
        assert_eq!(p.shown(), "http://prom.example:9090/sub");
        let scrubbed = p.scrub("bad uri: http://user:s3cret@prom.example:9090/sub/api/v1/query?token=abc123&query=up");
        for secret in ["s3cret", "abc123", "user:"] {
            assert!(!scrubbed.contains(secret), "{scrubbed}");
        }
        for bad in ["prom:9090", "ftp://prom", "not a url", "http://"] {
            let error = Prometheus::new(bad, QUERY_TIMEOUT).unwrap_err();
            assert!(error.contains("--prometheus-url"), "{bad}: {error}");
        }
    }

    #[test]
    fn one_number_takes_a_scalar_or_one_sample_and_nothing_else() {
        assert_eq!(one_number(&json!({"resultType": "scalar", "result": [1.0, "0.25"]})), Ok(0.25));
        let one = json!({"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "3"]}]});
        assert_eq!(one_number(&one), Ok(3.0));
        let empty = json!({"resultType": "vector", "result": []});
        assert!(one_number(&empty).unwrap_err().contains("no series"));
        let two = json!({"resultType": "vector", "result": [{"value": [1, "1"]}, {"value": [1, "2"]}]});
        assert!(one_number(&two).unwrap_err().contains("2 series"));
        for bad in ["NaN", "+Inf", "-Inf"] {
            let nan = json!({"resultType": "vector", "result": [{"value": [1, bad]}]});
            assert!(one_number(&nan).unwrap_err().contains("not a finite number"), "{bad}");
        }
        let matrix = json!({"resultType": "matrix", "result": []});
        assert!(one_number(&matrix).unwrap_err().contains("matrix"));
    }
}
