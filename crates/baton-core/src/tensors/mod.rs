//! Tensors and what a model declares about them: the tensor type that
//! crosses every boundary, the signature of a model's inputs and outputs,
//! and tensors as JSON values. The ground floor of the core: it imports no
//! other room.

pub mod signature;
pub mod tensor;
pub mod tensor_json;
