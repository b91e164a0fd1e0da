//! The fleet's store: etcd, through JSON records under one cluster's keys.
//! Every call is bounded by a timeout, so an unreachable etcd is an error
//! within seconds, never a hang.

use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions, WatchStream,
};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::error::ClusterError;
use crate::keys::Keys;

/// How long one call to etcd may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A record read from the store, with the revision it was last changed at
/// (for a compare-and-swap).
#[derive(Clone, Debug)]
pub struct Read<T> {
    /// The record.
    pub value: T,
    /// Its key.
    pub key: String,
    /// The store's revision of its last change.
    pub revision: i64,
}

impl<T> Read<T> {
    /// The last part of its key: the replica's ID or the model's name.
    pub fn name(&self) -> &str {
        Keys::last(&self.key)
    }
}

/// A connection to one cluster's keys in etcd. Cheap to clone.
#[derive(Clone)]
pub struct Store {
    client: Client,
    /// The cluster's key layout.
    pub keys: Keys,
}

/// Parses `etcd://HOST:PORT[,HOST:PORT…]` (or `http://…`) into endpoints.
pub fn endpoints(spec: &str) -> Result<Vec<String>, ClusterError> {
    let rest = spec.strip_prefix("etcd://").or_else(|| spec.strip_prefix("http://")).unwrap_or(spec);
    let list: Vec<String> =
        rest.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| format!("http://{s}")).collect();
    if list.is_empty() {
        return Err(ClusterError::Refused(format!(
            "'{spec}' names no etcd endpoint; use etcd://HOST:PORT[,HOST:PORT]"
        )));
    }
    Ok(list)
}

impl Store {
    /// Connects to the endpoints of `spec` for cluster `name`.
    pub async fn connect(spec: &str, name: &str) -> Result<Store, ClusterError> {
        let endpoints = endpoints(spec)?;
        let options = ConnectOptions::new()
            .with_connect_timeout(CALL_TIMEOUT)
            .with_timeout(CALL_TIMEOUT)
            .with_keep_alive(Duration::from_secs(1), CALL_TIMEOUT);
        let client = tokio::time::timeout(CALL_TIMEOUT, Client::connect(endpoints, Some(options)))
            .await
            .map_err(|_| ClusterError::Unreachable(format!("no answer from {spec} within {CALL_TIMEOUT:?}")))??;
        let store = Store { client, keys: Keys::new(name) };
        // The channel connects lazily: ask once, so that an unreachable
        // etcd is an error here and not at the first use.
        bounded(store.client.clone().get(store.keys.root(), Some(GetOptions::new().with_count_only())))
            .await
            .map_err(|e| ClusterError::Unreachable(format!("{spec}: {e}")))?;
        Ok(store)
    }

    /// The record at `key`, if any.
    pub async fn get<T: DeserializeOwned>(&self, key: &str) -> Result<Option<Read<T>>, ClusterError> {
        let response = bounded(self.client.clone().get(key, None)).await?;
        match response.kvs().first() {
            Some(kv) => {
                Ok(Some(Read { value: decode(key, kv.value())?, key: key.to_owned(), revision: kv.mod_revision() }))
            }
            None => Ok(None),
        }
    }

    /// Every record under `prefix`, and the store's revision when read.
    /// A record that cannot be read is skipped with a warning.
    pub async fn list<T: DeserializeOwned>(&self, prefix: &str) -> Result<(Vec<Read<T>>, i64), ClusterError> {
        let response = bounded(self.client.clone().get(prefix, Some(GetOptions::new().with_prefix()))).await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let mut records = Vec::new();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match decode(&key, kv.value()) {
                Ok(value) => records.push(Read { value, key, revision: kv.mod_revision() }),
                Err(error) => tracing::warn!(%key, %error, "Skipped a cluster record that cannot be read."),
            }
        }
        Ok((records, revision))
    }

    /// Writes `value` at `key`, under `lease` when given.
    pub async fn put<T: Serialize>(&self, key: &str, value: &T, lease: Option<i64>) -> Result<i64, ClusterError> {
        let options = lease.map(|l| PutOptions::new().with_lease(l));
        let response = bounded(self.client.clone().put(key, encode(value)?, options)).await?;
        Ok(response.header().map_or(0, |h| h.revision()))
    }

    /// Writes `value` at `key` only if nothing is there; whether it did.
    pub async fn create<T: Serialize>(&self, key: &str, value: &T, lease: Option<i64>) -> Result<bool, ClusterError> {
        let options = lease.map(|l| PutOptions::new().with_lease(l));
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key,
            encode(value)?,
            options,
        )]);
        Ok(bounded(self.client.clone().txn(txn)).await?.succeeded())
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
        let mut ops = vec![TxnOp::put(key, encode(value)?, None)];
        ops.extend(also.into_iter().map(|(k, v)| TxnOp::put(k, v, None)));
        let txn = Txn::new().when([Compare::mod_revision(key, CompareOp::Equal, revision)]).and_then(ops);
        Ok(bounded(self.client.clone().txn(txn)).await?.succeeded())
    }

    /// Deletes `key`.
    pub async fn delete(&self, key: &str) -> Result<(), ClusterError> {
        bounded(self.client.clone().delete(key, None)).await.map(drop)
    }

    /// Deletes every key under `prefix`.
    pub async fn delete_prefix(&self, prefix: &str) -> Result<(), ClusterError> {
        let options = etcd_client::DeleteOptions::new().with_prefix();
        bounded(self.client.clone().delete(prefix, Some(options))).await.map(drop)
    }

    /// A new lease of `ttl` seconds.
    pub async fn grant(&self, ttl: i64) -> Result<i64, ClusterError> {
        Ok(bounded(self.client.clone().lease_grant(ttl, None)).await?.id())
    }

    /// Revokes `lease`: its keys go at once.
    pub async fn revoke(&self, lease: i64) -> Result<(), ClusterError> {
        bounded(self.client.clone().lease_revoke(lease)).await.map(drop)
    }

    /// Keeps `lease` alive until the store stops answering or says it has
    /// expired: returns why. Refreshes at a third of `ttl`.
    pub async fn keep_alive(&self, lease: i64, ttl: i64) -> ClusterError {
        let (mut keeper, mut answers) = match bounded(self.client.clone().lease_keep_alive(lease)).await {
            Ok(pair) => pair,
            Err(error) => return error,
        };
        let every = Duration::from_millis((ttl as u64 * 1000 / 3).max(100));
        loop {
            if let Err(error) = bounded(keeper.keep_alive()).await {
                return error;
            }
            match tokio::time::timeout(CALL_TIMEOUT, answers.message()).await {
                Ok(Ok(Some(answer))) if answer.ttl() > 0 => {}
                Ok(Ok(Some(_))) => return ClusterError::Refused(format!("lease {lease:x} expired")),
                Ok(Ok(None)) => return ClusterError::Unreachable("the keep-alive stream ended".into()),
                Ok(Err(error)) => return error.into(),
                Err(_) => return ClusterError::Unreachable("no keep-alive answer in time".into()),
            }
            tokio::time::sleep(every).await;
        }
    }

    /// Watches every key under `prefix` from `revision` on (0: from now).
    pub async fn watch(&self, prefix: &str, revision: i64) -> Result<WatchStream, ClusterError> {
        let mut options = WatchOptions::new().with_prefix();
        if revision > 0 {
            options = options.with_start_revision(revision);
        }
        bounded(self.client.clone().watch(prefix, Some(options))).await
    }
}

/// Runs one call to etcd with the call timeout.
async fn bounded<T>(call: impl std::future::Future<Output = Result<T, etcd_client::Error>>) -> Result<T, ClusterError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(result) => result.map_err(ClusterError::from),
        Err(_) => Err(ClusterError::Unreachable(format!("etcd did not answer within {CALL_TIMEOUT:?}"))),
    }
}

/// A record as JSON bytes.
pub fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, ClusterError> {
    serde_json::to_vec(value).map_err(|e| ClusterError::Invalid(e.to_string()))
}

fn decode<T: DeserializeOwned>(key: &str, bytes: &[u8]) -> Result<T, ClusterError> {
    serde_json::from_slice(bytes).map_err(|e| ClusterError::Invalid(format!("{key}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::endpoints;

    #[test]
    fn endpoints_take_the_etcd_scheme_and_lists() {
        assert_eq!(endpoints("etcd://127.0.0.1:2379").unwrap(), ["http://127.0.0.1:2379"]);
        assert_eq!(endpoints("etcd://a:1,b:2").unwrap(), ["http://a:1", "http://b:2"]);
        assert!(endpoints("etcd://").is_err());
    }
}
