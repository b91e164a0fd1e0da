//! A request's deadline: the earliest of what the client asked for and the
//! server's default (`--request-timeout`), counted from the moment the
//! request arrived.
//!
//! A client says how long it waits in one of three ways:
//!
//! - gRPC's `grpc-timeout` metadata (every gRPC client's deadline);
//! - over HTTP, the header [`TIMEOUT_HEADER`] in milliseconds;
//! - Triton's request parameter `timeout`, in microseconds, over either
//!   protocol (0 means none, as in Triton).
//!
//! A request whose deadline has passed is answered at once with
//! `deadline_exceeded` and is never run (see [`crate::serving`]).

use std::time::{Duration, Instant};

use axum::http::HeaderMap;

use crate::error::ServeError;

/// The HTTP header that carries a client's timeout, in milliseconds.
/// Namespaced like `baton-error-kind`: no standard header says this.
pub const TIMEOUT_HEADER: &str = "baton-timeout-ms";

/// Triton's request parameter for a timeout, in microseconds.
pub const TIMEOUT_PARAMETER: &str = "timeout";

/// The instant `timeout` after `start`, if there is a timeout.
pub fn after(start: Instant, timeout: Option<Duration>) -> Option<Instant> {
    timeout.and_then(|t| start.checked_add(t))
}

/// The earlier of two deadlines; none when neither is set.
pub fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The timeout an HTTP request's [`TIMEOUT_HEADER`] asks for.
pub fn from_header(headers: &HeaderMap) -> Result<Option<Duration>, ServeError> {
    let Some(value) = headers.get(TIMEOUT_HEADER) else { return Ok(None) };
    let parsed = value.to_str().ok().and_then(|v| v.trim().parse::<u64>().ok());
    parsed.map(|ms| Some(Duration::from_millis(ms))).ok_or_else(|| {
        ServeError::bad_request(
            "invalid_header",
            format!("header {TIMEOUT_HEADER} must be a whole number of milliseconds, got {value:?}"),
        )
    })
}

/// The timeout gRPC's `grpc-timeout` metadata asks for: up to eight digits
/// and a unit, `H`, `M`, `S`, `m` (milliseconds), `u` or `n`.
pub fn from_grpc_timeout(value: &str) -> Result<Duration, ServeError> {
    let invalid = || ServeError::bad_request("invalid_timeout", format!("grpc-timeout '{value}' is not a timeout"));
    let split = value.len().checked_sub(1).filter(|&at| at > 0 && at <= 8 && value.is_char_boundary(at));
    let (digits, unit) = value.split_at(split.ok_or_else(invalid)?);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    let n: u64 = digits.parse().map_err(|_| invalid())?;
    Ok(match unit {
        "H" => Duration::from_secs(n * 3600),
        "M" => Duration::from_secs(n * 60),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return Err(invalid()),
    })
}

/// The timeout Triton's `timeout` request parameter asks for, given in
/// microseconds; 0 means none.
pub fn from_parameter_us(value: Option<i128>) -> Result<Option<Duration>, ServeError> {
    match value {
        None | Some(0) => Ok(None),
        Some(us) => u64::try_from(us).map(|us| Some(Duration::from_micros(us))).map_err(|_| {
            ServeError::bad_request(
                "invalid_parameter",
                format!("parameter '{TIMEOUT_PARAMETER}' must be a non-negative number of microseconds, got {us}"),
            )
        }),
    }
}

/// The `timeout` parameter of a REST request, if it has one.
pub fn from_json_parameters(
    parameters: &serde_json::Map<String, serde_json::Value>,
) -> Result<Option<Duration>, ServeError> {
    match parameters.get(TIMEOUT_PARAMETER) {
        None => Ok(None),
        Some(value) => {
            let us = value.as_i64().map(i128::from).or_else(|| value.as_u64().map(i128::from)).ok_or_else(|| {
                ServeError::bad_request(
                    "invalid_parameter",
                    format!("parameter '{TIMEOUT_PARAMETER}' must be a whole number of microseconds, got {value}"),
                )
            })?;
            from_parameter_us(Some(us))
        }
    }
}

/// The answer for a request whose deadline passed before it was answered.
pub fn exceeded() -> ServeError {
    ServeError::deadline_exceeded("the request's deadline passed before it was answered")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit_and_refuse_the_rest() {
        assert_eq!(from_grpc_timeout("100m").unwrap(), Duration::from_millis(100));
        assert_eq!(from_grpc_timeout("2S").unwrap(), Duration::from_secs(2));
        assert_eq!(from_grpc_timeout("1H").unwrap(), Duration::from_secs(3600));
        assert_eq!(from_grpc_timeout("3M").unwrap(), Duration::from_secs(180));
        assert_eq!(from_grpc_timeout("7u").unwrap(), Duration::from_micros(7));
        assert_eq!(from_grpc_timeout("99999999n").unwrap(), Duration::from_nanos(99_999_999));
        for bad in ["", "m", "100", "123456789m", "-1m", "1x", "1.5S"] {
            assert!(from_grpc_timeout(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn headers_and_parameters_give_timeouts_and_the_earliest_deadline_wins() {
        let mut headers = HeaderMap::new();
        assert_eq!(from_header(&headers).unwrap(), None);
        headers.insert(TIMEOUT_HEADER, "250".parse().unwrap());
        assert_eq!(from_header(&headers).unwrap(), Some(Duration::from_millis(250)));
        headers.insert(TIMEOUT_HEADER, "soon".parse().unwrap());
        assert_eq!(from_header(&headers).unwrap_err().kind, "invalid_header");

        let params = |v: serde_json::Value| v.as_object().unwrap().clone();
        assert_eq!(from_json_parameters(&params(serde_json::json!({}))).unwrap(), None);
        assert_eq!(from_json_parameters(&params(serde_json::json!({"timeout": 0}))).unwrap(), None);
        let t = from_json_parameters(&params(serde_json::json!({"timeout": 1500}))).unwrap();
        assert_eq!(t, Some(Duration::from_micros(1500)));
        assert!(from_json_parameters(&params(serde_json::json!({"timeout": -1}))).is_err());
        assert!(from_json_parameters(&params(serde_json::json!({"timeout": "1"}))).is_err());

        let now = Instant::now();
        let (soon, later) = (after(now, Some(Duration::from_millis(1))), after(now, Some(Duration::from_secs(1))));
        assert_eq!(earliest(soon, later), soon);
        assert_eq!(earliest(None, later), later);
        assert_eq!(earliest(None, None), None);
    }
}
