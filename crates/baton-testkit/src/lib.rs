//! baton-testkit

pub mod onnx;
