//! A fleet of baton servers that switches together, over etcd.
//!
//! Each replica registers under a lease and serves the version the fleet
//! committed. A rollout is two-phase: every participant prepares the
//! candidate beside its stable version with no traffic and acks; once all
//! have, one etcd transaction commits, and each replica switches by one
//! store when its watch delivers the commit. Gray release commits to a
//! subset first and judges it on every participant's merged observations.
//! The coordinator's whole state is the rollout record, so any process
//! holding the coordinator key can finish what a dead one began.
//!
//! See docs/fleet.md for the protocol, the failures and how to run it.

pub mod backoff;
pub mod coordinator;
pub mod error;
pub mod etcd;
pub mod health;
pub mod keys;
pub mod node;
pub mod ops;
pub mod participant;
pub mod records;
pub mod registry_node;
pub mod sidecar;
pub mod sim;
pub mod store;

pub use error::ClusterError;
pub use etcd::{StoreConfig, TlsFiles};
pub use health::Health;
pub use node::{Node, Refusal};
pub use participant::{Participant, ReplicaConfig};
pub use registry_node::RegistryNode;
pub use sidecar::{SidecarConfig, SidecarNode, TargetLayout};
pub use store::Store;
