//! The `command` swap method: `sh -c` with a time limit. The command runs
//! in its own process group, killed whole when it overruns, and its output
//! goes to files rather than pipes, so a process it leaves running in the
//! background cannot hold the drill up.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use std::os::unix::process::CommandExt;

use super::action::Outcome;

/// Runs `sh -c line`, up to `timeout`; its output is kept for the report.
pub fn run(line: &str, timeout: Duration) -> Outcome {
    let stamp = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let base = std::env::temp_dir().join(format!("baton-drill-{}-{stamp}", std::process::id()));
    let (out_path, err_path) = (base.with_extension("out"), base.with_extension("err"));
    let result = spawn_and_wait(line, timeout, &out_path, &err_path);
    let read = |path: &PathBuf| {
        let text = std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
        let _ = std::fs::remove_file(path);
        text
    };
    let (stdout, stderr) = (read(&out_path), read(&err_path));
    let said = tail(if stderr.trim().is_empty() { &stdout } else { &stderr });
    match result {
        Ok(status) if status.success() => Outcome { ok: true, detail: tail(&stdout), version: None, handover: None },
        Ok(status) => Outcome { ok: false, detail: format!("{status}: {said}"), version: None, handover: None },
        Err(e) => Outcome { ok: false, detail: format!("{e}: {said}"), version: None, handover: None },
    }
}

fn spawn_and_wait(
    line: &str,
    timeout: Duration,
    out: &PathBuf,
    err: &PathBuf,
) -> Result<std::process::ExitStatus, String> {
    let file = |path: &PathBuf| std::fs::File::create(path).map_err(|e| format!("creating {}: {e}", path.display()));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(line)
        .stdin(Stdio::null())
        .stdout(file(out)?)
        .stderr(file(err)?)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("starting sh: {e}"))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if started.elapsed() > timeout => {
                // The whole group: sh and whatever it started.
                let group = format!("-{}", child.id());
                let _ = Command::new("kill").args(["-KILL", "--", &group]).stderr(Stdio::null()).status();
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("still running after {timeout:?}; killed"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(2)),
            Err(e) => return Err(format!("waiting for the command: {e}")),
        }
    }
}

/// The last 300 characters of a command's output.
fn tail(text: &str) -> String {
    let text = text.trim();
    let start = text.char_indices().rev().nth(299).map_or(0, |(i, _)| i);
    text[start..].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        let ok = run("echo published", Duration::from_secs(10));
        assert_eq!((ok.ok, ok.detail.as_str()), (true, "published"));
        let failed = run("echo nope >&2; exit 3", Duration::from_secs(10));
        assert!(!failed.ok && failed.detail.contains("nope") && failed.detail.contains('3'), "{failed:?}");
        let started = Instant::now();
        let slow = run("sleep 30; echo never", Duration::from_millis(50));
        assert!(!slow.ok && slow.detail.contains("killed"), "{slow:?}");
        assert!(started.elapsed() < Duration::from_secs(20), "the command's group was not killed");
        let background = run("sleep 2 & echo started", Duration::from_secs(10));
        assert!(background.ok && background.detail == "started", "{background:?}");
    }
}
