//! Shared memory: an anonymous memory file (`memfd`) mapped read-write and
//! shared, whose descriptor the other process maps too.
//!
//! The two processes take turns on a region: one writes, then tells the
//! other over the control channel, which reads it only after that message
//! arrives; the socket's send and receive order the accesses. So neither
//! side ever reads bytes the other is still writing.

#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, fstat, ftruncate, memfd_create};
use rustix::mm::{MapFlags, ProtFlags, mmap, munmap};

/// The smallest region: a mapping is made of whole pages.
const MIN_LEN: usize = 4096;

/// A shared memory region, mapped for as long as this lives.
#[derive(Debug)]
pub struct Region {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; the pointer is
// only dereferenced through `&self`/`&mut self`, which Rust's borrows keep
// exclusive within this process.
unsafe impl Send for Region {}
// SAFETY: as above; shared references only read.
unsafe impl Sync for Region {}

impl Region {
    /// A new region of at least `len` bytes, zeroed, for calls.
    pub fn create(len: usize) -> io::Result<Region> {
        Region::named("baton-hop", len)
    }

    /// A new region of at least `len` bytes, zeroed, under `name` (which
    /// `/proc/PID/maps` shows as `/memfd:NAME`).
    pub fn named(name: &str, len: usize) -> io::Result<Region> {
        let len = len.max(MIN_LEN).next_multiple_of(MIN_LEN);
        let fd = memfd_create(name, MemfdFlags::CLOEXEC)?;
        ftruncate(&fd, len as u64)?;
        Region::map(fd, len)
    }

    /// Maps a region another process created and sent.
    pub fn open(fd: OwnedFd) -> io::Result<Region> {
        let len = usize::try_from(fstat(&fd)?.st_size)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "a shared region of negative size"))?;
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidData, "an empty shared region"));
        }
        Region::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<Region> {
        // SAFETY: a fresh shared mapping of `len` bytes of a file of that
        // size, at an address the kernel picks; nothing else aliases it in
        // this process.
        let ptr =
            unsafe { mmap(std::ptr::null_mut(), len, ProtFlags::READ | ProtFlags::WRITE, MapFlags::SHARED, &fd, 0)? };
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Region { fd, ptr, len })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes (never: a region is at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Its bytes, to write.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes for as long as `self`,
        // and `&mut self` makes this the only reference in this process.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The descriptor, to send to the other process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `map` made; no reference to
        // it outlives `self`.
        let _ = unsafe { munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_opened_from_its_descriptor_sees_what_the_creator_wrote() {
        let mut created = Region::create(10).unwrap();
        assert_eq!(created.len(), MIN_LEN);
        created.bytes_mut()[..5].copy_from_slice(b"baton");
        let opened = Region::open(created.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(&opened.bytes()[..5], b"baton");
        created.bytes_mut()[0] = b'B';
        assert_eq!(opened.bytes()[0], b'B');
    }
}
