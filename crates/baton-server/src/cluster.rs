//! `baton serve --cluster`: the replica takes part in its fleet. The
//! fleet's committed versions replace the repository watcher's choice, the
//! API's model operations are refused (the fleet decides), and readiness
//! waits until the replica serves what the fleet committed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use baton_cluster::{Health, Participant, RegistryNode, ReplicaConfig};

use crate::app::App;

/// The cluster options of `baton serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ClusterArgs {
    /// Take part in a fleet whose state is in this etcd:
    /// `etcd://HOST:PORT[,HOST:PORT…]`.
    #[arg(long, value_name = "ETCD")]
    pub cluster: Option<String>,
    /// The fleet's name: its keys live under `/baton/<name>/` in etcd.
    #[arg(long, default_value = "baton")]
    pub cluster_name: String,
    /// This replica's ID, unique in the fleet. Defaults to POD_NAME, then
    /// HOSTNAME, then the host's name.
    #[arg(long, env = "BATON_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// A label of this replica, `key=value`, for gray release by
    /// selector; repeat it for more.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// The replica's lease, in seconds: a replica that dies leaves the
    /// fleet this long after.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(i64).range(1..=60))]
    pub lease_ttl: i64,
    /// Do not coordinate rollouts whose coordinator is gone.
    #[arg(long)]
    pub no_coordinate: bool,
}

impl ClusterArgs {
    /// Who this process is in the fleet at `cluster`: a replica serving at
    /// `address`, or an agent speaking for the server there.
    pub fn replica(&self, cluster: String, address: String, agent: bool) -> ReplicaConfig {
        ReplicaConfig {
            cluster,
            name: self.cluster_name.clone(),
            id: replica_id(self.replica_id.as_deref()),
            address,
            labels: self.labels.iter().cloned().collect::<BTreeMap<_, _>>(),
            lease_ttl: self.lease_ttl,
            coordinate: !self.no_coordinate,
            agent,
        }
    }
}

/// Parses `key=value`.
pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let (key, value) = text.split_once('=').ok_or_else(|| format!("'{text}' is not key=value"))?;
    if key.is_empty() {
        return Err(format!("'{text}' has an empty key"));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// The replica's ID: the flag, else POD_NAME, HOSTNAME, the host's name.
pub fn replica_id(flag: Option<&str>) -> String {
    let from_env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
    flag.map(str::to_owned)
        .or_else(|| from_env("POD_NAME"))
        .or_else(|| from_env("HOSTNAME"))
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|h| h.trim().to_owned()))
        .unwrap_or_else(|| format!("baton-{}", std::process::id()))
}

/// Starts the participant on the current runtime; it stops when the app
/// starts draining. Readiness follows its convergence.
pub fn start(app: &Arc<App>, args: &ClusterArgs, address: String) -> Option<Arc<Health>> {
    let cluster = args.cluster.clone()?;
    let health = Arc::new(Health::default());
    let ready_app = Arc::clone(app);
    let ready = Arc::new(move |models: Option<BTreeSet<String>>| match models {
        Some(models) => ready_app.release(models),
        None => ready_app.hold(),
    });
    let node = Arc::new(RegistryNode::new(app.registry.clone(), ready));
    let config = args.replica(cluster, address, false);
    tracing::info!(replica = %config.id, cluster = %config.name, "Taking part in a fleet.");
    let participant = Participant::new(config, node, Arc::clone(&health));
    let stop = app.shutdown_signal();
    tokio::spawn(participant.run(stop));
    Some(health)
}

#[cfg(test)]
mod tests {
    use super::{parse_label, replica_id};

    #[test]
    fn labels_are_key_value_and_the_flag_names_the_replica_first() {
        assert_eq!(parse_label("zone=a").unwrap(), ("zone".into(), "a".into()));
        assert_eq!(parse_label("k=").unwrap(), ("k".into(), String::new()));
        assert!(parse_label("zone").is_err());
        assert!(parse_label("=a").is_err());
        assert_eq!(replica_id(Some("pod-3")), "pod-3");
        assert!(!replica_id(None).is_empty());
    }
}
