//! Tensors in a shared region: each one's bytes at an offset aligned to a
//! cache line, described by a [`Meta`] that travels in the control message.
//! Reading back checks every offset, length and shape against the region
//! and the datatype, so a confused or hostile peer yields an error, never a
//! read out of bounds.

use baton_core::tensor::{DataType, Tensor, TensorData, TensorView, ViewData, element_count};
use serde::{Deserialize, Serialize};

/// Where each tensor starts: a multiple of a cache line.
pub const ALIGN: usize = 64;

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
    /// How many bytes it takes there.
    pub len: usize,
    /// For `BYTES`: each element's length, its elements laid end to end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<Vec<usize>>,
}

fn bytes_of(tensor: &Tensor) -> usize {
    match &tensor.data {
        TensorData::Raw(raw) => raw.len(),
        TensorData::Bytes(elements) => elements.iter().map(Vec::len).sum(),
    }
}

/// The region size `tensors` need.
pub fn size_of(tensors: &[Tensor]) -> usize {
    tensors.iter().map(|t| bytes_of(t).next_multiple_of(ALIGN)).sum()
}

/// Writes `tensors` into `region`, which must hold [`size_of`] bytes.
pub fn write(region: &mut [u8], tensors: &[Tensor]) -> Result<Vec<Meta>, String> {
    if size_of(tensors) > region.len() {
        return Err(format!("{} bytes of tensors do not fit a region of {}", size_of(tensors), region.len()));
    }
    let mut offset = 0;
    let mut metas = Vec::with_capacity(tensors.len());
    for tensor in tensors {
        let meta = write_one(region, offset, &tensor.view());
        offset += meta.len.next_multiple_of(ALIGN);
        metas.push(meta);
    }
    Ok(metas)
}

/// Writes one tensor into `region` at `offset`, which the caller made
/// sure leaves room for its [`TensorView::len`] bytes.
pub fn write_one(region: &mut [u8], offset: usize, tensor: &TensorView<'_>) -> Meta {
    let len = tensor.len();
    let target = &mut region[offset..offset + len];
    let elements = match &tensor.data {
        ViewData::Raw(raw) => {
            target.copy_from_slice(raw);
            None
        }
        ViewData::Bytes(elements) => {
            let mut at = 0;
            for element in elements {
                target[at..at + element.len()].copy_from_slice(element);
                at += element.len();
            }
            Some(elements.iter().map(|e| e.len()).collect())
        }
    };
    Meta {
        name: tensor.name.to_owned(),
        datatype: tensor.datatype,
        shape: tensor.shape.to_vec(),
        offset,
        len,
        elements,
    }
}

/// Reads the tensors `metas` describe out of `region`: copies.
pub fn read(region: &[u8], metas: &[Meta]) -> Result<Vec<Tensor>, String> {
    metas.iter().map(|meta| Ok(view_one(region, meta)?.to_tensor())).collect()
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
    let count = element_count(&meta.shape).ok_or_else(|| format!("tensor '{name}' has an invalid shape"))?;
    let data = match (meta.datatype.size(), &meta.elements) {
        (Some(size), None) => {
            if count.checked_mul(size) != Some(meta.len) {
                return Err(format!("tensor '{name}': {} bytes for {count} elements", meta.len));
            }
            ViewData::Raw(bytes)
        }
        (None, Some(lengths)) => {
            if lengths.len() != count || lengths.iter().try_fold(0usize, |a, l| a.checked_add(*l)) != Some(meta.len) {
                return Err(format!("tensor '{name}': element lengths do not add up to its bytes"));
            }
            let mut at = 0;
            ViewData::Bytes(
                lengths
                    .iter()
                    .map(|l| {
                        at += l;
                        &bytes[at - l..at]
                    })
                    .collect(),
            )
        }
        _ => return Err(format!("tensor '{name}': element lengths given for the wrong datatype")),
    };
    Ok(TensorView { name: &meta.name, datatype: meta.datatype, shape: &meta.shape, data })
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn tensors_written_read_back_equal() {
        let tensors = tensors();
        let mut region = vec![0; size_of(&tensors)];
        let metas = write(&mut region, &tensors).unwrap();
        assert_eq!(metas[1].offset % ALIGN, 0);
        assert_eq!(read(&region, &metas).unwrap(), tensors);
    }

    #[test]
    fn a_meta_that_does_not_fit_the_region_or_its_datatype_is_refused() {
        let tensors = tensors();
        let mut region = vec![0; size_of(&tensors)];
        let metas = write(&mut region, &tensors).unwrap();
        let mut outside = metas[0].clone();
        outside.offset = usize::MAX - 2;
        assert!(read(&region, &[outside]).unwrap_err().contains("outside"));
        let mut short = metas[0].clone();
        short.shape = vec![2, 4];
        assert!(read(&region, &[short]).unwrap_err().contains("bytes for 8 elements"));
        let mut lengths = metas[1].clone();
        lengths.elements = Some(vec![1, 1, 1]);
        assert!(read(&region, &[lengths]).is_err());
        assert!(write(&mut [0; 8], &tensors).is_err());
    }
}
