//! A connection to etcd left idle stays open. etcd, like every gRPC
//! server in Go, closes the connection of a client that pings more often
//! than its keep-alive policy allows (every 5 s at least by default, and
//! not at all without a stream open): a call that goes out just then fails
//! with a broken pipe. baton's client pinged every second, idle or not.

use std::time::Duration;

use baton_cluster::{Store, StoreConfig};
use baton_testkit::etcd::Etcd;

/// The local ports of this process's established TCP connections to
/// `port` on 127.0.0.1, read from /proc/net/tcp.
fn established_to(port: u16) -> Vec<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let remote = format!("0100007F:{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local, remote, state (01: established)
            (fields.get(2) == Some(&remote.as_str()) && fields.get(3) == Some(&"01"))
                .then(|| u16::from_str_radix(fields[1].rsplit(':').next()?, 16).ok())
                .flatten()
        })
        .collect()
}

#[test]
fn an_idle_connection_to_etcd_is_not_closed_for_pinging_too_often() {
    let etcd = Etcd::start();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
    let config = StoreConfig::plain(&format!("etcd://127.0.0.1:{}", etcd.port()));
    let store = runtime.block_on(Store::connect(&config, "idle-test")).unwrap();
    runtime.block_on(store.get::<serde_json::Value>("/idle/probe")).unwrap();
    let before = established_to(etcd.port());
    assert!(!before.is_empty(), "no connection to etcd after a call");
    // Idle for three times the shortest ping interval etcd accepts, which
    // is long enough for it to close a connection that pings every second.
    std::thread::sleep(Duration::from_secs(15));
    let after = established_to(etcd.port());
    assert!(
        before.iter().all(|port| after.contains(port)),
        "etcd closed the idle connection: local ports {before:?} before, {after:?} after\n{}",
        etcd.log_tail()
    );
    runtime.block_on(store.get::<serde_json::Value>("/idle/probe")).unwrap();
}
