//! Processing inside a model version: what turns a client's request into
//! the graph's inputs, and the graph's outputs into the answer, read from
//! the version's own files and so swapped with its graph in one store.
//!
//! [`ProcessingBackend`] wraps an engine's backend. A version that declares
//! processing (a `processing.toml`, or a sentence-transformers directory:
//! see [`declaration`] and [`sentence`]) is served with a signature of its
//! own: texts in (a Hugging Face tokenizer, [`tokenize`]) or raw named
//! features ([`features`]), pooled,
//! normalized or scored outputs out ([`post`]). The processing runs in the
//! server's process on the calling session thread, the graph wherever its
//! engine runs it. A version that declares nothing is the engine's model as
//! it was. Knows nothing of the protocols: errors carry a stable kind, and
//! [`error::CLIENT_KINDS`] lists those a request's inputs cause.

pub mod declaration;
pub mod error;
pub mod features;
mod identity;
pub mod post;
pub mod sentence;
pub mod tokenize;
mod wrap;

pub use error::{CLIENT_KINDS, ProcessingError};
pub use wrap::ProcessingBackend;
