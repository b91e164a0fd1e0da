//! One copy of a version's weights for every session of its pool, and for
//! the next version where a tensor did not change.
//!
//! Left to itself, each ONNX Runtime session holds its own copy of the
//! weights: with a pool of four sessions, four copies. Instead, baton maps
//! the staged data file (a copy baton made of the verified bytes, in a
//! directory only it writes) and gives every session the same tensors over
//! that mapping (`AddInitializer`), with one container of pre-packed
//! weights for the pool: the first session packs a matrix, the others use
//! its packed copy. After the sessions exist and after validation has read
//! them, the mapped pages are dropped from the process's resident memory
//! (`MADV_DONTNEED`): they stay in the page cache, and a kernel that reads
//! one again (an embedding table, which is not packed) faults it back in
//! from there.
//!
//! A tensor that has the same name, type, shape and bytes as one of a live
//! version of the same model is not held a second time: the new version
//! uses the live tensor's buffer, kept alive by a reference count for as
//! long as either version is. Packed matrices are shared along successive
//! versions the same way ([`Chain`]). Equality is decided by comparing the bytes, so no
//! claim in the version's files can make two different tensors share.

// Mapping a file and handing ONNX Runtime values over the mapped bytes
// needs the system calls and raw pointers this module keeps to itself.
#![allow(unsafe_code)]

use std::fs::File;
use std::mem::ManuallyDrop;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use ort::memory::MemoryInfo;
use ort::session::builder::PrepackedWeights;
use ort::value::{DynValue, PrimitiveTensorElementType, Shape, TensorRefMut};

use crate::backend::Sharing;
use crate::proto::elem;

/// A read-only mapping of a whole file, unmapped when the last tensor over
/// it goes.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is read-only and never moves; any thread may read it.
unsafe impl Send for Mapping {}
// SAFETY: as above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `file` (of `len` bytes) read-only.
    pub(crate) fn map(file: &File, len: u64) -> std::io::Result<Mapping> {
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        if len == 0 {
            return Err(std::io::Error::other("the data file is empty"));
        }
        // SAFETY: a fresh shared read-only mapping of an open file; the
        // result is checked before use.
        let ptr =
            unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping { ptr: ptr.cast(), len })
    }

    /// The bytes of `range`, which must lie inside the mapping.
    pub(crate) fn bytes(&self, range: &Range<usize>) -> Option<&[u8]> {
        if range.start > range.end || range.end > self.len {
            return None;
        }
        // SAFETY: the range was checked against the mapping's length, and
        // the mapping lives as long as `self`.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(range.start), range.len()) })
    }

    /// Drops the pages of `range` from this process's resident memory; the
    /// next read faults them back in from the file.
    fn release(&self, range: &Range<usize>) {
        const PAGE: usize = 4096;
        let start = range.start.next_multiple_of(PAGE);
        let end = range.end.min(self.len) / PAGE * PAGE;
        if end > start {
            // SAFETY: a page-aligned range inside the mapping; for a shared
            // read-only file mapping DONTNEED changes no contents.
            unsafe { libc::madvise(self.ptr.add(start).cast(), end - start, libc::MADV_DONTNEED) };
        }
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: unmapped once, when nothing refers to it any more.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// A value that reads mapped memory, with references to the mappings it
/// reads: the value is dropped first, then the references, whatever the
/// order of the fields or locals around it. An ONNX Runtime session given
/// shared tensors is held in one, and so is each tensor's own value.
pub(crate) struct OverMapping<T> {
    value: ManuallyDrop<T>,
    /// Released only after `value` has been dropped (see `Drop`).
    _mappings: Vec<Arc<Mapping>>,
}

impl<T> OverMapping<T> {
    /// `value`, which reads `mappings`.
    pub(crate) fn new(value: T, mappings: Vec<Arc<Mapping>>) -> OverMapping<T> {
        OverMapping { value: ManuallyDrop::new(value), _mappings: mappings }
    }
}

impl<T> std::ops::Deref for OverMapping<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T> std::ops::DerefMut for OverMapping<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T> Drop for OverMapping<T> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, and never used again; the mappings
        // are released after this, when the fields are dropped.
        unsafe { ManuallyDrop::drop(&mut self.value) };
    }
}

/// One tensor over a mapping, as every session of a version (and of later
/// versions holding the same bytes) is given it.
pub(crate) struct SharedTensor {
    /// The ONNX Runtime value over the mapped bytes, holding the mapping.
    value: OverMapping<Arc<DynValue>>,
    name: String,
    data_type: i32,
    dims: Vec<i64>,
    range: Range<usize>,
    mapping: Arc<Mapping>,
}

impl SharedTensor {
    /// The tensor's bytes.
    pub(crate) fn bytes(&self) -> &[u8] {
        // The range was checked when the tensor was made.
        self.mapping.bytes(&self.range).unwrap_or(&[])
    }

    /// Its name.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Its dimensions.
    pub(crate) fn dims(&self) -> &[i64] {
        &self.dims
    }

    /// Its ONNX element type.
    pub(crate) fn data_type(&self) -> i32 {
        self.data_type
    }

    fn same_kind(&self, name: &str, data_type: i32, dims: &[i64]) -> bool {
        self.name == name && self.data_type == data_type && self.dims == dims
    }
}

/// A tensor of the staged data file: its name, element type, dimensions
/// and bytes in the file.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) name: String,
    pub(crate) data_type: i32,
    pub(crate) dims: Vec<i64>,
    pub(crate) range: Range<u64>,
}

/// The shared tensors of one version.
#[derive(Default)]
pub(crate) struct SharedWeights {
    tensors: Vec<Arc<SharedTensor>>,
    /// Bytes of the tensors taken from a live version.
    reused: u64,
    /// Which model's versions may share with this one.
    model: PathBuf,
}

/// Live versions' tensors, by model directory: what a new version may
/// reuse. Entries whose tensors are gone are pruned at each load.
static LIVE: Mutex<Vec<(PathBuf, Weak<SharedTensor>)>> = Mutex::new(Vec::new());

impl SharedWeights {
    /// Maps `data` and makes one value per placed tensor, reusing a live
    /// tensor of the same model (`model`, its repository directory) with
    /// the same name, type, shape and bytes. A tensor whose bytes are not
    /// aligned to its element size is left out: ONNX Runtime then reads it
    /// itself.
    /// With [`Sharing::Alone`], no live tensor is reused.
    pub(crate) fn new(
        model: &Path,
        data: &File,
        len: u64,
        placed: &[Placed],
        sharing: Sharing,
    ) -> Result<SharedWeights, String> {
        let mapping = Arc::new(Mapping::map(data, len).map_err(|e| format!("mapping the staged weights: {e}"))?);
        let live = if sharing == Sharing::WithLive { live_tensors(model) } else { Vec::new() };
        let mut shared = SharedWeights { model: model.to_owned(), ..SharedWeights::default() };
        for p in placed {
            let (Ok(start), Ok(end)) = (usize::try_from(p.range.start), usize::try_from(p.range.end)) else { continue };
            let range = start..end;
            let Some(bytes) = mapping.bytes(&range) else {
                return Err(format!("tensor '{}' lies past the end of the staged weights", p.name));
            };
            let reusable = live.iter().find(|t| t.same_kind(&p.name, p.data_type, &p.dims) && t.bytes() == bytes);
            // Comparing read the live tensor's pages back in.
            if let Some(t) = reusable {
                t.mapping.release(&t.range);
            }
            let reusable = reusable.cloned();
            let tensor = match reusable {
                Some(tensor) => {
                    shared.reused += bytes.len() as u64;
                    mapping.release(&range);
                    tensor
                }
                None => {
                    let Some(value) = value_over(&mapping, &range, p.data_type, &p.dims)? else { continue };
                    let value = OverMapping::new(value, vec![Arc::clone(&mapping)]);
                    let (name, data_type, dims) = (p.name.clone(), p.data_type, p.dims.clone());
                    Arc::new(SharedTensor { value, name, data_type, dims, range, mapping: Arc::clone(&mapping) })
                }
            };
            shared.tensors.push(tensor);
        }
        Ok(shared)
    }

    /// The tensors, to give to each session.
    pub(crate) fn values(&self) -> impl Iterator<Item = (&str, Arc<DynValue>)> {
        self.tensors.iter().map(|t| (t.name.as_str(), Arc::clone(&*t.value)))
    }

    /// Every mapping the tensors read, once each: what a session given
    /// them must hold (see [`OverMapping`]).
    pub(crate) fn mappings(&self) -> Vec<Arc<Mapping>> {
        let mut mappings: Vec<Arc<Mapping>> = Vec::new();
        for tensor in &self.tensors {
            if !mappings.iter().any(|m| Arc::ptr_eq(m, &tensor.mapping)) {
                mappings.push(Arc::clone(&tensor.mapping));
            }
        }
        mappings
    }

    /// The tensors themselves, for validation to read in place.
    pub(crate) fn tensors(&self) -> &[Arc<SharedTensor>] {
        &self.tensors
    }

    /// Bytes of all shared tensors.
    pub(crate) fn bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.range.len() as u64).sum()
    }

    /// Bytes taken from a live version instead of held again.
    pub(crate) fn reused(&self) -> u64 {
        self.reused
    }

    /// Makes this version's tensors reusable by later versions of its model.
    pub(crate) fn publish(&self) {
        let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
        live.retain(|(_, weak)| weak.strong_count() > 0);
        for tensor in &self.tensors {
            if !live.iter().any(|(_, w)| w.as_ptr() == Arc::as_ptr(tensor)) {
                live.push((self.model.clone(), Arc::downgrade(tensor)));
            }
        }
    }

    /// Drops every tensor's pages from resident memory (see the module's
    /// documentation).
    pub(crate) fn release(&self) {
        for tensor in &self.tensors {
            tensor.mapping.release(&tensor.range);
        }
    }
}

/// The live tensors of `model`'s versions.
fn live_tensors(model: &Path) -> Vec<Arc<SharedTensor>> {
    let mut live = LIVE.lock().unwrap_or_else(PoisonError::into_inner);
    live.retain(|(_, weak)| weak.strong_count() > 0);
    live.iter().filter(|(m, _)| m == model).filter_map(|(_, w)| w.upgrade()).collect()
}

/// An ONNX Runtime tensor over `range` of `mapping`; `None` when the bytes
/// are not aligned to the element size or the type is not one baton maps.
fn value_over(
    mapping: &Mapping,
    range: &Range<usize>,
    data_type: i32,
    dims: &[i64],
) -> Result<Option<Arc<DynValue>>, String> {
    macro_rules! typed {
        ($t:ty) => {{
            if range.start % std::mem::align_of::<$t>() != 0 {
                return Ok(None);
            }
            let elements: i64 = dims.iter().product();
            if elements as usize * std::mem::size_of::<$t>() != range.len() {
                return Err(format!("a tensor of {dims:?} does not fill its {} bytes", range.len()));
            }
            let data = mapping.bytes(range).ok_or("a tensor lies outside the mapping")?.as_ptr();
            // SAFETY: the pointer is aligned and valid for the tensor's
            // bytes for as long as the mapping lives, which outlives the
            // value (the caller puts it in an OverMapping, and sessions
            // given it are held in one too); ONNX Runtime only reads
            // initializers.
            let tensor = unsafe {
                TensorRefMut::<$t>::from_raw(MemoryInfo::default(), data.cast_mut().cast(), Shape::new(dims.to_vec()))
            }
            .map_err(|e| e.to_string())?;
            Ok(Some(Arc::new(owned(tensor).into_dyn())))
        }};
    }
    match data_type {
        elem::FLOAT => typed!(f32),
        elem::FLOAT16 => typed!(half::f16),
        elem::DOUBLE => typed!(f64),
        elem::INT8 => typed!(i8),
        elem::UINT8 => typed!(u8),
        elem::INT16 => typed!(i16),
        elem::UINT16 => typed!(u16),
        elem::INT32 => typed!(i32),
        elem::UINT32 => typed!(u32),
        elem::INT64 => typed!(i64),
        elem::UINT64 => typed!(u64),
        elem::BOOL => typed!(bool),
        _ => Ok(None),
    }
}

/// The value a [`TensorRefMut`] wraps, as an owned value: dropping it
/// releases the ONNX Runtime value and never the memory it points to, which
/// the value does not own.
fn owned<T: PrimitiveTensorElementType + std::fmt::Debug>(tensor: TensorRefMut<'static, T>) -> ort::value::Tensor<T> {
    // ort offers no way to own a value made over borrowed memory. The
    // reference wrapper must be the value it derefs to and nothing more
    // (a marker), so that moving the value out of it leaves nothing behind
    // and duplicates nothing: checked at compile time, for every element
    // type, against the ort in use.
    const {
        assert!(std::mem::size_of::<TensorRefMut<'static, T>>() == std::mem::size_of::<ort::value::Tensor<T>>());
        assert!(std::mem::align_of::<TensorRefMut<'static, T>>() == std::mem::align_of::<ort::value::Tensor<T>>());
    }
    // The wrapper holds exactly this value and has no drop of its own.
    let wrapper = std::mem::ManuallyDrop::new(tensor);
    // SAFETY: the wrapper is never dropped, so reading the value out of it
    // moves it: it is released once, by its new owner.
    unsafe { std::ptr::read(&**wrapper) }
}

/// A model's registry of live shared tensors is per repository directory.
pub(crate) fn model_dir(version_dir: &Path) -> PathBuf {
    version_dir.parent().map(Path::to_path_buf).unwrap_or_default()
}

/// A container of packed weights shared by successive versions of a model.
///
/// ONNX Runtime files a packed matrix in the container under a hash of its
/// packed bytes, so a version whose matrix is identical to one already in
/// the container uses that packed copy instead of holding its own: a
/// fine-tune of one layer in ten packs only that layer. The container keeps
/// what it holds until the last version using it goes, so the packed
/// matrices of versions that are gone stay in it. So a version joins the
/// container of the live versions only when it reuses some of their
/// tensors (one that reuses none would find nothing there to share), and
/// only while what the container holds, with what the version adds, stays
/// within [`CHAIN_LIMIT`] times the version's weights. Otherwise it starts a
/// new container, and the old one goes with the last version using it.
pub(crate) struct Chain {
    container: PrepackedWeights,
    /// What the container is estimated to hold: the bytes of every tensor
    /// that was new when its version joined.
    held: AtomicU64,
}

/// How much a container may hold, in multiples of one version's weights.
pub(crate) const CHAIN_LIMIT: u64 = 2;

/// The live container of each model (by repository directory).
static CHAINS: Mutex<Vec<(PathBuf, Weak<Chain>)>> = Mutex::new(Vec::new());

impl Chain {
    /// The container the sessions of a version with `shared` weights use:
    /// the model's live one when it has room (see [`Chain`]), else a new
    /// one, which becomes the model's live container. A version loaded
    /// [`Sharing::Alone`] gets a container of its own that no other joins.
    pub(crate) fn for_version(shared: &SharedWeights, sharing: Sharing) -> Arc<Chain> {
        let (weights, added) = (shared.bytes(), shared.bytes() - shared.reused());
        let fresh = || Arc::new(Chain { container: PrepackedWeights::new(), held: AtomicU64::new(weights) });
        if weights == 0 || sharing == Sharing::Alone {
            // Nothing shared: ONNX Runtime packs into the container only
            // what sessions share, so there is nothing to chain.
            return fresh();
        }
        let mut chains = CHAINS.lock().unwrap_or_else(PoisonError::into_inner);
        chains.retain(|(_, weak)| weak.strong_count() > 0);
        let live = chains.iter().find(|(m, _)| *m == shared.model).and_then(|(_, w)| w.upgrade());
        // A version that reuses no tensor has no packed matrix to find in
        // the live container either; joining it would only keep the older
        // versions' packed matrices alive for as long as this one lives.
        if let Some(chain) = live.filter(|_| shared.reused() > 0) {
            let held = chain.held.load(Ordering::Relaxed);
            if held + added <= CHAIN_LIMIT * weights {
                chain.held.store(held + added, Ordering::Relaxed);
                return chain;
            }
        }
        let chain = fresh();
        chains.retain(|(m, _)| *m != shared.model);
        chains.push((shared.model.clone(), Arc::downgrade(&chain)));
        chain
    }

    /// The container, for the session builder.
    pub(crate) fn container(&self) -> &PrepackedWeights {
        &self.container
    }

    /// The container as the memory book counts it: which one (its
    /// address, the same for every version sharing it) and what it holds.
    pub(crate) fn share(&self) -> baton_core::run::backend::SharedContainer {
        let id = std::ptr::from_ref(self) as u64;
        baton_core::run::backend::SharedContainer { id, holds: self.held.load(Ordering::Relaxed) }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    /// Weights of FP32 tensors `w0`, `w1`, … of 64 × 64, filled with
    /// `values`, one each.
    fn weights_of(model: &Path, values: &[f32]) -> (SharedWeights, tempfile::NamedTempFile) {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        let mut placed = Vec::new();
        for (i, value) in values.iter().enumerate() {
            let bytes: Vec<u8> = std::iter::repeat_n(value.to_le_bytes(), 4096).flatten().collect();
            file.write_all(&bytes).unwrap();
            let range = i as u64 * 16384..(i as u64 + 1) * 16384;
            placed.push(Placed { name: format!("w{i}"), data_type: elem::FLOAT, dims: vec![64, 64], range });
        }
        let len = values.len() as u64 * 16384;
        let shared = SharedWeights::new(model, file.as_file(), len, &placed, Sharing::WithLive).unwrap();
        shared.publish();
        (shared, file)
    }

    fn weights(model: &Path, value: f32) -> (SharedWeights, tempfile::NamedTempFile) {
        weights_of(model, &[value])
    }

    #[test]
    fn identical_tensors_are_reused_and_a_chain_is_left_when_it_would_hold_too_much() {
        if let Err(e) = crate::init() {
            panic!("ONNX Runtime is required for this test [{}]: {}", e.kind, e.message);
        }
        let model = tempfile::tempdir().unwrap();
        let (first, _f1) = weights(model.path(), 1.0);
        let chain = Chain::for_version(&first, Sharing::WithLive);
        // New bytes, nothing reused: a chain of its own, so that the
        // first version's packed matrices go with the first version.
        let (second, _f2) = weights(model.path(), 2.0);
        assert_eq!(second.reused(), 0);
        let second_chain = Chain::for_version(&second, Sharing::WithLive);
        assert!(!Arc::ptr_eq(&second_chain, &chain), "a version that reuses nothing joins no chain");
        drop((chain, second_chain));
        let (third, _f3) = weights(model.path(), 3.0);
        let next = Chain::for_version(&third, Sharing::WithLive);
        // Identical bytes are reused and add nothing: the new chain is joined.
        let (fourth, _f4) = weights(model.path(), 3.0);
        assert_eq!(fourth.reused(), 16384);
        assert!(Arc::ptr_eq(&fourth.tensors()[0], &third.tensors()[0]), "one buffer for both versions");
        assert!(Arc::ptr_eq(&Chain::for_version(&fourth, Sharing::WithLive), &next));
        // Another model never shares.
        let other = tempfile::tempdir().unwrap();
        let (elsewhere, _f5) = weights(other.path(), 3.0);
        assert_eq!(elsewhere.reused(), 0);
        // The reused tensor outlives the version that mapped it.
        drop(third);
        assert!(fourth.tensors()[0].bytes().chunks_exact(4).all(|c| c == 3.0f32.to_le_bytes()));
    }

    #[test]
    fn versions_that_reuse_some_tensors_join_the_chain_until_it_would_hold_twice_their_weights() {
        if let Err(e) = crate::init() {
            panic!("ONNX Runtime is required for this test [{}]: {}", e.kind, e.message);
        }
        let model = tempfile::tempdir().unwrap();
        // Two tensors each; w0 never changes, w1 always does.
        let (first, _f1) = weights_of(model.path(), &[1.0, 1.0]);
        let chain = Chain::for_version(&first, Sharing::WithLive);
        let (second, _f2) = weights_of(model.path(), &[1.0, 2.0]);
        assert_eq!(second.reused(), 16384);
        assert!(Arc::ptr_eq(&Chain::for_version(&second, Sharing::WithLive), &chain), "1.5 times: room");
        let (third, _f3) = weights_of(model.path(), &[1.0, 3.0]);
        assert!(Arc::ptr_eq(&Chain::for_version(&third, Sharing::WithLive), &chain), "twice: still room");
        let (fourth, _f4) = weights_of(model.path(), &[1.0, 4.0]);
        let next = Chain::for_version(&fourth, Sharing::WithLive);
        assert!(!Arc::ptr_eq(&next, &chain), "2.5 times would be too much: a new chain");
        // Loaded alone, a version shares nothing and joins nothing.
        let (alone, _f5) = weights_of(model.path(), &[1.0, 4.0]);
        assert!(!Arc::ptr_eq(&Chain::for_version(&alone, Sharing::Alone), &next));
    }
}
