//! baton's own client of etcd's v3 API: the calls a fleet needs (keys,
//! transactions, watches, leases, authentication), over tonic, with TLS
//! and user/password authentication. The API definitions are compiled at
//! build time with pure-Rust tools, so nothing here needs a system
//! `protoc` (the reason baton does not use the `etcd-client` crate).
//!
//! Every unary call is bounded by [`CALL_TIMEOUT`]; a connection checks
//! its peer with HTTP/2 pings, so a dead etcd ends watches and keep-alives
//! within seconds rather than never.

pub mod config;
mod lease;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use baton_core::sync::Lock;
use tonic::metadata::AsciiMetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

pub use config::{StoreConfig, TlsFiles};
pub use lease::KeepAlive;
pub use watch::{Event, Watch};

use crate::error::ClusterError;

/// The messages and clients generated from `proto/etcd.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/etcdserverpb.rs"));
}

/// How long one call to etcd may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(2);

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

/// A connection to one etcd endpoint. Cheap to clone: clones share the
/// connection and the token.
#[derive(Clone)]
pub struct Client {
    channel: Channel,
    token: Token,
    credentials: Option<Arc<(String, String)>>,
    endpoint: String,
}

impl Client {
    /// Connects to the first endpoint of `config` that answers, starting
    /// at a random one so that a fleet spreads over etcd's members, and
    /// authenticates when a user is configured.
    pub async fn connect(config: &StoreConfig) -> Result<Client, ClusterError> {
        let urls = config.urls()?;
        let credentials = config.credentials()?.map(Arc::new);
        let tls = match &config.tls {
            Some(files) => {
                let pem = files.read()?;
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem.ca));
                if let Some((cert, key)) = pem.identity {
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                Some(tls)
            }
            None => None,
        };
        let first = baton_core::rollout::assign::random_bucket() as usize % urls.len();
        let mut errors: Vec<(String, ClusterError)> = Vec::new();
        for url in urls.iter().cycle().skip(first).take(urls.len()) {
            match Client::connect_one(url, tls.clone(), credentials.clone()).await {
                Ok(client) => return Ok(client),
                Err(error) => errors.push((url.clone(), error)),
            }
        }
        let text = errors.iter().map(|(url, e)| format!("{url}: {}", e.detail())).collect::<Vec<_>>().join("; ");
        // Endpoints that all answered the same way say so; a mix is
        // reported as unreachable, the kind a caller retries.
        let kind = errors[0].1.kind();
        Err(match &errors[0].1 {
            ClusterError::Denied(_) if errors.iter().all(|(_, e)| e.kind() == kind) => ClusterError::Denied(text),
            ClusterError::Refused(_) if errors.iter().all(|(_, e)| e.kind() == kind) => ClusterError::Refused(text),
            _ => ClusterError::Unreachable(text),
        })
    }

    async fn connect_one(
        url: &str,
        tls: Option<ClientTlsConfig>,
        credentials: Option<Arc<(String, String)>>,
    ) -> Result<Client, ClusterError> {
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| ClusterError::Refused(format!("'{url}' is not a URL: {e}")))?
            .connect_timeout(CALL_TIMEOUT)
            .tcp_nodelay(true)
            // Pings within what etcd (gRPC in Go) accepts: not more often
            // than every 5 s, and none without a stream open, or it closes
            // the connection and a call that goes out then fails. 10 s is
            // what Go's own gRPC clients never go below. A dead etcd under
            // a watch or a lease is still noticed: their streams are open.
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(CALL_TIMEOUT)
            .keep_alive_while_idle(false);
        if let Some(tls) = tls {
            endpoint = endpoint.tls_config(tls).map_err(|e| ClusterError::Refused(format!("TLS settings: {e}")))?;
        }
        let channel = tokio::time::timeout(CALL_TIMEOUT, endpoint.connect())
            .await
            .map_err(|_| ClusterError::Unreachable(format!("no answer within {CALL_TIMEOUT:?}")))?
            .map_err(|e| ClusterError::Unreachable(describe_transport(&e)))?;
        let client = Client { channel, token: Token::default(), credentials, endpoint: url.to_owned() };
        if client.credentials.is_some() {
            client.authenticate().await?;
        } else {
            // Ask once: a server that is not etcd, or that wants TLS or
            // credentials, is an error here rather than at the first use.
            let probe = pb::RangeRequest { key: b"/".to_vec(), count_only: true, ..Default::default() };
            client.range(probe).await?;
        }
        Ok(client)
    }

    /// The endpoint this client speaks to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn kv(&self) -> pb::kv_client::KvClient<Service> {
        pb::kv_client::KvClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    fn lease_client(&self) -> pb::lease_client::LeaseClient<Service> {
        pb::lease_client::LeaseClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    fn watch_client(&self) -> pb::watch_client::WatchClient<Service> {
        pb::watch_client::WatchClient::with_interceptor(self.channel.clone(), self.token.clone())
    }

    /// Exchanges the user and password for a token that every later call
    /// carries.
    async fn authenticate(&self) -> Result<(), ClusterError> {
        let Some(credentials) = &self.credentials else { return Ok(()) };
        let (name, password) = (credentials.0.clone(), credentials.1.clone());
        let mut auth = pb::auth_client::AuthClient::new(self.channel.clone());
        let request = pb::AuthenticateRequest { name: name.clone(), password };
        let answer = bounded(auth.authenticate(request)).await.map_err(|e| match e {
            ClusterError::Denied(why) => ClusterError::Denied(format!("etcd refused user {name}: {why}")),
            other => other,
        })?;
        let token = AsciiMetadataValue::try_from(answer.token.as_str())
            .map_err(|_| ClusterError::Invalid("etcd sent a token that is not ASCII".into()))?;
        *self.token.0.lock() = Some(token);
        Ok(())
    }

    /// Runs a unary call; when etcd says the token expired, authenticates
    /// again and runs it once more.
    async fn unary<T, F, Fut>(&self, call: F) -> Result<T, ClusterError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match bounded(call(self.clone())).await {
            Err(ClusterError::Denied(why)) if self.credentials.is_some() && why.contains("invalid auth token") => {
                tracing::debug!(endpoint = %self.endpoint, "etcd's token expired; authenticating again.");
                self.authenticate().await?;
                bounded(call(self.clone())).await
            }
            other => other,
        }
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

    /// Opens a keep-alive stream for `lease`.
    pub async fn keep_alive(&self, lease: i64) -> Result<KeepAlive, ClusterError> {
        KeepAlive::open(self, lease).await
    }

    /// Opens a watch of every key in `[key, range_end)` from `revision`
    /// (0: from now).
    pub async fn watch(&self, ranges: Vec<(Vec<u8>, Vec<u8>)>, revision: i64) -> Result<Watch, ClusterError> {
        Watch::open(self, ranges, revision).await
    }
}

/// Runs one call with the call timeout, mapping gRPC's answer to a
/// [`ClusterError`].
pub(crate) async fn bounded<T>(
    call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, ClusterError> {
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(response)) => Ok(response.into_inner()),
        Ok(Err(status)) => Err(from_status(&status)),
        Err(_) => Err(ClusterError::Unreachable(format!("etcd did not answer within {CALL_TIMEOUT:?}"))),
    }
}

/// What etcd's gRPC status means for baton.
pub(crate) fn from_status(status: &tonic::Status) -> ClusterError {
    use tonic::Code;
    let text = describe(status);
    // etcd answers a wrong password and a missing user with
    // InvalidArgument; its messages say what they are.
    const DENIALS: [&str; 4] = ["authentication failed", "user name is empty", "permission denied", "auth token"];
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
