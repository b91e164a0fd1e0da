//! Every member of one etcd cluster a process may speak to, and what it
//! learnt of each: a connection kept for reuse, and how recently and how
//! often the member failed. A member that failed (it refused, or did not
//! answer within a deadline, as a stopped or partitioned one does) is
//! benched for a backoff that grows with each failure; connections go to
//! the members that answer first, starting at a random one so that a
//! fleet spreads over etcd. One authentication token serves them all (etcd
//! hands out tokens that every member accepts).

use std::sync::Arc;
use std::time::{Duration, Instant};

use baton_core::threads::sync::Lock;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use super::{CALL_TIMEOUT, Client, KEEP_ALIVE_INTERVAL, Token, describe_transport};
use crate::backoff::Backoff;
use crate::error::ClusterError;
use crate::etcd::config::StoreConfig;

/// How long a failed member is benched first; it doubles (with jitter) at
/// each failure in a row, up to [`BENCH_LAST`].
const BENCH_FIRST: Duration = Duration::from_millis(500);
const BENCH_LAST: Duration = Duration::from_secs(30);
/// The shortest time one member is given.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// One member and what is known of it.
struct Member {
    url: String,
    /// A connection that answered last time, kept for the next client.
    channel: Option<Channel>,
    /// Not tried before this instant unless every member is benched.
    benched_until: Option<Instant>,
    bench: Backoff,
}

/// The members of one etcd cluster, shared by every client made from them.
pub(crate) struct Pool {
    pub(crate) config: StoreConfig,
    pub(crate) token: Token,
    /// The key a member's check reads: one this process may read.
    pub(crate) probe: Vec<u8>,
    members: Lock<Vec<Member>>,
}

impl Pool {
    /// The members `config` names, checked by a read of `probe`; nothing
    /// is connected yet.
    pub(crate) fn new(config: &StoreConfig, probe: &str) -> Result<Arc<Pool>, ClusterError> {
        config.check_access()?;
        let members = config
            .urls()?
            .into_iter()
            .map(|url| Member { url, channel: None, benched_until: None, bench: Backoff::new(BENCH_FIRST, BENCH_LAST) })
            .collect();
        Ok(Arc::new(Pool {
            config: config.clone(),
            token: Token::default(),
            probe: probe.as_bytes().to_vec(),
            members: Lock::new(members),
        }))
    }

    /// How many members there are.
    pub(crate) fn len(&self) -> usize {
        self.members.lock().len()
    }

    /// Member `i`'s URL.
    pub(crate) fn url(&self, i: usize) -> String {
        self.members.lock()[i].url.clone()
    }

    /// The order to try the members in: those not benched, from a random
    /// one on, then the benched ones, soonest back first; `avoid` last.
    fn order(&self, avoid: Option<usize>) -> Vec<usize> {
        let members = self.members.lock();
        let now = Instant::now();
        let n = members.len();
        let first = baton_core::rollout::assign::random_bucket() as usize % n;
        let mut ready: Vec<usize> = (0..n)
            .map(|k| (first + k) % n)
            .filter(|&i| Some(i) != avoid && members[i].benched_until.is_none_or(|t| t <= now))
            .collect();
        let mut benched: Vec<usize> =
            (0..n).filter(|&i| Some(i) != avoid && members[i].benched_until.is_some_and(|t| t > now)).collect();
        benched.sort_by_key(|&i| members[i].benched_until);
        ready.append(&mut benched);
        ready.extend(avoid.filter(|&i| i < n));
        ready
    }

    /// Notes that member `i` failed: it is benched, and its connection is
    /// dropped (a hung member's connection may be wedged).
    pub(crate) fn failed(&self, i: usize) {
        let mut members = self.members.lock();
        let member = &mut members[i];
        member.benched_until = Some(Instant::now() + member.bench.next_wait());
        member.channel = None;
    }

    /// Notes that member `i` answered.
    pub(crate) fn answered(&self, i: usize) {
        let mut members = self.members.lock();
        let member = &mut members[i];
        member.benched_until = None;
        member.bench.reset();
    }

    /// A client of the first member that answers, trying each (`avoid`
    /// last) for at most `attempt`, all by `deadline`. A member answers
    /// when it is etcd, lets this process in, and serves a linearizable
    /// read (which needs its cluster's leader).
    pub(crate) async fn connect(
        self: &Arc<Self>,
        avoid: Option<usize>,
        attempt: Duration,
        deadline: Instant,
    ) -> Result<Client, ClusterError> {
        let mut errors: Vec<(String, ClusterError)> = Vec::new();
        for i in self.order(avoid) {
            let now = Instant::now();
            if now >= deadline && !errors.is_empty() {
                break;
            }
            let until = (now + attempt).min(deadline).max(now + MIN_ATTEMPT);
            match self.connect_to(i, until).await {
                Ok(client) => {
                    self.answered(i);
                    return Ok(client);
                }
                Err(error) => {
                    self.failed(i);
                    errors.push((self.url(i), error));
                }
            }
        }
        Err(summarize(errors))
    }

    /// A client of member `i`, over its kept connection or a new one,
    /// checked by `until`.
    async fn connect_to(self: &Arc<Self>, i: usize, until: Instant) -> Result<Client, ClusterError> {
        let (url, kept) = {
            let members = self.members.lock();
            (members[i].url.clone(), members[i].channel.clone())
        };
        let fresh = kept.is_none();
        let channel = match kept {
            Some(channel) => channel,
            None => self.open(&url, until).await?,
        };
        let client = Client { pool: Arc::clone(self), member: i, channel: channel.clone() };
        client.check(fresh, until).await?;
        self.members.lock()[i].channel = Some(channel);
        Ok(client)
    }

    /// A new connection to `url`, with TLS read from its files now (a
    /// rotated certificate is used from the next connection on).
    async fn open(&self, url: &str, until: Instant) -> Result<Channel, ClusterError> {
        let left = until.saturating_duration_since(Instant::now());
        let mut endpoint = Endpoint::from_shared(url.to_owned())
            .map_err(|e| ClusterError::Refused(format!("'{url}' is not a URL: {e}")))?
            .connect_timeout(left.min(CALL_TIMEOUT))
            .tcp_nodelay(true)
            // Pings within what etcd (gRPC in Go) accepts: not more often
            // than every 5 s, and none without a stream open, or it closes
            // the connection and a call that goes out then fails. 10 s is
            // what Go's own gRPC clients never go below. A hung member
            // under a watch or a lease is noticed sooner: the lease's
            // renewals have deadlines of their own.
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(CALL_TIMEOUT)
            .keep_alive_while_idle(false);
        if let Some(files) = &self.config.tls {
            let pem = files.read()?;
            let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem.ca));
            if let Some((cert, key)) = pem.identity {
                tls = tls.identity(Identity::from_pem(cert, key));
            }
            endpoint = endpoint.tls_config(tls).map_err(|e| ClusterError::Refused(format!("TLS settings: {e}")))?;
        }
        tokio::time::timeout_at(until.into(), endpoint.connect())
            .await
            .map_err(|_| ClusterError::Unreachable(format!("no connection within {left:?}")))?
            .map_err(|e| ClusterError::Unreachable(describe_transport(&e)))
    }
}

/// Members that all failed the same way say so; a mix is reported as
/// unreachable, the kind a caller retries.
fn summarize(errors: Vec<(String, ClusterError)>) -> ClusterError {
    let Some((_, first)) = errors.first() else {
        return ClusterError::Unreachable("no etcd member was tried".into());
    };
    let text = errors.iter().map(|(url, e)| format!("{url}: {}", e.detail())).collect::<Vec<_>>().join("; ");
    let same = errors.iter().all(|(_, e)| e.kind() == first.kind());
    match first {
        ClusterError::Denied(_) if same => ClusterError::Denied(text),
        ClusterError::Refused(_) if same => ClusterError::Refused(text),
        _ => ClusterError::Unreachable(text),
    }
}
