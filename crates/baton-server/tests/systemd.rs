//! The Debian package and its systemd unit, under a real systemd: each test
//! boots Debian's systemd as PID 1 in a podman container
//! (`scripts/systemd-test-image.sh`), installs the package built from the
//! binary under test (`scripts/package-deb.sh`) with `dpkg -i`, points
//! `/etc/default/baton` at free loopback ports (the container shares the
//! host's network) and a repository the test wrote (a bind mount), and
//! drives the service with `systemctl`: start (READY only once it serves),
//! reload under traffic (the binary upgrade: no failed request, systemd
//! follows the new process), a reload whose binary cannot start, a main
//! process killed, stop (a clean drain), the sandbox the upgraded process
//! still runs in, and a newer package installed (its postinst reloads)
//! and removed (its prerm stops the service) while the service runs.

mod common;

mod systemd_kit;

use std::time::Duration;

use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::Client;
use systemd_kit::{Service, Traffic};

/// Model `m`, whose warmup takes a moment, so that a READY sent before the
/// model serves would be seen, and model `w`, the same served by a worker
/// process (which must work in the sandbox too).
fn repository() -> TestRepo {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&MODEL_SIZES, 5101);
    repo.add_model("m", &mlp_toml(&mlp, "[warmup]\nbatch_sizes = [1, 2048, 4096]\n"));
    repo.publish_mlp("m", 1, &mlp);
    repo.add_model("w", &mlp_toml(&mlp, "[engine]\nisolation = \"process\"\n"));
    repo.publish_mlp("w", 1, &mlp);
    repo
}

/// Asks both models for an answer, which must come.
fn assert_both_answer(client: &Client, when: &str) {
    for model in ["m", "w"] {
        let answer = client.post_raw(
            &format!("/v2/models/{model}/infer"),
            request_body().as_bytes(),
            &[("content-type", "application/json")],
        );
        assert_eq!(answer.status, 200, "{when}, model {model}: {}", common::text(&answer.body));
    }
}

/// The model's layers: 64 features in, 2 scores out.
const MODEL_SIZES: [usize; 4] = [64, 512, 512, 2];

/// One inference request's body for model `m`.
fn request_body() -> String {
    common::request(&sample_input(MODEL_SIZES[0], 1, 7), 1).to_string()
}

#[test]
fn the_packaged_service_starts_ready_reloads_under_traffic_onto_the_new_process_and_stops_cleanly() {
    let repo = repository();
    let service = Service::install("reload", &repo);

    // `systemctl start` returns once baton said READY=1: by then it serves.
    service.systemctl(&["start", "baton"]);
    let client = Client::new(&service.base());
    assert_eq!(client.get("/v2/health/ready").status, 200, "READY=1 came before the server was ready");
    assert_both_answer(&client, "after the start");
    // The packaged ONNX Runtime, found beside the installed binary.
    let journal = service.journal();
    assert!(journal.contains("ONNX Runtime loaded") && journal.contains("lib/baton/libonnxruntime.so"), "{journal}");
    let first = service.main_pid();
    assert_eq!(service.served_pid(), first, "systemd's MainPID is not the process that serves");
    assert_eq!(service.state(), ("active".into(), "running".into()));

    // Two reloads in a row under traffic: each replaces the process, which
    // systemd follows, and no request fails.
    let traffic = Traffic::start(&service.base(), request_body());
    let mut previous = first;
    for round in 1..=2 {
        service.systemctl(&["reload", "baton"]);
        let now = service.main_pid();
        assert_ne!(now, previous, "reload {round}: MainPID did not move to a new process");
        assert_eq!(service.served_pid(), now, "reload {round}: MainPID is not the process that serves");
        assert_eq!(service.state(), ("active".into(), "running".into()), "reload {round}");
        service.wait_gone(previous);
        previous = now;
    }
    traffic.assert_clean();
    assert_eq!(service.property("NRestarts"), "0", "the reloads restarted the service");
    assert_both_answer(&client, "after the reloads");

    // The upgraded process runs in the unit's sandbox as its user, and
    // systemd rates the unit's exposure low (1.6 of 10 when written; a
    // setting dropped from the sandbox raises it).
    service.assert_sandboxed(previous);
    let security = service.exec_ok("systemd-analyze security baton --no-pager");
    let exposure: f64 = security
        .lines()
        .find_map(|line| line.strip_prefix("→ Overall exposure level for baton.service: "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|score| score.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{security}"));
    assert!(exposure <= 2.0, "the unit's exposure is {exposure}:\n{security}");

    // systemd follows the process it did not start: when it dies, the
    // service restarts (Restart=on-failure).
    service.exec_ok(&format!("kill -KILL {previous}"));
    let restarted = service.wait_for("a restart after the main process was killed", || {
        let pid = service.main_pid();
        let restarted = service.property("NRestarts") == "1" && pid != 0 && pid != previous;
        (restarted && service.property("ActiveState") == "active").then_some(pid)
    });
    assert_eq!(service.served_pid(), restarted);
    assert_eq!(client.get("/v2/health/ready").status, 200);

    // Stop after a reload: the upgraded process drains and exits 0, and
    // the unit ends inactive, not failed.
    service.systemctl(&["reload", "baton"]);
    let last = service.main_pid();
    assert_ne!(last, restarted);
    service.wait_gone(restarted);
    service.assert_stops_cleanly(last);
}

#[test]
fn a_reload_whose_new_binary_cannot_start_fails_and_the_old_process_serves_on() {
    let repo = repository();
    let service = Service::install("failed-reload", &repo);
    service.systemctl(&["start", "baton"]);
    let before = service.main_pid();

    // A broken install: /usr/bin/baton exits at once. `systemctl reload`
    // runs that binary too (`baton upgrade`), so it fails before asking
    // the server anything.
    service.exec_ok("cp /usr/bin/baton /usr/local/bin/baton.good && install -m 755 /bin/false /usr/bin/baton");
    let traffic = Traffic::start(&service.base(), request_body());
    let reload = service.exec(&["systemctl", "reload", "baton"]);
    assert!(!reload.status.success(), "the reload succeeded with a binary that cannot start");
    assert_eq!(service.main_pid(), before, "MainPID moved on a failed reload");

    // A binary whose client still works but whose server exits at start:
    // the server's upgrade fails, `baton upgrade` says so, and so does the
    // reload.
    service.exec_ok(
        "printf '#!/bin/sh\\nif [ \"$1\" = upgrade ]; then exec /usr/local/bin/baton.good \"$@\"; fi\\nexit 1\\n' > /usr/local/bin/broken \
         && install -m 755 /usr/local/bin/broken /usr/bin/baton",
    );
    let reload = service.exec(&["systemctl", "reload", "baton"]);
    assert!(!reload.status.success(), "the reload succeeded though the new server exited at start");
    assert_eq!(service.main_pid(), before, "MainPID moved on a failed reload");
    assert_eq!(service.served_pid(), before);
    assert_eq!(service.state(), ("active".into(), "running".into()));
    let journal = service.journal();
    assert!(journal.contains("The upgrade did not happen"), "no reason in the journal:\n{journal}");
    assert!(journal.contains("Reload failed"), "{journal}");

    // With the binary back, the next reload goes through.
    service.exec_ok("install -m 755 /usr/local/bin/baton.good /usr/bin/baton");
    service.systemctl(&["reload", "baton"]);
    let after = service.main_pid();
    assert_ne!(after, before);
    assert_eq!(service.served_pid(), after);
    service.wait_gone(before);
    traffic.assert_clean();
    service.assert_stops_cleanly(after);
}

#[test]
fn a_newer_package_reloads_the_running_service_onto_its_binary_and_removal_stops_it_cleanly() {
    let repo = repository();
    let (dir, file) = systemd_kit::stamped_package("pkg2");
    let service = Service::install_mounting("package-upgrade", &repo, &[(dir.as_path(), "/deb2")]);
    service.systemctl(&["start", "baton"]);
    // A new connection each time: one kept alive may still reach the old
    // process while it drains.
    let version = || Client::new(&service.base()).get("/v2").json()["version"].as_str().expect("a version").to_owned();
    let (before, old_version) = (service.main_pid(), version());
    assert!(!old_version.ends_with("+pkg2"), "{old_version}");
    let options = service.exec_ok("cat /etc/default/baton");

    // The postinst of the upgrade reloads the active service: the new
    // binary serves, in a process systemd follows, and no request fails.
    let traffic = Traffic::start(&service.base(), request_body());
    service.exec_ok(&format!("dpkg -i /deb2/{file}"));
    let after = service.main_pid();
    assert_ne!(after, before, "the package's upgrade did not reload the service");
    assert_eq!(service.served_pid(), after);
    assert!(version().ends_with("+pkg2"), "the new binary does not serve: {}", version());
    service.wait_gone(before);
    traffic.assert_clean();
    assert_eq!(service.state(), ("active".into(), "running".into()));
    // The options edited after the first install are kept (a conffile).
    assert_eq!(service.exec_ok("cat /etc/default/baton"), options);

    // Removing the package stops the service first (a drain, not a kill),
    // and keeps the options file until a purge.
    service.exec_ok("dpkg --remove baton");
    service.wait_gone(after);
    let log = service.exec_ok(&format!("journalctl --unit baton --no-pager _PID={after} --output cat"));
    assert!(log.contains("baton stopped."), "{after} did not stop on its own:\n{}", service.journal());
    assert!(!service.journal().contains("SIGKILL"), "{}", service.journal());
    assert_eq!(service.property("LoadState"), "not-found");
    service.exec_ok("test ! -e /usr/bin/baton && test -e /etc/default/baton");
}

/// How long a step inside the container may take before the test gives up:
/// a safety net against a hang, not a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(120);
