//! Stepping aside is off unless `--loader-step-aside` turns it on (the
//! default is checked with the metrics in metadata.rs). Turned on, a load
//! beside traffic steps off the CPU — here to keep to a tenth of a CPU while
//! requests are served — which the metrics count, and every request made
//! meanwhile still succeeds.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use baton_testkit::server::{eventually, metric};
use common::{mlp, repo_with, request, start};

#[test]
fn with_the_flag_a_load_beside_traffic_steps_aside_and_every_request_succeeds() {
    let repo = repo_with("m", &[1], "");
    let server = start(&repo, &["--loader-step-aside", "--loader-serving-share", "10"]);
    server.wait_serving("m", 1);
    let (client, stop, started) = (server.client(), Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
    let traffic = {
        let (stop, started) = (Arc::clone(&stop), Arc::clone(&started));
        std::thread::spawn(move || {
            let mut statuses = Vec::new();
            // Bounded: stops once version 2 serves, or after 20,000 requests.
            while !stop.load(Ordering::Relaxed) && statuses.len() < 20_000 {
                statuses.push(client.post_json("/v2/models/m/infer", &request(&[0.25; 8], 1)).status);
                started.store(true, Ordering::Relaxed);
            }
            statuses
        })
    };
    eventually("the first request", || started.load(Ordering::Relaxed).then_some(()));
    repo.publish_mlp("m", 2, &mlp(2));
    server.wait_serving("m", 2);
    stop.store(true, Ordering::Relaxed);
    let statuses = traffic.join().expect("the traffic thread");
    assert!(statuses.iter().all(|s| *s == 200), "failed requests: {:?}", statuses.iter().filter(|s| **s != 200));
    let text = server.metrics();
    let steps = metric(&text, "baton_loader_step_asides_total").expect("the step-aside counter");
    assert!(steps > 0.0, "version 2 loaded beside {} requests without stepping aside", statuses.len());
}
