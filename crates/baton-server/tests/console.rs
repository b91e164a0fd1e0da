//! The console at `/console`, black box. Its files carry a policy that
//! lets the page load only its own files and call only its own server, and
//! refuse framing; it is served where management is (the admin listener
//! when there is one) and refused elsewhere. In a real browser (headless
//! Chromium over the DevTools protocol), against the real binary in the
//! middle of a rollout under traffic: the page shows the versions, the
//! candidate's share, the guards of judged windows against their
//! thresholds and the decisions; a pause made through the API appears
//! without a reload; an action without the token is refused, and with it
//! goes through. On a replica of a fleet (a real etcd), the page shows
//! every replica, what each serves, each one's prepare and switch, the
//! committed version and the last switch's skew. The screenshots it takes
//! are the ones in docs/console.md.

mod common;
mod console_kit;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use baton_testkit::etcd::Etcd;
use baton_testkit::repo::TestRepo;
use baton_testkit::server::{Client, PATIENCE, Server, eventually};
use common::{mlp, post_with, repo_with, start, token_file};
use console_kit::Browser;
use serde_json::{Value, json};

const TOKEN: &str = "console-Token_7";

/// The model's section: a previous version kept, and windows that never
/// end unless a start overrides them.
const SECTION: &str = "[policy]\nkeep_previous = 1\n[rollout]\ninterval_ms = 600000\nsteps = [10, 50, 100]";

/// An operator's pause reason that is markup: the page must show it as text.
const PAUSE_REASON: &str = "paused by the console test <img src=x onerror=\"window.pwned=1\">";

fn auth() -> String {
    format!("Bearer {TOKEN}")
}

/// A rollout of version 2 beside version 1 in A/B mode: the candidate
/// holds a quarter of the traffic, windows of two seconds are judged
/// (and held, since A/B waits for an operator), and the guards are loose
/// enough that no window of this test's traffic fails, whatever the
/// machine's load: the test is about what the page shows, not the verdict.
/// The server keeps a rollout's last 32 decisions: at two seconds a
/// window, the start stays among them for about a minute, time enough for
/// a busy machine to open the page that must show it.
fn start_rollout(url: &str) -> Option<Value> {
    let body = json!({
        "version": 2, "mode": "ab", "steps": [25], "interval_ms": 2000, "failure_limit": 1000,
        "max_inconclusive": 1000, "watch_ms": 600000,
        "guards": { "min_samples": 3, "max_error_rate_increase": 0.9, "max_p99_ratio": 1000.0, "max_rel_l2": 1000.0 }
    });
    let answer = post_with(url, "/baton/v1/models/m/rollout", &body, &[("authorization", &auth())]);
    (answer.status == 200).then(|| answer.json())
}

/// Inference requests on `m` until `stop`, paced so the browser and the
/// server share the machine.
fn traffic(url: String, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let client = Client::new(&url);
        let input = baton_testkit::onnx::sample_input(common::SIZES[0], 1, 7);
        let body = common::request(&input, 1).to_string();
        let mut sent = 0;
        while !stop.load(Ordering::SeqCst) && sent < 100_000 {
            let _ = client.try_post_raw("/v2/models/m/infer", body.as_bytes(), &[("content-type", "application/json")]);
            sent += 1;
            std::thread::sleep(Duration::from_millis(15));
        }
        sent
    })
}

fn rollout(server: &Server) -> Value {
    server.get("/baton/v1/models/m/rollout").json()
}

/// Waits until `expression` is true in the page (the page may still be
/// loading: what it cannot read yet is false), polled every 100 ms (each
/// poll is a round trip through the browser) until `PATIENCE`.
fn wait_page(browser: &mut Browser, what: &str, expression: &str) {
    let guarded = format!("(() => {{ try {{ return ({expression}) === true; }} catch (_) {{ return false; }} }})()");
    let deadline = Instant::now() + PATIENCE;
    while browser.eval(&guarded) != json!(true) {
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn text_of(browser: &mut Browser, selector: &str) -> String {
    let expression = format!("(document.querySelector({selector:?}) || {{}}).textContent || ''");
    browser.eval(&expression).as_str().unwrap_or_default().to_owned()
}

/// Where the screenshots go: the target directory, from which the ones in
/// docs/ were copied.
fn save(name: &str, png: &[u8]) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
    std::fs::create_dir_all(&dir).expect("a screenshot directory");
    let path = dir.join(name);
    std::fs::write(&path, png).expect("writing a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    eprintln!("screenshot: {}", path.display());
}

/// Clicks an action button, then the confirmation's `choice` button;
/// gives the confirmation's question.
fn act(browser: &mut Browser, action: &str, choice: &str) -> String {
    let clicked = browser.eval(&format!(
        "(() => {{ const b = document.querySelector('#actions [data-action={action}]'); \
         if (!b || b.disabled) return false; b.click(); return document.getElementById('confirm').open; }})()"
    ));
    assert_eq!(clicked, json!(true), "the {action} button is enabled and asks for a confirmation");
    let question = text_of(browser, "#confirm-text");
    let words = question.to_lowercase().replace(' ', "");
    assert!(words.contains(action), "the confirmation names the {action}: {question}");
    browser.eval(&format!("document.getElementById('confirm-{choice}').click(), true"));
    question
}

#[test]
fn the_console_follows_a_rollout_and_acts_only_with_the_token() {
    let (_token_dir, token_path) = token_file(TOKEN);
    let repo = repo_with("m", &[1], SECTION);
    let server = start(&repo, &["--no-watch", "--admin-token-file", &token_path]);
    server.wait_settled("m", 1);
    repo.publish_mlp("m", 2, &mlp(2));
    // The start's load holds the model a moment after it settles.
    let started = eventually("the model to take a rollout", || start_rollout(server.base()));
    assert_eq!(started["rollout"]["phase"], "running", "{started}");
    let stop = Arc::new(AtomicBool::new(false));
    let load = traffic(server.base().to_owned(), Arc::clone(&stop));

    // Windows judged with enough samples for the drift guard to pass,
    // before the page opens (a busy machine may take a few windows).
    let drift_passed = |r: &Value| {
        r["rollout"]["decisions"]
            .as_array()
            .map(|ds| {
                ds.iter()
                    .filter(|d| d["action"] == "held")
                    .filter(|d| {
                        d["verdict"]["checks"].as_array().is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c["guard"].as_str().is_some_and(|g| g.starts_with("rel_l2")) && c["outcome"] == "pass"
                            })
                        })
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    eventually("two windows whose drift guard passed", || (drift_passed(&rollout(&server)) >= 2).then_some(()));

    let mut browser = Browser::start(1400, 1100);
    // Counts what the page's policy refuses, from before its scripts run.
    browser.call(
        "Page.addScriptToEvaluateOnNewDocument",
        json!({ "source": "window.violations = []; document.addEventListener('securitypolicyviolation', \
                 e => window.violations.push(e.violatedDirective + ' ' + e.blockedURI));" }),
    );
    browser.navigate(&format!("{}/console", server.base()));
    wait_page(&mut browser, "the rollout to show", "document.getElementById('rollout').dataset.phase === 'running'");
    // The versions, the share and the rollout's sides.
    let sides = browser.eval(
        "(() => { const r = document.getElementById('rollout').dataset; \
         return [r.stable, r.candidate, r.share]; })()",
    );
    assert_eq!(sides, json!(["1", "2", "25"]), "stable, candidate and share on the page");
    let roles = browser.eval(
        "Array.from(document.querySelectorAll('#versions tr[data-model=m]')).map(r => r.dataset.version + ' ' + \
         r.querySelector('.role').textContent).sort()",
    );
    let roles: Vec<String> = serde_json::from_value(roles).expect("a list");
    assert!(roles.contains(&"1 stable".to_owned()), "{roles:?}");
    assert!(roles.contains(&"2 candidate".to_owned()), "{roles:?}");
    let summary = text_of(&mut browser, "#rollout-summary");
    assert!(summary.contains("ab") && summary.contains("25 %"), "{summary}");
    // The plan's steps are in percent, as the share is.
    assert!(summary.contains("1 of 1: 25 %"), "{summary}");
    // Decisions and judged windows: the start, held windows, and a chart
    // per guard whose points are the windows' values, under a threshold.
    wait_page(
        &mut browser,
        "the held windows to show",
        "document.querySelectorAll('#decisions li[data-action=held]').length >= 2 && \
         document.querySelectorAll('#decisions li[data-action=started]').length === 1",
    );
    wait_page(
        &mut browser,
        "the drift guard's chart",
        "(() => { const c = document.querySelector('.chart[data-guard^=\"rel_l2\"]'); \
         return !!c && c.querySelectorAll('circle.pass').length >= 2 && !!c.querySelector('line.threshold'); })()",
    );
    let title = text_of(&mut browser, ".chart[data-guard^=\"rel_l2\"] .guard-title");
    assert!(title.contains("against 1000"), "the threshold is the start's: {title}");
    for guard in ["p99_ratio", "error_rate_increase"] {
        let drawn = browser.eval(&format!("!!document.querySelector('.chart[data-guard={guard}] svg')"));
        assert_eq!(drawn, json!(true), "a chart for {guard}");
    }
    let marks = browser.eval("document.querySelectorAll('#share-chart line.mark[data-action=started]').length");
    assert_eq!(marks, json!(1), "the start is marked on the share chart");
    save("console-rollout.png", &browser.screenshot());

    // A decision made elsewhere appears without a reload.
    browser.eval("window.sameDocument = 'yes'");
    let paused = post_with(
        server.base(),
        "/baton/v1/models/m/rollout/pause",
        &json!({ "reason": PAUSE_REASON }),
        &[("authorization", &auth())],
    );
    assert_eq!(paused.status, 200, "{}", paused.error());
    wait_page(
        &mut browser,
        "the pause to show",
        "document.getElementById('rollout').dataset.phase === 'paused' && \
         document.querySelectorAll('#decisions li[data-action=paused][data-by=operator]').length === 1",
    );
    // The reason is text on the page, never markup: its image is not
    // made and its handler never runs.
    assert!(text_of(&mut browser, "#rollout-summary").contains(PAUSE_REASON));
    let decision = text_of(&mut browser, "#decisions li[data-action=paused]");
    assert!(decision.contains(PAUSE_REASON), "{decision}");
    assert_eq!(browser.eval("document.querySelectorAll('img').length"), json!(0), "no image made of the reason");
    assert_eq!(browser.eval("window.pwned === undefined"), json!(true), "the reason's handler ran");
    assert_eq!(browser.eval("window.sameDocument"), json!("yes"), "the page was not reloaded");
    wait_page(
        &mut browser,
        "the stream to be live",
        "document.getElementById('stream').textContent === 'events: live'",
    );

    // Cancelled, nothing is sent.
    act(&mut browser, "promote", "cancel");
    assert_eq!(rollout(&server)["rollout"]["phase"], "paused");
    assert_eq!(text_of(&mut browser, "#action-result"), "");

    // Without the token an action is refused, and nothing changes.
    browser.refused.push(format!("{}/baton/v1/models/m/rollout/resume", server.base()));
    act(&mut browser, "resume", "ok");
    wait_page(
        &mut browser,
        "the refusal to show",
        "document.getElementById('action-result').textContent.startsWith('resume refused (401 unauthorized)')",
    );
    assert_eq!(rollout(&server)["rollout"]["phase"], "paused", "a refused resume changes nothing");

    // With the token, kept for the tab and never in the URL, it goes
    // through.
    browser.eval(&format!("document.getElementById('token').value = {TOKEN:?}; true"));
    browser.eval("document.getElementById('token-use').click(), true");
    assert_eq!(browser.eval("sessionStorage.getItem('baton-console-token')"), json!(TOKEN));
    let url = browser.eval("location.href");
    assert!(!url.as_str().unwrap_or_default().contains(TOKEN), "the token stays out of the URL: {url}");
    assert_eq!(browser.eval("document.getElementById('token').value"), json!(""), "the field is emptied");
    act(&mut browser, "promote", "ok");
    wait_page(
        &mut browser,
        "the promotion to show",
        "document.getElementById('action-result').textContent.startsWith('promote: done') && \
         document.getElementById('rollout').dataset.phase === 'watching' && \
         document.querySelectorAll('#decisions li[data-action=promoted][data-by=operator]').length === 1",
    );
    let after = rollout(&server);
    assert_eq!((after["serving"].clone(), after["rollout"]["phase"].clone()), (json!(2), json!("watching")), "{after}");
    let watch = text_of(&mut browser, "[data-field=watch-after-promotion]");
    assert!(watch.contains("judged against version 1"), "{watch}");
    let serving = text_of(&mut browser, "#models tr[data-model=m] .serving");
    assert_eq!(serving, "2");
    wait_page(
        &mut browser,
        "the timeline to hold the promotion",
        "Array.from(document.querySelectorAll('#timeline li[data-event=rollout]')).some(l => l.textContent.includes('promoted'))",
    );
    save("console-promoted.png", &browser.screenshot());

    // The other actions, each confirmed and each seen by the server and
    // then on the page: an abort during the watch puts version 1 back (the
    // rollout ends rolled back), a
    // pin makes 2 serve until unpinned, an unpin leaves the newest (2), a
    // rollback goes back to 1 and holds there.
    act(&mut browser, "abort", "ok");
    // During the watch an abort is the rollback to the replaced version.
    let aborted = eventually("the abort", || {
        let r = rollout(&server);
        (r["serving"] == 1).then_some(r)
    });
    assert_eq!(aborted["rollout"]["phase"], "rolled_back", "{aborted}");
    wait_page(
        &mut browser,
        "the abort to show",
        "document.getElementById('rollout').dataset.phase === 'rolled_back' && \
         document.querySelector('#models tr[data-model=m] .serving').textContent === '1'",
    );
    browser.eval("document.getElementById('pin-version').value = '2'; true");
    let question = act(&mut browser, "pin", "ok");
    assert!(question.contains("It serves version 2, whatever is published, until unpinned."), "{question}");
    wait_page(
        &mut browser,
        "the pin to show",
        "document.querySelector('#models tr[data-model=m] .serving').textContent === '2' && \
         document.querySelector('#models tr[data-model=m] .decision').textContent === 'pin at 2, until unpinned'",
    );
    assert_eq!(server.status("m")["decision"]["kind"], "pin");
    act(&mut browser, "unpin", "ok");
    wait_page(
        &mut browser,
        "the unpin to show",
        "document.querySelector('#models tr[data-model=m] .decision').textContent === '–'",
    );
    act(&mut browser, "rollback", "ok");
    wait_page(
        &mut browser,
        "the rollback to show",
        "document.getElementById('action-result').textContent.startsWith('rollback: done') && \
         document.querySelector('#models tr[data-model=m] .serving').textContent === '1'",
    );
    let status = server.status("m");
    assert_eq!(
        (status["serving"].clone(), status["decision"]["kind"].clone()),
        (json!(1), json!("rollback")),
        "{status}"
    );

    stop.store(true, Ordering::SeqCst);
    let sent = load.join().expect("the traffic thread");
    assert!(sent > 0);
    browser.drain_events();
    assert!(browser.problems.is_empty(), "the page ran without errors or refused loads: {:?}", browser.problems);
    assert_eq!(browser.eval("window.violations"), json!([]), "the page keeps to its own policy");
    // The policy is in force: a script from another origin, or inline, is
    // refused by the browser.
    browser.eval(
        "(() => { const s = document.createElement('script'); s.src = 'http://127.0.0.1:9/elsewhere.js'; \
         document.head.append(s); const i = document.createElement('script'); i.textContent = 'window.inline = 1'; \
         document.head.append(i); return true; })()",
    );
    wait_page(&mut browser, "the policy to refuse both scripts", "window.violations.length === 2");
    assert_eq!(browser.eval("window.inline === undefined"), json!(true), "the inline script did not run");
    drop(browser);
    common::assert_no_panic(&server);
}

#[test]
fn the_console_is_served_where_management_is_with_a_strict_policy() {
    let (_token_dir, token_path) = token_file(TOKEN);
    let repo = repo_with("m", &[1], SECTION);
    let mut server = start(&repo, &["--no-watch", "--admin-token-file", &token_path, "--admin-http", "127.0.0.1:0"]);
    let admin = format!("http://{}", common::listening_address(&server.next_line()));
    let admin = Client::new(&admin);

    let page = admin.get("/console");
    assert_eq!(page.status, 200, "{}", page.error());
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let policy = page.header("content-security-policy").unwrap_or_default().to_owned();
    for part in ["default-src 'none'", "script-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"] {
        assert!(policy.contains(part), "{part} in {policy}");
    }
    assert!(!policy.contains("unsafe"), "{policy}");
    assert_eq!(page.header("x-frame-options"), Some("DENY"));
    assert_eq!(page.header("x-content-type-options"), Some("nosniff"));
    let html = String::from_utf8_lossy(&page.body).into_owned();
    assert!(!html.contains("<script>") && !html.contains(" style="), "no inline script or style");
    for (path, kind) in [
        ("/console/console.js", "text/javascript"),
        ("/console/charts.js", "text/javascript"),
        ("/console/console.css", "text/css"),
    ] {
        let asset = admin.get(path);
        assert_eq!(asset.status, 200, "{path}");
        assert!(asset.header("content-type").is_some_and(|t| t.starts_with(kind)), "{path}");
        assert!(asset.header("content-security-policy").is_some(), "{path}");
        assert!(html.contains(&format!("\"{}\"", &path[1..])), "the page loads {path} relative to itself");
        // Nothing is fetched from elsewhere: the only URL in the files is
        // the SVG namespace, which names and fetches nothing.
        let text = String::from_utf8_lossy(&asset.body).replace("http://www.w3.org/2000/svg", "");
        assert!(!text.contains("http://") && !text.contains("https://") && !text.contains("//cdn"), "{path}");
    }

    // The inference listener does not serve it when an admin listener does.
    let elsewhere = server.get("/console");
    assert_eq!((elsewhere.status, elsewhere.json()["kind"].clone()), (403, json!("wrong_listener")));
    assert_eq!(server.get("/console/console.js").status, 403);
    // Nor is anything else under it served.
    assert_eq!(admin.get("/console/other.js").status, 404);
    server.wait_settled("m", 1);
}

/// A replica of fleet `console` in `etcd`, with `args` added.
fn replica(etcd: &Etcd, repo: &TestRepo, id: &str, args: &[&str]) -> Server {
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let mut all = vec!["--cluster", &cluster, "--cluster-name", "console", "--replica-id", id, "--label", "zone=a"];
    all.extend_from_slice(args);
    start(repo, &all)
}

#[test]
fn the_console_shows_the_fleet_its_replica_reads() {
    let mut etcd = Etcd::start();
    let (_token_dir, token_path) = token_file(TOKEN);
    let (repo1, repo2) = (repo_with("m", &[1], ""), repo_with("m", &[1], ""));
    let r1 = replica(&etcd, &repo1, "r1", &[]);
    r1.wait_ready();
    let r2 = replica(&etcd, &repo2, "r2", &["--admin-token-file", &token_path]);
    r2.wait_ready();
    for repo in [&repo1, &repo2] {
        repo.publish_mlp("m", 2, &mlp(2));
    }
    let cluster = format!("etcd://127.0.0.1:{}", etcd.port());
    let output = std::process::Command::new(common::bin())
        .args(["fleet", "--cluster", &cluster, "--cluster-name", "console", "rollout", "m", "--version", "2"])
        .env("BATON_LOG", "warn")
        .output()
        .expect("running baton fleet rollout");
    assert!(output.status.success(), "{}", common::text(&output.stderr));

    // The records are management's: without the token, refused.
    let refused = r2.get("/baton/v1/fleet");
    assert_eq!((refused.status, refused.json()["kind"].clone()), (401, json!("unauthorized")), "{}", refused.error());
    let view = Client::new(r2.base()).get_with("/baton/v1/fleet", &[("authorization", &auth())]);
    assert_eq!(view.status, 200, "{}", view.error());
    let view = view.json();
    assert_eq!(view["replicas"].as_array().map(Vec::len), Some(2), "{view}");
    assert_eq!(view["desired"]["m"]["version"], 2, "{view}");
    // A server outside a fleet says so.
    let repo = repo_with("m", &[1], "");
    let alone = start(&repo, &[]);
    assert_eq!(alone.get("/baton/v1/fleet").json()["kind"], "not_in_fleet");

    // On a loopback listener with no token, the page sees it all.
    let mut browser = Browser::start(1400, 1100);
    browser.navigate(&format!("{}/console", r1.base()));
    wait_page(
        &mut browser,
        "both replicas serving version 2",
        "['r1', 'r2'].every(id => { const r = document.querySelector(`#replicas tr[data-replica=${id}] .serves`); \
         return !!r && r.textContent === 'm: 2'; })",
    );
    wait_page(
        &mut browser,
        "the fleet rollout",
        "(() => { const b = document.querySelector('.fleet-rollout[data-model=m]'); if (!b) return false; \
         const acks = Array.from(b.querySelectorAll('td.ack')).map(t => t.textContent); \
         const switched = Array.from(b.querySelectorAll('td.switch')).map(t => t.textContent); \
         return acks.length === 2 && acks.every(a => a.startsWith('prepared in')) && \
           switched.every(s => s.startsWith('promoted')) && \
           b.querySelector('[data-field=committed-version]').textContent === '2' && \
           b.querySelector('[data-field=rollout]').textContent.includes('1 → 2, promoted') && \
           b.querySelector('[data-field=last-switch-s-skew]').textContent !== '–'; })()",
    );
    let connected = text_of(&mut browser, "#fleet");
    assert!(connected.contains("connectedyes"), "{connected}");
    save("console-fleet.png", &browser.screenshot());
    browser.drain_events();
    assert!(browser.problems.is_empty(), "{:?}", browser.problems);

    // etcd stalls: the page, opened again, shows the server's status
    // before the fleet's read answers (it fails after the read's time
    // limit), and the fleet again once etcd answers. The page notes the
    // order in which the fleet's answer came and the status showed.
    browser.call(
        "Page.addScriptToEvaluateOnNewDocument",
        json!({ "source": "window.order = []; const f = window.fetch; window.fetch = (...a) => { const p = f(...a); \
                 if (String(a[0]).includes('baton/v1/fleet')) p.then(() => window.order.push('fleet'), () => window.order.push('fleet')); \
                 return p; }; new MutationObserver(() => { const s = document.getElementById('server'); \
                 if (s && s.textContent.includes('pid') && !window.order.includes('status')) window.order.push('status'); }) \
                 .observe(document, { subtree: true, childList: true, characterData: true });" }),
    );
    browser.refused.push(format!("{}/baton/v1/fleet", r1.base()));
    etcd.pause();
    browser.navigate(&format!("{}/console", r1.base()));
    wait_page(&mut browser, "the status to show", "window.order.includes('status')");
    let order = browser.eval("window.order");
    assert_eq!(order[0], json!("status"), "the status showed before the fleet answered: {order}");
    wait_page(
        &mut browser,
        "the fleet's read to fail",
        "document.getElementById('fleet-note').textContent.startsWith('The fleet cannot be read')",
    );
    etcd.resume();
    wait_page(
        &mut browser,
        "the fleet to show again",
        "document.getElementById('fleet-note').textContent.endsWith('live replicas')",
    );
    browser.drain_events();
    assert!(browser.problems.is_empty(), "{:?}", browser.problems);
}

/// Every kind of event the server streams has a place in the page: the
/// page listens for it (an `EventSource` drops a named event nobody
/// listens for) and says it in words, not as raw JSON.
#[test]
fn the_timeline_listens_for_every_kind_of_event() {
    let events = include_str!("../../baton-core/src/registry/events.rs");
    let page = include_str!("../src/http/console/console.js");
    let body = events.split("pub enum EventKind {").nth(1).expect("the EventKind enum");
    let body = &body[..body.find("\n}\n").expect("the enum's end")];
    let kinds: Vec<String> = body
        .lines()
        .filter_map(|l| l.strip_prefix("    "))
        .filter(|l| l.starts_with(|c: char| c.is_ascii_uppercase()))
        .filter_map(|l| l.split([' ', ',', '{', '(']).next())
        .map(|name| {
            name.chars().enumerate().fold(String::new(), |mut out, (i, c)| {
                if c.is_ascii_uppercase() && i > 0 {
                    out.push('_');
                }
                out.push(c.to_ascii_lowercase());
                out
            })
        })
        .collect();
    assert!(kinds.len() >= 10 && kinds.contains(&"unpackaged".to_owned()), "{kinds:?}");
    let listened = page.split("const KINDS = [").nth(1).and_then(|k| k.split(']').next()).expect("KINDS");
    for kind in &kinds {
        assert!(listened.contains(&format!("\"{kind}\"")), "console.js KINDS lacks {kind}: {listened}");
        assert!(page.contains(&format!("case \"{kind}\":")), "console.js describe() has no case for {kind}");
    }
}
