//! The gate of a model whose version is being replaced under the resource
//! swap policy ([`crate::files::spec::SwapPolicy::Resource`]).
//!
//! While the old version is drained and freed and the new one loads, the
//! routing table holds no route for the model but this gate. A request that
//! finds it waits for it to open (without holding the table), then takes a
//! new snapshot: it is answered by the new version, or by the old one
//! loaded back when the new one failed. How long to wait is the caller's
//! to bound (a request's deadline, say); the core only says when.

use std::time::Instant;

use tokio::sync::watch;

/// A closed gate; opened once, by the commit that ends the pause (or the
/// publish that ends a failed one). Dropping it opens it too.
#[derive(Debug)]
pub struct Pause {
    open: watch::Sender<bool>,
    since: Instant,
    replacing: u64,
}

impl Pause {
    /// A closed gate for a pause that replaces version `replacing`.
    pub(crate) fn new(replacing: u64) -> Pause {
        Pause { open: watch::Sender::new(false), since: Instant::now(), replacing }
    }

    /// Resolves once the gate opens. Holds nothing of the routing table.
    pub fn resumed(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut open = self.open.subscribe();
        async move {
            // An error means the gate was dropped, which opens it.
            let _ = open.wait_for(|open| *open).await;
        }
    }

    /// Whether the gate has opened.
    pub fn is_open(&self) -> bool {
        *self.open.borrow()
    }

    /// When the pause began.
    pub fn since(&self) -> Instant {
        self.since
    }

    /// The version the pause replaces.
    pub fn replacing(&self) -> u64 {
        self.replacing
    }

    /// Opens the gate: every waiter goes on.
    pub(crate) fn open(&self) {
        self.open.send_replace(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiters_go_on_when_the_gate_opens_or_is_dropped() {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let pause = Pause::new(1);
        let waiting = pause.resumed();
        assert!(!pause.is_open());
        pause.open();
        runtime.block_on(waiting);
        runtime.block_on(pause.resumed());
        let dropped = Pause::new(2);
        let waiting = dropped.resumed();
        drop(dropped);
        runtime.block_on(waiting);
    }
}
