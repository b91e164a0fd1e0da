//! A store repository against a real S3-compatible server (SeaweedFS) on
//! loopback: listing, the one-pass fetch into the cache, what the verify
//! stage then reads, and each way a store fails.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use baton_core::files::manifest::{self, VerifyOptions};
use baton_core::files::source::{Presence, Source};
use baton_store::{Options, StoreSource};
use baton_testkit::s3::{CuttingProxy, S3};

fn options(url: &str, cache: &Path, env: &[(String, String)]) -> Options {
    let mut options = Options::new(url, cache.to_owned());
    options.settings = env.iter().map(|(k, v)| (k.to_ascii_lowercase(), v.clone())).collect();
    options.poll = Duration::from_millis(100);
    options.max_backoff = Duration::from_millis(400);
    // Small ranges, so a file of a few hundred KiB is read in several.
    options.plan.range_bytes = 64 * 1024;
    options
}

/// A version of files in a local directory, with its MANIFEST.
fn version(files: &[(&str, Vec<u8>)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, bytes) in files {
        let file = dir.path().join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, bytes).unwrap();
    }
    manifest::write(dir.path()).unwrap();
    dir
}

fn weights(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn publish(s3: &S3, model: &str, number: u64, files: &[(&str, Vec<u8>)]) {
    s3.put("models", &format!("prod/{model}/model.toml"), b"backend = \"onnx\"\n".to_vec());
    let dir = version(files);
    s3.publish_version("models", "prod", model, number, dir.path());
}

#[test]
fn a_version_is_fetched_once_hashed_as_it_arrives_and_served_from_the_cache_after() {
    let s3 = S3::start();
    s3.create_bucket("models");
    let big = weights(700 * 1024, 1);
    publish(&s3, "ranker", 1, &[("model.onnx", big.clone()), ("warmup/a.json", b"{}".to_vec())]);
    s3.put("models", "prod/ranker/2/model.onnx", b"no MANIFEST yet".to_vec());
    let cache = tempfile::tempdir().unwrap();

    let source = StoreSource::open(options("s3://models/prod", cache.path(), &s3.env())).unwrap();
    assert_eq!(source.models().unwrap(), ["ranker"]);
    assert_eq!(source.versions("ranker").unwrap(), [1], "a version without its MANIFEST is not complete");
    assert_eq!(source.presence("ranker", Some(1)), Presence::Present);
    assert_eq!(source.presence("ranker", Some(2)), Presence::Missing);
    assert!(source.version_stamp("ranker", 1).is_some());

    let fetched = source.fetch("ranker", 1).unwrap();
    assert!(fetched.dir.starts_with(cache.path()));
    let seal = fetched.seal.clone().expect("a fetch seals what it hashed");
    assert_eq!(seal.entries().len(), 2);
    let verified = manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap();
    assert_eq!(verified.file("model.onnx").unwrap().read_all().unwrap(), big);
    let answer = source.store_answer().unwrap();
    assert!(answer.ok && answer.kind == "ok", "{answer:?}");
    assert_eq!(answer.bytes_fetched, big.len() as u64 + 2);

    // Asked again, and by a source opened afresh (a restart): the cache.
    source.fetch("ranker", 1).unwrap();
    drop(source);
    let again = StoreSource::open(options("s3://models/prod", cache.path(), &s3.env())).unwrap();
    let fetched = again.fetch("ranker", 1).unwrap();
    manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap();
    let answer = again.store_answer().unwrap();
    assert_eq!((answer.bytes_fetched, answer.cache_hits), (0, 1), "{answer:?}");

    // Published again under the same number: fetched again.
    publish(&s3, "ranker", 1, &[("model.onnx", weights(1000, 9))]);
    again.refresh();
    let fetched = again.fetch("ranker", 1).unwrap();
    assert_eq!(std::fs::read(fetched.dir.join("model.onnx")).unwrap(), weights(1000, 9));
    assert!(!fetched.dir.join("warmup/a.json").exists(), "nothing of the old publication is left");
}

#[test]
fn a_corrupted_object_is_refused_at_verify_and_a_size_that_disagrees_at_fetch() {
    let s3 = S3::start();
    s3.create_bucket("models");
    let good = weights(300 * 1024, 2);
    publish(&s3, "ranker", 1, &[("model.onnx", good.clone())]);
    // The same length, one byte changed, after the MANIFEST was written.
    let mut bad = good.clone();
    bad[150_000] ^= 0x5a;
    s3.put("models", "prod/ranker/1/model.onnx", bad);
    let cache = tempfile::tempdir().unwrap();
    let source = StoreSource::open(options("s3://models/prod", cache.path(), &s3.env())).unwrap();
    let fetched = source.fetch("ranker", 1).unwrap();
    let error = manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap_err();
    assert_eq!(error.kind(), "digest_mismatch", "{error}");
    assert!(error.to_string().contains("model.onnx"), "{error}");
    // Never taken for cached: the next fetch downloads again.
    s3.put("models", "prod/ranker/1/model.onnx", good);
    let fetched = source.fetch("ranker", 1).unwrap();
    manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap();

    // Cached and verified: a later change to the object does not matter
    // while the MANIFEST stays the same.
    s3.put("models", "prod/ranker/1/model.onnx", weights(10, 2));
    source.refresh();
    manifest::verify_fetched(&source.fetch("ranker", 1).unwrap(), &VerifyOptions::default()).unwrap();

    // An object of another size than its MANIFEST says: refused before a
    // byte is downloaded.
    publish(&s3, "ranker", 2, &[("model.onnx", weights(5000, 2))]);
    s3.put("models", "prod/ranker/2/model.onnx", weights(10, 2));
    source.refresh();
    let before = source.store_answer().unwrap().bytes_fetched;
    let error = source.fetch("ranker", 2).unwrap_err();
    assert_eq!(error.kind(), "size_mismatch", "{error}");
    assert!(error.to_string().contains("has 10 bytes in the store"), "{error}");
    assert_eq!(source.store_answer().unwrap().bytes_fetched, before);
}

#[test]
fn a_download_cut_in_the_middle_resumes_and_hashes_the_same() {
    let s3 = S3::start();
    s3.create_bucket("models");
    let big = weights(2 << 20, 3);
    publish(&s3, "ranker", 1, &[("model.onnx", big.clone())]);
    // Every connection that carries more than 100 KiB of answer is cut,
    // three times: each range (256 KiB) dies half-way at first.
    let proxy = CuttingProxy::start(s3.port(), 100 * 1024, 3);
    let mut env = s3.env();
    env[0].1 = format!("http://127.0.0.1:{}", proxy.port());
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options("s3://models/prod", cache.path(), &env);
    opts.plan.range_bytes = 256 * 1024;
    let source = StoreSource::open(opts).unwrap();
    let fetched = source.fetch("ranker", 1).unwrap();
    assert_eq!(proxy.cut.load(Ordering::SeqCst), 3, "the proxy cut three downloads");
    manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap();
    assert_eq!(std::fs::read(fetched.dir.join("model.onnx")).unwrap(), big);
    // Resumed, not started over: little more than the file crossed the proxy.
    let relayed = proxy.relayed.load(Ordering::SeqCst);
    assert!(relayed < big.len() as u64 + (big.len() as u64) / 4, "relayed {relayed} bytes for {}", big.len());
}

/// A store whose `model.onnx` (2 MiB, under an unchanged MANIFEST) is
/// replaced by another of the same size each time the proxy cuts an
/// answer, `cuts` times: the cut answer's client sees nothing more until
/// the object has been replaced, so every read after it meets the new one.
/// Returns the source (reading through the proxy) and the contents the
/// object had, first to last.
fn replaced_at_each_cut(
    s3: &std::sync::Arc<S3>,
    cuts: u32,
    parallel: usize,
    cache: &Path,
) -> (StoreSource, CuttingProxy, Vec<Vec<u8>>) {
    let contents: Vec<Vec<u8>> = (0..=cuts).map(|n| weights(2 << 20, 20 + n as u8)).collect();
    publish(s3, "ranker", 1, &[("model.onnx", contents[0].clone())]);
    let (store, replacements) = (std::sync::Arc::clone(s3), contents.clone());
    let proxy = CuttingProxy::start_with(s3.port(), 100 * 1024, cuts, move |cut| {
        store.put("models", "prod/ranker/1/model.onnx", replacements[cut as usize].clone());
    });
    let mut env = s3.env();
    env[0].1 = format!("http://127.0.0.1:{}", proxy.port());
    let mut opts = options("s3://models/prod", cache, &env);
    opts.plan.range_bytes = 256 * 1024;
    opts.plan.parallel = parallel;
    (StoreSource::open(opts).unwrap(), proxy, contents)
}

fn no_partial_download(cache: &Path) -> bool {
    let entries = std::fs::read_dir(cache.join("ranker")).unwrap().flatten();
    entries.map(|e| e.file_name().to_string_lossy().into_owned()).all(|name| !name.ends_with(".partial"))
}

#[test]
fn an_object_replaced_before_a_ranged_resume_is_fetched_again_whole_never_spliced() {
    let s3 = std::sync::Arc::new(S3::start());
    s3.create_bucket("models");
    let cache = tempfile::tempdir().unwrap();
    let (source, proxy, contents) = replaced_at_each_cut(&s3, 1, 4, cache.path());
    let fetched = source.fetch("ranker", 1).expect("a fetch that starts over");
    assert_eq!(proxy.cut.load(Ordering::SeqCst), 1);
    let bytes = std::fs::read(fetched.dir.join("model.onnx")).unwrap();
    let spliced = bytes != contents[0] && bytes != contents[1];
    assert!(!spliced, "the file is a splice of both contents");
    assert_eq!(bytes, contents[1], "the content the store holds now");
    assert_eq!(source.restarts(), 1, "the change was seen and the download started over");
    // What the MANIFEST says was replaced: verify refuses it by its digest.
    let error = manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap_err();
    assert_eq!(error.kind(), "digest_mismatch", "{error}");
}

#[test]
fn an_object_that_keeps_changing_fails_the_fetch_as_changed() {
    let s3 = std::sync::Arc::new(S3::start());
    s3.create_bucket("models");
    let cache = tempfile::tempdir().unwrap();
    // One range at a time: each attempt is cut once, and the object
    // replaced, until the restarts are spent.
    let (source, proxy, _) = replaced_at_each_cut(&s3, 3, 1, cache.path());
    let error = source.fetch("ranker", 1).unwrap_err();
    assert_eq!(error.kind(), "store_changed", "{error}");
    let message = error.to_string();
    assert!(message.contains("model.onnx") && message.contains("changed while it was being fetched"), "{message}");
    assert_eq!(proxy.cut.load(Ordering::SeqCst), 3);
    assert_eq!(source.restarts(), 2);
    assert!(no_partial_download(cache.path()), "a partial download is left in the cache");
}

#[test]
fn a_version_published_again_between_listing_and_fetch_is_fetched_as_published_now() {
    let s3 = S3::start();
    s3.create_bucket("models");
    publish(&s3, "ranker", 1, &[("model.onnx", weights(300 * 1024, 7)), ("extra.bin", weights(1000, 7))]);
    let cache = tempfile::tempdir().unwrap();
    let source = StoreSource::open(options("s3://models/prod", cache.path(), &s3.env())).unwrap();
    // Listed as it was; then published again, other files, other sizes.
    let again = weights(200 * 1024, 8);
    publish(&s3, "ranker", 1, &[("model.onnx", again.clone())]);
    let fetched = source.fetch("ranker", 1).expect("the fetch starts over on the new publication");
    manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap();
    assert_eq!(std::fs::read(fetched.dir.join("model.onnx")).unwrap(), again);
    assert!(!fetched.dir.join("extra.bin").exists());
}

#[test]
fn a_store_that_refuses_or_is_gone_keeps_what_was_listed_and_says_why() {
    let mut s3 = S3::start();
    s3.create_bucket("models");
    publish(&s3, "ranker", 1, &[("model.onnx", weights(1000, 4))]);
    let cache = tempfile::tempdir().unwrap();

    // A wrong secret.
    let mut wrong = s3.env();
    wrong[4].1 = "not-the-secret".into();
    let refused = StoreSource::open(options("s3://models/prod", cache.path(), &wrong)).unwrap();
    let answer = refused.store_answer().unwrap();
    assert_eq!((answer.ok, answer.kind), (false, "store_denied"), "{answer:?}");
    assert!(answer.message.contains("refused the credentials"), "{}", answer.message);
    assert!(matches!(refused.presence("ranker", None), Presence::Unreadable(_)));
    drop(refused);

    // A bucket that does not exist.
    let missing = StoreSource::open(options("s3://no-such-bucket/prod", cache.path(), &s3.env())).unwrap();
    let answer = missing.store_answer().unwrap();
    assert_eq!(answer.kind, "store_not_found", "{answer:?}");
    assert!(answer.message.contains("no such bucket"), "{}", answer.message);
    drop(missing);

    // Listed and fetched, then the store goes away: what was listed stays,
    // presence is unreadable rather than missing, the cache still serves.
    let source = StoreSource::open(options("s3://models/prod", cache.path(), &s3.env())).unwrap();
    source.fetch("ranker", 1).unwrap();
    s3.kill();
    source.refresh();
    let answer = source.store_answer().unwrap();
    assert_eq!(answer.kind, "store_unreachable", "{answer:?}");
    assert_eq!(source.versions("ranker").unwrap(), [1]);
    assert!(matches!(source.presence("ranker", Some(1)), Presence::Unreadable(_)));
    source.fetch("ranker", 1).expect("served from the cache");
    assert_eq!(source.fetch("ranker", 7).unwrap_err().kind(), "store_unreachable");
    drop(source);

    // Started with the store down: what the cache holds.
    let offline = StoreSource::open(options("s3://models/prod", cache.path(), &s3.env())).unwrap();
    assert_eq!(offline.store_answer().unwrap().kind, "store_unreachable");
    assert_eq!(offline.versions("ranker").unwrap(), [1]);
    assert!(offline.spec("ranker").is_ok());
    let fetched = offline.fetch("ranker", 1).unwrap();
    manifest::verify_fetched(&fetched, &VerifyOptions::default()).unwrap();

    // And back: listed again, by the lister, without being asked.
    s3.restart();
    baton_testkit::server::eventually("the store listed again", || offline.store_answer().filter(|a| a.ok).map(|_| ()));
}

#[test]
fn the_cache_keeps_its_bound_by_evicting_what_does_not_serve() {
    let s3 = S3::start();
    s3.create_bucket("models");
    for v in 1..=3 {
        publish(&s3, "ranker", v, &[("model.onnx", weights(100_000, v as u8))]);
    }
    let cache = tempfile::tempdir().unwrap();
    let mut opts = options("s3://models/prod", cache.path(), &s3.env());
    opts.cache_max_bytes = Some(250_000);
    let source = StoreSource::open(opts).unwrap();
    source.set_serving(Box::new(|_, v| v == 1));
    source.fetch("ranker", 1).unwrap();
    source.fetch("ranker", 2).unwrap();
    source.fetch("ranker", 3).unwrap();
    let mut cached: Vec<u64> = source.cache().entries().iter().map(|e| e.version).collect();
    cached.sort_unstable();
    assert_eq!(cached, [1, 3], "version 2 made room; version 1 serves");
    // Two serving versions leave no room for a third.
    drop(source);
    let mut opts = options("s3://models/prod", cache.path(), &s3.env());
    opts.cache_max_bytes = Some(250_000);
    let source = StoreSource::open(opts).unwrap();
    source.set_serving(Box::new(|_, v| v != 2));
    let error = source.fetch("ranker", 2).unwrap_err();
    assert_eq!(error.kind(), "cache_full", "{error}");
    assert!(error.to_string().contains("--cache-max-bytes"), "{error}");
}
