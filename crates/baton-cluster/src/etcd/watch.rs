//! A watch of one or more key ranges over one stream.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Client, from_status, pb, stale_token};
use crate::error::ClusterError;

/// A change to a key.
#[derive(Clone, Debug)]
pub struct Event {
    /// The key.
    pub key: String,
    /// The new value; `None` when the key was deleted.
    pub value: Option<Vec<u8>>,
    /// The store's revision of the change.
    pub revision: i64,
    /// The revision the key was created at (0 when deleted).
    pub create_revision: i64,
    /// The lease the key is under (0: none).
    pub lease: i64,
}

/// An open watch. Dropping it closes the stream.
pub struct Watch {
    client: Client,
    ranges: Vec<(Vec<u8>, Vec<u8>)>,
    revision: i64,
    // Kept: the stream closes when its sender goes.
    _requests: mpsc::Sender<pb::WatchRequest>,
    responses: tonic::Streaming<pb::WatchResponse>,
    /// Whether the stream delivered changes yet.
    delivered: bool,
    /// Whether it was opened again with a new token already.
    renewed: bool,
}

/// `message` as a stream's first request, asking etcd for a member that
/// has a leader: a member that loses its leader for three election
/// timeouts ends such a stream ("no leader") instead of keeping it open
/// with nothing to say, as etcd's own client asks ("require leader").
pub(super) fn leader_required<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("hasleader", tonic::metadata::AsciiMetadataValue::from_static("true"));
    request
}

impl Watch {
    pub(super) async fn open(
        client: &Client,
        ranges: Vec<(Vec<u8>, Vec<u8>)>,
        revision: i64,
    ) -> Result<Watch, ClusterError> {
        let (requests, responses) = match Watch::stream(client, &ranges, revision).await {
            Err(error) if client.authenticates() && stale_token(&error) => {
                client.authenticate(std::time::Instant::now() + super::CALL_TIMEOUT).await?;
                Watch::stream(client, &ranges, revision).await?
            }
            other => other?,
        };
        let client = client.clone();
        Ok(Watch { client, ranges, revision, _requests: requests, responses, delivered: false, renewed: false })
    }

    async fn stream(
        client: &Client,
        ranges: &[(Vec<u8>, Vec<u8>)],
        revision: i64,
    ) -> Result<(mpsc::Sender<pb::WatchRequest>, tonic::Streaming<pb::WatchResponse>), ClusterError> {
        let (requests, rx) = mpsc::channel(ranges.len().max(1));
        for (key, range_end) in ranges.iter().cloned() {
            let create = pb::WatchCreateRequest { key, range_end, start_revision: revision, progress_notify: false };
            let request =
                pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)) };
            requests
                .try_send(request)
                .map_err(|_| ClusterError::Unreachable("the watch stream closed before it opened".into()))?;
        }
        let request = leader_required(ReceiverStream::new(rx));
        let responses =
            super::bounded_until(std::time::Instant::now() + super::CALL_TIMEOUT, client.watch_client().watch(request))
                .await?;
        Ok((requests, responses))
    }

    /// The next changes, in revision order. A watch that etcd cancelled
    /// is an error: [`ClusterError::Compacted`] when the revision it
    /// started from was compacted away (re-read and watch again), else
    /// the reason etcd gave. The end of the stream is the store lost, and
    /// so is a member that lost its leader. A watch etcd refused for its
    /// token alone, before it delivered anything, is opened again once
    /// with a new token.
    pub async fn next(&mut self) -> Result<Vec<Event>, ClusterError> {
        let result = self.receive().await;
        if matches!(result, Err(ClusterError::Unreachable(_))) {
            self.client.failed();
        }
        result
    }

    async fn receive(&mut self) -> Result<Vec<Event>, ClusterError> {
        loop {
            let response = match self.responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return Err(ClusterError::Unreachable("the watch ended".into())),
                Err(status) => return Err(from_status(&status)),
            };
            if response.compact_revision > 0 {
                return Err(ClusterError::Compacted(format!(
                    "the watch's start was compacted away (etcd keeps history from revision {})",
                    response.compact_revision
                )));
            }
            if response.canceled {
                let reason =
                    if response.cancel_reason.is_empty() { "no reason given" } else { &response.cancel_reason };
                let refused = ClusterError::Denied(reason.to_owned());
                if self.client.authenticates() && stale_token(&refused) && !self.delivered && !self.renewed {
                    tracing::debug!(endpoint = %self.client.endpoint(), reason, "etcd refused the watch's token; authenticating again.");
                    self.renewed = true;
                    // A watch "from now" goes on from when it was refused.
                    if self.revision == 0 {
                        self.revision = response.header.map_or(0, |h| h.revision + 1);
                    }
                    self.client.authenticate(std::time::Instant::now() + super::CALL_TIMEOUT).await?;
                    (self._requests, self.responses) = Watch::stream(&self.client, &self.ranges, self.revision).await?;
                    continue;
                }
                return Err(ClusterError::Refused(format!("etcd cancelled the watch: {reason}")));
            }
            if response.events.is_empty() {
                continue;
            }
            self.delivered = true;
            return Ok(response.events.into_iter().filter_map(event).collect());
        }
    }
}

fn event(event: pb::Event) -> Option<Event> {
    let kv = event.kv?;
    let deleted = event.r#type == pb::event::EventType::Delete as i32;
    Some(Event {
        key: String::from_utf8_lossy(&kv.key).into_owned(),
        value: (!deleted).then_some(kv.value),
        revision: kv.mod_revision,
        create_revision: kv.create_revision,
        lease: kv.lease,
    })
}
