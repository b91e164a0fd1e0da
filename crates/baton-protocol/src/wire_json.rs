//! The JSON header as serde structs, for decoding. Typed fields keep the
//! common path fast; tensor `data` stays a slice of the body (a
//! [`RawValue`], checked to be JSON but not converted), because its element
//! type depends on the datatype next to it and it is decoded later straight
//! into the tensor's buffer. Small fields whose type a client may get wrong
//! are [`Checked`], so the error can name the tensor instead of only a line
//! and column.
//!
//! The entries of `inputs` and `outputs` stay slices of the body too
//! ([`Entries`]), each parsed when its turn comes and checked before the
//! next: parsed all at once, an array of `{}` would cost a struct of a
//! few hundred bytes for every three bytes of the body.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::error::CodecError;
use crate::framing::json_error_at;

/// A field that parsed as JSON but may not have the expected type; the
/// value found is kept for the error message.
pub(crate) enum Checked<T> {
    /// The field had the expected type.
    Valid(T),
    /// The field had another type; this is what was found.
    Invalid(Value),
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let value = Value::deserialize(deserializer)?;
        Ok(match T::deserialize(&value) {
            Ok(typed) => Checked::Valid(typed),
            Err(_) => Checked::Invalid(value),
        })
    }
}

/// A JSON object of parameters.
pub(crate) type Parameters = Map<String, Value>;

/// The entries of a JSON array, each still the text of the body it came
/// from: 16 bytes each until it is parsed ([`parse_entry`]).
pub(crate) type Entries<'a> = Vec<&'a RawValue>;

/// Parses one entry of [`Entries`]; a JSON error's line and column are
/// moved to where the entry is in `json`, the header it is a slice of.
pub(crate) fn parse_entry<'a, T: Deserialize<'a>>(json: &[u8], entry: &'a RawValue) -> Result<T, CodecError> {
    let text = entry.get();
    serde_json::from_str(text).map_err(|e| json_error_at(json, offset_in(json, text), &e))
}

/// Where `text`, a slice of `json`, starts in it.
pub(crate) fn offset_in(json: &[u8], text: &str) -> usize {
    (text.as_ptr() as usize).saturating_sub(json.as_ptr() as usize)
}

/// One tensor of a request's `inputs` or a response's `outputs`.
#[derive(Deserialize)]
pub(crate) struct TensorJson<'a> {
    pub(crate) name: Option<Checked<String>>,
    pub(crate) datatype: Option<Checked<String>>,
    pub(crate) shape: Option<Checked<Vec<i64>>>,
    #[serde(borrow)]
    pub(crate) data: Option<&'a RawValue>,
    pub(crate) parameters: Option<Checked<Parameters>>,
}

/// One entry of a request's `outputs`.
#[derive(Deserialize)]
pub(crate) struct RequestedOutputJson {
    pub(crate) name: Option<Checked<String>>,
    pub(crate) parameters: Option<Checked<Parameters>>,
}

/// An inference request's JSON header.
#[derive(Deserialize)]
pub(crate) struct RequestJson<'a> {
    pub(crate) id: Option<Checked<String>>,
    #[serde(borrow)]
    pub(crate) inputs: Option<Entries<'a>>,
    #[serde(borrow)]
    pub(crate) outputs: Option<Entries<'a>>,
    pub(crate) parameters: Option<Checked<Parameters>>,
}

/// An inference response's JSON header (or an error object).
#[derive(Deserialize)]
pub(crate) struct ResponseJson<'a> {
    pub(crate) model_name: Option<Checked<String>>,
    pub(crate) model_version: Option<Value>,
    pub(crate) id: Option<Checked<String>>,
    #[serde(borrow)]
    pub(crate) outputs: Option<Entries<'a>>,
    pub(crate) error: Option<Value>,
}
