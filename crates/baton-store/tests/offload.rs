//! A download writes and hashes its files off the async runtime that
//! fetches them. Checked without timing: the file a version's weights are
//! written to is a FIFO, whose opening for writing blocks until a reader
//! opens it, and the reader is a task on the same single-threaded runtime
//! as the download. Written on that runtime's only thread, the download
//! would block the reader from ever running; written elsewhere, both go on.

use std::path::Path;
use std::sync::mpsc;

use baton_store::download::{self, Counters, Plan, Remote};
use baton_store::listing;
use baton_testkit::s3::S3;
use tokio::io::AsyncReadExt;

fn weights(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(13).wrapping_add(1)).collect()
}

fn fifo(path: &Path) {
    let made = std::process::Command::new("mkfifo").arg(path).status().expect("running mkfifo");
    assert!(made.success(), "mkfifo {}", path.display());
}

#[test]
fn a_download_writes_and_hashes_off_the_runtime_that_fetches() {
    let s3 = S3::start();
    s3.create_bucket("models");
    s3.put("models", "prod/ranker/model.toml", b"backend = \"onnx\"\n".to_vec());
    let bytes = weights(3 << 20);
    let published = tempfile::tempdir().unwrap();
    std::fs::write(published.path().join("model.onnx"), &bytes).unwrap();
    baton_core::files::manifest::write(published.path()).unwrap();
    s3.publish_version("models", "prod", "ranker", 1, published.path());
    let settings: Vec<(String, String)> = s3.env().into_iter().map(|(k, v)| (k.to_ascii_lowercase(), v)).collect();
    let location = baton_store::location::open("s3://models/prod", &settings).unwrap();

    let into = tempfile::tempdir().unwrap();
    let target = into.path().join("model.onnx");
    fifo(&target);
    let (done, finished) = mpsc::channel();
    let (into_path, fifo_path, expected) = (into.path().to_owned(), target.clone(), bytes.len());
    let download = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let outcome = runtime.block_on(async {
            let snapshot =
                listing::list(location.store.as_ref(), &location.prefix, "s3://models/prod", &Default::default())
                    .await
                    .expect("a listing");
            let listed = snapshot.models["ranker"].versions[&1].clone();
            // The reader: a task on this same runtime. Opened for reading
            // and writing, the FIFO neither blocks its opening nor ends
            // before the writer has written everything.
            let reader = tokio::spawn(async move {
                let mut pipe =
                    tokio::net::unix::pipe::OpenOptions::new().read_write(true).open_receiver(&fifo_path).unwrap();
                let mut read = vec![0u8; expected];
                pipe.read_exact(&mut read).await.map(|_| read)
            });
            let remote = Remote {
                store: location.store.as_ref(),
                prefix: location.prefix.child("ranker").child("1"),
                url: "s3://models/prod/ranker/1".into(),
            };
            let plan = Plan { range_bytes: 256 * 1024, parallel: 4, attempts: 3 };
            let fetched = download::version(&remote, &listed, &into_path, plan, &Counters::default()).await;
            (fetched, reader.await)
        });
        let _ = done.send(());
        outcome
    });
    if finished.recv_timeout(baton_testkit::server::PATIENCE).is_err() {
        // Let a download stuck opening the FIFO go (its writes then fail),
        // and fail without waiting for its thread.
        let _ = std::fs::File::open(&target);
        panic!("the download blocked its runtime: the FIFO's reader, a task beside it, never ran");
    }
    let (fetched, read) = download.join().unwrap();
    let (_, seal) = fetched.expect("the download");
    assert_eq!(read.unwrap().unwrap(), bytes, "the reader got the weights");
    let digest = seal.entries().iter().find(|e| e.path == "model.onnx").map(|e| e.sha256.clone());
    let manifest = std::fs::read_to_string(published.path().join("MANIFEST")).unwrap();
    let listed = baton_core::files::manifest::parse(&manifest).unwrap();
    let want = listed.entries.iter().find(|e| e.path == "model.onnx").map(|e| e.sha256.clone());
    assert_eq!(digest, want, "the download hashed what it wrote");
}
