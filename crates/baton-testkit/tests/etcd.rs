//! The etcd test kit against the real etcd: it starts healthy, stores a key
//! through the v3 JSON gateway, and after a crash comes back on the same
//! port with the key still in its data directory.

use baton_testkit::etcd::Etcd;
use baton_testkit::server::Client;

#[test]
fn etcd_starts_stores_and_survives_a_crash() {
    let mut etcd = Etcd::start();
    let endpoint = etcd.endpoint();
    assert_eq!(endpoint, format!("http://127.0.0.1:{}", etcd.port()));
    let health = Client::new(&endpoint).get("/health");
    assert_eq!(health.status, 200, "etcd's /health");
    assert_eq!(health.json()["health"], "true", "etcd's /health: {}", String::from_utf8_lossy(&health.body));

    assert_eq!(etcd.get("/baton/test/key"), None, "a fresh etcd holds no key");
    etcd.put("/baton/test/key", b"value one");
    assert_eq!(etcd.get("/baton/test/key").as_deref(), Some(&b"value one"[..]));

    let before = etcd.pid();
    etcd.kill();
    assert_eq!(etcd.pid(), 0, "a killed etcd has no process");
    assert!(Client::new(&endpoint).try_get("/health").is_err(), "a killed etcd still answers");

    etcd.restart();
    assert_ne!(etcd.pid(), before, "a restart starts a new process");
    assert_eq!(etcd.endpoint(), endpoint, "a restart keeps the client port");
    assert_eq!(etcd.get("/baton/test/key").as_deref(), Some(&b"value one"[..]), "the data dir survives a crash");

    etcd.stop();
    assert!(Client::new(&endpoint).try_get("/health").is_err(), "a stopped etcd still answers");
    assert!(etcd.log_tail().contains(&endpoint), "the log names the endpoint:\n{}", etcd.log_tail());
}
