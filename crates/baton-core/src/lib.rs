//! The hot-swap core of baton: model versions, the routing table requests
//! pin, and the load transaction that moves a model from one version to the
//! next while traffic flows.
//!
//! The design rests on three decisions:
//!
//! - **One pointer for all serving state.** Every model's stable version and
//!   the versions kept for rollback live in one immutable [`registry::routing::Routing`]
//!   behind one `ArcSwap`. A request loads it once and keeps that snapshot for
//!   every model call it makes, so a two-stage request never mixes versions.
//!   A commit builds a whole new table and publishes it with one store.
//! - **Versions are immutable and freed by reference count.** The registry
//!   keeps only weak references for accounting; the last request to let go
//!   of a version frees it, and the free is handed to a keeper thread that
//!   measures how much memory came back.
//! - **Loading happens beside serving, never in its way.** Every stage before
//!   commit runs at lower CPU priority, one load at a time, each on a thread
//!   of its own whose allocator arena holds that version alone
//!   ([`threads::heap`]); a failure at any stage leaves the serving version untouched
//!   and names the stage. Those lowered threads take no lock serving threads
//!   take ([`threads::sync`]): what they change, the registry's agent applies at
//!   serving priority ([`threads::agent`]).
//!
//! The core knows no protocol and no engine: engines plug in through
//! [`run::backend::Backend`], model stores through [`files::source::Source`].
//!
//! Its modules are rooms, each importing only the rooms below it:
//!
//! - [`tensors`]: tensors, signatures, tensors as JSON;
//! - [`human`]: byte counts and log fields as people read them;
//! - [`threads`]: priorities, the agent, locks, heaps, stepping aside;
//! - [`files`]: `model.toml`, a version's files and their verification;
//! - [`run`]: engines, loaded versions and the threads that run them;
//! - [`rollout`]: a candidate beside the stable version, and its guards;
//! - [`registry`]: the routing table, the load transaction, memory
//!   accounting and events.

pub mod files;
pub mod human;
pub mod registry;
pub mod rollout;
pub mod run;
pub mod tensors;
pub mod threads;
