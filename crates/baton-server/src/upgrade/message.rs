//! What the old and the new process say to each other over the channel
//! (a Unix `SOCK_SEQPACKET` pair: one message per send, whole or not at
//! all), as JSON, in this order:
//!
//! ```text
//! old → new   Listeners { names, fleet, kept, cold, protocol }   + the sockets (SCM_RIGHTS)
//! new → old   Checked                      what a start checks passed
//!         or  Failed { reason }            and it exits
//! new → old   Ready { pid }                it is ready to accept (warm only)
//!         or  Failed { reason }
//! old → new   Taken                        the old one has committed to hand
//!                                          over: the new one may now accept,
//!                                          own the replica's lease and tell
//!                                          systemd
//! ```
//!
//! The channel closing is a message too: the new process reads it as "the
//! old one is gone or gave up" and stops; the old one reads it as "the new
//! one died".
//!
//! `Ready` and `Taken` make a two-step commit: the old process decides
//! alone whether the handover happens (it answers `Taken` only within its
//! deadline), and the new one takes nothing the old one might still hold
//! before that answer. A release that predates `Taken` sends `protocol` 0
//! (the field's default): a new process then takes `Ready` as the end of
//! the handover, as that release does. Unknown fields and a higher
//! `protocol` are ignored, so an older new process upgraded to from this
//! release works as it did.

use std::collections::BTreeMap;
use std::os::fd::{BorrowedFd, OwnedFd};

use baton_worker::channel::Channel;
use serde::{Deserialize, Serialize};

/// The handover protocol this release speaks: 1 adds `Taken`.
pub(super) const PROTOCOL: u32 = 1;

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
        /// The handover protocol the old process speaks: [`PROTOCOL`];
        /// 0 for a release that sends no `Taken`.
        #[serde(default)]
        protocol: u32,
    },
    /// New to old: its flags, the state file, the token file and the
    /// repository passed what a start checks before it loads anything.
    Checked,
    /// New to old: it is ready to serve, and waits for `Taken`.
    Ready { pid: u32 },
    /// Old to new: the old process has committed to the handover (it
    /// stops acting for the replica and drains); the new one takes over.
    Taken,
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

#[cfg(test)]
mod tests {
    use super::Message;

    #[test]
    fn listeners_from_an_earlier_release_speak_protocol_zero_and_unknown_fields_are_ignored() {
        let earlier = br#"{"Listeners":{"names":["http"],"fleet":{"replica_id":null,"lease":null},"kept":{}}}"#;
        match serde_json::from_slice(earlier).expect("an earlier release's listeners") {
            Message::Listeners { protocol, cold, .. } => assert_eq!((protocol, cold), (0, false)),
            other => panic!("{other:?}"),
        }
        let later = br#"{"Listeners":{"names":[],"protocol":7,"something_new":true}}"#;
        match serde_json::from_slice(later).expect("a later release's listeners") {
            Message::Listeners { protocol, .. } => assert_eq!(protocol, 7),
            other => panic!("{other:?}"),
        }
    }
}
