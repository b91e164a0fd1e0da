//! Worker processes: a model version that runs in a child process of its
//! own, behind the server.
//!
//! A worker holds the engine, its sessions and the weights; the server
//! keeps the protocols, admission, routing and rollouts. This crate is
//! the hop between the two:
//!
//! - [`region`]: shared memory both processes map, where tensors cross:
//!   sealed at its size, and read by copying out when the peer made it.
//! - [`channel`]: the small control channel beside it, a Unix
//!   `SOCK_SEQPACKET` socket pair that also carries descriptors, and how a
//!   child is handed its ends (at fixed numbers, between fork and exec).
//! - [`frame`]: how tensors and their index are laid out in a region, so
//!   that no message grows with them, and read back with every offset,
//!   length and count checked.
//! - [`hop`]: calls from many server threads, each in a slot of its own,
//!   with a deadline, failing fast when the worker is gone, and retiring a
//!   worker whose slot breaks the protocol; and the worker's side that
//!   answers them, which ends the worker when one of its slots breaks.
//! - `cgroup`: a worker's memory limit, through a memory cgroup of its own
//!   where the machine offers one.
//! - [`process`]: a version loaded and run by a worker process, behind
//!   the same `Backend` contract as one in the server, and `weights`, the
//!   validation's pass over its weights, bounded by the version's files;
//!   [`serve`], the worker's side.
//!
//! The crate knows nothing of any engine: a worker answers with whatever
//! closure it is given.

mod cgroup;
pub mod channel;
pub mod frame;
pub mod hop;
mod life;
mod options;
pub use options::{KEYS as ENGINE_KEYS, reads_as_default};
pub mod process;
pub mod region;
pub mod serve;
mod weights;
mod wire;
