//! Values as people write and read them: byte counts in `model.toml` and
//! messages, numbers and lists in log fields. It imports no other room.

pub mod bytes;
pub mod fields;
