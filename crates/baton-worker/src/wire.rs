//! The setup channel's messages between the server and a worker, and the
//! environment a worker is started with.

use std::path::PathBuf;

use baton_core::run::backend::UpdateKind;
use baton_core::tensors::signature::Signature;
use baton_core::tensors::tensor::DataType;
use serde::{Deserialize, Serialize};

/// The name of the region a worker streams its weights through for
/// validation: it lives only as long as one pass over the weights.
pub const WEIGHTS_REGION: &str = "baton-weights";

/// The environment variable that tells a worker its descriptors: the setup
/// channel's, the life channel's, then each slot's, comma-separated.
pub const FDS_ENV: &str = "BATON_WORKER_FDS";

/// The environment variable that tells a worker its server's pid.
pub(crate) const PARENT_ENV: &str = "BATON_WORKER_PARENT";

/// The environment variable that gives a worker its nice level.
pub(crate) const NICE_ENV: &str = "BATON_WORKER_NICE";

/// The environment variable that gives a worker its memory limit, in
/// bytes, on its address space.
pub(crate) const MEMORY_ENV: &str = "BATON_WORKER_MEMORY";

/// The environment variable that gives how long, in microseconds, a
/// worker's slot looks for its next call before it sleeps.
pub(crate) const SPIN_ENV: &str = "BATON_WORKER_SPIN_US";

/// The environment variable that names the memory cgroup a worker joins.
pub(crate) const CGROUP_ENV: &str = "BATON_WORKER_CGROUP";

/// The environment variable that gives the largest shared region of a
/// slot, in bytes.
pub(crate) const REGION_ENV: &str = "BATON_WORKER_REGION_BYTES";

/// The name of the region a version's manifest is handed over in.
pub(crate) const MANIFEST_REGION: &str = "baton-manifest";

/// The largest manifest a worker takes.
pub(crate) const MANIFEST_MOST: usize = 64 << 20;

/// The name of the region a report too large for a setup message is sent
/// in (a load's, whose signature grows with the version's inputs and
/// outputs).
pub(crate) const REPORT_REGION: &str = "baton-report";

/// The largest report the server takes, in a region.
pub(crate) const REPORT_MOST: usize = 64 << 20;

/// Setup messages, server to worker.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Setup {
    /// Files of the version; their descriptors are attached, in order.
    Files { files: Vec<FileInfo> },
    /// Load the version from the files handed over. Its manifest, of
    /// `manifest` bytes, is in the region whose descriptor is attached (a
    /// manifest grows with the version's files; a message does not).
    Load { dir: PathBuf, manifest: usize, engine: String },
    /// Stream the weights, one [`Report::Weight`] at a time.
    Weights,
    /// The next weight.
    Next,
    /// No more weights.
    Stop,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct FileInfo {
    pub(crate) path: String,
    pub(crate) sealed: bool,
    pub(crate) copied_into: Option<PathBuf>,
}

/// Setup reports, worker to server.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Report {
    Loaded {
        signature: Signature,
        instances: usize,
        shared: u64,
        reused: u64,
        update: UpdateKind,
    },
    LoadFailed {
        kind: String,
        message: String,
        tensor: Option<String>,
    },
    /// A weight, in the weights region (a new one attached when `region`).
    Weight {
        name: String,
        datatype: Option<DataType>,
        shape: Vec<i64>,
        compute: bool,
        len: usize,
        region: bool,
    },
    WeightsEnd,
    WeightsFailed {
        message: String,
    },
    /// A report of `len` bytes, too large for a message, in the region
    /// whose descriptor is attached.
    InRegion {
        len: usize,
    },
}
