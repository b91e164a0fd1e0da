//! How tensors lie in a shared region, so that no control message grows
//! with them.
//!
//! A frame is the tensors of one call (or one answer), each at an offset
//! aligned to a cache line, then its index: a JSON list of [`Meta`], one
//! per tensor (name, datatype, shape, offset, length). A `BYTES` tensor's
//! element lengths lie in the region too, as little-endian `u32`s before
//! its elements. The control message carries only where the index lies
//! ([`Placed`]), so it is small whatever the tensors are: a string model's
//! answer of a hundred thousand elements is no larger a message than one
//! float's.
//!
//! Reading a frame checks every offset, length, count and shape against
//! the region and the datatype, so a confused or hostile peer yields an
//! error, never a read out of bounds. Its tensors must lie apart from one
//! another, and their number and the memory their copies take are bounded
//! ([`Bounds`]): a frame never costs its reader more than its region (and,
//! for string elements, their bookkeeping), however its index names the
//! bytes. The server reads what a worker wrote by copying it out
//! ([`read`]); a worker reads the server's inputs where they lie
//! ([`views`]).

use baton_core::tensors::tensor::{DataType, Tensor, TensorData, TensorView, ViewData, element_count};
use serde::{Deserialize, Serialize};

use crate::region::PeerRegion;

/// Where each tensor starts: a multiple of a cache line.
pub const ALIGN: usize = 64;

/// The bytes of one `BYTES` element's length.
const LENGTH: usize = std::mem::size_of::<u32>();

/// What one `BYTES` element costs once copied out, besides its bytes: the
/// `Vec` that holds it.
pub const HELD_PER_ELEMENT: usize = std::mem::size_of::<Vec<u8>>();

/// The most bytes of index one tensor may take: its name, datatype, shape,
/// offset and length, in JSON.
pub const INDEX_PER_TENSOR: usize = 4096;

/// What one frame may hold, as its reader bounds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// The most tensors.
    pub tensors: usize,
    /// The most bytes its tensors may take once copied out ([`held_by`]).
    pub held: usize,
}

/// One tensor as laid out in a region.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Meta {
    /// Input or output name.
    pub name: String,
    /// Element datatype.
    pub datatype: DataType,
    /// Dimensions.
    pub shape: Vec<i64>,
    /// Where its bytes start in the region.
    pub offset: usize,
    /// How many bytes it takes there (for `BYTES`, its element lengths
    /// and its elements).
    pub len: usize,
}

/// Where a frame's index lies in its region: all a control message says
/// of the tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placed {
    /// Where the index starts.
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
}

/// The bytes `tensor` takes in a region, unaligned.
pub fn len_of(tensor: &TensorView<'_>) -> usize {
    match &tensor.data {
        ViewData::Raw(raw) => raw.len(),
        ViewData::Bytes(elements) => elements.len() * LENGTH + elements.iter().map(|e| e.len()).sum::<usize>(),
    }
}

/// What `tensor` is taken to cost once copied out of a region: its bytes
/// there ([`len_of`]), and for a `BYTES` tensor [`HELD_PER_ELEMENT`] more
/// for each element.
pub fn held_by(tensor: &TensorView<'_>) -> usize {
    let elements = match &tensor.data {
        ViewData::Raw(_) => 0,
        ViewData::Bytes(elements) => elements.len(),
    };
    elements.saturating_mul(HELD_PER_ELEMENT).saturating_add(len_of(tensor))
}

/// Where `tensors` go, one after another from offset 0, and where their
/// data ends (the index's offset).
pub fn layout(tensors: &[TensorView<'_>]) -> (Vec<Meta>, usize) {
    let mut offset = 0;
    let metas = tensors
        .iter()
        .map(|tensor| {
            let meta = meta_of(tensor, offset);
            offset += meta.len.next_multiple_of(ALIGN);
            meta
        })
        .collect();
    (metas, offset)
}

fn meta_of(tensor: &TensorView<'_>, offset: usize) -> Meta {
    Meta {
        name: tensor.name.to_owned(),
        datatype: tensor.datatype,
        shape: tensor.shape.to_vec(),
        offset,
        len: len_of(tensor),
    }
}

/// The index of `metas`, as it lies in a region.
pub fn index_bytes(metas: &[Meta]) -> Vec<u8> {
    serde_json::to_vec(metas).unwrap_or_default()
}

/// Writes `tensors` and then `index` (of their [`layout`], whose data ends
/// at `end`) into `region`, which must hold `end + index.len()` bytes.
pub fn write(region: &mut [u8], tensors: &[TensorView<'_>], end: usize, index: &[u8]) -> Result<Placed, String> {
    let need = end.checked_add(index.len()).filter(|need| *need <= region.len());
    need.ok_or_else(|| format!("{end} bytes of tensors and their index do not fit a region of {}", region.len()))?;
    let mut offset = 0;
    for tensor in tensors {
        offset += write_one(region, offset, tensor)?.len.next_multiple_of(ALIGN);
    }
    region[end..end + index.len()].copy_from_slice(index);
    Ok(Placed { offset: end, len: index.len() })
}

/// Writes one tensor into `region` at `offset`, which the caller made sure
/// leaves room for its [`len_of`] bytes.
pub fn write_one(region: &mut [u8], offset: usize, tensor: &TensorView<'_>) -> Result<Meta, String> {
    let meta = meta_of(tensor, offset);
    let target = &mut region[offset..offset + meta.len];
    match &tensor.data {
        ViewData::Raw(raw) => target.copy_from_slice(raw),
        ViewData::Bytes(elements) => {
            let (lengths, mut data) = target.split_at_mut(elements.len() * LENGTH);
            for (element, length) in elements.iter().zip(lengths.chunks_exact_mut(LENGTH)) {
                let len = u32::try_from(element.len())
                    .map_err(|_| format!("tensor '{}': an element of {} bytes", tensor.name, element.len()))?;
                length.copy_from_slice(&len.to_le_bytes());
                let (this, rest) = data.split_at_mut(element.len());
                this.copy_from_slice(element);
                data = rest;
            }
        }
    }
    Ok(meta)
}

/// Writes `index` at `offset` of `region`, which must leave room for it.
pub fn write_index(region: &mut [u8], offset: usize, index: &[u8]) -> Result<Placed, String> {
    let target = offset.checked_add(index.len()).and_then(|end| region.get_mut(offset..end));
    target.ok_or_else(|| format!("an index of {} bytes does not fit the region", index.len()))?.copy_from_slice(index);
    Ok(Placed { offset, len: index.len() })
}

/// What a frame is read from: the peer's region (copied out at checked
/// offsets), or bytes of this process.
pub trait Source {
    /// The `len` bytes at `offset`, copied; `None` when they are not all
    /// there.
    fn copy(&self, offset: usize, len: usize) -> Option<Vec<u8>>;
    /// Its size in bytes.
    fn size(&self) -> usize;
}

impl Source for PeerRegion {
    fn copy(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        self.read(offset, len)
    }

    fn size(&self) -> usize {
        self.len()
    }
}

impl Source for [u8] {
    fn copy(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        self.get(offset..offset.checked_add(len)?).map(<[u8]>::to_vec)
    }

    fn size(&self) -> usize {
        self.len()
    }
}

/// The index at `placed` in `region`, of at most `tensors` tensors, each
/// within the region, of a shape its length fits, and none overlapping
/// another.
pub fn index<S: Source + ?Sized>(region: &S, placed: Placed, tensors: usize) -> Result<Vec<Meta>, String> {
    let most = tensors.max(1).saturating_mul(INDEX_PER_TENSOR);
    if placed.len > most {
        return Err(format!("an index of {} bytes, more than {most} for {tensors} tensors", placed.len));
    }
    let bytes = region
        .copy(placed.offset, placed.len)
        .ok_or_else(|| format!("an index of {} bytes at {} lies outside the region", placed.len, placed.offset))?;
    let metas: Vec<Meta> = serde_json::from_slice(&bytes).map_err(|e| format!("an index baton does not read: {e}"))?;
    if metas.len() > tensors {
        return Err(format!("an index of {} tensors, more than the {tensors} taken", metas.len()));
    }
    for meta in &metas {
        let end = meta.offset.checked_add(meta.len).filter(|end| *end <= region.size());
        end.ok_or_else(|| format!("tensor '{}' lies outside the shared region", meta.name))?;
        count_of(meta, region.size())?;
    }
    apart(&metas)?;
    Ok(metas)
}

/// Checks that no two of `metas` share a byte of the region: together they
/// then take no more than the region.
fn apart(metas: &[Meta]) -> Result<(), String> {
    // Each lies within the region (checked): its end does not overflow.
    let mut spans: Vec<(usize, usize, &str)> =
        metas.iter().filter(|m| m.len > 0).map(|m| (m.offset, m.offset + m.len, m.name.as_str())).collect();
    spans.sort_unstable();
    match spans.windows(2).find(|pair| pair[1].0 < pair[0].1) {
        Some(pair) => Err(format!("tensors '{}' and '{}' overlap in the shared region", pair[0].2, pair[1].2)),
        None => Ok(()),
    }
}

/// What the tensor `meta` describes is taken to cost once copied out (see
/// [`held_by`]); `meta` was checked by [`index`].
fn held_of(meta: &Meta) -> usize {
    match meta.datatype.size() {
        Some(_) => meta.len,
        None => element_count(&meta.shape).unwrap_or(0).saturating_mul(HELD_PER_ELEMENT).saturating_add(meta.len),
    }
}

/// The tensors of the frame whose index is at `placed` in `region`,
/// copied out, within `bounds`.
pub fn read<S: Source + ?Sized>(region: &S, placed: Placed, bounds: Bounds) -> Result<Vec<Tensor>, String> {
    let metas = index(region, placed, bounds.tensors)?;
    let held = metas.iter().fold(0usize, |sum, meta| sum.saturating_add(held_of(meta)));
    if held > bounds.held {
        let most = bounds.held;
        return Err(format!("tensors that take {held} bytes once copied out, more than the {most} taken"));
    }
    metas.into_iter().map(|meta| read_one(region, meta)).collect()
}

/// How many elements `meta` has, and, for a fixed-size datatype, checks
/// its length against them.
fn count_of(meta: &Meta, size: usize) -> Result<usize, String> {
    let name = &meta.name;
    let count = element_count(&meta.shape).ok_or_else(|| format!("tensor '{name}' has an invalid shape"))?;
    let elements = meta.datatype.size().map_or(LENGTH, |s| s);
    let least = count.checked_mul(elements).filter(|least| *least <= size);
    let least = least.ok_or_else(|| format!("tensor '{name}': {count} elements do not fit the region"))?;
    if meta.datatype.size().is_some() && least != meta.len {
        return Err(format!("tensor '{name}': {} bytes for {count} elements", meta.len));
    }
    if meta.datatype.size().is_none() && meta.len < least {
        return Err(format!("tensor '{name}': {} bytes hold no lengths for {count} elements", meta.len));
    }
    Ok(count)
}

fn read_one<S: Source + ?Sized>(region: &S, meta: Meta) -> Result<Tensor, String> {
    let outside = || format!("tensor '{}' lies outside the shared region", meta.name);
    let end = meta.offset.checked_add(meta.len).filter(|end| *end <= region.size()).ok_or_else(outside)?;
    let count = count_of(&meta, region.size())?;
    let data = match meta.datatype.size() {
        Some(_) => TensorData::Raw(region.copy(meta.offset, meta.len).ok_or_else(outside)?),
        None => {
            let lengths = region.copy(meta.offset, count * LENGTH).ok_or_else(outside)?;
            let data_at = meta.offset + count * LENGTH;
            let data = region.copy(data_at, end - data_at).ok_or_else(outside)?;
            TensorData::Bytes(split(&meta.name, &lengths, &data)?.map(<[u8]>::to_vec).collect())
        }
    };
    Ok(Tensor { name: meta.name, datatype: meta.datatype, shape: meta.shape, data })
}

/// `data` cut at the little-endian `u32` `lengths`, which must add up to
/// all of it.
fn split<'a>(name: &str, lengths: &'a [u8], data: &'a [u8]) -> Result<impl Iterator<Item = &'a [u8]>, String> {
    let total = lengths
        .chunks_exact(LENGTH)
        .try_fold(0usize, |sum, l| sum.checked_add(u32::from_le_bytes(l.try_into().unwrap_or_default()) as usize));
    if total != Some(data.len()) {
        return Err(format!("tensor '{name}': element lengths do not add up to its bytes"));
    }
    let mut at = 0;
    Ok(lengths.chunks_exact(LENGTH).map(move |l| {
        let len = u32::from_le_bytes(l.try_into().unwrap_or_default()) as usize;
        at += len;
        &data[at - len..at]
    }))
}

/// The tensors `metas` describe where they lie in `region`: no copy.
pub fn views<'a>(region: &'a [u8], metas: &'a [Meta]) -> Result<Vec<TensorView<'a>>, String> {
    metas.iter().map(|meta| view_one(region, meta)).collect()
}

fn view_one<'a>(region: &'a [u8], meta: &'a Meta) -> Result<TensorView<'a>, String> {
    let name = &meta.name;
    let bytes = meta
        .offset
        .checked_add(meta.len)
        .and_then(|end| region.get(meta.offset..end))
        .ok_or_else(|| format!("tensor '{name}' lies outside the shared region"))?;
    let count = count_of(meta, region.len())?;
    let data = match meta.datatype.size() {
        Some(_) => ViewData::Raw(bytes),
        None => {
            let (lengths, data) = bytes.split_at(count * LENGTH);
            ViewData::Bytes(split(name, lengths, data)?.collect())
        }
    };
    Ok(TensorView { name: &meta.name, datatype: meta.datatype, shape: &meta.shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bounds that refuse nothing.
    const ANY: Bounds = Bounds { tensors: 1 << 10, held: usize::MAX };

    fn tensors() -> Vec<Tensor> {
        vec![
            Tensor::from_f32("x", vec![2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            Tensor {
                name: "s".into(),
                datatype: DataType::Bytes,
                shape: vec![3],
                data: TensorData::Bytes(vec![b"ab".to_vec(), Vec::new(), b"cde".to_vec()]),
            },
        ]
    }

    /// A region holding `tensors` as a frame, and where its index is.
    fn frame(tensors: &[Tensor]) -> (Vec<u8>, Placed) {
        let views: Vec<_> = tensors.iter().map(Tensor::view).collect();
        let (metas, end) = layout(&views);
        let index = index_bytes(&metas);
        let mut region = vec![0; end + index.len()];
        let placed = write(&mut region, &views, end, &index).unwrap();
        (region, placed)
    }

    #[test]
    fn tensors_written_read_back_equal_copied_or_in_place() {
        let tensors = tensors();
        let (region, placed) = frame(&tensors);
        let metas = index(&region[..], placed, 2).unwrap();
        assert_eq!(metas[1].offset % ALIGN, 0);
        assert_eq!(read(&region[..], placed, ANY).unwrap(), tensors);
        let views = views(&region, &metas).unwrap();
        assert_eq!(views.iter().map(TensorView::to_tensor).collect::<Vec<_>>(), tensors);
    }

    #[test]
    fn a_message_s_worth_of_metadata_does_not_grow_with_the_elements() {
        let many = vec![Tensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![100_000],
            data: TensorData::Bytes(vec![b"ten bytes!".to_vec(); 100_000]),
        }];
        let (region, placed) = frame(&many);
        assert!(placed.len < 100, "an index of {} bytes", placed.len);
        assert_eq!(read(&region[..], placed, ANY).unwrap(), many);
    }

    #[test]
    fn an_index_that_does_not_fit_the_region_or_its_datatype_is_refused() {
        let tensors = tensors();
        let (region, placed) = frame(&tensors);
        let metas = index(&region[..], placed, 2).unwrap();
        let reread = |metas: &[Meta]| {
            let mut copy = region.clone();
            let index = index_bytes(metas);
            copy.extend_from_slice(&index);
            read(&copy[..], Placed { offset: region.len(), len: index.len() }, ANY)
        };
        let mut outside = metas.clone();
        outside[0].offset = usize::MAX - 2;
        assert!(reread(&outside).unwrap_err().contains("outside"));
        let mut short = metas.clone();
        short[0].shape = vec![2, 4];
        assert!(reread(&short).unwrap_err().contains("bytes for 8 elements"));
        let mut lengths = metas.clone();
        lengths[1].len -= 1;
        assert!(reread(&lengths).unwrap_err().contains("do not add up"));
        let mut huge = metas.clone();
        huge[1].shape = vec![i64::MAX / 2];
        assert!(reread(&huge).is_err());
        let mut negative = metas.clone();
        negative[1].shape = vec![-3];
        assert!(reread(&negative).unwrap_err().contains("invalid shape"));
        assert!(read(&region[..], Placed { offset: placed.offset, len: placed.len + 1 }, ANY).is_err());
        assert!(read(&region[..], Placed { offset: usize::MAX, len: 2 }, ANY).unwrap_err().contains("outside"));
        let views: Vec<_> = tensors.iter().map(Tensor::view).collect();
        assert!(write(&mut [0; 8], &views, 64, b"[]").is_err());
    }

    /// A region of 128 KiB whose index, at 64 KiB, names the same 64 KiB
    /// of bytes 64 times: each tensor lies within the region, together
    /// they are 32 times its size.
    #[test]
    fn tensors_that_overlap_are_refused_before_anything_is_copied() {
        let meta = Meta { name: "y".into(), datatype: DataType::Uint8, shape: vec![65536], offset: 0, len: 65536 };
        let index = index_bytes(&vec![meta; 64]);
        let mut region = vec![0; 128 << 10];
        region[64 << 10..(64 << 10) + index.len()].copy_from_slice(&index);
        let placed = Placed { offset: 64 << 10, len: index.len() };
        let error = read(&region[..], placed, ANY).unwrap_err();
        assert!(error.contains("overlap"), "{error}");
    }

    /// Two tensors apart are read; the same two overlapping by one byte
    /// are not; tensors of no bytes overlap nothing.
    #[test]
    fn tensors_apart_are_read_and_one_shared_byte_is_refused() {
        let meta = |name: &str, offset| Meta {
            name: name.into(),
            datatype: DataType::Uint8,
            shape: vec![64],
            offset,
            len: 64,
        };
        let empty = Meta { name: "e".into(), datatype: DataType::Uint8, shape: vec![0], offset: 32, len: 0 };
        let at = |metas: &[Meta]| {
            let index = index_bytes(metas);
            let mut region = vec![7; 4096];
            region[1024..1024 + index.len()].copy_from_slice(&index);
            read(&region[..], Placed { offset: 1024, len: index.len() }, ANY)
        };
        assert_eq!(at(&[meta("a", 0), meta("b", 64), empty.clone()]).unwrap().len(), 3);
        assert!(at(&[meta("a", 0), meta("b", 63)]).unwrap_err().contains("'a' and 'b' overlap"));
    }

    /// The number of tensors, the index's length and what the tensors take
    /// once copied out are bounded: a string tensor of many empty elements
    /// costs far more copied out than in the region.
    #[test]
    fn a_frame_past_its_bounds_is_refused() {
        let tensors = tensors();
        let (region, placed) = frame(&tensors);
        assert!(read(&region[..], placed, Bounds { tensors: 1, held: usize::MAX }).unwrap_err().contains("2 tensors"));
        let mut long = region.clone();
        long.resize(placed.offset + INDEX_PER_TENSOR + 1, b' ');
        let long_index = Placed { offset: placed.offset, len: INDEX_PER_TENSOR + 1 };
        assert!(read(&long[..], long_index, Bounds { tensors: 1, held: usize::MAX }).is_err());
        let empties = vec![Tensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![1000],
            data: TensorData::Bytes(vec![Vec::new(); 1000]),
        }];
        let (region, placed) = frame(&empties);
        let held = held_by(&empties[0].view());
        assert_eq!(held, 1000 * (HELD_PER_ELEMENT + LENGTH));
        assert_eq!(read(&region[..], placed, Bounds { tensors: 1, held }).unwrap(), empties);
        let error = read(&region[..], placed, Bounds { tensors: 1, held: held - 1 }).unwrap_err();
        assert!(error.contains("copied out"), "{error}");
    }
}
