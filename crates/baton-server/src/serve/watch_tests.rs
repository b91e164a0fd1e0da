//! The repository watcher against a source that fails once: its
//! `model.toml` changing between the watcher's read and the load's (an
//! editor saving it), or its store not answering a fetch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::ThreadId;

use baton_core::files::source::{BareVersion, FetchError, Fetched, LocalRepository, Presence, Source};
use baton_core::files::spec::ModelSpec;
use baton_core::registry::{Registry, RegistryConfig};
use baton_testkit::onnx::Mlp;
use baton_testkit::repo::{TestRepo, mlp_toml};

use super::Watcher;
use crate::app::{App, ServerLimits};
use crate::decisions::Decisions;

/// A local repository whose `model.toml` can read as invalid once to
/// anyone but the watcher's thread (the load's config stage), and whose
/// fetch can fail once as a store that does not answer; it counts the
/// loads the watcher started and the fetches.
struct Flaky {
    local: LocalRepository,
    watcher: ThreadId,
    invalid_once: AtomicBool,
    unreachable_once: AtomicBool,
    loads: AtomicUsize,
    fetches: AtomicUsize,
}

impl Flaky {
    fn new(repo: &TestRepo, invalid_once: bool, unreachable_once: bool) -> Arc<Flaky> {
        Arc::new(Flaky {
            local: LocalRepository::new(repo.root()),
            watcher: std::thread::current().id(),
            invalid_once: AtomicBool::new(invalid_once),
            unreachable_once: AtomicBool::new(unreachable_once),
            loads: AtomicUsize::new(0),
            fetches: AtomicUsize::new(0),
        })
    }
}

impl Source for Flaky {
    fn models(&self) -> Result<Vec<String>, FetchError> {
        self.local.models()
    }
    fn versions(&self, model: &str) -> Result<Vec<u64>, FetchError> {
        self.local.versions(model)
    }
    fn presence(&self, model: &str, version: Option<u64>) -> Presence {
        self.local.presence(model, version)
    }
    fn spec(&self, model: &str) -> Result<ModelSpec, FetchError> {
        if std::thread::current().id() != self.watcher {
            self.loads.fetch_add(1, Ordering::SeqCst);
            if self.invalid_once.swap(false, Ordering::SeqCst) {
                return Err(FetchError::Spec(
                    "model.toml: expected `=`, found end of file (a save in progress)".into(),
                ));
            }
        }
        self.local.spec(model)
    }
    fn fetch(&self, model: &str, version: u64) -> Result<Fetched, FetchError> {
        self.fetches.fetch_add(1, Ordering::SeqCst);
        if self.unreachable_once.swap(false, Ordering::SeqCst) {
            let message = "the store did not answer GET m/1/model.onnx within 10s".to_owned();
            return Err(FetchError::Store { kind: "store_unreachable", message });
        }
        self.local.fetch(model, version)
    }
    fn version_stamp(&self, model: &str, version: u64) -> Option<String> {
        self.local.version_stamp(model, version)
    }
    fn unpackaged(&self, model: &str) -> Vec<BareVersion> {
        self.local.unpackaged(model)
    }
}

/// A repository with model `m` version 1, and a watcher of it through
/// `source`, on a registry with no engine: a load that passes its fetch
/// fails at its load stage, which is enough to count it.
fn watching(source: &Arc<Flaky>) -> (Arc<App>, Watcher, tempfile::TempDir) {
    let state = tempfile::tempdir().expect("a state directory");
    let decisions = Decisions::open(state.path().join("state.json")).expect("decisions");
    let registry = Registry::new(Arc::clone(source) as Arc<dyn Source>, Vec::new(), RegistryConfig::default());
    let app = Arc::new(App::new(registry, ServerLimits::default(), decisions));
    let watcher = Watcher::new(Arc::clone(&app), 3);
    (app, watcher, state)
}

fn repo() -> TestRepo {
    let repo = TestRepo::new();
    let mlp = Mlp::new(&[8, 16, 2], 1);
    repo.add_model("m", &mlp_toml(&mlp, ""));
    repo.publish_mlp("m", 1, &mlp);
    repo
}

#[test]
fn a_store_that_does_not_answer_once_is_waited_for_and_the_model_tried_again() {
    let repo = repo();
    let source = Flaky::new(&repo, false, true);
    let (app, mut watcher, _state) = watching(&source);
    watcher.scan();
    assert_eq!(source.fetches.load(Ordering::SeqCst), 1);
    assert_eq!(app.findings(|f| f.cannot_serve.get("m").cloned()), None, "not given up on");
    assert!(!app.ready(), "readiness waits for the model");
    // Polls until it is tried again (after a wait of its own), bounded.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while source.fetches.load(Ordering::SeqCst) < 2 {
        assert!(std::time::Instant::now() < deadline, "the model was not tried again");
        std::thread::sleep(std::time::Duration::from_millis(50));
        watcher.scan();
    }
    // Tried again, its fetch passes and the missing engine refuses it: a
    // refusal that excuses it.
    let kind = app.findings(|f| f.cannot_serve.get("m").map(|c| c.kind));
    assert_eq!(kind, Some("load_failed"));
}

#[test]
fn a_model_toml_refused_mid_save_is_tried_again_once_it_reads_as_valid() {
    let repo = repo();
    let source = Flaky::new(&repo, true, false);
    let (app, mut watcher, _state) = watching(&source);

    watcher.scan();
    assert_eq!(source.loads.load(Ordering::SeqCst), 1, "the first pass loads the model once");
    let failed = app.findings(|f| f.cannot_serve.get("m").map(|c| c.kind));
    assert_eq!(failed, Some("config_failed"));
    // The watcher read the file as valid all along: the next pass must
    // still take the save's end up.
    watcher.scan();
    assert_eq!(source.loads.load(Ordering::SeqCst), 2, "the next pass tries the model again");
}
