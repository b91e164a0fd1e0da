//! The fleet's store: etcd, through JSON records under one cluster's keys.
//! Every call is bounded by a timeout, so an unreachable etcd is an error
//! within seconds, never a hang.
//!
//! Records are read leniently: a field this baton does not know (written
//! by a newer one during a rolling upgrade) is ignored, and records that
//! are rewritten keep it (see [`crate::records`]).

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ClusterError;
use crate::etcd::{Client, StoreConfig, Watch, pb, prefix_end};
use crate::keys::Keys;

/// A record read from the store, with the revisions a compare-and-swap
/// needs.
#[derive(Clone, Debug)]
pub struct Read<T> {
    /// The record.
    pub value: T,
    /// Its key.
    pub key: String,
    /// The store's revision of its last change.
    pub revision: i64,
    /// The revision it was created at: a coordinator key's tenure.
    pub created: i64,
    /// The lease it lives under (0: none).
    pub lease: i64,
}

impl<T> Read<T> {
    /// The last part of its key: the replica's ID or the model's name.
    pub fn name(&self) -> &str {
        Keys::last(&self.key)
    }
}

/// A key and its raw value, as a snapshot reads it.
#[derive(Clone, Debug)]
pub struct Kv {
    /// The key.
    pub key: String,
    /// The value's bytes.
    pub value: Vec<u8>,
    /// The revision of its last change.
    pub revision: i64,
    /// The revision it was created at.
    pub created: i64,
    /// Its lease (0: none).
    pub lease: i64,
}

impl Kv {
    fn from_pb(kv: pb::KeyValue) -> Kv {
        Kv {
            key: String::from_utf8_lossy(&kv.key).into_owned(),
            value: kv.value,
            revision: kv.mod_revision,
            created: kv.create_revision,
            lease: kv.lease,
        }
    }

    /// The record it holds.
    pub fn decode<T: DeserializeOwned>(&self) -> Result<Read<T>, ClusterError> {
        Ok(Read {
            value: decode(&self.key, &self.value)?,
            key: self.key.clone(),
            revision: self.revision,
            created: self.created,
            lease: self.lease,
        })
    }
}

/// A transaction: writes that happen together, only if every condition
/// holds.
#[derive(Clone, Debug, Default)]
pub struct Txn {
    compare: Vec<pb::Compare>,
    success: Vec<pb::RequestOp>,
}

impl Txn {
    /// An empty transaction.
    pub fn new() -> Txn {
        Txn::default()
    }

    fn when(mut self, key: &str, target: pb::compare::CompareTarget, union: pb::compare::TargetUnion) -> Txn {
        self.compare.push(pb::Compare {
            result: pb::compare::CompareResult::Equal as i32,
            target: target as i32,
            key: key.as_bytes().to_vec(),
            target_union: Some(union),
        });
        self
    }

    /// Only if `key` was last changed at `revision` (0: it is absent).
    pub fn if_changed_at(self, key: &str, revision: i64) -> Txn {
        self.when(key, pb::compare::CompareTarget::Mod, pb::compare::TargetUnion::ModRevision(revision))
    }

    /// Only if `key` was created at `revision` (0: it is absent): the key
    /// is still the one that was read, not a new one in its place.
    pub fn if_created_at(self, key: &str, revision: i64) -> Txn {
        self.when(key, pb::compare::CompareTarget::Create, pb::compare::TargetUnion::CreateRevision(revision))
    }

    /// Writes `value` at `key`, under `lease` when given.
    pub fn put(mut self, key: &str, value: Vec<u8>, lease: Option<i64>) -> Txn {
        let put = pb::PutRequest { key: key.as_bytes().to_vec(), value, lease: lease.unwrap_or(0) };
        self.success.push(pb::RequestOp { request: Some(pb::request_op::Request::RequestPut(put)) });
        self
    }

    /// Writes the record `value` at `key`.
    pub fn put_record<T: Serialize>(self, key: &str, value: &T, lease: Option<i64>) -> Result<Txn, ClusterError> {
        Ok(self.put(key, encode(value)?, lease))
    }

    /// Deletes `key`.
    pub fn delete(mut self, key: &str) -> Txn {
        let delete = pb::DeleteRangeRequest { key: key.as_bytes().to_vec(), range_end: Vec::new() };
        self.success.push(pb::RequestOp { request: Some(pb::request_op::Request::RequestDeleteRange(delete)) });
        self
    }

    /// Deletes every key under `prefix`.
    pub fn delete_prefix(mut self, prefix: &str) -> Txn {
        let delete =
            pb::DeleteRangeRequest { key: prefix.as_bytes().to_vec(), range_end: prefix_end(prefix.as_bytes()) };
        self.success.push(pb::RequestOp { request: Some(pb::request_op::Request::RequestDeleteRange(delete)) });
        self
    }
}

/// Keys read or watched together: every key under a prefix, or one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Span {
    /// Every key that starts with this.
    Prefix(String),
    /// This key alone.
    Key(String),
}

impl Span {
    fn range(&self) -> (Vec<u8>, Vec<u8>) {
        match self {
            Span::Prefix(p) => (p.as_bytes().to_vec(), prefix_end(p.as_bytes())),
            Span::Key(k) => (k.as_bytes().to_vec(), Vec::new()),
        }
    }

    /// Spans of whole prefixes.
    pub fn prefixes(prefixes: &[String]) -> Vec<Span> {
        prefixes.iter().cloned().map(Span::Prefix).collect()
    }
}

/// A connection to one cluster's keys in etcd. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    client: Client,
    /// The cluster's key layout.
    pub keys: Keys,
}

impl Store {
    /// Connects to the etcd of `config` for cluster `name`.
    pub async fn connect(config: &StoreConfig, name: &str) -> Result<Store, ClusterError> {
        let keys = Keys::new(name);
        let client = Client::connect(config, keys.root()).await?;
        Ok(Store { client, keys })
    }

    /// The same cluster's keys through the member that answers first,
    /// keeping what is known of every member (see [`Client::reconnect`]).
    pub async fn reconnect(&self) -> Result<Store, ClusterError> {
        Ok(Store { client: self.client.reconnect().await?, keys: self.keys.clone() })
    }

    /// Whether this store's member serves a linearizable read within
    /// [`crate::etcd::CALL_TIMEOUT`]: it is reachable and has a leader.
    pub async fn answers(&self) -> Result<(), ClusterError> {
        self.client.answers(std::time::Instant::now() + crate::etcd::CALL_TIMEOUT).await
    }

    /// The endpoint this store speaks to.
    pub fn endpoint(&self) -> String {
        self.client.endpoint()
    }

    /// The record at `key`, if any.
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<Read<T>>, ClusterError> {
        let request = pb::RangeRequest { key: key.as_bytes().to_vec(), ..Default::default() };
        let response = self.client.range(request).await?;
        response.kvs.into_iter().next().map(|kv| Kv::from_pb(kv).decode()).transpose()
    }

    /// Every record under `prefix`, and the store's revision when read.
    /// A record that cannot be read is skipped with a warning.
    pub async fn list<T: DeserializeOwned>(&self, prefix: &str) -> Result<(Vec<Read<T>>, i64), ClusterError> {
        let (mut lists, revision) = self.snapshot(&[Span::Prefix(prefix.to_owned())]).await?;
        Ok((decode_all(lists.pop().unwrap_or_default()), revision))
    }

    /// How many keys are under `prefix`, read without their values.
    pub async fn count(&self, prefix: &str) -> Result<usize, ClusterError> {
        let request = pb::RangeRequest {
            key: prefix.as_bytes().to_vec(),
            range_end: prefix_end(prefix.as_bytes()),
            count_only: true,
            ..Default::default()
        };
        Ok(self.client.range(request).await?.count.max(0) as usize)
    }

    /// Every key of each of `spans`, read at one revision (one
    /// transaction), and that revision: watches of all of them from the
    /// next revision miss nothing and see nothing twice.
    pub async fn snapshot(&self, spans: &[Span]) -> Result<(Vec<Vec<Kv>>, i64), ClusterError> {
        let success = spans
            .iter()
            .map(|span| {
                let (key, range_end) = span.range();
                let range = pb::RangeRequest { key, range_end, ..Default::default() };
                pb::RequestOp { request: Some(pb::request_op::Request::RequestRange(range)) }
            })
            .collect();
        let response = self.client.txn(pb::TxnRequest { compare: Vec::new(), success, failure: Vec::new() }).await?;
        let revision = response.header.map_or(0, |h| h.revision);
        let lists = response
            .responses
            .into_iter()
            .map(|op| match op.response {
                Some(pb::response_op::Response::ResponseRange(range)) => {
                    range.kvs.into_iter().map(Kv::from_pb).collect()
                }
                _ => Vec::new(),
            })
            .collect();
        Ok((lists, revision))
    }

    /// Writes `value` at `key`, under `lease` when given; the revision.
    pub async fn put<T: Serialize>(&self, key: &str, value: &T, lease: Option<i64>) -> Result<i64, ClusterError> {
        let request = pb::PutRequest { key: key.as_bytes().to_vec(), value: encode(value)?, lease: lease.unwrap_or(0) };
        Ok(self.client.put(request).await?.header.map_or(0, |h| h.revision))
    }

    /// Runs `txn`: the store's revision after it when its conditions held
    /// (and its writes happened), `None` when they did not.
    pub async fn commit(&self, txn: Txn) -> Result<Option<i64>, ClusterError> {
        let request = pb::TxnRequest { compare: txn.compare, success: txn.success, failure: Vec::new() };
        let response = self.client.txn(request).await?;
        Ok(response.succeeded.then(|| response.header.map_or(0, |h| h.revision)))
    }

    /// Writes `value` at `key` only if nothing is there: the revision it
    /// was created at, or `None` when the key existed.
    pub async fn create<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        lease: Option<i64>,
    ) -> Result<Option<i64>, ClusterError> {
        self.commit(Txn::new().if_created_at(key, 0).put_record(key, value, lease)?).await
    }

    /// Writes `value` at `key` only if the key is still at `revision` (0:
    /// absent), with `also` written in the same transaction; whether it did.
    pub async fn swap<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        revision: i64,
        also: Vec<(String, Vec<u8>)>,
    ) -> Result<bool, ClusterError> {
        let mut txn = Txn::new().if_changed_at(key, revision).put_record(key, value, None)?;
        for (k, v) in also {
            txn = txn.put(&k, v, None);
        }
        Ok(self.commit(txn).await?.is_some())
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), ClusterError> {
        let request = pb::DeleteRangeRequest { key: key.as_bytes().to_vec(), range_end: Vec::new() };
        self.client.delete(request).await.map(drop)
    }

    /// Deletes every key under `prefix`.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<(), ClusterError> {
        let request =
            pb::DeleteRangeRequest { key: prefix.as_bytes().to_vec(), range_end: prefix_end(prefix.as_bytes()) };
        self.client.delete(request).await.map(drop)
    }

    /// A new lease of `ttl` seconds.
    pub async fn grant(&self, ttl: i64) -> Result<i64, ClusterError> {
        self.client.grant(ttl).await
    }

    /// Revokes `lease`: its keys go at once.
    pub async fn revoke(&self, lease: i64) -> Result<(), ClusterError> {
        self.client.revoke(lease).await
    }

    /// Whether `lease` is still alive; renews it if so. A process that
    /// reconnects keeps its lease this way, and with it its registration,
    /// its acks and any coordinator key it holds.
    pub async fn renew(&self, lease: i64) -> Result<bool, ClusterError> {
        match self.client.keep_alive(lease).await {
            Ok(_) => Ok(true),
            Err(ClusterError::LeaseLost(_)) => Ok(false),
            Err(error) => Err(error),
        }
    }

    /// Keeps `lease` alive until etcd says it has expired, or until no
    /// member renewed it before it would have: returns why. Renews at a
    /// third of `ttl`, through another member whenever one does not
    /// answer in time (see [`crate::etcd`]).
    pub async fn keep_alive(&self, lease: i64, ttl: i64) -> ClusterError {
        self.keep_alive_via(lease, ttl, &tokio::sync::watch::channel(String::new()).0).await
    }

    /// [`Store::keep_alive`], telling `via` the endpoint each time the
    /// renewals move to another member.
    pub async fn keep_alive_via(&self, lease: i64, ttl: i64, via: &tokio::sync::watch::Sender<String>) -> ClusterError {
        crate::etcd::keep(self.client.clone(), lease, ttl, via).await
    }

    /// Watches every key of each of `spans` from `revision` on (0: from
    /// now), over one stream.
    pub async fn watch(&self, spans: &[Span], revision: i64) -> Result<Watch, ClusterError> {
        self.client.watch(spans.iter().map(Span::range).collect(), revision).await
    }
}

/// The records among `kvs`; one that cannot be read is skipped with a
/// warning.
pub fn decode_all<T: DeserializeOwned>(kvs: Vec<Kv>) -> Vec<Read<T>> {
    let mut records = Vec::with_capacity(kvs.len());
    for kv in kvs {
        match kv.decode() {
            Ok(record) => records.push(record),
            Err(error) => tracing::warn!(key = %kv.key, %error, "Skipped a cluster record that cannot be read."),
        }
    }
    records
}

/// A record as JSON bytes.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ClusterError> {
    serde_json::to_vec(value).map_err(|e| ClusterError::Invalid(e.to_string()))
}

/// A record from JSON bytes.
pub fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(bytes).map_err(|e| ClusterError::Invalid(format!("{key}: {e}")))
}
