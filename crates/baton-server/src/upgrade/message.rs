//! What the old and the new process say to each other over the channel
//! (a Unix `SOCK_SEQPACKET` pair: one message per send, whole or not at
//! all), as JSON, in this order:
//!
//! ```text
//! old → new   Listeners { names, fleet, kept, cold }   + the sockets (SCM_RIGHTS)
//! new → old   Checked                                  what a start checks passed
//!         or  Failed { reason }                        and it exits
//! new → old   Ready { pid }                            it accepts (warm only)
//!         or  Failed { reason }
//! ```
//!
//! The channel closing is a message too: the new process reads it as "the
//! old one is gone or gave up" and stops; the old one reads it as "the new
//! one died".

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};

use baton_worker::channel::Channel;
use serde::{Deserialize, Serialize};

/// Messages on the channel.
#[derive(Debug, Serialize, Deserialize)]
pub(super) enum Message {
    /// Old to new: the listening sockets, named, their descriptors attached
    /// in order, and what the new process takes on.
    Listeners {
        names: Vec<String>,
        #[serde(default)]
        fleet: Fleet,
        #[serde(default)]
        kept: Kept,
        /// A cold handover: the old process drains and exits first, and
        /// the new one loads only then.
        #[serde(default)]
        cold: bool,
    },
    /// New to old: its flags, the state file, the token file and the
    /// repository passed what a start checks before it loads anything.
    Checked,
    /// New to old: it serves.
    Ready { pid: u32 },
    /// New to old: it could not start or become ready, and exits.
    Failed { reason: String },
}

/// What a replica of a fleet hands on: its ID, resolved once (the new
/// process is the same replica, whatever its environment would make of
/// it), and its live lease, under which its registration, acks and
/// coordinator keys stay where they are through the handover.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Fleet {
    /// The replica's ID.
    pub replica_id: Option<String>,
    /// The lease it acts under now.
    pub lease: Option<i64>,
}

/// The versions each model keeps for rollback, newest first.
pub type Kept = BTreeMap<String, Vec<u64>>;

impl Message {
    /// Sends this message with `fds` attached.
    pub fn send(&self, channel: &Channel, fds: &[BorrowedFd<'_>]) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        channel.send(&bytes, fds)
    }

    /// The next message and its descriptors; `None` once the other end
    /// closed. A message that does not parse is an error: both ends are
    /// the same program, or one that speaks this protocol.
    pub fn receive(channel: &Channel) -> std::io::Result<Option<(Message, Vec<OwnedFd>)>> {
        let mut buffer = Vec::new();
        let Some(fds) = channel.recv(&mut buffer)? else { return Ok(None) };
        let message = serde_json::from_slice(&buffer)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("an upgrade message: {e}")))?;
        Ok(Some((message, fds)))
    }
}
