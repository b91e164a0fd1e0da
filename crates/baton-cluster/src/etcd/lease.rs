//! A lease's keep-alive stream, and the loop that keeps a lease alive
//! through whichever member answers.
//!
//! A lease is renewed every third of its time to live, as etcd's own
//! client does. A renewal waits for the current member alone for half of
//! what is left of the lease (at most [`CALL_TIMEOUT`]); then the others
//! are asked as well, and whichever answers first renews it. A slow member
//! (a leader's fsync stall, a defragmentation) thus still renews the lease
//! and keeps it, and one that hangs is left while half the lease remains.
//! With one member there is nowhere to go, and a renewal waits for it as
//! long as the lease lasts.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{CALL_TIMEOUT, Client, from_status, pb, stale_token};
use crate::backoff::Backoff;
use crate::error::ClusterError;

/// The shortest time a member is given while the lease has more left.
const MIN_ATTEMPT: Duration = Duration::from_millis(100);

/// An open keep-alive stream for one lease.
pub struct KeepAlive {
    lease: i64,
    requests: mpsc::Sender<pb::LeaseKeepAliveRequest>,
    answers: tonic::Streaming<pb::LeaseKeepAliveResponse>,
}

impl KeepAlive {
    /// Opens the stream and renews the lease once, by `until`: etcd
    /// answers a stream's call only with its first message, so one is
    /// sent first. Asks for a member with a leader; a token etcd refuses
    /// is renewed once.
    pub(super) async fn open(client: &Client, lease: i64, until: Instant) -> Result<(KeepAlive, i64), ClusterError> {
        match KeepAlive::open_once(client, lease, until).await {
            Err(error) if client.authenticates() && stale_token(&error) => {
                client.authenticate(until).await?;
                KeepAlive::open_once(client, lease, until).await
            }
            other => other,
        }
    }

    async fn open_once(client: &Client, lease: i64, until: Instant) -> Result<(KeepAlive, i64), ClusterError> {
        let (requests, rx) = mpsc::channel(4);
        requests
            .try_send(pb::LeaseKeepAliveRequest { id: lease })
            .map_err(|_| ClusterError::Unreachable("the keep-alive stream closed before it opened".into()))?;
        let request = super::watch::leader_required(ReceiverStream::new(rx));
        let answers = super::bounded_until(until, client.lease_client().lease_keep_alive(request)).await?;
        let mut keeper = KeepAlive { lease, requests, answers };
        let ttl = keeper.answer(until).await?;
        Ok((keeper, ttl))
    }

    /// Renews the lease once, by `until`: its time to live in seconds, or
    /// an error when it has expired or etcd did not answer in time.
    pub async fn renew(&mut self, until: Instant) -> Result<i64, ClusterError> {
        let lease = self.lease;
        self.requests
            .send(pb::LeaseKeepAliveRequest { id: lease })
            .await
            .map_err(|_| ClusterError::Unreachable("the keep-alive stream closed".into()))?;
        self.answer(until).await
    }

    /// Reads the answer to the last renewal.
    async fn answer(&mut self, until: Instant) -> Result<i64, ClusterError> {
        let lease = self.lease;
        match tokio::time::timeout_at(until.into(), self.answers.message()).await {
            Ok(Ok(Some(answer))) if answer.ttl > 0 => Ok(answer.ttl),
            Ok(Ok(Some(_))) => Err(ClusterError::LeaseLost(format!("lease {lease:x} expired"))),
            Ok(Ok(None)) => Err(ClusterError::Unreachable("the keep-alive stream ended".into())),
            Ok(Err(status)) => Err(from_status(&status)),
            Err(_) => Err(ClusterError::Unreachable("no keep-alive answer in time".into())),
        }
    }
}

/// Keeps `lease` (of `ttl` seconds) alive through `client`'s member, and
/// through another whenever that one does not renew it in time, until
/// etcd says it expired or no member renewed it before it would have:
/// returns why. `via` is told the endpoint each time the renewals move.
pub(crate) async fn keep(
    client: Client,
    lease: i64,
    ttl: i64,
    via: &tokio::sync::watch::Sender<String>,
) -> ClusterError {
    let granted = Duration::from_secs(ttl.max(1) as u64);
    let mut client = client;
    let mut stream: Option<KeepAlive> = None;
    // The caller holds a live lease: it was renewed or granted at most a
    // call ago. It is renewed at once, which says how long it has.
    let mut expires = Instant::now() + granted;
    let mut next = Instant::now();
    loop {
        tokio::time::sleep_until(next.into()).await;
        match renew(&mut client, &mut stream, lease, expires, via).await {
            Ok((sent, ttl)) => {
                expires = sent + ttl;
                next = sent + ttl / 3;
            }
            Err(error) => return error,
        }
    }
}

/// What a renewal through another member found: that member's client,
/// its keep-alive stream, and the lease's time to live in seconds.
type Found = (Client, KeepAlive, i64);

/// A renewal through the other members, under way.
type Elsewhere = Pin<Box<dyn Future<Output = Result<Found, ClusterError>> + Send>>;

/// One renewal: through the current member, which has the lease to itself
/// for half of what is left (at most [`CALL_TIMEOUT`]); past that, or
/// when it fails, through the others as well, and whichever answers first
/// renews it. A member that is only slow still renews the lease (and
/// keeps it); one that hangs is left for the first that answers. Returns
/// when the renewal was sent and the time to live etcd gave.
async fn renew(
    client: &mut Client,
    stream: &mut Option<KeepAlive>,
    lease: i64,
    expires: Instant,
    via: &tokio::sync::watch::Sender<String>,
) -> Result<(Instant, Duration), ClusterError> {
    let sent = Instant::now();
    let left = expires.saturating_duration_since(sent);
    if left.is_zero() {
        return Err(expired(lease, None));
    }
    // With one member there is nowhere else to ask: it has all that is left.
    let patience = if client.members() > 1 { (left / 2).clamp(MIN_ATTEMPT, CALL_TIMEOUT).min(left) } else { left };
    let here = renew_here(client.clone(), stream.take(), lease, expires);
    tokio::pin!(here);
    let mut elsewhere: Option<Elsewhere> = None;
    let mut here_failed = false;
    let mut elsewhere_failed: Option<ClusterError> = None;
    loop {
        tokio::select! {
            (renewed, kept) = &mut here, if !here_failed => match renewed {
                Ok(ttl) => {
                    tracing::trace!(endpoint = %client.endpoint(), lease = format!("{lease:x}"), ttl, "Renewed the lease.");
                    *stream = kept;
                    return Ok((sent, seconds(ttl)));
                }
                // Refused, denied or expired: every member would say the same.
                Err(error) if !matches!(error, ClusterError::Unreachable(_)) => return Err(error),
                Err(error) => {
                    client.failed();
                    if let Some(every) = elsewhere_failed.take() {
                        return Err(expired(lease, Some(every)));
                    }
                    tracing::warn!(endpoint = %client.endpoint(), lease = format!("{lease:x}"), %error, "An etcd member could not renew the lease; renewing it through another.");
                    here_failed = true;
                    if elsewhere.is_none() {
                        elsewhere = Some(Box::pin(renew_elsewhere(client.clone(), lease, expires)));
                    }
                }
            },
            () = tokio::time::sleep_until((sent + patience).into()), if elsewhere.is_none() && !here_failed => {
                tracing::warn!(endpoint = %client.endpoint(), lease = format!("{lease:x}"), waited_ms = patience.as_millis() as u64, "An etcd member has not renewed the lease yet; asking another as well.");
                elsewhere = Some(Box::pin(renew_elsewhere(client.clone(), lease, expires)));
            }
            found = async { elsewhere.as_mut().expect("guarded by the branch's condition").await }, if elsewhere.is_some() && elsewhere_failed.is_none() => match found {
                Ok((other, open, ttl)) => {
                    if !here_failed {
                        // It did not answer within its time: tried last for a while.
                        client.failed();
                    }
                    *client = other;
                    *stream = Some(open);
                    via.send_replace(client.endpoint());
                    tracing::info!(endpoint = %client.endpoint(), lease = format!("{lease:x}"), ttl, "Renewed the lease through another etcd member.");
                    return Ok((sent, seconds(ttl)));
                }
                Err(error) if here_failed || !matches!(error, ClusterError::Unreachable(_)) => {
                    return Err(if matches!(error, ClusterError::Unreachable(_)) { expired(lease, Some(error)) } else { error });
                }
                // Still waiting for the current member, while the lease lasts.
                Err(error) => elsewhere_failed = Some(error),
            },
        }
    }
}

/// A time to live in seconds, as a duration.
fn seconds(ttl: i64) -> Duration {
    Duration::from_secs(ttl.max(1) as u64)
}

/// Why a lease was given up: no member renewed it in time.
fn expired(lease: i64, last: Option<ClusterError>) -> ClusterError {
    let why = last.map_or_else(String::new, |e| format!(": {e}"));
    ClusterError::Unreachable(format!("no etcd member renewed lease {lease:x} before it would have expired{why}"))
}

/// Renews the lease through `client`'s member by `until`, over `stream`
/// when one is open, else over a new one; a token etcd refuses opens the
/// stream again with a new one. Gives the stream back when it renewed.
async fn renew_here(
    client: Client,
    stream: Option<KeepAlive>,
    lease: i64,
    until: Instant,
) -> (Result<i64, ClusterError>, Option<KeepAlive>) {
    if let Some(mut open) = stream {
        match open.renew(until).await {
            Ok(ttl) => return (Ok(ttl), Some(open)),
            Err(error) if client.authenticates() && stale_token(&error) => {
                if let Err(error) = client.authenticate(until).await {
                    return (Err(error), None);
                }
            }
            Err(error) => return (Err(error), None),
        }
    }
    match KeepAlive::open(&client, lease, until).await {
        Ok((open, ttl)) => (Ok(ttl), Some(open)),
        Err(error) => (Err(error), None),
    }
}

/// Renews the lease through the members other than `client`'s (or, with
/// one member, through it again, over a new connection), each given a
/// share of what is left, round after round while the lease lasts.
async fn renew_elsewhere(client: Client, lease: i64, expires: Instant) -> Result<Found, ClusterError> {
    let mut rounds = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let mut last: Option<ClusterError> = None;
    loop {
        let now = Instant::now();
        let left = expires.saturating_duration_since(now);
        if left.is_zero() {
            return Err(expired(lease, last));
        }
        let (attempt, until) = if client.members() > 1 {
            let attempt = (left / 3).clamp(MIN_ATTEMPT, CALL_TIMEOUT).min(left);
            (attempt, (now + (left / 2).clamp(MIN_ATTEMPT, CALL_TIMEOUT)).min(expires))
        } else {
            (left, expires)
        };
        let tried = match client.another(attempt, expires).await {
            Ok(other) => match KeepAlive::open(&other, lease, until).await {
                Ok((open, ttl)) => return Ok((other, open, ttl)),
                Err(error) => {
                    if matches!(error, ClusterError::Unreachable(_)) {
                        other.failed();
                    }
                    error
                }
            },
            Err(error) => error,
        };
        if !matches!(tried, ClusterError::Unreachable(_)) {
            return Err(tried);
        }
        last = Some(tried);
        // Every member failed this round: a short pause, then the next.
        let pause = rounds.next_wait().min(expires.saturating_duration_since(Instant::now()));
        tokio::time::sleep(pause).await;
    }
}
