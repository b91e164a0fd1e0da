//! The ONNX Runtime backend of baton.
//!
//! [`OnnxBackend`] loads a version directory's `model.onnx` into a pool of
//! ONNX Runtime sessions and serves requests on whichever session is free.
//! ONNX Runtime itself is a shared library loaded at run time; see
//! [`runtime_path`] for where it is looked for, and [`init`] for starting it
//! (once per process, from a thread at serving priority).
//!
//! `model.toml`'s `[engine]` table configures the pool; see [`EngineOptions`].

mod backend;
mod convert;
mod options;
pub mod proto;
mod runtime;

pub use backend::{MODEL_FILE, OnnxBackend};
pub use options::{EngineOptions, MAX_SESSIONS, MAX_THREADS, Optimization};
pub use runtime::{PoolThreads, RUNTIME_RELATIVE_PATH, SPAWNER_THREAD_NAME, WORKER_THREAD_NAME, init, runtime_path};
