//! Downloads run on the loader's thread and the store client's threads,
//! at the loader's priority; such threads take no lock that serving
//! threads take, and logging takes one. Checked against a real store
//! (SeaweedFS) through a proxy that cuts connections: a download that
//! resumes, an eviction and a cache hit, each on a lowered thread, log
//! nothing there at the server's default level, and their log lines are
//! written by the store's lister afterwards.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use baton_store::{Options, StoreSource};
use baton_testkit::s3::{CuttingProxy, S3};
use tracing_subscriber::Layer;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Every event at the default level: whether a lowered thread logged it,
/// and its message.
static EVENTS: Mutex<Vec<(bool, String)>> = Mutex::new(Vec::new());

struct Recorder;

impl<S: tracing::Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        let lowered = baton_core::threads::sys::current_thread_lowered();
        EVENTS.lock().unwrap_or_else(|e| e.into_inner()).push((lowered, message.0));
    }
}

fn events() -> Vec<(bool, String)> {
    EVENTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Fetches on a thread lowered as the loader's is.
fn fetch_lowered(source: &StoreSource, model: &str, version: u64) {
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let _ = baton_core::threads::sys::lower_current_thread(10, false);
                baton_core::files::source::Source::fetch(source, model, version).unwrap();
            })
            .join()
            .unwrap();
    });
}

#[test]
fn downloads_on_lowered_threads_leave_their_log_lines_to_the_lister() {
    tracing_subscriber::registry().with(Recorder.with_filter(LevelFilter::INFO)).init();
    let s3 = S3::start();
    s3.create_bucket("models");
    s3.put("models", "prod/ranker/model.toml", b"backend = \"onnx\"\n".to_vec());
    for number in 1..=2u8 {
        let dir = tempfile::tempdir().unwrap();
        let bytes: Vec<u8> = (0..(1usize << 20)).map(|i| (i as u8).wrapping_mul(7).wrapping_add(number)).collect();
        std::fs::write(dir.path().join("model.onnx"), bytes).unwrap();
        baton_core::files::manifest::write(dir.path()).unwrap();
        s3.publish_version("models", "prod", "ranker", u64::from(number), dir.path());
    }
    // The first connections that carry more than 100 KiB are cut: ranges resume.
    let proxy = CuttingProxy::start(s3.port(), 100 * 1024, 2);
    let mut env = s3.env();
    env[0].1 = format!("http://127.0.0.1:{}", proxy.port());
    let cache = tempfile::tempdir().unwrap();
    let mut options = Options::new("s3://models/prod", cache.path().to_owned());
    options.settings = env.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
    options.poll = Duration::from_millis(100);
    options.plan.range_bytes = 256 * 1024;
    // Room for one version: the second evicts the first.
    options.cache_max_bytes = Some(1_500_000);
    let source = StoreSource::open(options).unwrap();

    fetch_lowered(&source, "ranker", 1);
    fetch_lowered(&source, "ranker", 2);
    fetch_lowered(&source, "ranker", 2);
    let said = |what: &str| events().iter().filter(|(lowered, m)| !lowered && m.contains(what)).count();
    let counts = || {
        let resumed = said("resuming at the first byte").min(2);
        [resumed, said("Downloaded and hashed"), said("Evicted a version"), said("in the cache; nothing to download")]
    };
    // The lister logs at its next tick; wait for it, then say what is missing.
    let deadline = Instant::now() + Duration::from_secs(30);
    while counts() != [2, 2, 1, 1] && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        counts(),
        [2, 2, 1, 1],
        "resumptions, downloads, evictions and cache hits logged by the lister: {:#?}",
        events()
    );
    assert_eq!(proxy.cut.load(std::sync::atomic::Ordering::SeqCst), 2, "the proxy cut two downloads");
    let lowered: Vec<_> = events().into_iter().filter(|(lowered, _)| *lowered).collect();
    assert!(lowered.is_empty(), "events logged on lowered threads: {lowered:#?}");
}
