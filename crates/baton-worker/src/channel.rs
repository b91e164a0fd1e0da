//! The control channel between the server and a worker: a Unix
//! `SOCK_SEQPACKET` socket pair. Each send is one message, received whole
//! or not at all, and may carry descriptors (a shared region's, a model's
//! files). Messages are small: tensors cross in shared memory.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec, poll};

use rustix::io::{FdFlags, fcntl_getfd, fcntl_setfd};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType, recvmsg, sendmsg, socketpair,
};

/// The largest control message.
pub const MAX_MESSAGE: usize = 256 * 1024;

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 16;

/// One end of a control channel.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// A connected pair; both ends closed on exec unless one is made
    /// [`inheritable`](Channel::inheritable).
    pub fn pair() -> io::Result<(Channel, Channel)> {
        let (a, b) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        Ok((Channel { fd: a }, Channel { fd: b }))
    }

    /// Lets a child started after this call inherit this end; returns the
    /// descriptor number the child finds it at.
    pub fn inheritable(&self) -> io::Result<RawFd> {
        let flags = fcntl_getfd(&self.fd)?;
        fcntl_setfd(&self.fd, flags - FdFlags::CLOEXEC)?;
        Ok(self.fd.as_raw_fd())
    }

    /// Takes the end a parent left at descriptor `fd`, and closes it on exec.
    ///
    /// # Safety
    /// `fd` must be an open socket descriptor that nothing else in this
    /// process owns.
    #[allow(unsafe_code)]
    pub unsafe fn inherited(fd: RawFd) -> io::Result<Channel> {
        // SAFETY: the caller guarantees `fd` is open and owned by no one else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        fcntl_setfd(&fd, FdFlags::CLOEXEC)?;
        Ok(Channel { fd })
    }

    /// Sends one message, with `fds` attached.
    pub fn send(&self, message: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if message.len() > MAX_MESSAGE || fds.len() > MAX_FDS {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a control message too large"));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(io::Error::other("descriptors did not fit the control buffer"));
        }
        let sent = sendmsg(&self.fd, &[IoSlice::new(message)], &mut control, SendFlags::NOSIGNAL)?;
        if sent != message.len() {
            return Err(io::Error::other("a control message was sent in part"));
        }
        Ok(())
    }

    /// Receives one message into `buffer` (resized to it) with its
    /// descriptors; `None` once the other end is closed.
    pub fn recv(&self, buffer: &mut Vec<u8>) -> io::Result<Option<Vec<OwnedFd>>> {
        buffer.resize(MAX_MESSAGE, 0);
        let received = self.recv_into(buffer)?;
        buffer.truncate(received.as_ref().map_or(0, |(bytes, _)| *bytes));
        Ok(received.map(|(_, fds)| fds))
    }

    /// Receives one message into the start of `buffer`, which must hold
    /// [`MAX_MESSAGE`] bytes: its length and descriptors; `None` once the
    /// other end is closed. The calls across the hop use this with a buffer
    /// of their own, which is never cleared or resized between messages.
    pub fn recv_into(&self, buffer: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
        if buffer.len() < MAX_MESSAGE {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a receive buffer smaller than a message"));
        }
        let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let received = loop {
            match recvmsg(&self.fd, &mut [IoSliceMut::new(buffer)], &mut control, RecvFlags::CMSG_CLOEXEC) {
                Err(rustix::io::Errno::INTR) => continue,
                other => break other?,
            }
        };
        let fds: Vec<OwnedFd> = control
            .drain()
            .filter_map(|m| match m {
                RecvAncillaryMessage::ScmRights(fds) => Some(fds),
                _ => None,
            })
            .flatten()
            .collect();
        if received.flags.contains(ReturnFlags::TRUNC) || received.flags.contains(ReturnFlags::CTRUNC) {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "a control message was cut short"));
        }
        if received.bytes == 0 && fds.is_empty() {
            return Ok(None);
        }
        Ok(Some((received.bytes, fds)))
    }

    /// Shuts both directions down: the other end reads its close, and a
    /// thread of this process waiting on this end wakes.
    pub fn shutdown(&self) {
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
    }

    /// Polls for a message (or the other end's close) for up to `within`
    /// without sleeping, giving the CPU to any other thread ready to run
    /// between polls: true once one is there. Across the hop an answer
    /// often comes within tens of microseconds, sooner than a sleeping
    /// thread is woken on an idle CPU (docs/workers.md, "Waiting for the
    /// other side").
    pub fn readable_soon(&self, within: Duration) -> bool {
        if within.is_zero() {
            return false;
        }
        let until = Instant::now() + within;
        loop {
            if self.readable_within(Duration::ZERO).unwrap_or(true) {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            std::thread::yield_now();
        }
    }

    /// Waits up to `within` for a message (or the other end's close) to
    /// read; false when none came.
    pub fn readable_within(&self, within: Duration) -> io::Result<bool> {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let timeout = Timespec::try_from(left).map_err(|_| io::Error::other("a deadline too far"))?;
            let mut fds = [PollFd::new(&self.fd, PollFlags::IN)];
            match poll(&mut fds, Some(&timeout)) {
                Ok(0) => return Ok(false),
                Ok(_) => return Ok(true),
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_arrive_whole_with_their_descriptors_and_a_closed_end_reads_none() {
        let (a, b) = Channel::pair().unwrap();
        let region = crate::region::Region::create(1).unwrap();
        a.send(b"first", &[region.fd()]).unwrap();
        a.send(b"second", &[]).unwrap();
        let mut buffer = Vec::new();
        let fds = b.recv(&mut buffer).unwrap().unwrap();
        assert_eq!((buffer.as_slice(), fds.len()), (&b"first"[..], 1));
        let fds = b.recv(&mut buffer).unwrap().unwrap();
        assert_eq!((buffer.as_slice(), fds.len()), (&b"second"[..], 0));
        drop(a);
        assert!(b.recv(&mut buffer).unwrap().is_none());
    }

    #[test]
    fn a_brief_poll_sees_a_message_without_taking_it_and_gives_up_after_its_time() {
        let (a, b) = Channel::pair().unwrap();
        assert!(!b.readable_soon(Duration::ZERO));
        let began = Instant::now();
        assert!(!b.readable_soon(Duration::from_millis(2)));
        assert!(began.elapsed() >= Duration::from_millis(2));
        a.send(b"here", &[]).unwrap();
        assert!(b.readable_soon(Duration::from_millis(2)));
        let mut buffer = vec![0; MAX_MESSAGE];
        let (bytes, _) = b.recv_into(&mut buffer).unwrap().unwrap();
        assert_eq!(&buffer[..bytes], b"here");
        drop(a);
        assert!(b.readable_soon(Duration::from_millis(2)), "a closed end reads at once");
        assert!(b.recv_into(&mut buffer).unwrap().is_none());
    }
}
