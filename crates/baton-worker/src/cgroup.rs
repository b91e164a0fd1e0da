//! A worker's memory limit on resident memory, through a memory cgroup the
//! server makes for each worker: cgroup v2's `memory.max` where the
//! server's own group lets its children have the memory controller, else
//! cgroup v1's `memory.limit_in_bytes` where the v1 memory hierarchy is
//! mounted and the server may make groups in it. With neither, the worker
//! falls back to a limit on its address space (`RLIMIT_AS`), and status
//! says which limit a worker has.
//!
//! The worker joins its group itself, first thing, before the engine
//! allocates anything; the server removes the group once the worker is
//! reaped, and removes groups left by servers that are gone.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use baton_core::run::backend::MemoryLimit;

/// What a worker group's directory is called: the server's pid, then a
/// number, so that a later server can tell groups whose server is gone.
const PREFIX: &str = "baton-worker-";

/// Which cgroup hierarchy a group is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hierarchy {
    V1,
    V2,
}

/// A worker's memory cgroup, made by the server.
#[derive(Debug)]
pub(crate) struct Group {
    dir: PathBuf,
    hierarchy: Hierarchy,
    bytes: u64,
}

impl Group {
    /// Makes a group for one worker, limited to `bytes` of memory; why
    /// not, when the machine offers no memory cgroup the server may use.
    pub(crate) fn make(bytes: u64) -> Result<Group, String> {
        let (parent, hierarchy) = own_memory_group()?;
        sweep(&parent);
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!("{PREFIX}{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
        let dir = parent.join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("making {}: {e}", dir.display()))?;
        let group = Group { dir, hierarchy, bytes };
        let limited = match hierarchy {
            Hierarchy::V2 => group.write("memory.max", bytes).map(|()| {
                // No swap beyond the limit, where the kernel accounts it.
                let _ = group.write("memory.swap.max", 0);
            }),
            Hierarchy::V1 => group.write("memory.limit_in_bytes", bytes).map(|()| {
                // Memory and swap together, where the kernel accounts swap.
                let _ = group.write("memory.memsw.limit_in_bytes", bytes);
            }),
        };
        match limited {
            Ok(()) => Ok(group),
            Err(e) => {
                group.remove();
                Err(e)
            }
        }
    }

    fn write(&self, file: &str, value: u64) -> Result<(), String> {
        let path = self.dir.join(file);
        std::fs::write(&path, value.to_string()).map_err(|e| format!("writing {}: {e}", path.display()))
    }

    /// The group's directory, which the worker joins.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The limit, as status shows it.
    pub(crate) fn limit(&self) -> MemoryLimit {
        let by = match self.hierarchy {
            Hierarchy::V1 => "cgroup_v1",
            Hierarchy::V2 => "cgroup_v2",
        };
        MemoryLimit { bytes: self.bytes, by }
    }

    /// How many times the kernel killed a process of the group for
    /// reaching its limit, where it says.
    pub(crate) fn oom_kills(&self) -> Option<u64> {
        let file = match self.hierarchy {
            Hierarchy::V1 => "memory.oom_control",
            Hierarchy::V2 => "memory.events",
        };
        let text = std::fs::read_to_string(self.dir.join(file)).ok()?;
        text.lines().find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
    }

    /// Removes the group, once its worker has been reaped. An exited
    /// process may leave the group a moment after it is reaped: tried for
    /// up to a second.
    pub(crate) fn remove(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while std::fs::remove_dir(&self.dir).is_err() && self.dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // A worker that never started leaves its group empty.
        self.remove();
    }
}

/// Joins this process to the group at `dir`: for the worker, before it
/// starts a thread.
pub(crate) fn join(dir: &Path) -> io::Result<()> {
    std::fs::write(dir.join("cgroup.procs"), std::process::id().to_string())
}

/// The directory of this process's memory cgroup where it may make
/// children with the memory controller, and its hierarchy.
fn own_memory_group() -> Result<(PathBuf, Hierarchy), String> {
    let groups = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| format!("reading /proc/self/cgroup: {e}"))?;
    let mounts =
        std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("reading /proc/self/mountinfo: {e}"))?;
    let mut why = Vec::new();
    for hierarchy in [Hierarchy::V2, Hierarchy::V1] {
        match group_dir(&groups, &mounts, hierarchy) {
            Ok(dir) => return Ok((dir, hierarchy)),
            Err(e) => why.push(e),
        }
    }
    Err(why.join("; "))
}

/// This process's group in `hierarchy`, from `/proc/self/cgroup` and
/// `/proc/self/mountinfo`, when it can have children with memory limits.
fn group_dir(groups: &str, mounts: &str, hierarchy: Hierarchy) -> Result<PathBuf, String> {
    let path = groups
        .lines()
        .find_map(|line| {
            let mut fields = line.splitn(3, ':');
            let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
            let wanted = match hierarchy {
                Hierarchy::V2 => id == "0" && controllers.is_empty(),
                Hierarchy::V1 => controllers.split(',').any(|c| c == "memory"),
            };
            wanted.then_some(path)
        })
        .ok_or_else(|| format!("this process is in no {hierarchy:?} memory cgroup"))?;
    let (root, mount) = mounts
        .lines()
        .find_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let theirs: Vec<&str> = after.split(' ').collect();
            let (fstype, options) = (*theirs.first()?, *theirs.get(2)?);
            let wanted = match hierarchy {
                Hierarchy::V2 => fstype == "cgroup2",
                Hierarchy::V1 => fstype == "cgroup" && options.split(',').any(|o| o == "memory"),
            };
            wanted.then(|| Some((*fields.get(3)?, *fields.get(4)?))).flatten()
        })
        .ok_or_else(|| format!("no {hierarchy:?} memory hierarchy is mounted"))?;
    // The mount shows the hierarchy from `root` down.
    let below = path.strip_prefix(root).unwrap_or(path).trim_start_matches('/');
    let dir = Path::new(mount).join(below);
    if hierarchy == Hierarchy::V2 {
        let control = std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default();
        if !control.split_whitespace().any(|c| c == "memory") {
            return Err(format!("{} does not give its children the memory controller", dir.display()));
        }
    }
    let writable = rustix::fs::access(&dir, rustix::fs::Access::WRITE_OK).is_ok();
    if !writable {
        return Err(format!("{} is not writable", dir.display()));
    }
    Ok(dir)
}

/// Removes groups under `parent` left by servers that are gone (killed
/// before they could remove them).
fn sweep(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(server) = name.strip_prefix(PREFIX).and_then(|rest| rest.split('-').next()) else { continue };
        if !Path::new("/proc").join(server).exists() {
            let _ = std::fs::remove_dir(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "\
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 /outer /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_group_is_found_under_its_mount_with_the_mount_s_root_taken_off() {
        let groups = "4:memory:/api/abc\n1:name=systemd:/\n0::/outer/inner\n";
        // The v1 path is writable only as root: its directory is all that
        // is compared here, through the error when it is not.
        match group_dir(groups, MOUNTS, Hierarchy::V1) {
            Ok(dir) => assert_eq!(dir, Path::new("/sys/fs/cgroup/memory/api/abc")),
            Err(e) => assert!(e.contains("/sys/fs/cgroup/memory/api/abc"), "{e}"),
        }
        let v2 = group_dir(groups, MOUNTS, Hierarchy::V2).unwrap_err();
        assert!(v2.contains("/sys/fs/cgroup/unified/inner"), "{v2}");
        let none = group_dir("1:name=systemd:/\n", MOUNTS, Hierarchy::V1).unwrap_err();
        assert!(none.contains("no V1 memory cgroup"), "{none}");
        let unmounted = group_dir(groups, "", Hierarchy::V2).unwrap_err();
        assert!(unmounted.contains("no V2 memory hierarchy"), "{unmounted}");
    }
}
