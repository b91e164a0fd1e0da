//! A lease's keep-alive stream.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{CALL_TIMEOUT, Client, from_status, pb};
use crate::error::ClusterError;

/// An open keep-alive stream for one lease.
pub struct KeepAlive {
    lease: i64,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    answers: tonic::Streaming<pb::LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Opens the stream and renews the lease once: etcd answers a
    /// stream's call only with its first message, so one is sent first.
    pub(super) async fn open(client: &Client, lease: i64) -> Result<KeepAlive, ClusterError> {
        let (requests, rx) = mpsc::channel(4);
        requests
            .try_send(pb::LeaseKeepAliveRequest { id: lease })
            .map_err(|_| ClusterError::Unreachable("the keep-alive stream closed before it opened".into()))?;
        let answers = super::bounded(client.lease_client().lease_keep_alive(ReceiverStream::new(rx))).await?;
        let mut keeper = KeepAlive { lease, requests, answers };
        keeper.answer().await?;
        Ok(keeper)
    }

    /// Renews the lease once: its remaining time to live in seconds, or
    /// an error when it has expired or etcd did not answer in time.
    pub async fn renew(&mut self) -> Result<i64, ClusterError> {
        let lease = self.lease;
        self.requests
            .send(pb::LeaseKeepAliveRequest { id: lease })
            .await
            .map_err(|_| ClusterError::Unreachable("the keep-alive stream closed".into()))?;
        self.answer().await
    }

    /// Reads the answer to the last renewal.
    async fn answer(&mut self) -> Result<i64, ClusterError> {
        let lease = self.lease;
        match tokio::time::timeout(CALL_TIMEOUT, self.answers.message()).await {
            Ok(Ok(Some(answer))) if answer.ttl > 0 => Ok(answer.ttl),
            Ok(Ok(Some(_))) => Err(ClusterError::LeaseLost(format!("lease {lease:x} expired"))),
            Ok(Ok(None)) => Err(ClusterError::Unreachable("the keep-alive stream ended".into())),
            Ok(Err(status)) => Err(from_status(&status)),
            Err(_) => Err(ClusterError::Unreachable(format!("no keep-alive answer within {CALL_TIMEOUT:?}"))),
        }
    }
}
