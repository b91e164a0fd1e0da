//! Where inferences run: the contract with an engine ([`backend`]), a
//! loaded version ([`version`]) and how its engine is handed back when
//! it is dropped ([`release`]), the threads of its engine instances
//! ([`executor`]), the gate in front of them ([`admission`]), dynamic
//! batching ([`batcher`]), what a version keeps of its warmup
//! ([`warmed`]) and the errors a request can meet ([`error`]).
//! It imports the rooms below it: tensors, threads, files.

pub mod admission;
pub mod backend;
pub mod batcher;
pub mod error;
pub mod executor;
pub mod release;
pub mod version;
pub mod warmed;
