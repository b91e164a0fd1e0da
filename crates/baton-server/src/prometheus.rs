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

/// How long one query may take before its reading is "did not answer".
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// A Prometheus server's query API.
#[derive(Debug)]
pub struct Prometheus {
    base: String,
    agent: ureq::Agent,
}

impl Prometheus {
    /// The Prometheus at `base`, e.g. `http://127.0.0.1:9090`.
    pub fn new(base: &str) -> Prometheus {
        let agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(QUERY_TIMEOUT))
            .build()
            .into();
        Prometheus { base: base.trim_end_matches('/').to_owned(), agent }
    }
}

impl MetricSource for Prometheus {
    fn read(&self, query: &str) -> Result<f64, String> {
        let url = format!("{}/api/v1/query", self.base);
        let answer = self.agent.get(&url).query("query", query).call();
        let mut response = answer.map_err(|e| format!("Prometheus at {} did not answer: {e}", self.base))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| format!("Prometheus at {} did not answer whole: {e}", self.base))?;
        let body: Value = serde_json::from_str(&text)
            .map_err(|_| format!("Prometheus at {} answered HTTP {status} with no JSON", self.base))?;
        if body["status"] != "success" {
            let error = body["error"].as_str().unwrap_or("no reason given");
            return Err(format!("Prometheus refused the query `{query}` (HTTP {status}): {error}"));
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
