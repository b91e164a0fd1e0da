//! A watch of one or more key ranges over one stream.

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{Client, from_status, pb};
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
    // Kept: the stream closes when its sender goes.
    _requests: mpsc::Sender<pb::WatchRequest>,
    responses: tonic::Streaming<pb::WatchResponse>,
}

impl Watch {
    pub(super) async fn open(
        client: &Client,
        ranges: Vec<(Vec<u8>, Vec<u8>)>,
        revision: i64,
    ) -> Result<Watch, ClusterError> {
        let (requests, rx) = mpsc::channel(ranges.len().max(1));
        for (key, range_end) in ranges {
            let create = pb::WatchCreateRequest { key, range_end, start_revision: revision, progress_notify: false };
            let request =
                pb::WatchRequest { request_union: Some(pb::watch_request::RequestUnion::CreateRequest(create)) };
            requests
                .try_send(request)
                .map_err(|_| ClusterError::Unreachable("the watch stream closed before it opened".into()))?;
        }
        let responses = super::bounded(client.watch_client().watch(ReceiverStream::new(rx))).await?;
        Ok(Watch { _requests: requests, responses })
    }

    /// The next changes, in revision order. A watch that etcd cancelled
    /// is an error: [`ClusterError::Compacted`] when the revision it
    /// started from was compacted away (re-read and watch again), else
    /// the reason etcd gave. The end of the stream is the store lost.
    pub async fn next(&mut self) -> Result<Vec<Event>, ClusterError> {
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
                return Err(ClusterError::Refused(format!("etcd cancelled the watch: {reason}")));
            }
            if response.events.is_empty() {
                continue;
            }
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
