//! The fleet as a replica can read it from etcd, for the console and
//! `GET /baton/v1/fleet`: every live replica and what it serves, each
//! model's committed version, its rollout (in progress or last) with who
//! coordinates it, each participant's prepare (acknowledged or failed) and
//! switch, and the skew of the last switch. It is what `baton fleet status
//! --json` reads, plus the switches and coordinators, read on demand
//! through one connection kept between reads.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use baton_cluster::records::{Ack, Desired, ReplicaRecord, RolloutRecord, Switched};
use baton_cluster::{Store, StoreConfig};
use serde_json::{Value, json};

use crate::error::{Class, ServeError};

/// How long one read of the fleet may take before it is given up on (the
/// console reads again a moment later).
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a view read from etcd answers the reads that follow: many
/// console tabs polling one replica make one read of etcd a second.
const FRESH_FOR: Duration = Duration::from_secs(1);

/// How a replica reads its fleet.
pub struct FleetView {
    config: StoreConfig,
    name: String,
    /// The connection kept between reads. A read takes it out and puts it
    /// back only once the read went through: a read cut off mid-way drops
    /// the connection it held (it may be stuck), and nothing else does.
    store: std::sync::Mutex<Option<Store>>,
    /// The last view read and when; its lock makes reads take turns.
    last: tokio::sync::Mutex<Option<(Instant, Value)>>,
}

impl FleetView {
    /// A view of cluster `name` in the etcd of `config`; it connects on the
    /// first read.
    pub fn new(config: StoreConfig, name: String) -> FleetView {
        FleetView { config, name, store: std::sync::Mutex::new(None), last: tokio::sync::Mutex::new(None) }
    }

    /// The fleet now (read from etcd at most once per [`FRESH_FOR`]), or
    /// `fleet_unreachable` when etcd does not answer in time. Reads take
    /// turns; waiting for the turn counts in the time allowed, and a read
    /// that gives up while waiting leaves the connection alone.
    pub async fn read(&self) -> Result<Value, ServeError> {
        let attempt = async {
            let mut last = self.last.lock().await;
            if let Some((_, view)) = last.as_ref().filter(|(at, _)| at.elapsed() < FRESH_FOR) {
                return Ok(view.clone());
            }
            let kept = self.store.lock().unwrap_or_else(|e| e.into_inner()).take();
            let store = match kept {
                Some(store) => store,
                None => Store::connect(&self.config, &self.name).await.map_err(|e| e.to_string())?,
            };
            // On failure the connection is dropped here; the next read makes another.
            let view = snapshot(&store).await.map_err(|e| e.to_string())?;
            *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
            *last = Some((Instant::now(), view.clone()));
            Ok::<Value, String>(view)
        };
        let error = match tokio::time::timeout(READ_TIMEOUT, attempt).await {
            Ok(Ok(view)) => return Ok(view),
            Ok(Err(error)) => error,
            Err(_) => format!("etcd did not answer within {READ_TIMEOUT:?}"),
        };
        Err(ServeError::new(Class::Unavailable, "fleet_unreachable", format!("the fleet cannot be read: {error}")))
    }
}

/// One read of every record the view shows.
async fn snapshot(store: &Store) -> Result<Value, baton_cluster::ClusterError> {
    let keys = &store.keys;
    let (replicas, _) = store.list::<ReplicaRecord>(&keys.replicas()).await?;
    let (desired, _) = store.list::<Desired>(&keys.desired_all()).await?;
    let (rollouts, _) = store.list::<RolloutRecord>(&keys.records()).await?;
    let (coordinators, _) = store.list::<String>(&keys.coordinators()).await?;
    let coordinators: BTreeMap<String, String> =
        coordinators.into_iter().map(|c| (c.name().to_owned(), c.value)).collect();
    let mut models = Vec::new();
    for rollout in rollouts {
        let record = rollout.value;
        let (acks, _) = store.list::<Ack>(&keys.acks(&record.model)).await?;
        let acks: BTreeMap<String, Ack> =
            acks.into_iter().filter(|a| a.value.rollout == record.id).map(|a| (a.name().to_owned(), a.value)).collect();
        let (switches, _) = store.list::<Switched>(&keys.switches(&record.model)).await?;
        let switches: BTreeMap<String, Switched> = switches
            .into_iter()
            .filter(|s| s.value.rollout == record.id)
            .map(|s| (s.name().to_owned(), s.value))
            .collect();
        models.push(json!({
            "model": record.model,
            "coordinator": coordinators.get(&record.model),
            "skew_ms": skew_ms(&switches),
            "acks": acks,
            "switched": switches,
            "rollout": record,
        }));
    }
    let desired: BTreeMap<String, Desired> = desired.into_iter().map(|d| (d.name().to_owned(), d.value)).collect();
    let replicas: Vec<ReplicaRecord> = replicas.into_iter().map(|r| r.value).collect();
    Ok(json!({ "replicas": replicas, "desired": desired, "rollouts": models }))
}

/// The spread of the latest switch of a rollout across its replicas, in
/// milliseconds: last minus first of the switches of its latest phase and
/// step. `None` with fewer than two.
fn skew_ms(switches: &BTreeMap<String, Switched>) -> Option<f64> {
    let latest = switches.values().map(|s| (s.phase as u8, s.step)).max()?;
    let times: Vec<u64> = switches.values().filter(|s| (s.phase as u8, s.step) == latest).map(|s| s.at_us).collect();
    if times.len() < 2 {
        return None;
    }
    let (first, last) = (times.iter().min()?, times.iter().max()?);
    Some((last - first) as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use baton_cluster::records::FleetPhase;

    use super::*;

    fn switched(phase: FleetPhase, step: Option<usize>, at_us: u64) -> Switched {
        Switched { rollout: 1, phase, step, at_us, seen_us: at_us, delay_us: 0 }
    }

    #[test]
    fn the_skew_is_of_the_latest_step_switched() {
        let mut switches = BTreeMap::new();
        assert_eq!(skew_ms(&switches), None);
        switches.insert("r1".to_owned(), switched(FleetPhase::Committed, Some(0), 1_000_000));
        assert_eq!(skew_ms(&switches), None, "one switch has no skew");
        switches.insert("r2".to_owned(), switched(FleetPhase::Committed, Some(0), 1_004_000));
        assert_eq!(skew_ms(&switches), Some(4.0));
        // A later step's switches replace the earlier one's, even while
        // some replicas have not switched yet.
        switches.insert("r1".to_owned(), switched(FleetPhase::Committed, Some(1), 2_000_000));
        switches.insert("r3".to_owned(), switched(FleetPhase::Committed, Some(1), 2_001_500));
        assert_eq!(skew_ms(&switches), Some(1.5));
        switches.insert("r2".to_owned(), switched(FleetPhase::Promoted, Some(1), 3_000_000));
        assert_eq!(skew_ms(&switches), None, "the promotion's first switch alone");
    }
}
