//! A headless Chromium driven over the DevTools protocol, for the console's
//! tests: the browser started with `--remote-debugging-pipe` (commands on
//! its descriptor 3, answers and events on 4, each message JSON ended by a
//! NUL byte), so no port and no WebSocket client are needed. One page, its
//! session attached in flat mode; scripts evaluated in it, screenshots
//! taken of it, and the exceptions and error messages it logged kept.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

use base64::Engine;
use command_fds::{CommandFdExt, FdMapping};
use serde_json::{Value, json};

/// How long one DevTools command may take before the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The Chromium binary: Debian's `chromium`, which
/// `scripts/setup-packages.sh` installs.
fn chromium() -> String {
    let found =
        ["/usr/bin/chromium", "/usr/bin/chromium-browser"].into_iter().find(|p| std::path::Path::new(p).exists());
    match found {
        Some(path) => path.to_owned(),
        None => panic!(
            "the console's browser tests need Chromium (Debian package `chromium`), which is not installed: \
             run scripts/setup-packages.sh"
        ),
    }
}

/// A running headless Chromium with one page attached.
pub struct Browser {
    child: Child,
    commands: std::io::PipeWriter,
    messages: Receiver<Value>,
    next_id: u64,
    session: String,
    /// Exceptions thrown and errors logged by the page, as text.
    pub problems: Vec<String>,
    /// URLs the test has the server refuse: the browser's error log lines
    /// for them are not problems.
    pub refused: Vec<String>,
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium with a fresh profile and opens a blank page of
    /// `width` × `height` CSS pixels.
    pub fn start(width: u32, height: u32) -> Browser {
        let (their_commands, commands) = std::io::pipe().expect("a pipe");
        let (answers, their_answers) = std::io::pipe().expect("a pipe");
        let profile = tempfile::tempdir().expect("a profile directory");
        let mut command = Command::new(chromium());
        command
            .args([
                "--headless=new",
                // As root (CI, containers) Chromium refuses to start sandboxed.
                "--no-sandbox",
                "--remote-debugging-pipe",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                // Nothing but the page's own requests leaves the browser.
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--hide-scrollbars",
                "--mute-audio",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
            .fd_mappings(vec![
                FdMapping { parent_fd: OwnedFd::from(their_commands), child_fd: 3 },
                FdMapping { parent_fd: OwnedFd::from(their_answers), child_fd: 4 },
            ])
            .expect("distinct descriptors");
        let child = command.spawn().expect("starting chromium");
        // The child's ends close here, so that the reader sees the end of
        // the stream when Chromium exits.
        drop(command);
        let (sender, messages) = channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(answers);
            let mut message = Vec::new();
            loop {
                message.clear();
                match reader.read_until(0, &mut message) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
                if message.last() == Some(&0) {
                    message.pop();
                }
                let Ok(value) = serde_json::from_slice::<Value>(&message) else { continue };
                if sender.send(value).is_err() {
                    return;
                }
            }
        });
        let mut browser = Browser {
            child,
            commands,
            messages,
            next_id: 0,
            session: String::new(),
            problems: Vec::new(),
            refused: Vec::new(),
            _profile: profile,
        };
        let target = browser.call_in(None, "Target.createTarget", json!({ "url": "about:blank" }));
        let target_id = target["targetId"].as_str().expect("a target id").to_owned();
        let attached =
            browser.call_in(None, "Target.attachToTarget", json!({ "targetId": target_id, "flatten": true }));
        browser.session = attached["sessionId"].as_str().expect("a session id").to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.call(domain, json!({}));
        }
        browser.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": 1, "mobile": false }),
        );
        browser
    }

    /// Sends `method` to the page's session and waits for its answer.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.call_in(Some(&session), method, params)
    }

    fn call_in(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        let mut bytes = message.to_string().into_bytes();
        bytes.push(0);
        self.commands.write_all(&bytes).unwrap_or_else(|e| panic!("sending {method} to chromium: {e}"));
        let deadline = Instant::now() + COMMAND_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let message = match self.messages.recv_timeout(left) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => panic!("chromium did not answer {method} within {COMMAND_TIMEOUT:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("chromium exited while answering {method}"),
            };
            if message["id"] == id {
                if let Some(error) = message.get("error") {
                    panic!("chromium refused {method}: {error}");
                }
                return message["result"].clone();
            }
            self.note(&message);
        }
    }

    /// Keeps what an event says went wrong in the page.
    fn note(&mut self, event: &Value) {
        match event["method"].as_str() {
            Some("Runtime.exceptionThrown") => {
                let details = &event["params"]["exceptionDetails"];
                let text = details["exception"]["description"].as_str().or(details["text"].as_str()).unwrap_or("?");
                self.problems.push(format!("exception: {text}"));
            }
            Some("Log.entryAdded") if event["params"]["entry"]["level"] == "error" => {
                let entry = &event["params"]["entry"];
                // An action the test has the server refuse is logged by the
                // browser as a failed resource: that is the test's own doing.
                let text = entry["text"].as_str().unwrap_or("?");
                let url = entry["url"].as_str().unwrap_or("");
                if !self.refused.iter().any(|r| r == url) {
                    self.problems.push(format!("log: {text} ({url})"));
                }
            }
            Some("Runtime.consoleAPICalled") if event["params"]["type"] == "error" => {
                self.problems.push(format!("console.error: {}", event["params"]["args"]));
            }
            _ => {}
        }
    }

    /// Opens `url` in the page.
    pub fn navigate(&mut self, url: &str) {
        let answer = self.call("Page.navigate", json!({ "url": url }));
        assert!(answer.get("errorText").is_none(), "navigating to {url}: {answer}");
    }

    /// Evaluates `expression` in the page (awaiting a promise) and returns
    /// its value as JSON; panics when it throws.
    pub fn eval(&mut self, expression: &str) -> Value {
        let answer = self
            .call("Runtime.evaluate", json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }));
        if let Some(details) = answer.get("exceptionDetails") {
            panic!("evaluating `{expression}` threw: {details}");
        }
        answer["result"]["value"].clone()
    }

    /// Reads what is pending of the events, without waiting.
    pub fn drain_events(&mut self) {
        while let Ok(message) = self.messages.try_recv() {
            self.note(&message);
        }
    }

    /// A PNG of the whole page.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let answer = self.call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": true }));
        let data = answer["data"].as_str().expect("screenshot data");
        base64::engine::general_purpose::STANDARD.decode(data).expect("base64 screenshot")
    }
}

impl Drop for Browser {
    /// Closes the browser, and kills it by its pid when it does not exit
    /// in time.
    fn drop(&mut self) {
        let mut bytes = json!({ "id": 0, "method": "Browser.close" }).to_string().into_bytes();
        bytes.push(0);
        let _ = self.commands.write_all(&bytes);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
