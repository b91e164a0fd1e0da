//! Times as baton prints them: RFC 3339 in UTC in JSON (beside the epoch
//! seconds the documents have always carried), the local time in text.

use chrono::{DateTime, Local, SecondsFormat, Utc};
use serde_json::Value;

fn utc(epoch_s: f64) -> Option<DateTime<Utc>> {
    if !epoch_s.is_finite() || epoch_s < 0.0 {
        return None;
    }
    let nanos = (epoch_s.fract() * 1e9).round() as u32;
    DateTime::from_timestamp(epoch_s.trunc() as i64, nanos.min(999_999_999))
}

/// `epoch_s` (seconds since the Unix epoch) in RFC 3339, UTC, to the millisecond.
pub fn rfc3339(epoch_s: f64) -> Option<String> {
    utc(epoch_s).map(|t| t.to_rfc3339_opts(SecondsFormat::Millis, true))
}

/// `epoch_s` as the local date and time, to the second, e.g. `2026-12-07 14:05:09`.
pub fn local(epoch_s: f64) -> Option<String> {
    utc(epoch_s).map(|t| t.with_timezone(&Local).format("%Y-%m-%d %H:%M:%S").to_string())
}

/// `epoch_s` as the local time of day with milliseconds, e.g. `14:05:09.123`
/// (for lines that follow one another, such as events).
pub fn local_time_of_day(epoch_s: f64) -> Option<String> {
    utc(epoch_s).map(|t| t.with_timezone(&Local).format("%H:%M:%S%.3f").to_string())
}

/// Beside the epoch-seconds field `key` of the object `value`, when it has
/// one, puts `{key}_rfc3339`.
pub fn add_rfc3339(value: &mut Value, key: &str) {
    let Some(fields) = value.as_object_mut() else { return };
    if let Some(text) = fields.get(key).and_then(Value::as_f64).and_then(rfc3339) {
        fields.insert(format!("{key}_rfc3339"), Value::String(text));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_in_utc_to_the_millisecond() {
        assert_eq!(rfc3339(0.0).unwrap(), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(1_796_649_909.25).unwrap(), "2026-12-07T13:25:09.250Z");
        assert!(rfc3339(-1.0).is_none() && rfc3339(f64::NAN).is_none());
        let mut v = serde_json::json!({ "at": 1.5, "other": "x" });
        add_rfc3339(&mut v, "at");
        assert_eq!(v["at_rfc3339"], "1970-01-01T00:00:01.500Z");
        add_rfc3339(&mut v, "other");
        assert!(v.get("other_rfc3339").is_none());
    }
}
