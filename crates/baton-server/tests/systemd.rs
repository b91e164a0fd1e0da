//! The Debian package and its systemd unit, under a real systemd: each test
//! boots Debian's systemd as PID 1 in a podman container
//! (`scripts/systemd-test-image.sh`), installs the package built from the
//! binary under test (`scripts/package-deb.sh`) with `dpkg -i`, points
//! `/etc/default/baton` at free loopback ports (the container shares the
//! host's network) and a repository the test wrote (a bind mount), and
//! drives the service with `systemctl`: start (READY only once it serves),
//! reload under traffic (the binary upgrade: no failed request, systemd
//! follows the new process), a reload whose binary cannot start, a main
//! process killed, stop (a clean drain, also right after two reloads while
//! the first process still drains, and under a `Delegate=` drop-in), the
//! stop script without a cgroup, the sandbox the upgraded process still
//! runs in and the unit's settings one by one, the admin token that keeps
//! other local users out whatever `BATON_OPTS` says, an existing `baton`
//! user or group, and a newer package installed (its postinst reloads) and
//! removed (its prerm stops the service) while the service runs.

mod common;

mod systemd_kit;

use std::time::Duration;

use baton_core::tensors::tensor::Tensor;
use baton_testkit::onnx::{Mlp, sample_input};
use baton_testkit::repo::{TestRepo, mlp_toml};
use baton_testkit::server::Client;
use systemd_kit::{Service, Traffic};

/// Model `m`, whose warmup takes a moment, so that a READY sent before the
/// model serves would be seen, model `w`, the same served by a worker
/// process (which must work in the sandbox too), and model `slow`, whose
/// one large request takes seconds.
fn repository() -> TestRepo {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&MODEL_SIZES, 5101);
    repo.add_model("m", &mlp_toml(&mlp, "[warmup]\nbatch_sizes = [1, 2048, 4096]\n"));
    repo.publish_mlp("m", 1, &mlp);
    repo.add_model("w", &mlp_toml(&mlp, "[engine]\nisolation = \"process\"\n"));
    repo.publish_mlp("w", 1, &mlp);
    let slow = Mlp::new(&SLOW, 71);
    // One session: its requests run one after the other on one core, which
    // leaves the other to the upgrade's new process, whose loader runs at
    // idle priority.
    let toml = format!(
        "max_batch_size = {SLOW_BATCH}\n[engine]\nsessions = 1\n[warmup]\nbatch_sizes = [1]\nmax_latency_ms = 60000"
    );
    repo.add_model("slow", &mlp_toml(&slow, &toml));
    repo.publish_mlp("slow", 1, &slow);
    repo
}

/// A model and batch that make one request take seconds (tens of GFLOP).
const SLOW: [usize; 4] = [16, 1024, 1024, 1];
const SLOW_BATCH: usize = 32768;

/// Sends `count` slow requests to `base`, each from a thread of its own
/// (one after the other, they keep the server busy for `count` times as
/// long), and waits until the server counts one in flight (or all are done).
fn slow_requests(base: &str, count: usize) -> Vec<std::thread::JoinHandle<Result<u16, String>>> {
    let input = sample_input(SLOW[0], SLOW_BATCH, 72);
    let tensor = Tensor::from_f32("input", vec![SLOW_BATCH as i64, SLOW[0] as i64], &input);
    let (body, length) = common::binary_request(&[tensor], &[]);
    let requests: Vec<_> = (0..count)
        .map(|_| {
            let (client, body, length) = (Client::new(base), body.clone(), length.clone());
            std::thread::spawn(move || {
                let headers = [("inference-header-content-length", length.as_str())];
                client.try_post_raw("/v2/models/slow/infer", &body, &headers).map(|answer| answer.status)
            })
        })
        .collect();
    baton_testkit::server::eventually("a slow request to be in flight, or all done", || {
        let in_flight = common::conn::metric_now(base, "baton_inflight_requests") >= 1.0;
        (in_flight || requests.iter().all(|r| r.is_finished())).then_some(())
    });
    requests
}

/// Sends slow requests to the main process, reloads `reloads` times at
/// once (the processes between have nothing in flight and exit, so the
/// last is PID 1's child, not the draining one's), stops the service while
/// the first process still drains, and checks that the stop waited for it:
/// its requests are answered, it stopped on its own, nothing was SIGKILLed
/// and the unit ends inactive, not failed.
fn assert_stop_waits_for_draining(service: &Service, reloads: usize) {
    let mut attempts = 0;
    let (draining, requests, between) = loop {
        attempts += 1;
        assert!(attempts <= 3, "the slow requests never outlasted {reloads} reloads");
        let draining = service.main_pid();
        // More each attempt, as the reloads took longer than they last.
        let requests = slow_requests(&service.base(), 2 + 2 * attempts);
        let mut between = Vec::new();
        for _ in 0..reloads {
            service.systemctl(&["reload", "baton"]);
            between.push(service.main_pid());
        }
        let last = between.pop().expect("at least one reload");
        if !requests.iter().all(|r| r.is_finished()) {
            break (draining, requests, between);
        }
        assert_answered(requests, "the slow requests");
        service.wait_gone(draining);
        between.iter().for_each(|&pid| service.wait_gone(pid));
        assert_eq!(service.main_pid(), last);
    };
    let last = service.main_pid();
    assert!(last != draining && !between.contains(&last), "the reloads did not move MainPID");
    between.iter().for_each(|&pid| service.wait_gone(pid));
    service.exec_ok("systemctl --no-block stop baton");
    // The draining process must still be there once the stop began (a stop
    // that does not wait lets systemd SIGKILL it at once, which fails here
    // too), or the stop below would prove nothing.
    let alive = service.exec(&["sh", "-c", &format!("kill -0 {draining}")]);
    assert!(
        alive.status.success(),
        "{draining} was gone right after the stop began (SIGKILLed, or done before it): {}\n{}",
        String::from_utf8_lossy(&alive.stderr),
        service.journal()
    );
    service.wait_for("the stop to end", || {
        let state = service.state();
        (state.0 != "active" && state.0 != "deactivating").then_some(())
    });
    service.assert_stops_cleanly(last);
    assert_answered(requests, "the slow requests draining in the first process");
    assert!(service.log_of(draining).contains("baton stopped."), "{draining} did not stop on its own");
}

/// Waits for each request, which must have been answered 200.
fn assert_answered(requests: Vec<std::thread::JoinHandle<Result<u16, String>>>, what: &str) {
    for request in requests {
        assert_eq!(request.join().expect("a request thread"), Ok(200), "{what}");
    }
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
    let mut service = Service::install("reload", &repo);
    // The first install leaves the service stopped and disabled: it has no
    // repository configured yet.
    assert_eq!(service.state(), ("inactive".into(), "dead".into()), "the install started the service");
    assert_eq!(service.property("UnitFileState"), "disabled");

    // `systemctl start` returns once baton said READY=1: by then it serves.
    service.start();
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

    // Stop right after two reloads, while the first process still drains
    // slow requests: P0 drains, P1 (nothing in flight) exits at the second
    // reload, and P2, re-parented to PID 1, is the main process. The stop
    // waits for P0 too (not only for $MAINPID, P2), the requests get their
    // answers, and the unit ends inactive, not failed (nothing SIGKILLed).
    service.systemctl(&["reload", "baton"]);
    let draining = service.main_pid();
    assert_ne!(draining, restarted);
    service.wait_gone(restarted);
    assert_stop_waits_for_draining(&service, 2);
}

#[test]
fn a_reload_whose_new_binary_cannot_start_fails_and_the_old_process_serves_on() {
    let repo = repository();
    // A user `baton` made before the package without a group of that name:
    // the install makes the group, and the service runs.
    let mut service =
        Service::install_after("failed-reload", &repo, &[], "useradd --system --gid nogroup --no-create-home baton");
    service.exec_ok("id -Gn baton | grep -qw baton");
    // baton-stop where it finds no cgroup (the tree hidden by an empty
    // mount): it still stops the main process and waits until it is gone.
    service.exec_ok(
        "unshare --mount sh -c 'mount -t tmpfs none /sys/fs/cgroup \
         && pid=$(sh -c \"sleep 120 >/dev/null 2>&1 & echo \\$!\") \
         && MAINPID=$pid /usr/lib/baton/baton-stop && ! kill -0 $pid'",
    );
    // Options set as docs/systemd.md shows (they name no token file): the
    // admin token must stay in force all the same.
    service.exec_ok(
        "sed -i 's/^BATON_OPTS=.*/BATON_OPTS=--model-control explicit --load-model m --load-model w --load-model slow --memory-budget 6GiB/' /etc/default/baton",
    );
    service.start();
    let before = service.main_pid();

    // Another local user cannot manage models: the admin listener wants the
    // token the package wrote, which that user cannot read. And the unit's
    // settings are in force as systemd loaded them.
    let mut problems = Vec::new();
    let unload = service.exec(&[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "/usr/bin/baton",
        "unload",
        "m",
        "--admin-url",
        &service.admin_url(),
    ]);
    let said = format!("{}{}", String::from_utf8_lossy(&unload.stdout), String::from_utf8_lossy(&unload.stderr));
    if unload.status.success() || !said.contains("401") {
        problems.push(format!("another user's unload was not refused with 401: {said}"));
    }
    let modes = service.exec(&["stat", "-c", "%a %U:%G", "/etc/baton/admin-token", "/etc/default/baton"]);
    let modes = String::from_utf8_lossy(&modes.stdout);
    if modes != "640 root:baton\n640 root:baton\n" {
        problems.push(format!("the token and options files are {modes:?}, not 640 root:baton"));
    }
    problems.extend(service.property_mismatches(&UNIT_SETTINGS));
    let reload = service.property("ExecReload");
    if !reload.contains("--timeout 14m") {
        problems.push(format!("the reload is not bounded below TimeoutStartSec=15min: {reload}"));
    }
    assert!(problems.is_empty(), "{problems:#?}");
    let client = Client::new(&service.base());
    assert_both_answer(&client, "after another user's unload");

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

    // Under a `Delegate=` drop-in (docs/systemd.md: worker memory cgroups)
    // systemd runs the stop command in the unit's `.control` cgroup: the
    // stop must still wait for a process draining after a reload.
    service.exec_ok(
        "mkdir -p /etc/systemd/system/baton.service.d \
         && printf '[Service]\\nDelegate=memory\\nProtectControlGroups=no\\n' >/etc/systemd/system/baton.service.d/delegate.conf \
         && systemctl daemon-reload",
    );
    assert_eq!(service.property("Delegate"), "yes");
    service.systemctl(&["restart", "baton"]);
    assert_stop_waits_for_draining(&service, 1);
}

#[test]
fn a_newer_package_reloads_the_running_service_onto_its_binary_and_removal_stops_it_cleanly() {
    let repo = repository();
    let (dir, file) = systemd_kit::stamped_package("pkg2");
    // A group `baton` made before the package (to grant it the repository,
    // say): the postinst's user joins it.
    let mut service =
        Service::install_after("package-upgrade", &repo, &[(dir.as_path(), "/deb2")], "groupadd --system baton");
    service.exec_ok("test \"$(id -gn baton)\" = baton");
    service.start();
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
    let log = service.log_of(after);
    assert!(log.contains("baton stopped."), "{after} did not stop on its own:\n{}", service.journal());
    assert!(!service.journal().contains("SIGKILL"), "{}", service.journal());
    assert_eq!(service.property("LoadState"), "not-found");
    service.exec_ok("test ! -e /usr/bin/baton && test -e /etc/default/baton");
}

/// The unit's settings that matter, each as `systemctl show` gives it: the
/// sandbox (a single setting dropped shows here, where the overall exposure
/// score would barely move), the user, and how systemd treats the service.
const UNIT_SETTINGS: [(&str, &str); 31] = [
    ("Type", "notify"),
    ("NotifyAccess", "all"),
    ("KillMode", "mixed"),
    ("OOMPolicy", "continue"),
    ("Restart", "on-failure"),
    ("User", "baton"),
    ("Group", "baton"),
    ("UMask", "0027"),
    ("NoNewPrivileges", "yes"),
    ("CapabilityBoundingSet", ""),
    ("AmbientCapabilities", ""),
    ("ProtectSystem", "strict"),
    ("ProtectHome", "yes"),
    ("PrivateTmp", "yes"),
    ("PrivateDevices", "yes"),
    ("PrivateIPC", "yes"),
    ("ProtectKernelTunables", "yes"),
    ("ProtectKernelModules", "yes"),
    ("ProtectKernelLogs", "yes"),
    ("ProtectControlGroups", "yes"),
    ("ProtectClock", "yes"),
    ("ProtectHostname", "yes"),
    ("ProtectProc", "invisible"),
    ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
    ("RestrictNamespaces", "yes"),
    ("RestrictRealtime", "yes"),
    ("RestrictSUIDSGID", "yes"),
    ("LockPersonality", "yes"),
    ("MemoryDenyWriteExecute", "yes"),
    ("SystemCallArchitectures", "native"),
    ("RemoveIPC", "yes"),
];

/// How long a step inside the container may take before the test gives up:
/// a safety net against a hang, not a timing assertion.
pub const PATIENCE: Duration = Duration::from_secs(120);
