//! How long a fleet process waits before it tries etcd again: waits that
//! double from a first to a last, each spread at random (backon's
//! exponential backoff with jitter: a wait of `d` becomes one between `d`
//! and `2d`). Replicas that lost etcd together do not come back at the
//! same instant, and a member that stays away is tried less and less
//! often, so that a fleet of hundreds does not hammer an etcd that is
//! struggling to come back.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// The waits between tries of one thing that keeps failing.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    waits: ExponentialBackoff,
    last: Duration,
}

impl Backoff {
    /// Waits that start at `first` and double up to `last`, before jitter.
    pub fn new(first: Duration, last: Duration) -> Backoff {
        let builder = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(last)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff { builder, waits: builder.build(), last }
    }

    /// The wait before the next try.
    pub fn next_wait(&mut self) -> Duration {
        // Endless (no most times): the fallback is never taken.
        self.waits.next().unwrap_or(self.last)
    }

    /// Starts again from the first wait, after a success.
    pub fn reset(&mut self) {
        self.waits = self.builder.build();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Backoff;

    const FIRST: Duration = Duration::from_millis(100);
    const LAST: Duration = Duration::from_secs(5);

    #[test]
    fn waits_double_up_to_the_last_each_spread_by_jitter() {
        let mut backoff = Backoff::new(FIRST, LAST);
        let mut base = FIRST;
        for attempt in 0..12 {
            let wait = backoff.next_wait();
            assert!(wait >= base && wait < base * 2, "try {attempt}: {wait:?} is not in [{base:?}, {:?})", base * 2);
            base = (base * 2).min(LAST);
        }
        // Two processes that failed together do not come back together.
        let waits = |_| {
            let mut b = Backoff::new(FIRST, LAST);
            (0..6).map(|_| b.next_wait()).collect::<Vec<_>>()
        };
        let runs: Vec<Vec<Duration>> = (0..4).map(waits).collect();
        assert!(runs.windows(2).any(|w| w[0] != w[1]), "no jitter: {runs:?}");
        // A success starts again from the first wait.
        backoff.reset();
        let wait = backoff.next_wait();
        assert!(wait >= FIRST && wait < FIRST * 2, "{wait:?}");
    }
}
