//! A lease's keep-alive stream, and the loop that keeps a lease alive
//! through whichever member answers.
//!
//! A lease is renewed every third of its time to live, as etcd's own
//! client does. Each renewal has a deadline of a third of what is left of
//! the lease (at most [`CALL_TIMEOUT`]): a member that hangs is left for
//! another while two thirds of the lease remain, and the next member gets
//! a third of what is left then. With one member there is nowhere to go,
//! and a renewal waits for it as long as the lease lasts.

use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{CALL_TIMEOUT, Client, from_status, pb, stale_token};
use crate::backoff::Backoff;
use crate::error::ClusterError;

/// The shortest deadline a renewal is given while the lease has more left.
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

/// One renewal, through the current member or, when it does not answer
/// in time, the others in turn, until the lease would have expired: when
/// the renewal was sent and the time to live etcd gave.
async fn renew(
    client: &mut Client,
    stream: &mut Option<KeepAlive>,
    lease: i64,
    expires: Instant,
    via: &tokio::sync::watch::Sender<String>,
) -> Result<(Instant, Duration), ClusterError> {
    let mut rounds = Backoff::new(Duration::from_millis(50), Duration::from_millis(500));
    let mut last: Option<ClusterError> = None;
    loop {
        let sent = Instant::now();
        let left = expires.saturating_duration_since(sent);
        if left.is_zero() {
            let why = last.map_or_else(String::new, |e| format!(": {e}"));
            return Err(ClusterError::Unreachable(format!(
                "no etcd member renewed lease {lease:x} before it would have expired{why}"
            )));
        }
        let attempt = if client.members() > 1 { (left / 3).clamp(MIN_ATTEMPT, CALL_TIMEOUT).min(left) } else { left };
        let until = sent + attempt;
        let renewed = match stream {
            Some(open) => open.renew(until).await,
            None => KeepAlive::open(client, lease, until).await.map(|(open, ttl)| {
                *stream = Some(open);
                ttl
            }),
        };
        match renewed {
            Ok(ttl) => {
                tracing::trace!(endpoint = %client.endpoint(), lease = format!("{lease:x}"), ttl, "Renewed the lease.");
                return Ok((sent, Duration::from_secs(ttl.max(1) as u64)));
            }
            Err(error @ ClusterError::LeaseLost(_)) => return Err(error),
            Err(error) if client.authenticates() && stale_token(&error) && last.is_none() => {
                // Opened again, with a new token, at the next try.
                *stream = None;
                last = Some(error);
            }
            // Refused or denied: every member would say the same.
            Err(error) if !matches!(error, ClusterError::Unreachable(_)) => return Err(error),
            Err(error) => {
                *stream = None;
                tracing::warn!(endpoint = %client.endpoint(), lease = format!("{lease:x}"), %error, "An etcd member did not renew the lease in time; renewing it through another.");
                let left = expires.saturating_duration_since(Instant::now());
                let attempt = (left / 3).clamp(MIN_ATTEMPT, CALL_TIMEOUT);
                match client.fail_over(attempt, expires).await {
                    Ok(other) => {
                        *client = other;
                        via.send_replace(client.endpoint());
                        last = Some(error);
                    }
                    Err(every) => {
                        last = Some(every);
                        // Every member failed this round: a short pause,
                        // then the next round, while the lease lasts.
                        let pause = rounds.next_wait().min(expires.saturating_duration_since(Instant::now()));
                        tokio::time::sleep(pause).await;
                    }
                }
            }
        }
    }
}
