//! Stepping aside where it does not exist (any system but Linux): arming
//! warns once and does nothing, so the crate builds and behaves as with
//! stepping aside off.

use std::marker::PhantomData;
use std::time::Duration;

use super::{Counts, StepAside};

/// Would arm the calling thread; here it warns once that it cannot.
pub(super) fn arm(_policy: StepAside) -> Armed {
    static WARNED: std::sync::Once = std::sync::Once::new();
    WARNED.call_once(|| {
        crate::threads::agent::at_serving_priority(|| {
            tracing::warn!("Stepping aside needs Linux; loading threads keep their priority alone.");
        });
    });
    Armed::none()
}

/// Stepping aside, armed on the thread that created it; never active here.
#[derive(Debug)]
pub struct Armed {
    _this_thread: PhantomData<*const ()>,
}

impl Armed {
    pub(super) fn none() -> Armed {
        Armed { _this_thread: PhantomData }
    }

    /// Whether the timer really runs: never here.
    pub fn is_active(&self) -> bool {
        false
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        // Nothing to stop; the guard keeps the same shape as on Linux.
    }
}

/// Whether the calling thread is armed now: never here.
pub fn armed_here() -> bool {
    false
}

/// How long the calling thread has been stepped aside: never here.
pub fn paused_here() -> Duration {
    Duration::ZERO
}

/// The process-wide counts: all zero here.
pub(super) fn counts() -> Counts {
    Counts::default()
}

/// Notes that a request is being served now; nothing to note here.
pub fn note_request() {}

/// Would keep the step-aside signal blocked; there is none here.
pub fn hold() -> Hold {
    Hold { _this_thread: PhantomData }
}

/// The guard of [`hold`].
#[derive(Debug)]
pub struct Hold {
    _this_thread: PhantomData<*const ()>,
}
