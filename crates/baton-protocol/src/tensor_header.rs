//! What a request says about one input before its data is decoded: name,
//! datatype, shape, and the memory its decoded tensor will take. REST and
//! gRPC requests both give these out between parsing and decoding, so a
//! server can check a request against the model and reserve its memory
//! before allocating any of it.

use baton_core::tensors::signature::{InputError, InputShape, Signature};
use baton_core::tensors::tensor::DataType;

/// One tensor of a parsed request, its data not decoded yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorHeader {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    count: usize,
    bytes: usize,
}

impl TensorHeader {
    /// A header for `count` elements whose decoded data takes `bytes`.
    pub(crate) fn new(name: String, datatype: DataType, shape: Vec<i64>, count: usize, bytes: usize) -> TensorHeader {
        TensorHeader { name, datatype, shape, count, bytes }
    }

    /// The tensor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its element datatype.
    pub fn datatype(&self) -> DataType {
        self.datatype
    }

    /// Its concrete shape (every dimension 0 or more).
    pub fn shape(&self) -> &[i64] {
        &self.shape
    }

    /// The number of elements the shape holds, which the data has been or
    /// will be checked to hold.
    pub fn element_count(&self) -> usize {
        self.count
    }

    /// The bytes decoding allocates for this tensor's data: `count × size`
    /// for fixed-size datatypes, exactly. For BYTES, one `Vec<u8>` header
    /// per element plus the elements' bytes: exact for binary data (REST
    /// binary, gRPC raw or typed contents); for JSON strings an upper
    /// bound, the strings' text length (escapes only shrink).
    pub fn tensor_bytes(&self) -> usize {
        self.bytes
    }

    /// The name, datatype and shape, as the model check takes them.
    pub fn input_shape(&self) -> InputShape<'_> {
        InputShape { name: &self.name, datatype: self.datatype, shape: &self.shape }
    }

    pub(crate) fn set_bytes(&mut self, bytes: usize) {
        self.bytes = bytes;
    }

    pub(crate) fn into_parts(self) -> (String, DataType, Vec<i64>) {
        (self.name, self.datatype, self.shape)
    }
}

/// The decoded size of BYTES data: one vector per element and the bytes.
pub(crate) fn bytes_size(count: usize, payload: usize) -> usize {
    count.saturating_mul(size_of::<Vec<u8>>()).saturating_add(payload)
}

/// Checks a request's inputs against the model before decoding (see
/// [`Signature::check_request`]).
pub(crate) fn check<'a>(
    inputs: impl Iterator<Item = &'a TensorHeader>,
    signature: &Signature,
    max_batch_size: usize,
) -> Result<(), InputError> {
    let shapes: Vec<InputShape<'_>> = inputs.map(TensorHeader::input_shape).collect();
    signature.check_request(&shapes, max_batch_size)
}

/// The bytes decoding allocates for all of a request's tensors.
pub(crate) fn total_bytes<'a>(inputs: impl Iterator<Item = &'a TensorHeader>) -> usize {
    inputs.map(TensorHeader::tensor_bytes).fold(0, usize::saturating_add)
}
