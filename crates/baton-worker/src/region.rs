//! Shared memory: an anonymous memory file (`memfd`) sealed at its size,
//! mapped shared by the process that made it ([`Region`]) and, read-only,
//! by the process it is sent to ([`PeerRegion`]).
//!
//! The two processes take turns on a region: one writes, then tells the
//! other over the control channel, which reads it only after that message
//! arrives; the socket's send and receive order the accesses.
//!
//! Neither side trusts the other's memory. A region is sealed against
//! shrinking and growing (`F_SEAL_SHRINK`, `F_SEAL_GROW`) before it is
//! sent, and the side that maps a region the peer made refuses one that is
//! not: a peer that could truncate a region under the other's mapping
//! would make its next read fault (SIGBUS) instead of failing. It refuses
//! a region on huge pages too (a memory file made with `MFD_HUGETLB`): a
//! page its maker punched out of it faults with SIGBUS when no huge page
//! is free. Once its maker has mapped it, a region is sealed against
//! writes too (`F_SEAL_FUTURE_WRITE`): its maker writes through the
//! mapping it holds, and the peer, which holds the descriptor, can neither
//! write nor punch holes in it. What a peer made is read only by copying
//! bytes out at checked offsets, never through a Rust reference the peer
//! could change underneath.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use memfd::{FileSeal, Memfd, MemfdOptions};
use memmap2::{MmapOptions, MmapRaw};

/// The unit a region's size is a multiple of: a mapping is made of whole
/// pages.
pub const PAGE: usize = 4096;

/// The smallest region.
const MIN_LEN: usize = PAGE;

fn memfd_error(error: memfd::Error) -> io::Error {
    match error {
        memfd::Error::Create(e) | memfd::Error::AddSeals(e) | memfd::Error::GetSeals(e) => e,
    }
}

fn invalid(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why)
}

/// The file system of memory files made without huge pages (`statfs`'s
/// `f_type`).
const TMPFS_MAGIC: u32 = 0x0102_1994;

/// The file system of memory files on huge pages.
const HUGETLBFS_MAGIC: u32 = 0x9584_58f6;

/// Refuses a memory file that is not on the file system of ordinary
/// memory files (one on huge pages, above all).
fn on_ordinary_pages(file: &File) -> io::Result<()> {
    // The magic numbers are 32 bits, whatever the width of the field.
    #[allow(clippy::cast_possible_truncation)]
    let kind = rustix::fs::fstatfs(file)?.f_type as u32;
    match kind {
        TMPFS_MAGIC => Ok(()),
        HUGETLBFS_MAGIC => Err(invalid("the region is on huge pages".into())),
        other => Err(invalid(format!("the region is on a file system of kind {other:#x}, not a memory file's"))),
    }
}

/// A shared memory region this process made, mapped read-write for as long
/// as this lives. Its size is sealed: nobody can change it.
#[derive(Debug)]
pub struct Region {
    file: File,
    map: MmapRaw,
}

impl Region {
    /// A new region of at least `len` bytes, zeroed, for calls.
    pub fn create(len: usize) -> io::Result<Region> {
        Region::named("baton-hop", len)
    }

    /// A new region of at least `len` bytes, zeroed, under `name` (which
    /// `/proc/PID/maps` shows as `/memfd:NAME`), sealed at its size.
    pub fn named(name: &str, len: usize) -> io::Result<Region> {
        let len = len.max(MIN_LEN).checked_next_multiple_of(PAGE).ok_or_else(|| invalid(format!("{len} bytes")))?;
        let memfd =
            MemfdOptions::default().close_on_exec(true).allow_sealing(true).create(name).map_err(memfd_error)?;
        memfd.as_file().set_len(len as u64)?;
        memfd.add_seals(&[FileSeal::SealShrink, FileSeal::SealGrow]).map_err(memfd_error)?;
        let map = MmapOptions::new().len(len).map_raw(memfd.as_file())?;
        // This process writes through the mapping it has; nobody writes
        // otherwise, nor punches holes. Kernels before 5.1 know no such
        // seal: there, the size's seals are all.
        match memfd.add_seal(FileSeal::SealFutureWrite) {
            Err(memfd::Error::AddSeals(e)) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {}
            other => other.map_err(memfd_error)?,
        }
        // No seal can be added or removed after this.
        memfd.add_seal(FileSeal::SealSeal).map_err(memfd_error)?;
        Ok(Region { file: memfd.into_file(), map })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds no bytes (never: a region is at least a page).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes, to write. The peer maps this region read-only and reads
    /// it only once told to.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` writable bytes for as long as `self`
        // (its size is sealed, so no process can truncate it), and `&mut
        // self` makes this the only reference to it in this process.
        unsafe { std::slice::from_raw_parts_mut(self.map.as_mut_ptr(), self.map.len()) }
    }

    /// The descriptor, to send to the other process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }
}

/// A shared memory region the peer made and sent, mapped read-only once
/// its seals and size are checked.
#[derive(Debug)]
pub struct PeerRegion {
    _file: File,
    map: MmapRaw,
}

impl PeerRegion {
    /// Maps a region the peer sent: refused unless it is an anonymous
    /// memory file, not on huge pages, sealed against shrinking and
    /// growing, of 1 to `most` bytes. Every refusal is `InvalidData`; any
    /// other error is this process's own (mapping it, say).
    pub fn open(fd: OwnedFd, most: usize) -> io::Result<PeerRegion> {
        let memfd = Memfd::try_from_fd(fd).map_err(|_| invalid("the region is not an anonymous memory file".into()))?;
        let seals = memfd.seals().map_err(|e| invalid(format!("the region's seals: {}", memfd_error(e))))?;
        if !(seals.contains(&FileSeal::SealShrink) && seals.contains(&FileSeal::SealGrow)) {
            return Err(invalid("the region is not sealed against shrinking and growing".into()));
        }
        let file = memfd.into_file();
        on_ordinary_pages(&file)?;
        // Sealed: this size holds for as long as the region lives.
        let size = file.metadata()?.len();
        let len = usize::try_from(size).ok().filter(|len| (1..=most).contains(len));
        let len = len.ok_or_else(|| invalid(format!("a region of {size} bytes (1 to {most} are taken)")))?;
        let map = MmapOptions::new().len(len).map_raw_read_only(&file)?;
        Ok(PeerRegion { _file: file, map })
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether it holds no bytes (never: an empty region is refused).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the `len` bytes at `offset` out; `None` when they do not lie
    /// within the region.
    pub fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.map.len() {
            return None;
        }
        // Not zeroed first: the copy is the one pass over the bytes.
        let mut out = Vec::with_capacity(len);
        // SAFETY: `offset..end` lies within the mapping (see `read_into`);
        // `out` has room for `len` bytes, all of which the copy writes
        // before the length is set.
        unsafe {
            std::ptr::copy_nonoverlapping(self.map.as_ptr().add(offset), out.as_mut_ptr(), len);
            out.set_len(len);
        }
        Some(out)
    }

    /// Copies `out.len()` bytes at `offset` into `out`; `None` when they do
    /// not lie within the region.
    pub fn read_into(&self, offset: usize, out: &mut [u8]) -> Option<()> {
        let end = offset.checked_add(out.len())?;
        if end > self.map.len() {
            return None;
        }
        // SAFETY: `offset..end` lies within the mapping, which stays mapped
        // (and, sealed, of this size) for as long as `self`; the bytes are
        // copied as they are, whatever the peer writes meanwhile, and no
        // reference into the mapping is made.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr().add(offset), out.as_mut_ptr(), out.len()) };
        Some(())
    }

    /// Its bytes, in place, for a region whose maker does not write it
    /// while it is read: the server's inputs, as the worker running the call
    /// sees them (the server writes a slot's region only between calls,
    /// and never again into a slot whose call it gave up on).
    pub fn bytes_in_place(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes for as long as `self`,
        // and its size is sealed; see above for who writes it when.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr(), self.map.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(region: &Region) -> io::Result<PeerRegion> {
        PeerRegion::open(region.fd().try_clone_to_owned().unwrap(), 1 << 30)
    }

    #[test]
    fn a_region_opened_from_its_descriptor_sees_what_the_creator_wrote() {
        let mut created = Region::create(10).unwrap();
        assert_eq!(created.len(), MIN_LEN);
        created.bytes_mut()[..5].copy_from_slice(b"baton");
        let opened = peer(&created).unwrap();
        assert_eq!(opened.read(0, 5).unwrap(), b"baton");
        created.bytes_mut()[0] = b'B';
        assert_eq!(opened.read(0, 1).unwrap(), b"B");
        assert_eq!(&opened.bytes_in_place()[..5], b"Baton");
    }

    #[test]
    fn reads_outside_the_region_are_refused() {
        let opened = peer(&Region::create(10).unwrap()).unwrap();
        assert!(opened.read(MIN_LEN - 4, 4).is_some());
        assert!(opened.read(MIN_LEN - 4, 5).is_none());
        assert!(opened.read(usize::MAX, 2).is_none());
    }

    #[test]
    fn a_region_cannot_be_resized_and_an_unsealed_or_oversized_one_is_refused() {
        let region = Region::create(MIN_LEN).unwrap();
        let file = File::from(region.fd().try_clone_to_owned().unwrap());
        assert!(file.set_len(0).is_err(), "a sealed region shrank");
        assert!(file.set_len(2 * MIN_LEN as u64).is_err(), "a sealed region grew");
        assert!(PeerRegion::open(region.fd().try_clone_to_owned().unwrap(), MIN_LEN - 1).is_err());
        let unsealed = MemfdOptions::default().allow_sealing(true).create("unsealed").unwrap();
        unsealed.as_file().set_len(MIN_LEN as u64).unwrap();
        let error = PeerRegion::open(unsealed.into_file().into(), 1 << 20).unwrap_err();
        assert!(error.to_string().contains("not sealed"), "{error}");
        // A plain file is no region, sealed or not.
        let file = tempfile::tempfile().unwrap();
        file.set_len(MIN_LEN as u64).unwrap();
        assert!(PeerRegion::open(file.into(), 1 << 20).is_err());
    }

    /// The peer holds the region's descriptor, writable: it can neither
    /// punch holes in the region (on huge pages, a hole faulted in with
    /// none free ends the process that reads it with SIGBUS) nor write
    /// into it, nor map it writable. Its maker still writes it through its
    /// own mapping.
    #[test]
    fn the_peer_can_neither_punch_holes_in_a_region_nor_write_it() {
        use std::os::unix::fs::FileExt;
        let mut region = Region::create(4 * PAGE).unwrap();
        let held = File::from(region.fd().try_clone_to_owned().unwrap());
        let punched = rustix::fs::fallocate(
            &held,
            rustix::fs::FallocateFlags::PUNCH_HOLE | rustix::fs::FallocateFlags::KEEP_SIZE,
            0,
            PAGE as u64,
        );
        assert!(punched.is_err(), "a hole was punched in a sealed region");
        assert!(held.write_at(b"x", 0).is_err(), "the peer wrote into the region");
        assert!(MmapOptions::new().len(PAGE).map_raw(&held).is_err(), "the peer mapped the region writable");
        region.bytes_mut()[0] = b'm';
        assert_eq!(peer(&region).unwrap().read(0, 1).unwrap(), b"m");
    }

    /// A region on huge pages (`memfd_create` with `MFD_HUGETLB`) is
    /// refused before it is mapped: a page the peer punched out of it
    /// faults with SIGBUS when no huge page is free.
    #[test]
    fn a_region_on_huge_pages_is_refused_before_it_is_mapped() {
        let huge =
            MemfdOptions::default().allow_sealing(true).hugetlb(Some(memfd::HugetlbSize::Huge2MB)).create("baton-hop");
        let Ok(huge) = huge else {
            eprintln!("skipped: this kernel makes no memory file on huge pages");
            return;
        };
        huge.as_file().set_len(2 << 20).unwrap();
        huge.add_seals(&[FileSeal::SealShrink, FileSeal::SealGrow]).unwrap();
        let error = PeerRegion::open(huge.into_file().into(), 1 << 30).unwrap_err();
        assert!(error.to_string().contains("huge pages"), "{error}");
    }
}
