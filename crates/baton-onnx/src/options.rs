//! The `[engine]` table of `model.toml`, as the ONNX backend reads it.
//!
//! ```toml
//! [engine]
//! sessions = 2             # sessions in the pool; default: CPUs, at most 4
//! intra_op_threads = 1     # threads per operator; 1 = the caller's thread only
//! inter_op_threads = 1     # threads running independent operators in parallel
//! optimization = "all"     # "disable" | "basic" | "extended" | "all"
//! stage_weights = true     # map a large model's weights instead of copying them
//! prepack = true           # pack matrices once per version for faster products
//! allow_spinning = true    # the engine's threads busy-wait for work; false: they sleep
//! ```
//!
//! Parsing is strict: an unknown key or a value of the wrong type is an
//! error of kind `invalid_engine_options`, so a typo never silently falls
//! back to a default.

use baton_core::run::backend::BackendError;
use ort::session::builder::GraphOptimizationLevel;

/// Most sessions a pool may have.
pub const MAX_SESSIONS: usize = 64;

/// Most threads per pool a session may have.
pub const MAX_THREADS: usize = 256;

/// The default pool size never exceeds this, whatever the CPU count.
const DEFAULT_SESSIONS_CAP: usize = 4;

/// Every `[engine]` key this backend reads.
pub const KEYS: [&str; 7] =
    ["sessions", "intra_op_threads", "inter_op_threads", "optimization", "stage_weights", "prepack", "allow_spinning"];

/// ONNX Runtime graph optimization level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Optimization {
    /// No graph optimizations.
    Disable,
    /// Semantics-preserving rewrites such as constant folding.
    Basic,
    /// Basic plus complex node fusions.
    Extended,
    /// Everything, including layout optimizations.
    All,
}

impl Optimization {
    /// The `model.toml` spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Optimization::Disable => "disable",
            Optimization::Basic => "basic",
            Optimization::Extended => "extended",
            Optimization::All => "all",
        }
    }

    pub(crate) fn level(self) -> GraphOptimizationLevel {
        match self {
            Optimization::Disable => GraphOptimizationLevel::Disable,
            Optimization::Basic => GraphOptimizationLevel::Level1,
            Optimization::Extended => GraphOptimizationLevel::Level2,
            Optimization::All => GraphOptimizationLevel::All,
        }
    }
}

/// Parsed `[engine]` options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineOptions {
    /// Number of ORT sessions in the pool; each serves one request at a time.
    pub sessions: usize,
    /// Intra-op threads per session. With 1, a request runs entirely on the
    /// calling thread and ORT creates no threads.
    pub intra_op_threads: usize,
    /// Inter-op threads per session; above 1, the session runs independent
    /// branches of the graph in parallel.
    pub inter_op_threads: usize,
    /// Graph optimization level.
    pub optimization: Optimization,
    /// Whether a large model that keeps its weights inline is first staged
    /// with them as external data, so that ONNX Runtime maps them instead
    /// of copying them into every session (see `staged.rs`). On by default;
    /// off, ONNX Runtime reads the verified model file itself. A model that
    /// has external data is staged either way (its data copied from the
    /// verified files); off, its inline weights stay inline.
    pub stage_weights: bool,
    /// Whether ONNX Runtime packs weight matrices into its own layout once
    /// per version (shared by the pool), for faster products on batches.
    /// On by default. Off, the sessions compute from the one mapped copy of
    /// the weights: a version holds its weights once and loads faster, and
    /// batched products run slower (docs/memory.md has the figures).
    pub prepack: bool,
    /// Whether the engine's threads busy-wait for work between operators
    /// and a calling thread busy-waits for them (ONNX Runtime's default,
    /// for the lowest latency on cores of their own). Off, they sleep: on a
    /// machine whose cores serve other work too, the spinning is CPU that
    /// work waits for. Only matters with `intra_op_threads` or
    /// `inter_op_threads` above 1.
    pub allow_spinning: bool,
}

impl Default for EngineOptions {
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        EngineOptions {
            sessions: cpus.clamp(1, DEFAULT_SESSIONS_CAP),
            intra_op_threads: 1,
            inter_op_threads: 1,
            optimization: Optimization::All,
            stage_weights: true,
            prepack: true,
            allow_spinning: true,
        }
    }
}

impl EngineOptions {
    /// Parses the `[engine]` table; absent keys take their defaults.
    pub fn parse(table: &toml::Table) -> Result<EngineOptions, BackendError> {
        let mut options = EngineOptions::default();
        for (key, value) in table {
            match key.as_str() {
                "sessions" => options.sessions = count(key, value, MAX_SESSIONS)?,
                "intra_op_threads" => options.intra_op_threads = count(key, value, MAX_THREADS)?,
                "inter_op_threads" => options.inter_op_threads = count(key, value, MAX_THREADS)?,
                "stage_weights" => options.stage_weights = flag(key, value)?,
                "prepack" => options.prepack = flag(key, value)?,
                "allow_spinning" => options.allow_spinning = flag(key, value)?,
                "optimization" => {
                    options.optimization = match value.as_str() {
                        Some("disable") => Optimization::Disable,
                        Some("basic") => Optimization::Basic,
                        Some("extended") => Optimization::Extended,
                        Some("all") => Optimization::All,
                        _ => {
                            return Err(invalid(format!(
                                "engine option 'optimization' must be one of \"disable\", \"basic\", \"extended\", \"all\"; got {value}"
                            )));
                        }
                    }
                }
                _ => {
                    return Err(invalid(format!(
                        "unknown engine option '{key}'; the onnx backend accepts {}",
                        KEYS.join(", ")
                    )));
                }
            }
        }
        Ok(options)
    }

    /// Whether sessions get worker threads (and so need [`PoolThreads`](crate::PoolThreads)).
    pub fn has_worker_threads(&self) -> bool {
        self.intra_op_threads > 1 || self.inter_op_threads > 1
    }
}

fn count(key: &str, value: &toml::Value, max: usize) -> Result<usize, BackendError> {
    value
        .as_integer()
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=max).contains(n))
        .ok_or_else(|| invalid(format!("engine option '{key}' must be an integer from 1 to {max}; got {value}")))
}

fn flag(key: &str, value: &toml::Value) -> Result<bool, BackendError> {
    value.as_bool().ok_or_else(|| invalid(format!("engine option '{key}' must be true or false; got {value}")))
}

fn invalid(message: String) -> BackendError {
    BackendError::new("invalid_engine_options", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<EngineOptions, BackendError> {
        EngineOptions::parse(&text.parse::<toml::Table>().unwrap())
    }

    #[test]
    fn defaults_apply_to_an_empty_table() {
        let options = parse("").unwrap();
        assert!((1..=4).contains(&options.sessions));
        assert_eq!((options.intra_op_threads, options.inter_op_threads), (1, 1));
        assert_eq!(options.optimization, Optimization::All);
        assert!(options.stage_weights && options.allow_spinning);
        assert!(!options.has_worker_threads());
    }

    #[test]
    fn every_key_parses() {
        let options = parse(
            "sessions = 3\nintra_op_threads = 2\ninter_op_threads = 4\noptimization = \"basic\"\nstage_weights = false\n\
             prepack = false\nallow_spinning = false",
        )
        .unwrap();
        assert_eq!(
            options,
            EngineOptions {
                sessions: 3,
                intra_op_threads: 2,
                inter_op_threads: 4,
                optimization: Optimization::Basic,
                stage_weights: false,
                prepack: false,
                allow_spinning: false,
            }
        );
        assert!(options.has_worker_threads());
        for level in ["disable", "basic", "extended", "all"] {
            assert_eq!(parse(&format!("optimization = \"{level}\"")).unwrap().optimization.as_str(), level);
        }
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        let e = parse("sesions = 2").unwrap_err();
        assert_eq!(e.kind, "invalid_engine_options");
        assert!(e.message.contains("'sesions'") && e.message.contains("sessions"), "{}", e.message);
        for bad in [
            "sessions = 0",
            "sessions = -1",
            "sessions = 65",
            "sessions = \"2\"",
            "sessions = 1.5",
            "intra_op_threads = 0",
            "inter_op_threads = 100000",
            "optimization = \"max\"",
            "optimization = 3",
            "stage_weights = 1",
            "stage_weights = \"yes\"",
            "allow_spinning = 0",
        ] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind, "invalid_engine_options", "{bad}");
        }
    }
}
