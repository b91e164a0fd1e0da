//! baton's own client of etcd's v3 API: the calls a fleet needs (keys,
//! transactions, watches, leases, authentication), over tonic, with TLS
//! and user/password authentication. The API definitions are compiled at
//! build time with pure-Rust tools, so nothing here needs a system
//! `protoc` (the reason baton does not use the `etcd-client` crate).
//!
//! A [`Client`] speaks to one member of the cluster at a time, and knows
//! them all ([`pool`]): it moves to another when its member stops
//! answering, whether it refuses connections or hangs. Every unary call is
//! bounded by [`CALL_TIMEOUT`]; a lease is renewed early, each renewal with
//! a deadline well inside what is left of the lease, and through another
//! member when one does not answer in time ([`lease`]). Watches and
//! keep-alives ask for a member with a leader, so that a member cut from
//! its quorum ends them rather than going quiet. A token that etcd calls
//! expired or old is renewed, for calls and streams alike.

pub mod config;
mod lease;
mod pool;
mod watch;

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::threads::sync::Lock;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub use config::{StoreConfig, TlsFiles};
pub use lease::KeepAlive;
pub(crate) use lease::keep;
pub use watch::{Event, Watch};

use crate::error::ClusterError;
use pool::Pool;

/// The messages and clients generated from `proto/etcd.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// How long one call to etcd may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection to a member may take, all members tried.
const CONNECT_LIMIT: Duration = Duration::from_secs(6);

/// How often a connection with a stream open is pinged.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Adds the authentication token, once there is one, to every call.
#[derive(Clone, Default)]
pub struct Token(Arc<Lock<Option<AsciiMetadataValue>>>);

impl Interceptor for Token {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.0.lock().clone() {
            request.metadata_mut().insert("token", token);
        }
        Ok(request)
    }
}

type Service = InterceptedService<Channel, Token>;

/// A connection to one member of an etcd cluster, which knows the others.
/// Cheap to clone: clones share the connection, the token and what is
/// known of every member.
#[derive(Clone)]
pub struct Client {
    pool: Arc<Pool>,
    member: usize,
    channel: Channel,
}

impl Client {
    /// Connects to the first member of `config` that answers, starting
    /// at a random one so that a fleet spreads over etcd's members, and
    /// authenticates when a user is configured. A member is checked by a
    /// read of `probe`, a key this process may read (under its cluster's
    /// prefix, which a least-privilege role covers).
    pub async fn connect(config: &StoreConfig, probe: &str) -> Result<Client, ClusterError> {
        Pool::new(config, probe)?.connect(None, CALL_TIMEOUT, Instant::now() + CONNECT_LIMIT).await
    }

    /// Connects again, to the member that answers first, keeping what is
    /// known of each: a member that just failed is tried last, and the
    /// connections and token that still work are reused.
    pub async fn reconnect(&self) -> Result<Client, ClusterError> {
        self.pool.connect(None, CALL_TIMEOUT, Instant::now() + CONNECT_LIMIT).await
    }

    /// A client of another member that answers (this one tried last), each
    /// tried for at most `attempt`, all by `deadline`. With one member,
    /// connects to it again. This client's member is not noted as failed:
    /// see [`Client::failed`].
    pub(crate) async fn another(&self, attempt: Duration, deadline: Instant) -> Result<Client, ClusterError> {
        self.pool.connect(Some(self.member), attempt, deadline).await
    }

    /// How many members this client knows.
    pub(crate) fn members(&self) -> usize {
        self.pool.len()
    }

    /// Notes that this client's member failed, so that the next connection
    /// tries it last.
    pub(crate) fn failed(&self) {
        self.pool.failed(self.member);
    }

    /// The endpoint this client speaks to.
    pub fn endpoint(&self) -> String {
        self.pool.url(self.member)
    }

    fn kv(&self) -> pb::kv_client::KvClient<Service> {
        pb::kv_client::KvClient::with_interceptor(self.channel.clone(), self.pool.token.clone())
    }

    fn lease_client(&self) -> pb::lease_client::LeaseClient<Service> {
        pb::lease_client::LeaseClient::with_interceptor(self.channel.clone(), self.pool.token.clone())
    }

    fn watch_client(&self) -> pb::watch_client::WatchClient<Service> {
        pb::watch_client::WatchClient::with_interceptor(self.channel.clone(), self.pool.token.clone())
    }

    /// Whether a user is configured: a token etcd refuses is renewed.
    pub(crate) fn authenticates(&self) -> bool {
        self.pool.config.user.is_some()
    }

    /// Checks that the member answers (by `until`): on a new connection
    /// with credentials, by authenticating; else by a linearizable read of
    /// the probe key, which a member without a leader cannot serve. A
    /// server that is not etcd, or that wants TLS or credentials, fails
    /// here rather than at the first use.
    async fn check(&self, fresh: bool, until: Instant) -> Result<(), ClusterError> {
        if fresh && self.authenticates() {
            return self.authenticate(until).await;
        }
        self.answers(until).await
    }

    /// Whether the member serves a linearizable read (of the probe key,
    /// counted only) by `until`: it is reachable and has a leader.
    pub(crate) async fn answers(&self, until: Instant) -> Result<(), ClusterError> {
        let probe = pb::RangeRequest { key: self.pool.probe.clone(), count_only: true, ..Default::default() };
        self.unary_until(until, |c| {
            let probe = probe.clone();
            async move { c.kv().range(probe).await }
        })
        .await
        .map(drop)
    }

    /// Exchanges the user and password (read from its file now) for a
    /// token that every later call and stream carries.
    pub(crate) async fn authenticate(&self, until: Instant) -> Result<(), ClusterError> {
        let Some((name, password)) = self.pool.config.credentials()? else { return Ok(()) };
        let mut auth = pb::auth_client::AuthClient::new(self.channel.clone());
        let request = pb::AuthenticateRequest { name: name.clone(), password };
        let answer = bounded_until(until, auth.authenticate(request)).await.map_err(|e| match e {
            ClusterError::Denied(why) => ClusterError::Denied(format!("etcd refused user {name}: {why}")),
            other => other,
        })?;
        let token = AsciiMetadataValue::try_from(answer.token.as_str())
            .map_err(|_| ClusterError::Invalid("etcd sent a token that is not ASCII".into()))?;
        *self.pool.token.0.lock() = Some(token);
        Ok(())
    }

    /// Runs a unary call, bounded by [`CALL_TIMEOUT`].
    async fn unary<T, F, Fut>(&self, call: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        self.unary_until(Instant::now() + CALL_TIMEOUT, call).await
    }

    /// Runs a unary call by `until`; when etcd says the token expired or
    /// is old, authenticates again and runs it once more. A member that
    /// does not answer is noted, so that the next connection avoids it.
    async fn unary_until<T, F, Fut>(&self, until: Instant, call: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let result = match bounded_until(until, call(self.clone())).await {
            Err(error) if self.authenticates() && stale_token(&error) => {
                tracing::debug!(endpoint = %self.endpoint(), %error, "etcd refused the token; authenticating again.");
                self.authenticate(until).await?;
                bounded_until(until, call(self.clone())).await
            }
            other => other,
        };
        if matches!(result, Err(ClusterError::Unreachable(_))) {
            self.failed();
        }
        result
    }
    /// `KV.Range`.
    pub async fn range(&self, request: pb::RangeRequest) -> Result<pb::RangeResponse, ClusterError> {
        self.unary(|c| {
            let request = request.clone();
            async move { c.kv().range(request).await }
        })
        .await
    }

    /// `KV.Put`.
    pub async fn put(&self, request: pb::PutRequest) -> Result<pb::PutResponse, ClusterError> {
        self.unary(|c| {
            let request = request.clone();
            async move { c.kv().put(request).await }
        })
        .await
    }

    /// `KV.DeleteRange`.
    pub async fn delete(&self, request: pb::DeleteRangeRequest) -> Result<pb::DeleteRangeResponse, ClusterError> {
        self.unary(|c| {
            let request = request.clone();
            async move { c.kv().delete_range(request).await }
        })
        .await
    }

    /// `KV.Txn`.
    pub async fn txn(&self, request: pb::TxnRequest) -> Result<pb::TxnResponse, ClusterError> {
        self.unary(|c| {
            let request = request.clone();
            async move { c.kv().txn(request).await }
        })
        .await
    }

    /// `Lease.LeaseGrant`: a new lease of `ttl` seconds.
    pub async fn grant(&self, ttl: i64) -> Result<i64, ClusterError> {
        let answer = self
            .unary(|c| async move { c.lease_client().lease_grant(pb::LeaseGrantRequest { ttl, id: 0 }).await })
            .await?;
        if !answer.error.is_empty() {
            return Err(ClusterError::Refused(format!("etcd granted no lease: {}", answer.error)));
        }
        Ok(answer.id)
    }

    /// `Lease.LeaseRevoke`.
    pub async fn revoke(&self, lease: i64) -> Result<(), ClusterError> {
        self.unary(|c| async move { c.lease_client().lease_revoke(pb::LeaseRevokeRequest { id: lease }).await })
            .await
            .map(drop)
    }

    /// Opens a keep-alive stream for `lease`, renewing it once: the stream
    /// and the lease's time to live, in seconds.
    pub async fn keep_alive(&self, lease: i64) -> Result<(KeepAlive, i64), ClusterError> {
        let opened = KeepAlive::open(self, lease, Instant::now() + CALL_TIMEOUT).await;
        if matches!(opened, Err(ClusterError::Unreachable(_))) {
            self.failed();
        }
        opened
    }

    /// Opens a watch of every key in `[key, range_end)` from `revision`
    /// (0: from now).
    pub async fn watch(&self, ranges: Vec<(Vec<u8>, Vec<u8>)>, revision: i64) -> Result<Watch, ClusterError> {
        Watch::open(self, ranges, revision).await
    }
}

/// Runs one call by `until`, mapping gRPC's answer to a [`ClusterError`].
pub(crate) async fn bounded_until<T>(
    until: Instant,
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout_at(until.into(), call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(from_status(&status)),
        Err(_) => Err(ClusterError::Unreachable("etcd did not answer in time".into())),
    }
}

/// Whether etcd refused a call for its token alone (expired, made old by a
/// change to etcd's users and roles, or lost): authenticating again cures
/// it, as etcd's own client does.
pub(crate) fn stale_token(error: &ClusterError) -> bool {
    const STALE: [&str; 3] = ["invalid auth token", "revision of auth store is old", "user name is empty"];
    matches!(error, ClusterError::Denied(_)) && STALE.iter().any(|s| error.detail().contains(s))
}

/// What etcd's gRPC status means for baton.
pub(crate) fn from_status(status: &tonic::Status) -> ClusterError {
    use tonic::Code;
    let text = describe(status);
    // etcd answers a wrong password and a missing user with
    // InvalidArgument; its messages say what they are.
    const DENIALS: [&str; 5] = [
        "authentication failed",
        "user name is empty",
        "permission denied",
        "auth token",
        "revision of auth store is old",
    ];
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => ClusterError::Denied(text),
        _ if DENIALS.iter().any(|d| text.contains(d)) => ClusterError::Denied(text),
        Code::OutOfRange if text.contains("compacted") => ClusterError::Compacted(text),
        _ if text.contains("lease not found") => ClusterError::LeaseLost(text),
        Code::NotFound | Code::InvalidArgument | Code::FailedPrecondition | Code::ResourceExhausted => {
            ClusterError::Refused(text)
        }
        _ => ClusterError::Unreachable(text),
    }
}

/// A status as one line: etcd's message, or the transport's error chain.
fn describe(status: &tonic::Status) -> String {
    let mut text =
        if status.message().is_empty() { status.code().description().to_owned() } else { status.message().to_owned() };
    let mut source = std::error::Error::source(status);
    while let Some(error) = source {
        text.push_str(": ");
        text.push_str(&error.to_string());
        source = error.source();
    }
    text
}

/// A transport error with its causes, as one line.
fn describe_transport(error: &tonic::transport::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The end of the range of every key that starts with `prefix`.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every key: etcd's "\0" range end.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::prefix_end;

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"/baton/a/"), b"/baton/a0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff"), b"\0");
    }
}
