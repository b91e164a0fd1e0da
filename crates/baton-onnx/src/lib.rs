//! The ONNX Runtime backend of baton.
//!
//! [`OnnxBackend`] loads a version directory's `model.onnx` into a pool of
//! ONNX Runtime sessions and serves requests on whichever session is free,
//! queueing them in arrival order when none is.
//! ONNX Runtime itself is a shared library loaded at run time; see
//! [`runtime_path`] for where it is looked for, and [`init`] for starting it
//! (once per process, from a thread at serving priority).
//!
//! `model.toml`'s `[engine]` table configures the pool; see [`EngineOptions`].
//!
//! The backend also reads the model file itself ([`proto`]): the weights,
//! which validation checks, and the graph's nodes, from which it tells
//! each weight's role (a compute weight such as a matrix or an embedding
//! table, or a constant such as a mask) and the values each integer input
//! may take (an index into a table of `n` rows: `[0, n)`), for warmup to
//! generate. [`writer`] writes ONNX models in code, and [`mlp`] and
//! [`encoder`] the models baton's demos and tests serve.
//!
//! # Thread priority
//!
//! baton loads models on a loader thread running at lower CPU priority (a
//! higher nice value) than serving, so a load never slows requests down.
//! Linux keeps a nice value per thread and a new thread inherits its
//! creator's, while lowering a nice value again needs privileges. ONNX
//! Runtime creates a session's worker threads while the session is created,
//! that is on the loader thread, so they would serve every request at loader
//! priority. To prevent that, sessions with worker threads create them
//! through [`PoolThreads`], which asks one dedicated thread,
//! `baton-ort-spawner`, to spawn them. That thread is started by [`init`],
//! which therefore must run on a thread at serving priority (normally the
//! main thread, at startup); the spawner and every worker inherit that
//! priority.

mod backend;
mod convert;
pub mod costly;
pub mod encoder;
mod graph;
pub mod mlp;
mod model_file;
mod options;
mod pool;
pub mod proto;
mod runtime;
pub mod safetensors;
mod shared;
mod staged;
mod weights_only;
pub mod writer;

pub use backend::{MODEL_FILE, OnnxBackend};
pub use options::{EngineOptions, KEYS as ENGINE_KEYS, MAX_SESSIONS, MAX_THREADS, Optimization};
pub use runtime::{
    PoolThreads, RUNTIME_RELATIVE_PATH, SPAWNER_THREAD_NAME, WORKER_THREAD_NAME, environment, init, runtime_path,
};
pub use weights_only::{GRAPH_FILE, graph_for_weights};
