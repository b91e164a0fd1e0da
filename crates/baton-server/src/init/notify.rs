//! `baton init`'s notification socket: the datagram socket it names in
//! its main process's `NOTIFY_SOCKET`, on which baton says `READY=1`,
//! `STOPPING=1` and, during an upgrade, `MAINPID=` (the protocol systemd
//! uses: one datagram of `KEY=VALUE` lines).
//!
//! The socket has an abstract name (`@baton-init-PID-RANDOM`), not a
//! path: it needs no writable directory (a container's root filesystem
//! is often read-only) and leaves nothing to clean up. Any process in the
//! same network namespace can send to an abstract name, so what a
//! datagram says is not taken at its word: a `MAINPID=` is followed only
//! for a live process that descends from init (see [`super::procs`]).

use std::hash::{BuildHasher, Hasher};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;

/// The largest datagram read whole; a longer one is cut (baton's are a
/// few dozen bytes).
const MAX_DATAGRAM: usize = 4096;

/// The socket, bound.
pub struct Socket {
    socket: tokio::net::UnixDatagram,
    name: String,
}

impl Socket {
    /// Binds a new socket under an abstract name of its own.
    pub fn bind() -> std::io::Result<Socket> {
        let mut last = None;
        for _ in 0..8 {
            // Random enough to miss other inits' names in a shared network
            // namespace; a name taken is tried again.
            let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
            let name = format!("baton-init-{}-{random:016x}", std::process::id());
            let address = SocketAddr::from_abstract_name(name.as_bytes())?;
            match std::os::unix::net::UnixDatagram::bind_addr(&address) {
                Ok(socket) => {
                    socket.set_nonblocking(true)?;
                    let socket = tokio::net::UnixDatagram::from_std(socket)?;
                    return Ok(Socket { socket, name: format!("@{name}") });
                }
                Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => last = Some(error),
                Err(error) => return Err(error),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other("no free name")))
    }

    /// The value of `NOTIFY_SOCKET` that names it.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The next datagram, waiting for it.
    pub async fn next(&self) -> std::io::Result<String> {
        let mut buffer = vec![0; MAX_DATAGRAM];
        let n = self.socket.recv(&mut buffer).await?;
        Ok(String::from_utf8_lossy(&buffer[..n]).into_owned())
    }

    /// Every datagram already queued, without waiting.
    pub fn queued(&self) -> Vec<String> {
        let mut buffer = vec![0; MAX_DATAGRAM];
        let mut got = Vec::new();
        while let Ok(n) = self.socket.try_recv(&mut buffer) {
            got.push(String::from_utf8_lossy(&buffer[..n]).into_owned());
        }
        got
    }
}

/// The pid a datagram's `MAINPID=` line names, if it has one.
pub fn main_pid(datagram: &str) -> Option<u32> {
    datagram.lines().find_map(|line| line.strip_prefix("MAINPID=")).and_then(|pid| pid.trim().parse().ok())
}

/// The datagram without its `MAINPID=` lines: what init passes on to a
/// manager of its own, for which init stays the main process.
pub fn without_main_pid(datagram: &str) -> String {
    datagram.lines().filter(|line| !line.starts_with("MAINPID=")).collect::<Vec<_>>().join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_main_pid_is_read_from_any_line_and_kept_from_what_is_passed_on() {
        assert_eq!(main_pid("MAINPID=42\nREADY=1"), Some(42));
        assert_eq!(main_pid("READY=1\nMAINPID=7"), Some(7));
        assert_eq!(main_pid("READY=1"), None);
        assert_eq!(main_pid("MAINPID=-3"), None);
        assert_eq!(main_pid("MAINPID=x"), None);
        assert_eq!(without_main_pid("MAINPID=42\nREADY=1"), "READY=1");
        assert_eq!(without_main_pid("MAINPID=42"), "");
    }
}
