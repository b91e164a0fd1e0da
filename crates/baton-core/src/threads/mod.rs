//! The threads of a server and the rules between them: serving threads
//! keep their priority, loading threads run lowered and take no lock a
//! serving thread takes ([`sync`]), what they change the agent applies at
//! serving priority ([`agent`]), each load builds on a heap of its own
//! ([`heap`]), and a lowered thread steps aside while serving threads wait
//! for a CPU ([`step_aside`]). The operating-system calls all of this needs
//! are in [`sys`]. It imports no other room.

pub mod agent;
pub mod heap;
pub mod step_aside;
pub mod sync;
pub mod sys;
pub(crate) mod trimmer;
