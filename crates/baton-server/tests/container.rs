//! baton's container image (scripts/image.sh) run under podman, built from
//! the binary under test: it runs as a user that is not root and serves a
//! model from a repository mounted read-only, over REST and gRPC; the
//! decisions an operator makes hold when a new container starts on the same
//! state directory; `podman stop` under traffic drains without failing a
//! request and the container exits 0; and an upgrade inside the container
//! hands the sockets over as on a host, PID 1 staying in place.
//!
//! Most containers use the host's network, and the test passes baton
//! loopback ports of its own on top of the image's command (baton takes an
//! option's last value), so everything else in the command is the image's;
//! one runs the image's command unchanged in a network namespace of its own.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

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
struct Served {
    container: Container,
    http: String,
    grpc: String,
}

impl Served {
    /// Runs the image's command with `repo` mounted read-only at /models,
    /// `state` at /var/lib/baton, `flags` for podman and `extra` options
    /// for baton, and waits until it is ready. Starts again on other ports
    /// when one was taken between the test choosing it and baton binding it.
    fn start(repo: &Path, state: &Path, flags: &[&str], extra: &[&str]) -> Served {
        for _ in 0..3 {
            let [http, grpc, admin, admin_grpc] =
                [free_port(), free_port(), free_port(), free_port()].map(|p| format!("127.0.0.1:{p}"));
            let mut args = image().command();
            for (flag, address) in
                [("--http", &http), ("--grpc", &grpc), ("--admin-http", &admin), ("--admin-grpc", &admin_grpc)]
            {
                args.extend([flag.to_owned(), address.clone()]);
            }
            args.extend(extra.iter().map(|e| (*e).to_owned()));
            let container = Run::new(image(), "serve")
                .mount_read_only(repo, "/models")
                .mount(state, "/var/lib/baton")
                // Where `podman exec NAME baton …` finds this server.
                .env("BATON_URL", &format!("http://{http}"))
                .env("BATON_ADMIN_URL", &format!("http://{admin}"))
                .env("BATON_LOG", "info,baton=debug")
                .flags(flags)
                .args(&args)
                .start();
            let served = Served { container, http: format!("http://{http}"), grpc };
            match served.container.try_wait_ready(&served.http) {
                Ok(()) => return served,
                Err(log) if log.contains("Address already in use") => continue,
                Err(log) => panic!("the container stopped before it was ready:\n{log}"),
            }
        }
        panic!("three containers in a row found a port taken");
    }

    fn client(&self) -> Client {
        Client::new(&self.http)
    }

    /// The version of `model` serving, from its status.
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

#[test]
fn decisions_made_in_one_container_hold_in_the_next_one_on_the_same_state_directory() {
    let repo = repo_with("ranker", &[1, 2], "");
    repo.add_model("other", &baton_testkit::repo::mlp_toml(&mlp(1), ""));
    repo.publish_mlp("other", 1, &mlp(1));
    let state = mounts(&repo);

    let first = Served::start(repo.root(), state.path(), &[], &[]);
    first.container.exec_ok(&["baton", "pin", "ranker", "1"]);
    first.container.exec_ok(&["baton", "unload", "other"]);
    assert_eq!(first.serving("ranker"), 1);
    let unloaded = first.client().get("/v2/models/other/ready");
    assert_ne!(unloaded.status, 200, "the model serves after its unload: {}", common::text(&unloaded.body));
    assert!(state.path().join("state.json").is_file(), "no state file in the state directory");
    assert_eq!(first.container.stop(Duration::from_secs(30)), 0, "{}", first.container.logs());
    drop(first);

    let second = Served::start(repo.root(), state.path(), &[], &[]);
    assert_eq!(second.serving("ranker"), 1, "the pin did not hold");
    assert_eq!(infer_checked(&second.client(), "ranker"), 1);
    let other = second.client().get("/v2/models/other/ready");
    assert_ne!(other.status, 200, "the unloaded model serves again: {}", common::text(&other.body));
}

#[test]
fn the_image_s_own_command_serves_in_a_network_namespace_of_its_own() {
    // Nothing overridden: public inference ports, loopback management, the
    // image's environment. In a namespace with only a loopback device,
    // nothing it binds is reachable from outside; `podman exec` reaches it.
    let repo = repo_with("ranker", &[1], "");
    let state = mounts(&repo);
    let container = Run::new(image(), "default")
        .network(podman::Network::None)
        .mount_read_only(repo.root(), "/models")
        .mount(state.path(), "/var/lib/baton")
        .start();
    let status = baton_testkit::server::eventually("the model to serve", || {
        let output = container.exec(&["baton", "status", "--json", "ranker"]);
        let status: serde_json::Value = serde_json::from_slice(&output.stdout).ok()?;
        (status["serving"] == 1).then_some(status)
    });
    assert_eq!(status["serving"], 1, "{status}");
    // Management answers on the loopback admin listener the image names.
    container.exec_ok(&["baton", "pin", "ranker", "1"]);
    assert!(state.path().join("state.json").is_file(), "the pin was not written to the state directory");
    let logs = container.logs();
    assert!(logs.contains("http://0.0.0.0:8000") && logs.contains("http://127.0.0.1:8002"), "{logs}");
    assert_eq!(container.stop(Duration::from_secs(30)), 0, "{}", container.logs());
}

/// Requests to `model` in a loop, on one keep-alive connection and on a new
/// connection each, until stopped, or (`follow_readiness`) until the server
/// says it is not ready, as a load balancer stops sending then.
struct Traffic {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<(u64, Vec<String>)>>,
}

impl Traffic {
    fn start(base: &str, model: &str, follow_readiness: bool) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads: Vec<JoinHandle<(u64, Vec<String>)>> = [true, false]
            .into_iter()
            .map(|keep_alive| {
                let (stop, base, path) = (Arc::clone(&stop), base.to_owned(), format!("/v2/models/{model}/infer"));
                std::thread::spawn(move || {
                    let body = request(&sample_input(SIZES[0], 1, 3), 1).to_string();
                    let headers = [("content-type", "application/json")];
                    let shared = Client::new(&base);
                    let (mut answered, mut failed) = (0, Vec::new());
                    while !stop.load(Ordering::SeqCst) {
                        let client = if keep_alive { shared.clone() } else { Client::new(&base) };
                        match client.try_post_raw(&path, body.as_bytes(), &headers) {
                            Ok(answer) if answer.status == 200 => answered += 1,
                            Ok(answer) => failed.push(format!("{}: {}", answer.status, common::text(&answer.body))),
                            Err(error) => failed.push(error),
                        }
                    }
                    (answered, failed)
                })
            })
            .collect();
        let (watch, base) = (Arc::clone(&stop), base.to_owned());
        threads.extend(follow_readiness.then(|| {
            std::thread::spawn(move || {
                let client = Client::new(&base);
                while !watch.load(Ordering::SeqCst) {
                    if client.try_get("/v2/health/ready").map_or(true, |a| a.status != 200) {
                        watch.store(true, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                (0, Vec::new())
            })
        }));
        Traffic { stop, threads }
    }

    /// Waits for the traffic to end, and returns the requests answered and
    /// the failures.
    fn join(self) -> (u64, Vec<String>) {
        let mut all = (0, Vec::new());
        for thread in self.threads {
            let (answered, failed) = thread.join().expect("a traffic thread");
            all.0 += answered;
            all.1.extend(failed);
        }
        all
    }

    /// Stops, and returns the requests answered and the failures.
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.join()
    }
}

/// Asserts some requests were answered and none failed.
fn assert_clean((answered, failed): (u64, Vec<String>), what: &str) {
    assert!(
        failed.is_empty(),
        "{what}: {} failed of {}: {:?}",
        failed.len(),
        answered + failed.len() as u64,
        &failed[..failed.len().min(5)]
    );
    assert!(answered > 0, "{what}: no request answered");
    eprintln!("{what}: {answered} requests answered, none failed");
}

#[test]
fn podman_stop_under_traffic_drains_fails_no_request_and_exits_0() {
    let repo = repo_with("ranker", &[1], "");
    let state = mounts(&repo);
    // As the Kubernetes manifests run it: a delay in which a load balancer
    // sees the server not ready and stops sending.
    let served = Served::start(repo.root(), state.path(), &[], &["--shutdown-delay", "3s"]);
    let traffic = Traffic::start(&served.http, "ranker", true);
    baton_testkit::server::eventually("some requests answered", || {
        let metrics = served.client().get("/metrics");
        let text = common::text(&metrics.body);
        baton_testkit::server::metric(
            &text,
            r#"baton_inference_requests_total{model="ranker",version="1",role="stable"}"#,
        )
        .filter(|n| *n >= 20.0)
    });

    let code = served.container.stop(Duration::from_secs(30));
    assert_clean(traffic.join(), "podman stop");
    let logs = served.container.logs();
    assert_eq!(code, 0, "{logs}");
    for needle in ["Shutting down: not ready from now on", "The shutdown delay is over"] {
        assert!(logs.contains(needle), "the log does not show the drain ({needle:?}):\n{logs}");
    }
    assert!(!logs.contains("timed out"), "{logs}");
}

/// The pid of the process serving at `client`, from the server's status.
fn server_pid(client: &Client) -> u64 {
    let status = client.get("/baton/v1/status");
    assert_eq!(status.status, 200, "{}", common::text(&status.body));
    status.json()["pid"].as_u64().expect("a pid in the status")
}

/// Asserts PID 1 of the container is `baton init`, and returns its
/// processes.
fn assert_init_is_pid_1(container: &Container) -> Vec<(u32, String)> {
    let processes = container.processes();
    assert!(
        processes.iter().any(|(pid, args)| *pid == 1 && args.starts_with("/usr/bin/baton init")),
        "PID 1 is not baton init: {processes:?}"
    );
    processes
}

#[test]
fn an_upgrade_inside_the_container_fails_no_request_and_keeps_init_as_pid_1() {
    let repo = repo_with("ranker", &[1], "");
    let state = mounts(&repo);
    let served = Served::start(repo.root(), state.path(), &[], &[]);
    assert_init_is_pid_1(&served.container);
    let first = server_pid(&served.client());
    assert_ne!(first, 1, "the server runs under init, not as PID 1");

    // Through the CLI, with `podman exec`, on the loopback admin listener.
    let traffic = Traffic::start(&served.http, "ranker", false);
    let said = served.container.exec_ok(&["baton", "upgrade", "--json"]);
    let said: serde_json::Value = serde_json::from_str(&said).unwrap_or_else(|e| panic!("{said:?}: {e}"));
    assert_eq!(said["old_pid"].as_u64(), Some(first), "the upgrade does not name the old pid: {said}");
    let second = said["new_pid"].as_u64().unwrap_or_else(|| panic!("the upgrade names no new pid: {said}"));
    assert_ne!(second, first, "{said}");
    // A new connection may still meet the old process while it stops accepting.
    baton_testkit::server::eventually("the new process to serve", || {
        (server_pid(&served.client()) == second).then_some(())
    });
    baton_testkit::server::eventually("the old process to exit", || {
        let processes = served.container.processes();
        (!processes.iter().any(|(pid, _)| u64::from(*pid) == first)).then_some(())
    });
    assert!(served.container.running(), "{}", served.container.logs());
    let processes = assert_init_is_pid_1(&served.container);
    assert!(processes.iter().any(|(pid, _)| u64::from(*pid) == second), "the new process is gone: {processes:?}");

    // Through SIGUSR2 to PID 1, which init passes on to the main process.
    served.container.kill("USR2");
    let third = baton_testkit::server::eventually("SIGUSR2's upgrade", || {
        let pid = server_pid(&served.client());
        (pid != second).then_some(pid)
    });
    baton_testkit::server::eventually("the second old process to exit", || {
        let processes = served.container.processes();
        (!processes.iter().any(|(pid, _)| u64::from(*pid) == second)).then_some(())
    });
    assert_init_is_pid_1(&served.container);
    assert_clean(traffic.stop(), "two upgrades in the container");
    assert_eq!(infer_checked(&served.client(), "ranker"), 1);
    assert_eq!(server_pid(&served.client()), third);

    // The process init follows now is the one a stop ends, cleanly.
    let code = served.container.stop(Duration::from_secs(30));
    assert_eq!(code, 0, "{}", served.container.logs());
}

#[test]
fn the_image_script_fails_naming_a_missing_tool_and_how_to_install_it() {
    // A PATH with nothing but dirname: podman, the first tool it checks,
    // is missing. The checks come before any cached root filesystem or
    // image is looked at, so a cache never hides a missing install.
    let path = tempfile::tempdir().expect("a temp dir");
    let dirname = ["/usr/bin/dirname", "/bin/dirname"].into_iter().find(|p| Path::new(p).is_file());
    std::os::unix::fs::symlink(dirname.expect("dirname"), path.path().join("dirname")).expect("a symlink");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/image.sh");
    let output = std::process::Command::new("/bin/bash")
        .arg(&script)
        .args(["--binary", common::bin().to_str().expect("a UTF-8 path")])
        .env("PATH", path.path())
        .output()
        .expect("running scripts/image.sh");
    let stderr = common::text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("needs podman") && stderr.contains("apt-get install podman"), "{stderr}");
    assert!(stderr.contains("scripts/setup-packages.sh"), "{stderr}");
}

#[test]
fn test_containers_stop_by_themselves_and_those_of_a_killed_test_are_removed() {
    // One of this test's own: it exits at once and stays until dropped.
    let alive = Run::new(image(), "alive").args(&["--version"]).start();
    assert_eq!(
        alive.inspect("{{.Config.Timeout}}"),
        podman::CONTAINER_TIMEOUT_S.to_string(),
        "a test container runs with no time limit"
    );
    // One left by a test process that is gone: a pid no process has now.
    let mut child = std::process::Command::new("true").spawn().expect("running true");
    let dead = child.id();
    child.wait().expect("waiting for true");
    let orphan = format!("baton-test-orphan-{dead}-0");
    podman::podman_ok(&["create", "--name", &orphan, image().name()]);

    let removed = podman::remove_orphans();
    let exists = |name: &str| podman::podman_output(&["container", "exists", name]).status.success();
    let left = exists(&orphan);
    if left {
        let _ = podman::podman_output(&["rm", "--force", &orphan]);
    }
    assert!(!left && removed.contains(&orphan), "the orphan was kept: {removed:?}");
    assert!(exists(alive.name()), "a container of a running test was removed: {removed:?}");
}
