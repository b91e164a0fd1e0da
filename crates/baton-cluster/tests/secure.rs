//! A fleet over a secured etcd, started by each test with certificates it
//! generates: TLS with client certificates, and TLS with authentication
//! (a user whose password is read from a file). Replicas join and a
//! rollout commits; a client configured for TLS never speaks plaintext;
//! wrong or missing credentials are refused with a clear error; an
//! expired token is renewed, and so is one an operator's change to etcd's
//! users made old, for calls and watches (etcd checks no token on a
//! lease's keep-alive: one with an old token renews the lease as it is);
//! a reconnect over a kept connection checks the member with a read a
//! role limited to baton's keys may make.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use baton_cluster::records::FleetPhase;
use baton_cluster::store::Span;
use baton_cluster::{Store, StoreConfig, TlsFiles};
use baton_testkit::certs::Certs;
use baton_testkit::etcd::{Etcd, Security, ServerTls};
use common::{Fleet, logs, plan, wait_until};

fn endpoints(etcd: &Etcd) -> String {
    format!("etcd://127.0.0.1:{}", etcd.port())
}

fn connect(runtime: &tokio::runtime::Runtime, config: &StoreConfig) -> Result<Store, baton_cluster::ClusterError> {
    logs();
    runtime.block_on(Store::connect(config, "t"))
}

/// Two replicas over `fleet` prepare and switch to version 2, coordinated
/// by the test: replicas that may take over an orphaned rollout could win
/// its key before the test does on a busy machine, so these may not.
fn roll_out(fleet: &Fleet) {
    let (r1, r2) = fleet.pair(&[(1, false), (2, false)], &[(1, false), (2, false)], false);
    fleet.start(2, plan()).unwrap();
    let done = fleet.finish("coordinator");
    assert_eq!(done.phase, FleetPhase::Promoted, "{:?}", done.decisions);
    wait_until("both serve 2", || r1.serves() == Some(2) && r2.serves() == Some(2));
    assert!(r1.health.state().last_error.is_none(), "{:?}", r1.health.state());
}

#[test]
fn over_tls_with_client_certificates_a_rollout_commits_and_plaintext_is_never_spoken() {
    let certs = Certs::new();
    let tls = ServerTls { server: certs.server(), client_ca: Some(certs.ca()) };
    let etcd = Etcd::start_secured(&Security { tls: Some(tls), users: Vec::new(), jwt: false });
    let client = certs.client("baton");
    let files = TlsFiles { ca: certs.ca(), cert: Some(client.cert.clone()), key: Some(client.key.clone()) };
    let config = StoreConfig { tls: Some(files.clone()), ..StoreConfig::plain(&endpoints(&etcd)) };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    // Plaintext to a TLS etcd, and TLS without a client certificate, fail.
    let plain = connect(&runtime, &StoreConfig::plain(&endpoints(&etcd)));
    assert!(plain.is_err(), "a plaintext client reached a TLS etcd");
    let anonymous = StoreConfig { tls: Some(TlsFiles { cert: None, key: None, ..files.clone() }), ..config.clone() };
    assert!(connect(&runtime, &anonymous).is_err(), "a client without a certificate was let in");
    // A plaintext URL is refused before anything is sent.
    let downgrade = StoreConfig { endpoints: format!("http://127.0.0.1:{}", etcd.port()), ..config.clone() };
    let refused = connect(&runtime, &downgrade).err().expect("refused");
    assert!(refused.to_string().contains("plaintext"), "{refused}");
    // A CA that did not sign etcd's certificate is refused.
    let other = Certs::new();
    let stranger = StoreConfig { tls: Some(TlsFiles { ca: other.ca(), ..files.clone() }), ..config.clone() };
    assert!(connect(&runtime, &stranger).is_err(), "etcd's certificate was trusted without its CA");

    roll_out(&Fleet::over(etcd, config));
}

#[test]
fn a_client_configured_for_tls_refuses_a_plaintext_etcd() {
    let etcd = Etcd::start();
    let certs = Certs::new();
    let config = StoreConfig {
        tls: Some(TlsFiles { ca: certs.ca(), cert: None, key: None }),
        ..StoreConfig::plain(&endpoints(&etcd))
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let refused = connect(&runtime, &config).err().expect("a TLS client spoke to a plaintext etcd");
    assert_eq!(refused.kind(), "cluster_unreachable", "{refused}");
}

#[test]
fn with_authentication_the_password_comes_from_a_file_and_wrong_ones_are_refused() {
    let certs = Certs::new();
    let tls = ServerTls { server: certs.server(), client_ca: None };
    let users = vec![("baton".to_owned(), "correct horse".to_owned())];
    let etcd = Etcd::start_secured(&Security { tls: Some(tls), users, jwt: false });
    let secrets = tempfile::tempdir().unwrap();
    let password = |name: &str, text: &str| -> PathBuf {
        let path = secrets.path().join(name);
        std::fs::write(&path, format!("{text}\n")).unwrap();
        path
    };
    let tls = TlsFiles { ca: certs.ca(), cert: None, key: None };
    let config = StoreConfig {
        tls: Some(tls),
        user: Some("baton".into()),
        password_file: Some(password("good", "correct horse")),
        ..StoreConfig::plain(&endpoints(&etcd))
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();

    let wrong = StoreConfig { password_file: Some(password("bad", "battery staple")), ..config.clone() };
    let refused = connect(&runtime, &wrong).err().expect("a wrong password was let in");
    assert_eq!(refused.kind(), "cluster_denied", "{refused}");
    assert!(refused.to_string().contains("user baton"), "{refused}");
    let nobody = StoreConfig { user: None, password_file: None, ..config.clone() };
    assert!(connect(&runtime, &nobody).is_err(), "a client without credentials was let in");

    // A token that expired while the client was idle is renewed.
    let store = connect(&runtime, &config).expect("the right password");
    runtime.block_on(store.put("/baton/t/probe", &1, None)).unwrap();
    std::thread::sleep(Duration::from_millis(3500));
    let read = runtime.block_on(store.get::<u32>("/baton/t/probe")).expect("a read after the token expired");
    assert_eq!(read.map(|r| r.value), Some(1));
    // A reconnect over the kept connection (no new token): the member is
    // checked with a read the fleet's role, limited to baton's keys, may make.
    let again = runtime.block_on(store.reconnect()).expect("a reconnect with a role limited to baton's keys");
    assert!(runtime.block_on(again.get::<u32>("/baton/t/probe")).is_ok());

    roll_out(&Fleet::over(etcd, config));
}

#[test]
fn a_token_made_old_by_a_change_to_etcds_users_is_renewed_for_calls_and_watches() {
    let certs = Certs::new();
    let tls = ServerTls { server: certs.server(), client_ca: None };
    let users = vec![("baton".to_owned(), "correct horse".to_owned())];
    let etcd = Etcd::start_secured(&Security { tls: Some(tls), users, jwt: true });
    let secrets = tempfile::tempdir().unwrap();
    let file = secrets.path().join("password");
    std::fs::write(&file, "correct horse\n").unwrap();
    let config = StoreConfig {
        tls: Some(TlsFiles { ca: certs.ca(), cert: None, key: None }),
        user: Some("baton".into()),
        password_file: Some(file),
        ..StoreConfig::plain(&endpoints(&etcd))
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let store = connect(&runtime, &config).expect("the right password");
    let writer = connect(&runtime, &config).expect("the right password");
    let lease = runtime.block_on(store.grant(60)).unwrap();

    // Before each use, an operator changes etcd's roles: the token this
    // client holds is then old.
    etcd.change_auth();
    let key = "/baton/t/watched";
    let mut watch = runtime.block_on(store.watch(&[Span::Key(key.into())], 0)).expect("a watch with an old token");
    runtime.block_on(writer.put(key, &7, None)).expect("a put by another client");
    let events = runtime
        .block_on(async { tokio::time::timeout(Duration::from_secs(10), watch.next()).await })
        .expect("the watch delivered the put")
        .expect("the watch got in with a renewed token");
    assert_eq!(events.first().and_then(|e| e.value.clone()), Some(b"7".to_vec()));

    // etcd does not check the token of a keep-alive: the lease renews
    // whatever the token, and nothing of baton's is tried here.
    etcd.change_auth();
    assert!(runtime.block_on(store.renew(lease)).expect("a keep-alive with an old token"), "the lease is alive");

    etcd.change_auth();
    let read = runtime.block_on(store.get::<u32>(key)).expect("a read with an old token");
    assert_eq!(read.map(|r| r.value), Some(7));
}
