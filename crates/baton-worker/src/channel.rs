//! The control channel between the server and a worker: a Unix
//! `SOCK_SEQPACKET` socket pair. Each send is one message, received whole
//! or not at all, and may carry descriptors (a shared region's, a model's
//! files). Messages are small: tensors cross in shared memory.
//!
//! A child gets its ends of the channels at fixed descriptor numbers
//! ([`hand_to_child`]), set up in the child between fork and exec, so that
//! the server never clears a close-on-exec flag: a flag cleared in the
//! server is cleared for every process it starts meanwhile (another
//! worker, an upgrade), which would inherit the ends and hold the
//! channels open after the worker ended.

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::process::Command;
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use rustix::io::{FdFlags, fcntl_getfd, fcntl_setfd};
use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketFlags, SocketType, recvmsg, sendmsg, socketpair,
};

/// The first descriptor number a child is handed an end at: the ones
/// after its standard streams.
pub const FIRST_HANDED: RawFd = 3;

/// The most ends one child is handed.
pub const MOST_HANDED: usize = 64;

/// Gives the child `command` starts each of `fds`, in order, at descriptors
/// [`FIRST_HANDED`], 4, 5, …; returns those numbers. They are duplicated
/// onto those numbers in the child, between fork and exec (`dup2`), so this
/// process's close-on-exec flags never change and no other process started
/// meanwhile inherits them. `command` holds `fds` until it is dropped: drop
/// it once the child is started, or the ends stay open here too.
pub fn hand_to_child(command: &mut Command, fds: Vec<OwnedFd>) -> io::Result<Vec<RawFd>> {
    if fds.len() > MOST_HANDED {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{} descriptors to hand over", fds.len())));
    }
    let numbers: Vec<RawFd> = (FIRST_HANDED..).take(fds.len()).collect();
    let mappings =
        fds.into_iter().zip(&numbers).map(|(parent_fd, &child_fd)| FdMapping { parent_fd, child_fd }).collect();
    command.fd_mappings(mappings).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(numbers)
}

/// Takes the channel ends a parent handed this process at `numbers` (see
/// [`hand_to_child`]), refusing a number that is not one: each must be
/// distinct, from [`FIRST_HANDED`] on, and an open Unix `SOCK_SEQPACKET`
/// socket. Each is closed on exec from then on.
pub fn take_handed(numbers: &[RawFd]) -> io::Result<Vec<Channel>> {
    let invalid = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    if numbers.len() > MOST_HANDED {
        return Err(invalid(format!("{} descriptors named", numbers.len())));
    }
    for (i, fd) in numbers.iter().enumerate() {
        if numbers[..i].contains(fd) {
            return Err(invalid(format!("descriptor {fd} named twice")));
        }
    }
    // SAFETY: every number was checked to be a distinct socket of the kind
    // a parent hands, above the standard streams, before any of them is
    // owned; this process opens its own sockets close-on-exec and takes
    // these first thing, so nothing else in it owns them.
    #[allow(unsafe_code)]
    numbers.iter().map(|&fd| unsafe { Channel::inherited(fd) }).collect()
}

/// A message of no bytes: no side of baton sends one, and it must not be
/// taken for the other end's close.
fn empty() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "an empty message, which baton never sends")
}

/// The largest control message: the setup channel's (a version's files,
/// its signature, a weight's name and shape); a slot's are far smaller
/// ([`crate::hop::SLOT_MESSAGE`]).
pub const MAX_MESSAGE: usize = 128 * 1024;

/// The most descriptors one message carries.
pub const MAX_FDS: usize = 16;

/// One end of a control channel.
#[derive(Debug)]
pub struct Channel {
    fd: OwnedFd,
}

impl Channel {
    /// A connected pair; both ends closed on exec. An end reaches a child
    /// through [`hand_to_child`] alone.
    pub fn pair() -> io::Result<(Channel, Channel)> {
        let (a, b) = socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None)?;
        Ok((Channel { fd: a }, Channel { fd: b }))
    }

    /// Takes the end a parent left at descriptor `fd`, and closes it on
    /// exec. Refused unless `fd` is from [`FIRST_HANDED`] on and an open
    /// Unix `SOCK_SEQPACKET` socket.
    ///
    /// # Safety
    /// If `fd` is such a socket, nothing else in this process may own it.
    #[allow(unsafe_code)]
    pub unsafe fn inherited(fd: RawFd) -> io::Result<Channel> {
        let invalid = |why: &str| io::Error::new(io::ErrorKind::InvalidInput, format!("descriptor {fd}: {why}"));
        if fd < FIRST_HANDED {
            return Err(invalid("a standard stream, or no descriptor"));
        }
        // SAFETY: borrowed for these checks only; a number that is not open
        // makes them fail with EBADF, and nothing is closed or kept.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        fcntl_getfd(borrowed).map_err(|_| invalid("not open"))?;
        let kind = rustix::net::sockopt::socket_type(borrowed).map_err(|_| invalid("not a socket"))?;
        let domain = rustix::net::sockopt::socket_domain(borrowed).map_err(|_| invalid("not a socket"))?;
        if kind != SocketType::SEQPACKET || domain != AddressFamily::UNIX {
            return Err(invalid("not a Unix SOCK_SEQPACKET socket"));
        }
        // SAFETY: open, and, as the caller guarantees, owned by no one else.
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

    /// Receives one message into the start of `buffer`: its length and
    /// descriptors; `None` once the other end is closed. A message longer
    /// than `buffer` is an error (it was cut short), as is one with more
    /// than [`MAX_FDS`] descriptors. The calls across the hop use this with
    /// a buffer of their own, which is never cleared or resized between
    /// messages.
    pub fn recv_into(&self, buffer: &mut [u8]) -> io::Result<Option<(usize, Vec<OwnedFd>)>> {
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
            // A message of no bytes reads like the other end's close; the
            // close also says so to `poll`, and a peer that sent one is
            // still there, so the two are told apart.
            return if self.closed()? { Ok(None) } else { Err(empty()) };
        }
        Ok(Some((received.bytes, fds)))
    }

    /// Whether the other end is closed, or shut its sending side down:
    /// nothing more will arrive.
    fn closed(&self) -> io::Result<bool> {
        let mut fds = [PollFd::new(&self.fd, PollFlags::IN | PollFlags::RDHUP)];
        loop {
            match poll(&mut fds, Some(&Timespec::default())) {
                Ok(_) => return Ok(fds[0].revents().intersects(PollFlags::HUP | PollFlags::RDHUP)),
                Err(rustix::io::Errno::INTR) => continue,
                Err(error) => return Err(error.into()),
            }
        }
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

impl From<Channel> for OwnedFd {
    fn from(channel: Channel) -> OwnedFd {
        channel.fd
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

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
    fn a_message_of_no_bytes_is_an_error_and_not_the_other_end_s_close() {
        let (a, b) = Channel::pair().unwrap();
        a.send(b"", &[]).unwrap();
        a.send(b"after", &[]).unwrap();
        let mut buffer = vec![0; 64];
        let error = b.recv_into(&mut buffer).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
        assert_eq!(b.recv_into(&mut buffer).unwrap().unwrap().0, 5);
        // A sending side shut down, and a closed end, read as closed.
        a.send(b"", &[]).unwrap();
        rustix::net::shutdown(&a.fd, rustix::net::Shutdown::Write).unwrap();
        assert!(b.recv_into(&mut buffer).unwrap().is_none());
        drop(a);
        assert!(b.recv_into(&mut buffer).unwrap().is_none());
    }

    #[test]
    fn a_descriptor_that_is_no_channel_end_is_refused() {
        #[allow(unsafe_code)]
        let take = |fd| unsafe { Channel::inherited(fd) };
        assert!(take(1).is_err(), "a standard stream");
        let file = tempfile::tempfile().unwrap();
        let error = take(file.as_raw_fd()).unwrap_err();
        assert!(error.to_string().contains("not a socket"), "{error}");
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let error = take(a.as_raw_fd()).unwrap_err();
        assert!(error.to_string().contains("SOCK_SEQPACKET"), "{error}");
        assert!(take_handed(&[5, 5]).unwrap_err().to_string().contains("twice"));
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
