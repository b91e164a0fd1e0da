//! Holding the rollouts' judgements, as a barrier: an upgrade holds them,
//! then writes what the new process takes up, and no judgement may land in
//! between.
//!
//! A judgement is in flight from the moment the controller starts reading
//! its window (the metric guards' queries included, which can take up to
//! the metric source's timeout) until what it decided is applied or
//! dropped. Setting the hold waits until none is in flight. A judgement
//! checks the hold again before it applies, and applies under the hold's
//! lock: one that began before the hold was set, and read its numbers
//! while it was being set, is dropped, and its window is judged afresh
//! once the hold is released.

use std::sync::{Condvar, MutexGuard, PoisonError};

use crate::threads::sync::Lock;

/// The hold and the judgements in flight.
#[derive(Debug, Default)]
pub(crate) struct Hold {
    state: Lock<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    held: bool,
    judging: usize,
}

impl Hold {
    /// Holds the judgements (`true`), waiting until none is in flight, or
    /// releases them.
    pub(crate) fn set(&self, held: bool) {
        let mut state = self.state.lock();
        state.held = held;
        while held && state.judging > 0 {
            state = self.changed.wait(state).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Whether the judgements are held.
    pub(crate) fn is_held(&self) -> bool {
        self.state.lock().held
    }

    /// Begins a judgement, unless the judgements are held.
    pub(crate) fn begin(&self) -> Option<Judging<'_>> {
        let mut state = self.state.lock();
        if state.held {
            return None;
        }
        state.judging += 1;
        Some(Judging { hold: self })
    }
}

/// A judgement in flight; it ends when dropped.
pub(crate) struct Judging<'a> {
    hold: &'a Hold,
}

impl Judging<'_> {
    /// The right to apply what was decided: `None` when the judgements
    /// were held since this one began. Hold it while applying, so that a
    /// hold set meanwhile waits until what was decided has landed.
    pub(crate) fn apply(&self) -> Option<Applying<'_>> {
        let state = self.hold.state.lock();
        (!state.held).then_some(Applying { _state: state })
    }
}

/// What a judgement holds while it applies its decision: a hold being set
/// waits for it.
pub(crate) struct Applying<'a> {
    _state: MutexGuard<'a, State>,
}

impl Drop for Judging<'_> {
    fn drop(&mut self) {
        self.hold.state.lock().judging -= 1;
        self.hold.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_hold_waits_for_the_judgement_in_flight_and_drops_what_it_decided() {
        let hold = Arc::new(Hold::default());
        let judging = hold.begin().expect("not held");
        let setter = {
            let hold = Arc::clone(&hold);
            std::thread::spawn(move || hold.set(true))
        };
        while !hold.is_held() {
            std::thread::yield_now();
        }
        assert!(!setter.is_finished(), "the hold returned while a judgement was in flight");
        assert!(judging.apply().is_none(), "a judgement that began before the hold lands after it");
        drop(judging);
        setter.join().unwrap();
        assert!(hold.begin().is_none(), "no judgement begins while held");
        hold.set(false);
        let judging = hold.begin().expect("released");
        assert!(judging.apply().is_some());
    }
}
