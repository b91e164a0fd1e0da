//! Directories a server makes for one load under the temporary directory
//! (staged models, verified copies), named `<prefix><pid>-<n>`, and their
//! removal after a server that was killed while loading left them behind.

use std::path::Path;
use std::time::Duration;

/// A scratch directory is left alone for this long after it was last
/// changed, even when its process seems gone: a server in another pid
/// namespace sharing the directory may be loading from it.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// Removes the directories under `parent` whose names begin with `prefix`
/// and a pid, left by processes that no longer run and unchanged for
/// [`STALE_AFTER`]. Errors are ignored: a directory that cannot be listed
/// or removed is left for the next start.
pub fn remove_stale(parent: &Path, prefix: &str) {
    remove_stale_after(parent, prefix, STALE_AFTER);
}

/// [`remove_stale`] with another age.
pub fn remove_stale_after(parent: &Path, prefix: &str, age: Duration) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix(prefix)).and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        let alive = pid.parse::<u32>().is_ok_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        let old = entry.metadata().and_then(|m| m.modified()).is_ok_and(|t| t.elapsed().is_ok_and(|e| e >= age));
        if !alive && old && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::info!(dir = %entry.path().display(), "A scratch directory left by a stopped server was removed.");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_directories_of_stopped_servers_are_removed_and_others_kept() {
        const PREFIX: &str = "baton-test-";
        let tmp = tempfile::tempdir().unwrap();
        let mine = tmp.path().join(format!("{PREFIX}{}-0", std::process::id()));
        // Pid numbers stop well below this.
        let stale = tmp.path().join(format!("{PREFIX}{}-3", u32::MAX - 1));
        let other = tmp.path().join("unrelated");
        for dir in [&mine, &stale, &other] {
            std::fs::create_dir(dir).unwrap();
        }
        // Too recent: another server may be loading from it.
        remove_stale(tmp.path(), PREFIX);
        assert!(mine.exists() && other.exists() && stale.exists());
        remove_stale_after(tmp.path(), PREFIX, Duration::ZERO);
        assert!(mine.exists() && other.exists());
        assert!(!stale.exists());
    }
}
