//! baton's container image (scripts/image.sh) run under podman, built from
//! the binary under test: it runs as a user that is not root and serves a
//! model from a repository mounted read-only, over REST and gRPC; the
//! decisions an operator makes hold when a new container starts on the same
//! state directory; `podman stop` under traffic drains without failing a
//! request and the container exits 0; and an upgrade inside the container
//! hands the sockets over as on a host, PID 1 staying in place.
//!
//! The containers use the host's network, and the test passes baton
//! loopback ports of its own on top of the image's command (baton takes an
//! option's last value), so everything else in the command is the image's.

mod common;

use std::path::Path;

use baton_protocol::grpc::pb;
use baton_testkit::onnx::sample_input;
use baton_testkit::podman::{self, Container, Image, Run};
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, free_port};
use common::{SIZES, assert_close, mlp, output_f32, repo_with, request, version_of};

/// The image of the binary under test.
fn image() -> &'static Image {
    Image::of(common::bin())
}

/// A container serving the image's command on loopback ports of its own.
#[allow(dead_code)] // Filled in by the next tests.
struct Served {
    container: Container,
    http: String,
    grpc: String,
    admin: String,
}

impl Served {
    /// Runs the image's command with `repo` mounted read-only at /models,
    /// `state` at /var/lib/baton, `flags` for podman and `extra` options
    /// for baton, and waits until it is ready.
    fn start(repo: &Path, state: &Path, flags: &[&str], extra: &[&str]) -> Served {
        let image = image();
        let [http, grpc, admin, admin_grpc] =
            [free_port(), free_port(), free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
        let mut args = image.command();
        for (flag, address) in
            [("--http", &http), ("--grpc", &grpc), ("--admin-http", &admin), ("--admin-grpc", &admin_grpc)]
        {
            args.extend([flag.to_owned(), address.clone()]);
        }
        args.extend(extra.iter().map(|e| (*e).to_owned()));
        let container = Run::new(image, "serve")
            .mount_read_only(repo, "/models")
            .mount(state, "/var/lib/baton")
            // Where `podman exec NAME baton …` finds this server.
            .env("BATON_URL", &format!("http://{http}"))
            .env("BATON_ADMIN_URL", &format!("http://{admin}"))
            .env("BATON_LOG", "info,baton=debug")
            .flags(flags)
            .args(&args)
            .start();
        let served = Served { container, http: format!("http://{http}"), grpc, admin: format!("http://{admin}") };
        served.container.wait_ready(&served.http);
        served
    }

    fn client(&self) -> Client {
        Client::new(&self.http)
    }

    /// The version of `model` serving, from its status.
    #[allow(dead_code)]
    fn serving(&self, model: &str) -> u64 {
        let status = self.client().get(&format!("/baton/v1/models/{model}/status"));
        assert_eq!(status.status, 200, "{}", common::text(&status.body));
        status.json()["serving"].as_u64().expect("a serving version")
    }
}

/// A repository the image's user can read, and a state directory it owns.
fn mounts(repo: &TestRepo) -> tempfile::TempDir {
    podman::share_read_only(repo.root());
    let state = tempfile::tempdir().expect("a state dir");
    podman::give_to_image_user(state.path());
    state
}

/// One REST inference of `model`: the version that answered, and its outputs
/// checked against the reference forward pass.
fn infer_checked(client: &Client, model: &str) -> u64 {
    let input = sample_input(SIZES[0], 2, 7);
    let answer = client.post_json(&format!("/v2/models/{model}/infer"), &request(&input, 2));
    assert_eq!(answer.status, 200, "{}", common::text(&answer.body));
    let body = answer.json();
    let version = version_of(&body);
    assert_close(&output_f32(&body, "output"), &mlp(version).forward(&input, 2), "REST output");
    version
}

#[test]
fn the_image_serves_as_its_own_user_from_a_read_only_repository_over_rest_and_grpc() {
    let repo = repo_with("ranker", &[1], "");
    let state = mounts(&repo);
    // --read-only: nothing is written outside the state directory.
    let served = Served::start(repo.root(), state.path(), &["--read-only"], &[]);

    assert_eq!(infer_checked(&served.client(), "ranker"), 1);

    // gRPC, on the port the test gave it.
    let runtime = common::grpc::runtime();
    runtime.block_on(async {
        let (mut client, _) = common::grpc::clients_at(&served.grpc).await;
        let input = sample_input(SIZES[0], 1, 9);
        let request = pb::ModelInferRequest {
            model_name: "ranker".into(),
            inputs: vec![pb::model_infer_request::InferInputTensor {
                name: "input".into(),
                datatype: "FP32".into(),
                shape: vec![1, SIZES[0] as i64],
                contents: Some(pb::InferTensorContents { fp32_contents: input.clone(), ..Default::default() }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let answer = common::grpc::within("gRPC inference", client.model_infer(request))
            .await
            .expect("a gRPC answer")
            .into_inner();
        assert_eq!(answer.model_version, "1");
        let output = answer.outputs[0].contents.as_ref().expect("typed outputs").fp32_contents.clone();
        assert_close(&output, &mlp(1).forward(&input, 1), "gRPC output");
    });

    // Every process of the container runs as the image's user.
    let users = podman::podman_ok(&["top", served.container.name(), "pid", "huser", "user", "args"]);
    let rows: Vec<&str> = users.lines().skip(1).collect();
    assert!(!rows.is_empty(), "no processes in {users}");
    for row in &rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(fields.get(2), Some(&"baton"), "a process not run as baton: {users}");
    }
    // The status names the server's pid inside the container, and the CLI
    // run with `podman exec` reaches the server where the image says.
    let status = served.container.exec_ok(&["baton", "status", "--json"]);
    assert!(status.contains("ranker"), "{status}");
}
