//! A server embedded in another program (`baton_server::InProcess`) cannot
//! be upgraded: an upgrade would start the embedding program's own
//! executable with its arguments, then stop the whole embedding process.
//! The API refuses it, and nothing is started.

use std::sync::Arc;

use baton_server::{InProcess, ServeArgs};
use baton_testkit::fake::{FAKE_TOML, FakeBackend};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, eventually};

#[test]
fn an_embedded_server_refuses_to_upgrade_and_starts_nothing() {
    // Were an upgrade to start this test's executable again, the copy would
    // run this test: it stops at once, and the old side's answer names its
    // exit status.
    if std::env::var_os("BATON_UPGRADE_FD").is_some() {
        std::process::exit(3);
    }
    let repo = TestRepo::new();
    repo.add_model("f", FAKE_TOML);
    repo.write_files("f", 1, &[("fake.txt", b"2")]);
    repo.seal("f", 1);
    let root = repo.root().to_str().expect("a UTF-8 path").to_owned();
    let args = ServeArgs::from_options(["--repo", &root, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"])
        .expect("valid options");
    let server = InProcess::start(args, vec![Arc::new(FakeBackend::new())], 2).expect("starting the server in-process");
    let client = Client::new(&format!("http://{}", server.http));
    eventually("the server to become ready", || (client.get("/v2/health/ready").status == 200).then_some(()));

    let refused = client.post_raw("/baton/v1/upgrade", b"{}", &[("content-type", "application/json")]);
    assert_eq!(refused.status, 409, "{}", String::from_utf8_lossy(&refused.body));
    assert_eq!(refused.json()["kind"], "upgrade_unavailable", "{}", String::from_utf8_lossy(&refused.body));
    assert!(refused.error().contains("embedded"), "{}", refused.error());
    assert_eq!(client.get("/v2/health/ready").status, 200, "the server serves on");
    server.stop().expect("stopping the server");
}
