//! `baton serve --cluster`: the replica takes part in its fleet. The
//! fleet's committed versions replace the repository watcher's choice, the
//! API's model operations are refused (the fleet decides), and readiness
//! waits until the replica serves what the fleet committed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use baton_cluster::{Health, Participant, RegistryNode, ReplicaConfig, StoreConfig, TlsFiles};

use crate::app::App;

/// How to reach a secured etcd: TLS and credentials, each secret from a
/// file. Shared by `baton serve`, `baton agent` and `baton fleet`.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct EtcdAccess {
    /// The certificate authority (PEM) that signed etcd's certificate:
    /// every endpoint is then spoken to over TLS, never in plaintext.
    #[arg(long, value_name = "FILE", env = "BATON_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// This process's client certificate (PEM), when etcd asks for one.
    #[arg(long, value_name = "FILE", env = "BATON_ETCD_CERT", requires = "etcd_key")]
    pub etcd_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", env = "BATON_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// The etcd user, when etcd has authentication on.
    #[arg(long, value_name = "NAME", env = "BATON_ETCD_USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// A file holding the etcd user's password.
    #[arg(long, value_name = "FILE", env = "BATON_ETCD_PASSWORD_FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// Send the etcd password without TLS. Refused otherwise: use it only
    /// where something else encrypts the way to etcd (a service mesh's
    /// sidecar, an etcd on the same host).
    #[arg(long, env = "BATON_ETCD_PLAINTEXT_PASSWORD", requires = "etcd_user")]
    pub etcd_plaintext_password: bool,
}

impl EtcdAccess {
    /// The store settings for the etcd at `endpoints`.
    pub fn store(&self, endpoints: &str) -> StoreConfig {
        let tls =
            self.etcd_ca.clone().map(|ca| TlsFiles { ca, cert: self.etcd_cert.clone(), key: self.etcd_key.clone() });
        StoreConfig {
            endpoints: endpoints.to_owned(),
            tls,
            user: self.etcd_user.clone(),
            password_file: self.etcd_password_file.clone(),
            plaintext_password: self.etcd_plaintext_password,
        }
    }
}

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
    /// The replica's lease, whole seconds from 1s to 60s (a bare number
    /// is seconds): a replica that dies leaves the fleet this long after.
    #[arg(long, default_value = "3s", value_parser = parse_lease, value_name = "DURATION")]
    pub lease_ttl: i64,
    /// Do not coordinate rollouts whose coordinator is gone.
    #[arg(long)]
    pub no_coordinate: bool,
    #[command(flatten)]
    pub etcd: EtcdAccess,
}

impl ClusterArgs {
    /// The fleet's store settings, checked (endpoints parse, every file
    /// named can be read); `None` outside a fleet.
    pub fn checked_store(&self) -> anyhow::Result<Option<StoreConfig>> {
        let Some(cluster) = &self.cluster else { return Ok(None) };
        let store = self.etcd.store(cluster);
        store.check().map_err(|e| anyhow::anyhow!("the fleet's etcd settings: {e}"))?;
        Ok(Some(store))
    }

    /// Who this process is in the fleet at `cluster`: a replica serving at
    /// `address`, or an agent speaking for the server there.
    pub fn replica(&self, cluster: &str, address: String, agent: bool) -> ReplicaConfig {
        ReplicaConfig {
            store: self.etcd.store(cluster),
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
/// `handed` is what the process this one replaces handed on (`None`
/// outside an upgrade): the replica's ID and lease are taken over, and
/// this process acts for the replica only once it serves.
pub fn start(
    app: &Arc<App>,
    args: &ClusterArgs,
    address: String,
    handed: Option<crate::upgrade::Fleet>,
) -> Option<Arc<Health>> {
    let cluster = args.cluster.clone()?;
    let health = Arc::new(Health::default());
    if let Some(handed) = &handed {
        health.inherit_lease(handed.lease);
    }
    let ready_app = Arc::clone(app);
    let ready = Arc::new(move |models: Option<BTreeSet<String>>| match models {
        Some(models) => ready_app.release(models),
        None => ready_app.hold(),
    });
    let node = Arc::new(RegistryNode::new(app.registry.clone(), ready));
    let mut config = args.replica(&cluster, address, false);
    if let Some(id) = handed.and_then(|h| h.replica_id) {
        config.id = id;
    }
    let _ = app.replica_id.set(config.id.clone());
    let _ = app.fleet.set(Arc::new(crate::fleet_view::FleetView::new(config.store.clone(), config.name.clone())));
    tracing::info!(replica = %config.id, cluster = %config.name, "Taking part in a fleet.");
    let participant = Participant::new(config, node, Arc::clone(&health));
    let stop = app.shutdown_signal();
    tokio::spawn(participant.run(stop));
    Some(health)
}

/// Parses a lease: a duration (`3s`, or a bare number of seconds) of whole
/// seconds from 1 to 60, as etcd grants them.
fn parse_lease(text: &str) -> Result<i64, String> {
    let lease = baton_drill::args::parse_duration(text)?;
    if lease.subsec_nanos() != 0 || !(1..=60).contains(&lease.as_secs()) {
        return Err(format!("'{text}': a lease is whole seconds from 1s to 60s"));
    }
    Ok(lease.as_secs() as i64)
}

#[cfg(test)]
mod tests {
    use super::{parse_label, parse_lease, replica_id};

    #[test]
    fn a_lease_is_whole_seconds_with_or_without_the_unit() {
        assert_eq!(parse_lease("3").unwrap(), 3);
        assert_eq!(parse_lease("3s").unwrap(), 3);
        assert_eq!(parse_lease("1m").unwrap(), 60);
        assert!(parse_lease("1500ms").unwrap_err().contains("whole seconds"));
        assert!(parse_lease("0s").is_err() && parse_lease("61s").is_err() && parse_lease("soon").is_err());
    }

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
