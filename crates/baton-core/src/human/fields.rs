//! Values as log fields show them: what a person reads, not Rust's debug
//! form (`3.96`, not `3.9587930000000005`; `1,2`, not `[1, 2]`).

use std::time::Duration;

/// A duration in milliseconds, to the hundredth.
pub fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 100_000.0).round() / 100.0
}

/// Versions (or anything numbered) as `1,2`; empty for none.
pub fn list<T: std::fmt::Display>(items: &[T]) -> String {
    items.iter().map(ToString::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_keep_hundredths_and_lists_commas() {
        assert_eq!(ms(Duration::from_nanos(3_958_793)), 3.96);
        assert_eq!(ms(Duration::from_millis(30)).to_string(), "30");
        assert_eq!(list(&[1u64, 2]), "1,2");
        assert_eq!(list::<u64>(&[]), "");
    }
}
