//! `baton init`'s notification socket: the datagram socket it names in
//! its main process's `NOTIFY_SOCKET`, on which baton says `READY=1`,
//! `STOPPING=1` and, during an upgrade, `MAINPID=` (the protocol systemd
//! uses: one datagram of `KEY=VALUE` lines).
//!
//! The socket has an abstract name (`@baton-init-PID-RANDOM`), not a
//! path: it needs no writable directory (a container's root filesystem
//! is often read-only) and leaves nothing to clean up. Any process in the
//! same network namespace (a pod's other containers) can send to an
//! abstract name, so each datagram comes with its sender's pid, as the
//! kernel vouches for it (`SO_PASSCRED`), and init decides whom to
//! believe (see [`super::Supervisor`]). A sender outside init's pid
//! namespace has pid 0 here: unknown, never believed.

use std::hash::{BuildHasher, Hasher};
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::SocketAddr;

/// The largest datagram read whole; a longer one is cut (baton's are a
/// few dozen bytes).
const MAX_DATAGRAM: usize = 4096;

/// The most datagrams [`Socket::queued`] reads at once.
const MAX_QUEUED: usize = 4096;

/// The socket, bound.
pub struct Socket {
    socket: tokio::net::UnixDatagram,
    name: String,
}

/// One datagram, and who sent it.
#[derive(Debug)]
pub struct Datagram {
    /// Its text: `KEY=VALUE` lines.
    pub text: String,
    /// The sender's pid, when the kernel could name it in init's pid
    /// namespace.
    pub sender: Option<u32>,
}

impl Socket {
    /// Binds a new socket under an abstract name of its own, passing its
    /// senders' credentials.
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
                    nix::sys::socket::setsockopt(&socket, nix::sys::socket::sockopt::PassCred, &true)?;
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
    pub async fn next(&self) -> std::io::Result<Datagram> {
        loop {
            self.socket.readable().await?;
            match self.socket.try_io(tokio::io::Interest::READABLE, || self.receive()) {
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
                got => return got,
            }
        }
    }

    /// The datagrams already queued, without waiting: at most
    /// [`MAX_QUEUED`], so that a sender that never stops cannot hold init
    /// here (the socket's buffer holds far fewer).
    pub fn queued(&self) -> Vec<Datagram> {
        std::iter::from_fn(|| self.receive().ok()).take(MAX_QUEUED).collect()
    }

    /// One datagram with its sender, without waiting.
    fn receive(&self) -> std::io::Result<Datagram> {
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixCredentials, recvmsg};
        let mut buffer = vec![0; MAX_DATAGRAM];
        let mut space = nix::cmsg_space!(UnixCredentials);
        let mut parts = [std::io::IoSliceMut::new(&mut buffer)];
        let fd = self.socket.as_raw_fd();
        let flags = MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC;
        let message = recvmsg::<()>(fd, &mut parts, Some(&mut space), flags)?;
        // A datagram with more ancillary data than credentials (passed
        // descriptors) has it cut (the kernel closes what did not fit):
        // it is read, and counts as from an unknown sender, so that the
        // datagrams behind it are still read.
        let sender = message.cmsgs().ok().and_then(|mut cmsgs| {
            cmsgs.find_map(|c| match c {
                ControlMessageOwned::ScmCredentials(credentials) => u32::try_from(credentials.pid()).ok(),
                _ => None,
            })
        });
        let length = message.bytes;
        Ok(Datagram {
            text: String::from_utf8_lossy(&buffer[..length]).into_owned(),
            sender: sender.filter(|&pid| pid != 0),
        })
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
