//! What can go wrong between a baton process and the fleet's store.

/// An error talking to the fleet's store, or a fleet operation refused.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd could not be reached, or did not answer in time.
    #[error("the cluster store is unreachable: {0}")]
    Unreachable(String),
    /// Another process changed what this one was changing; re-read.
    #[error("the cluster state changed meanwhile: {0}")]
    Conflict(String),
    /// The operation is not possible in the fleet's present state.
    #[error("{0}")]
    Refused(String),
    /// A record in the store could not be read.
    #[error("a record in the cluster store is invalid: {0}")]
    Invalid(String),
}

impl ClusterError {
    /// A stable name, for metrics and responses.
    pub fn kind(&self) -> &'static str {
        match self {
            ClusterError::Unreachable(_) => "cluster_unreachable",
            ClusterError::Conflict(_) => "cluster_conflict",
            ClusterError::Refused(_) => "cluster_refused",
            ClusterError::Invalid(_) => "cluster_invalid",
        }
    }
}

impl From<etcd_client::Error> for ClusterError {
    fn from(error: etcd_client::Error) -> Self {
        ClusterError::Unreachable(error.to_string())
    }
}
