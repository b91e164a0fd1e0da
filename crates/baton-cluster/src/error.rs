//! What can go wrong between a baton process and the fleet's store.

/// An error talking to the fleet's store, or a fleet operation refused.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// etcd could not be reached, or did not answer in time.
    #[error("the cluster store is unreachable: {0}")]
    Unreachable(String),
    /// etcd refused the credentials, or the user may not do this.
    #[error("the cluster store refused access: {0}")]
    Denied(String),
    /// The lease a key was to live under has expired.
    #[error("the lease was lost: {0}")]
    LeaseLost(String),
    /// A watch or read started from history etcd has compacted away:
    /// read again and watch from there.
    #[error("the cluster store compacted the history: {0}")]
    Compacted(String),
    /// Another process changed what this one was changing; re-read.
    #[error("the cluster state changed meanwhile: {0}")]
    Conflict(String),
    /// This process no longer holds the coordinator key it acted under.
    #[error("no longer the coordinator: {0}")]
    Fenced(String),
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
            ClusterError::Denied(_) => "cluster_denied",
            ClusterError::LeaseLost(_) => "cluster_lease_lost",
            ClusterError::Compacted(_) => "cluster_compacted",
            ClusterError::Conflict(_) => "cluster_conflict",
            ClusterError::Fenced(_) => "cluster_fenced",
            ClusterError::Refused(_) => "cluster_refused",
            ClusterError::Invalid(_) => "cluster_invalid",
        }
    }

    /// The message without the kind's prefix.
    pub fn detail(&self) -> &str {
        match self {
            ClusterError::Unreachable(s)
            | ClusterError::Denied(s)
            | ClusterError::LeaseLost(s)
            | ClusterError::Compacted(s)
            | ClusterError::Conflict(s)
            | ClusterError::Fenced(s)
            | ClusterError::Refused(s)
            | ClusterError::Invalid(s) => s,
        }
    }
}
