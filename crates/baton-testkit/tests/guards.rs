//! Guards you can trust, through the real registry: latency compared like
//! for like at every step (100 % included) with the default guards on; a
//! candidate three times as costly rolled back wherever it is judged, and
//! so is one that does its work on a thread of its own while the calling
//! thread waits, and one as costly in arithmetic that then sleeps twice as
//! long, off the CPU; NaN where the stable version has a number counted as
//! drift, comparison copies that never run on the caller's thread, one
//! validation for every plan, a shadow that stops with its rollout, buckets
//! salted per rollout, and the watch after promotion, which rolls a
//! regression back.
//!
//! The versions are the fake backend's, whose cost is a fixed amount of
//! arithmetic (`work`), so that "three times as costly" is exact whatever this
//! machine's speed, and whose sleep is a multiple of the arithmetic's own
//! time; no assertion reads a wall-clock time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use baton_core::files::rollout_spec::{Guards, RolloutPolicy};
use baton_core::registry::Registry;
use baton_core::registry::events::{Event, EventKind, EventReceiver};
use baton_core::registry::load::RolloutStart;
use baton_core::rollout::control::{Action, By, Decision};
use baton_core::rollout::guard::Outcome;
use baton_core::rollout::plan::{Overrides, Plan};
use baton_core::rollout::{FULL, Role};
use baton_core::tensors::tensor::Tensor;
use baton_testkit::fake::{FAKE_TOML, FakeBackend, Gate};
use baton_testkit::repo::TestRepo;

const LONG: Duration = Duration::from_secs(120);

/// A fake model `f` with versions given as their extra files; version
/// `n` multiplies by `n` unless `scale` files say otherwise.
struct Model {
    registry: Registry,
    backend_threads: Arc<std::sync::Mutex<Vec<String>>>,
    gate: Gate,
    failing: Arc<AtomicBool>,
    _repo: TestRepo,
}

fn model(section: &str, versions: &[(u64, &[(&str, &str)])]) -> Model {
    let repo = TestRepo::new();
    repo.add_model("f", &format!("{FAKE_TOML}{section}"));
    for (n, files) in versions {
        let scale = files.iter().find(|(name, _)| *name == "fake.txt").map_or("2", |(_, v)| v).to_owned();
        let mut all: Vec<(&str, &[u8])> = vec![("fake.txt", scale.as_bytes())];
        all.extend(files.iter().filter(|(name, _)| *name != "fake.txt").map(|(n, v)| (*n, v.as_bytes())));
        repo.write_files("f", *n, &all);
        repo.seal("f", *n);
    }
    let gate = Gate::closed();
    gate.open();
    let backend = FakeBackend::gated(gate.clone());
    let (backend_threads, failing) = (backend.threads(), backend.failures());
    let registry = baton_testkit::registry_with(repo.root(), vec![Arc::new(backend)]);
    registry.load("f", Some(1)).unwrap().wait().unwrap();
    Model { registry, backend_threads, gate, failing, _repo: repo }
}

/// A `[rollout]` section with windows of `interval_ms` and the default
/// guards, plus `guards` lines.
fn section(steps: &str, interval_ms: u64, extra: &str, guards: &str) -> String {
    format!(
        "[rollout]\nsteps = [{steps}]\ninterval_ms = {interval_ms}\nmax_inconclusive = 1000\n{extra}\n\
         [rollout.guards]\n{guards}\n"
    )
}

fn x(seed: u64) -> Tensor {
    // The first element runs through 0..10, so `nan-from = 9` is one row in ten.
    let first = (seed % 10) as f32;
    Tensor::from_f32("x", vec![1, 4], &[first, 1.0, 2.0, 3.0])
}

/// Keyless requests from `threads` threads until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start(registry: &Registry, threads: usize) -> Traffic {
        let (stop, sent, failed) = (Arc::<AtomicBool>::default(), Arc::<AtomicU64>::default(), Arc::default());
        let threads = (0..threads)
            .map(|t| {
                let (r, s, n, f): (Registry, Arc<AtomicBool>, Arc<AtomicU64>, Arc<AtomicU64>) =
                    (registry.clone(), Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&failed));
                std::thread::spawn(move || {
                    let mut seed = t as u64;
                    while !s.load(Ordering::Relaxed) {
                        seed += 1;
                        if r.snapshot().serve("f", None, &[x(seed)]).is_err() {
                            f.fetch_add(1, Ordering::Relaxed);
                        }
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        Traffic { stop, sent, failed, threads }
    }

    fn stop(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        (self.sent.load(Ordering::Relaxed), self.failed.load(Ordering::Relaxed))
    }
}

fn decision(event: &Event) -> Option<&Decision> {
    match &event.kind {
        EventKind::Rollout { decision } => Some(decision),
        _ => None,
    }
}

/// The rollout's judged decisions until one of `last` (or a pause), in order.
fn judged_until(events: &mut EventReceiver, last: &[Action]) -> Vec<Decision> {
    let mut judged: Vec<Decision> = Vec::new();
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let d = match events.try_recv() {
            Ok(event) => match decision(&event) {
                Some(d) if d.by == By::Guards => d.clone(),
                _ => continue,
            },
            Err(tokio::sync::broadcast::error::TryRecvError::Empty) => {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no end after {} judged windows: {:#?}",
                    judged.len(),
                    summary(&judged)
                );
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(tokio::sync::broadcast::error::TryRecvError::Lagged(_)) => continue,
            Err(e) => panic!("the event stream ended: {e}"),
        };
        let done = last.contains(&d.action) || d.action == Action::Paused;
        judged.push(d);
        if done {
            return judged;
        }
    }
}

fn summary(judged: &[Decision]) -> Vec<String> {
    judged.iter().map(|d| format!("{} at {}%: {}", d.action.as_str(), d.weight_percent, d.message)).collect()
}

fn p99_ratio(d: &Decision) -> Option<f64> {
    d.verdict.as_ref()?.checks.iter().find(|c| c.guard == "p99_ratio")?.value
}

fn start(m: &Model, version: u64, step: usize) {
    let start = RolloutStart { version: Some(version), step, ..RolloutStart::default() };
    m.registry.start_rollout("f", start).unwrap().wait().unwrap();
}

#[test]
fn an_identical_candidate_reads_a_p99_ratio_near_one_at_every_step_and_is_promoted_with_the_default_guards() {
    let work: &[(&str, &str)] = &[("work", "40")];
    let m = model(&section("10, 50, 100", 1500, "", ""), &[(1, work), (2, work)]);
    let mut events = m.registry.subscribe();
    let traffic = Traffic::start(&m.registry, 2);
    start(&m, 2, 0);
    let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack]);
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} failed");
    let summary: Vec<String> =
        judged.iter().map(|d| format!("{} at {}%: {:?}", d.action.as_str(), d.weight_percent, p99_ratio(d))).collect();
    assert_eq!(judged.last().unwrap().action, Action::Promoted, "{summary:?}");
    eprintln!("{summary:#?}");
    // Every step was judged on a latency ratio. Its value is a wall-clock
    // reading on a shared machine (0.70 at one step of a CI run): the
    // bound below only catches a measurement that compares unlike things,
    // such as a cold candidate against a warm stable version (2-3x).
    for d in judged.iter().filter(|d| d.action != Action::Held) {
        let ratio = p99_ratio(d).unwrap_or_else(|| panic!("no p99 ratio: {summary:?}"));
        assert!((0.5..=1.5).contains(&ratio), "an identical candidate read {ratio}: {summary:?}");
    }
}

/// Runs an identical candidate through `steps` under traffic; returns
/// the judged decisions, asserting none of the requests failed.
fn roll_identical(m: &Model) -> Vec<Decision> {
    let mut events = m.registry.subscribe();
    let traffic = Traffic::start(&m.registry, 2);
    start(m, 2, 0);
    let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack]);
    let (sent, failed) = traffic.stop();
    assert_eq!(failed, 0, "{failed} of {sent} failed");
    judged
}

#[test]
fn a_candidate_as_cold_as_its_small_share_makes_it_is_timed_against_a_stable_twin_just_as_cold() {
    // Every version runs colder the more other versions ran since its last
    // run, as a real model's weights go cold in the cache: at a 10 % share
    // the candidate is cold, the stable version serving 90 % is warm. Timed
    // against that warm stable version, an identical candidate read about
    // twice as slow and was rolled back.
    let warmth: &[(&str, &str)] = &[("work", "40"), ("cold-work", "10")];
    let m = model(&section("10, 50, 100", 1500, "", ""), &[(1, warmth), (2, warmth)]);
    let judged = roll_identical(&m);
    let summary: Vec<String> =
        judged.iter().map(|d| format!("{} at {}%: {:?}", d.action.as_str(), d.weight_percent, p99_ratio(d))).collect();
    assert_eq!(judged.last().unwrap().action, Action::Promoted, "{summary:?}");
    // At 100 % the stable version answers nothing and copies alone time
    // it, twin or not: there is no share to even out. (This fake's cost
    // grows with every run in between, so a copy dropped for want of a
    // free instance makes the next one colder; a real model's does not,
    // and its copies read as the candidate does at 100 %.)
    for d in judged.iter().filter(|d| d.action != Action::Held && d.weight_percent < 100.0) {
        let ratio = p99_ratio(d).unwrap_or_else(|| panic!("no p99 ratio: {summary:?}"));
        assert!((0.8..=1.2).contains(&ratio), "an identical candidate read {ratio}: {summary:?}");
    }
}

#[test]
fn a_twin_of_the_stable_version_runs_the_copies_is_accounted_as_a_twin_and_is_freed_with_its_rollout() {
    let m = model(&section("10, 100", 600_000, "", ""), &[(1, &[("ballast", "8")]), (2, &[])]);
    let mut events = m.registry.subscribe();
    start(&m, 2, 0);
    let twin = m.registry.rollout("f").unwrap().twin;
    assert!(twin.loaded, "{twin:?}");
    // Measured as the RSS the load grew by, which other tests running in
    // this process blur: only its presence is checked.
    assert!(twin.bytes_held.is_some(), "{twin:?}");
    let live: Vec<(u64, bool)> = m.registry.live_versions("f").iter().map(|v| (v.version, v.twin)).collect();
    assert_eq!(live, [(1, false), (1, true), (2, false)]);
    // A copy of what the candidate answers runs on the twin, not on stable.
    let snapshot = m.registry.snapshot();
    let route = snapshot.model("f").unwrap();
    let twin_version = route.rollout.as_ref().unwrap().twin.clone().unwrap();
    assert!(twin_version.is_twin() && twin_version.number() == 1);
    let routed = (0..10_000u32)
        .map(|k| snapshot.route("f", None, Some(&k.to_le_bytes())).unwrap())
        .find(|r| r.role == Role::Candidate)
        .unwrap();
    assert!(std::sync::Arc::ptr_eq(routed.compare.unwrap().other, &twin_version));
    assert!(!std::sync::Arc::ptr_eq(&route.stable, &twin_version));
    drop((snapshot, twin_version));
    m.registry.abort_rollout("f").unwrap().wait().unwrap();
    // Freed with the rollout, recorded as the twin's: the stable version serves on.
    let deadline = std::time::Instant::now() + LONG;
    let mut freed = Vec::new();
    while !freed.contains(&(Some(1), true)) {
        if let Ok(event) = events.try_recv()
            && let EventKind::Unloaded { twin, .. } = event.kind
        {
            freed.push((event.version, twin));
            continue;
        }
        assert!(std::time::Instant::now() < deadline, "the twin was never freed: {freed:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(!freed.contains(&(Some(1), false)), "{freed:?}");
    let records: Vec<(u64, bool)> = m.registry.unload_records().iter().map(|r| (r.version, r.twin)).collect();
    assert!(records.contains(&(1, true)) && !records.contains(&(1, false)), "{records:?}");
    wait_settled(&m.registry);
    assert_eq!(m.registry.snapshot().model("f").unwrap().stable.number(), 1);
}

#[test]
fn a_twin_is_not_loaded_for_a_shadow_an_unpaired_plan_or_a_stable_version_beyond_its_bound() {
    // The bound is judged on the RSS the stable version's load grew by,
    // which a concurrent free elsewhere in this process (another test's
    // twin, or an earlier case's ballast still being released) can shrink:
    // that case comes first, with a ballast far above its bound.
    for (extra, mode, why) in [
        ("twin_max_mb = 16\n", None, "more than twin_max_mb = 16"),
        ("", Some(baton_core::files::rollout_spec::Mode::Shadow), "shadow"),
        ("paired = false\n", Some(baton_core::files::rollout_spec::Mode::Ab), "pairs no copies"),
        ("twin_max_mb = 0\n", None, "twin_max_mb = 0"),
    ] {
        let m = model(&section("10", 600_000, extra, ""), &[(1, &[("ballast", "64")]), (2, &[])]);
        let overrides = Overrides { mode, ..Overrides::default() };
        let start = RolloutStart { version: Some(2), overrides, ..RolloutStart::default() };
        m.registry.start_rollout("f", start).unwrap().wait().unwrap();
        let twin = m.registry.rollout("f").unwrap().twin;
        assert!(!twin.loaded && twin.reason.as_deref().unwrap_or_default().contains(why), "{extra}: {twin:?}");
        assert!(m.registry.live_versions("f").iter().all(|v| !v.twin));
        assert!(m.registry.snapshot().model("f").unwrap().rollout.as_ref().unwrap().twin.is_none());
    }
}

#[test]
fn a_candidate_three_times_as_costly_is_rolled_back_at_every_step_where_it_is_judged() {
    // Twice as costly read a p99 ratio of 1.3-1.5 at 100 % in about one
    // run in five on two busy cores (the clients and the paired copies on
    // the same two), under the default bound of 1.5: three times is a
    // regression no run misreads as noise.
    assert_rolled_back_on_latency_at_every_step(&[("work", "120")]);
}

#[test]
fn a_candidate_that_spends_its_time_off_the_cpu_is_rolled_back_at_every_step_where_it_is_judged() {
    // As much arithmetic as stable, then four times as long asleep: a run
    // that waits for a disk, a lock or another device. Its CPU time is
    // stable's; what the user waits for is five times as long. (Twice as
    // long asleep read 1.34 at 100 % once under the whole suite: the stable
    // side's tail there reached twice its median.)
    assert_rolled_back_on_latency_at_every_step(&[("work", "40"), ("off-cpu", "4")]);
}

#[test]
fn a_candidate_whose_engine_thread_works_while_the_calling_thread_waits_is_rolled_back_at_every_step() {
    // Three times the arithmetic, on a thread of the engine's own: the
    // calling thread only waits, and its CPU time alone read next to nothing.
    assert_rolled_back_on_latency_at_every_step(&[("work", "120"), ("engine-thread", "")]);
}

/// A canary from a stable version of 40 thousand rounds of work to one
/// made of `candidate`, started at each step in turn under two clients:
/// rolled back on its p99 ratio alone, past the default bound, each time.
fn assert_rolled_back_on_latency_at_every_step(candidate: &[(&str, &str)]) {
    let m = model(&section("10, 50, 100", 1500, "", ""), &[(1, &[("work", "40")]), (2, candidate)]);
    for step in 0..3 {
        let mut events = m.registry.subscribe();
        let traffic = Traffic::start(&m.registry, 2);
        start(&m, 2, step);
        let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack, Action::Advanced]);
        traffic.stop();
        let d = judged.last().unwrap();
        let summary: Vec<String> = judged.iter().map(|d| format!("{} {:?}", d.action.as_str(), p99_ratio(d))).collect();
        assert_eq!(d.action, Action::RolledBack, "at step {step}: {summary:?}");
        assert_eq!(failed_guards(d), ["p99_ratio"], "at step {step}: {summary:?}");
        assert!(p99_ratio(d).is_some_and(|ratio| ratio > 1.5), "at step {step}: {summary:?}");
        wait_settled(&m.registry);
    }
}

/// Waits until no operation runs on `f` (a rollback drains).
fn wait_settled(registry: &Registry) {
    let deadline = std::time::Instant::now() + LONG;
    while registry.status("f").is_some_and(|s| s.busy) || registry.snapshot().model("f").unwrap().rollout.is_some() {
        assert!(std::time::Instant::now() < deadline, "f never settled");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_candidate_answering_nan_where_stable_does_not_is_rolled_back() {
    let guards = "max_rel_l2 = 0.05\n";
    let m = model(
        &section("50, 100", 1000, "", guards),
        &[(1, &[("work", "40")]), (2, &[("work", "40"), ("nan-from", "9")])],
    );
    let mut events = m.registry.subscribe();
    let traffic = Traffic::start(&m.registry, 2);
    start(&m, 2, 0);
    let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack]);
    traffic.stop();
    let d = judged.last().unwrap();
    assert_eq!(d.action, Action::RolledBack, "{}", d.message);
    let failed = failed_guards(d);
    assert_eq!(failed, ["rel_l2:y"], "{}", d.message);
}

#[test]
fn nan_on_both_sides_is_agreement() {
    let guards = "max_rel_l2 = 0.05\n";
    let nan: &[(&str, &str)] = &[("work", "40"), ("nan-from", "9")];
    let m = model(&section("50, 100", 1000, "", guards), &[(1, nan), (2, nan)]);
    let mut events = m.registry.subscribe();
    let traffic = Traffic::start(&m.registry, 2);
    start(&m, 2, 0);
    let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack]);
    traffic.stop();
    assert_eq!(judged.last().unwrap().action, Action::Promoted, "{}", judged.last().unwrap().message);
}

#[test]
fn a_paired_copy_never_runs_on_the_thread_that_served_the_answer() {
    // Cheap enough to run inline when a session is free.
    let extra = "paired = true\n";
    let m = model(
        &format!("{}[admission]\ninline_us = 1000000\n", section("100", 600_000, extra, "")),
        &[(1, &[]), (2, &[])],
    );
    start(&m, 2, 0);
    let me = std::thread::current().name().unwrap_or_default().to_owned();
    for seed in 0..50 {
        let snapshot = m.registry.snapshot();
        let routed = snapshot.route("f", None, None).unwrap();
        assert_eq!(routed.role, Role::Candidate);
        let before = m.backend_threads.lock().unwrap().len();
        let compare = routed.compare.expect("a paired copy");
        let answered = [Tensor::from_f32("y", vec![1, 4], &[0.0; 4])];
        if let Some(copy) = compare.start(vec![x(seed)], Some(&answered)) {
            let ran_here: Vec<String> = m.backend_threads.lock().unwrap()[before..].to_vec();
            assert!(!ran_here.contains(&me), "the copy ran on the caller's thread before it returned");
            copy.wait(Some(&answered));
        }
    }
}

#[test]
fn every_plan_is_validated_wherever_it_comes_from() {
    let m = model(&section("10, 100", 600_000, "", ""), &[(1, &[]), (2, &[])]);
    let base = Plan::new(&RolloutPolicy::default(), &Overrides::default()).unwrap();
    let refused = |plan: Plan, why: &str| {
        let start = RolloutStart { version: Some(2), plan: Some(plan), restored: true, ..RolloutStart::default() };
        let error = m.registry.start_rollout("f", start).unwrap().wait().expect_err(why);
        assert_eq!(error.kind(), "rollout_refused", "{why}: {error}");
        assert!(m.registry.snapshot().model("f").unwrap().rollout.is_none(), "{why}");
    };
    refused(Plan { steps: Vec::new(), ..base.clone() }, "no steps");
    refused(Plan { steps: vec![5000, 1000], ..base.clone() }, "falling steps");
    refused(Plan { paired: false, ..base.clone() }, "a 100 % step unpaired");
    let nan = Guards { max_p99_ratio: Some(f64::NAN), ..Guards::default() };
    refused(Plan { guards: nan.clone(), ..base.clone() }, "a NaN threshold");
    let negative = Guards { max_rel_l2: Some(-0.1), ..Guards::default() };
    refused(Plan { guards: negative, ..base.clone() }, "a negative drift threshold");
    // The same from an operator's overrides.
    let overrides = Overrides { guards: Some(nan), ..Overrides::default() };
    assert!(Plan::new(&RolloutPolicy::default(), &overrides).is_err(), "a NaN threshold is refused");
    // A steered rollout (a fleet's) may not lower its weight.
    let steered = Plan { steps: vec![0, FULL], ..base };
    let start = RolloutStart { version: Some(2), plan: Some(steered), steered: true, ..RolloutStart::default() };
    m.registry.start_rollout("f", start).unwrap().wait().unwrap();
    m.registry.step_rollout("f", 1, By::Fleet).unwrap();
    let lowered = m.registry.step_rollout("f", 0, By::Fleet);
    assert!(lowered.is_err(), "a fleet step lowered the weight");
    assert_eq!(m.registry.rollout("f").unwrap().weight_percent, 100.0);
}

#[test]
fn a_shadow_drops_its_queued_copies_when_its_candidate_becomes_stable() {
    let m = model(
        &section("100", 600_000, "mode = \"shadow\"\nqueue = 64\n", ""),
        &[(1, &[]), (2, &[("hold-every-infer", "")])],
    );
    start(&m, 2, 0);
    // Copies pile up behind the one the candidate holds at the gate.
    m.gate.close();
    for seed in 0..10 {
        let (answer, role) = m.registry.snapshot().serve("f", None, &[x(seed)]).unwrap();
        assert_eq!((answer.version, role), (1, Role::Stable));
    }
    let shadow_runs = |m: &Model| m.backend_threads.lock().unwrap().iter().filter(|t| *t == "baton-shadow").count();
    m.registry.promote_rollout("f").unwrap().wait().unwrap();
    let at_promotion = shadow_runs(&m);
    m.gate.open();
    // Version 2 now serves as stable; what the runner still had is dropped.
    for seed in 0..10 {
        assert_eq!(m.registry.snapshot().serve("f", None, &[x(seed)]).unwrap().0.version, 2);
    }
    std::thread::sleep(Duration::from_millis(300));
    let after = shadow_runs(&m);
    assert!(after <= at_promotion + 1, "the runner ran {} queued copies after the promotion", after - at_promotion);
}

#[test]
fn buckets_are_salted_per_rollout_so_the_same_users_do_not_get_every_canary() {
    let m = model(&section("1, 100", 600_000, "", ""), &[(1, &[]), (2, &[]), (3, &[])]);
    let keys: Vec<String> = (0..20_000).map(|i| format!("user-{i}")).collect();
    let chosen = |m: &Model| -> BTreeSet<String> {
        let snapshot = m.registry.snapshot();
        keys.iter()
            .filter(|k| snapshot.route("f", None, Some(k.as_bytes())).unwrap().role == Role::Candidate)
            .cloned()
            .collect()
    };
    start(&m, 2, 0);
    let first = chosen(&m);
    assert_eq!(first, chosen(&m), "a key keeps its side within a rollout");
    m.registry.abort_rollout("f").unwrap().wait().unwrap();
    wait_settled(&m.registry);
    start(&m, 3, 0);
    let second = chosen(&m);
    let both = first.intersection(&second).count();
    assert!(!first.is_empty() && !second.is_empty());
    assert!(both * 5 < first.len(), "{both} of {} keys got both canaries", first.len());
}

#[test]
fn a_regression_after_promotion_is_rolled_back_to_the_version_it_replaced() {
    let work: &[(&str, &str)] = &[("work", "40")];
    let m = model(
        &section("50, 100", 500, "watch_ms = 600000\n", ""),
        &[(1, work), (2, &[("work", "40"), ("fail-when-told", "")])],
    );
    let mut events = m.registry.subscribe();
    let traffic = Traffic::start(&m.registry, 2);
    start(&m, 2, 0);
    let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack]);
    assert_eq!(judged.last().unwrap().action, Action::Promoted, "{:#?}", summary(&judged));
    // Promoted and watched: 2 serves as stable, 1 stays to go back to.
    let deadline = std::time::Instant::now() + LONG;
    while m.registry.rollout("f").unwrap().watch.is_none() {
        assert!(std::time::Instant::now() < deadline, "the watch never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let route = m.registry.snapshot().model("f").unwrap().clone();
    assert_eq!((route.stable.number(), route.previous[0].number()), (2, 1));
    assert_eq!(m.registry.rollout("f").unwrap().watch.unwrap().against, 1);
    // It regresses only now: every answer of version 2 fails.
    m.failing.store(true, Ordering::SeqCst);
    let judged = judged_until(&mut events, &[Action::RolledBack, Action::Watched]);
    let d = judged.last().unwrap();
    assert_eq!(d.action, Action::RolledBack, "{:#?}", summary(&judged));
    let failed = failed_guards(d);
    assert!(failed.contains(&"error_rate_increase"), "{}", d.message);
    wait_settled(&m.registry);
    m.failing.store(false, Ordering::SeqCst);
    traffic.stop();
    let route = m.registry.snapshot().model("f").unwrap().clone();
    assert_eq!(route.stable.number(), 1, "back to the version it replaced");
    assert!(route.previous.iter().all(|v| v.number() != 2), "the regressed version is gone");
}

#[test]
fn a_watch_with_no_failure_ends_and_an_operator_can_cut_it_short() {
    let work: &[(&str, &str)] = &[("work", "40")];
    let m = model(&section("100", 500, "watch_ms = 1500\n", ""), &[(1, work), (2, work), (3, work)]);
    let mut events = m.registry.subscribe();
    let traffic = Traffic::start(&m.registry, 2);
    start(&m, 2, 0);
    let judged = judged_until(&mut events, &[Action::Watched, Action::RolledBack]);
    assert_eq!(judged.last().unwrap().action, Action::Watched, "{:#?}", summary(&judged));
    wait_settled(&m.registry);
    let route = m.registry.snapshot().model("f").unwrap().clone();
    assert_eq!((route.stable.number(), route.previous[0].number()), (2, 1));
    assert!(route.rollout.is_none(), "no copies after the watch");
    // An operator's promotion is watched too; an abort during it goes back.
    m.registry
        .start_rollout("f", RolloutStart { version: Some(3), ..RolloutStart::default() })
        .unwrap()
        .wait()
        .unwrap();
    m.registry.promote_rollout("f").unwrap().wait().unwrap();
    assert!(m.registry.rollout("f").unwrap().watch.is_some(), "an operator's promotion is watched");
    assert_eq!(m.registry.snapshot().model("f").unwrap().stable.number(), 3);
    m.registry.abort_rollout("f").unwrap().wait().unwrap();
    traffic.stop();
    assert_eq!(m.registry.snapshot().model("f").unwrap().stable.number(), 2, "the abort went back to 2");
}

#[test]
fn a_candidate_failing_every_request_at_a_full_step_is_rolled_back() {
    // At 100 % the stable version answers nothing: its side of the window
    // comes from copies, which the failed requests must get too.
    let m = model(
        &section("100", 500, "watch_ms = 0\n", ""),
        &[(1, &[("work", "40")]), (2, &[("work", "40"), ("fail-when-told", "")])],
    );
    let mut events = m.registry.subscribe();
    start(&m, 2, 0);
    // It warmed up; it fails from its first request on.
    m.failing.store(true, Ordering::SeqCst);
    let traffic = Traffic::start(&m.registry, 2);
    let judged = judged_until(&mut events, &[Action::Promoted, Action::RolledBack]);
    traffic.stop();
    let d = judged.last().unwrap();
    assert_eq!(d.action, Action::RolledBack, "{:#?}", summary(&judged));
    assert!(d.message.contains("error_rate_increase"), "{}", d.message);
}

/// The guards that failed in a decision's verdict.
fn failed_guards(d: &Decision) -> Vec<&str> {
    let checks = d.verdict.as_ref().map_or(&[][..], |v| v.checks.as_slice());
    checks.iter().filter(|c| c.outcome == Outcome::Fail).map(|c| c.guard.as_str()).collect()
}
