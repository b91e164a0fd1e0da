//! JSON tensor data decoded straight into the tensor's buffer: a serde
//! visitor walks the flat or nested arrays and writes each element, checked
//! against the datatype, as little-endian bytes into a buffer of exactly the
//! tensor's size (BYTES: a vector of exactly the element count). Nothing
//! proportional to the JSON is built, so a request's memory is its body and
//! its tensors.
//!
//! The element rules: BOOL takes `true`/`false`; integer types take JSON
//! integers in their range (no fractions, no exponents); FP16/FP32/FP64
//! take any number, read as the nearest `f64` and then rounded to the
//! type; BYTES takes strings (their UTF-8 bytes); `null` is NaN for
//! floating-point types when [`NullFloats::AsNan`] says so, else invalid.

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::f32_to_f16;
use crate::tensors::tensor::{DataType, TensorData};

/// What a JSON `null` element of a floating-point tensor means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NullFloats {
    /// An invalid element: requests must carry numbers.
    Reject,
    /// NaN: baton (like serde_json) writes NaN and ±Inf as `null`.
    AsNan,
}

/// Why JSON tensor data did not decode.
#[derive(Debug)]
pub enum ElementsError {
    /// The data holds another number of elements than the shape needs.
    /// Takes precedence over a bad element.
    Count {
        /// Elements found, all nesting levels together.
        found: usize,
    },
    /// The first element that is not a valid value of the datatype.
    Element {
        /// Its position in row-major order.
        index: usize,
        /// It, as JSON (an object is shown as `{…}`).
        found: String,
    },
    /// The text is not JSON, or nests deeper than serde_json allows; the
    /// error's line and column are within the text.
    Json(serde_json::Error),
}

/// The most elements JSON text of `len` bytes can hold: a flat array of n
/// one-character elements takes 2n + 1 bytes, and a lone element one byte.
/// A shape needing more elements than this is refused before any buffer
/// is sized by it.
pub fn max_json_elements(len: usize) -> usize {
    len.div_ceil(2)
}

/// Checks, without allocating, that `text` can hold `count` elements: in
/// O(1) when [`max_json_elements`] allows it, else by counting them (then
/// [`ElementsError::Count`], since they cannot be `count`). Whether they
/// are exactly `count` is known only once they are decoded.
pub fn check_json_count(text: &str, count: usize) -> Result<(), ElementsError> {
    if count <= max_json_elements(text.len()) {
        return Ok(());
    }
    let mut sink = Sink::new(DataType::Bool, 0, NullFloats::Reject);
    walk_text(text, &mut sink).map_err(ElementsError::Json)?;
    Err(ElementsError::Count { found: sink.seen })
}

/// Decodes JSON tensor data (flat or nested, row-major; a lone element
/// counts as one) of `count` elements of `datatype` into a buffer of
/// exactly the tensor's size. Elements past `count`, and every element
/// after a bad one, are only counted, never stored, so the error can say
/// how many there were.
pub fn elements_from_json(
    text: &str,
    datatype: DataType,
    count: usize,
    nulls: NullFloats,
) -> Result<TensorData, ElementsError> {
    check_json_count(text, count)?;
    let mut sink = Sink::new(datatype, count, nulls);
    walk_text(text, &mut sink).map_err(ElementsError::Json)?;
    sink.finish()
}

/// Decodes an already parsed JSON value, by the same rules as
/// [`elements_from_json`]; its elements are counted before the buffer is
/// sized.
pub fn elements_from_value(
    value: &Value,
    datatype: DataType,
    count: usize,
    nulls: NullFloats,
) -> Result<TensorData, ElementsError> {
    let found = count_value(value);
    if found != count {
        return Err(ElementsError::Count { found });
    }
    let mut sink = Sink::new(datatype, count, nulls);
    Walk(&mut sink).deserialize(value).map_err(ElementsError::Json)?;
    sink.finish()
}

fn count_value(value: &Value) -> usize {
    match value {
        Value::Array(items) => items.iter().map(count_value).sum(),
        _ => 1,
    }
}

fn walk_text(text: &str, sink: &mut Sink) -> Result<(), serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    Walk(sink).deserialize(&mut deserializer)?;
    deserializer.end()
}

/// One element as the parser gave it.
#[derive(Clone, Copy)]
enum Element<'a> {
    Null,
    Bool(bool),
    Unsigned(u64),
    Signed(i64),
    Float(f64),
    Str(&'a str),
    Object,
}

impl Element<'_> {
    fn int<T: TryFrom<u64> + TryFrom<i64>>(self) -> Option<T> {
        match self {
            Element::Unsigned(u) => T::try_from(u).ok(),
            Element::Signed(i) => T::try_from(i).ok(),
            _ => None,
        }
    }

    fn float(self, nulls: NullFloats) -> Option<f64> {
        match self {
            Element::Unsigned(u) => Some(u as f64),
            Element::Signed(i) => Some(i as f64),
            Element::Float(f) => Some(f),
            Element::Null if nulls == NullFloats::AsNan => Some(f64::NAN),
            _ => None,
        }
    }

    /// The element as JSON, for an error message.
    fn render(self) -> String {
        let value = match self {
            Element::Null => Value::Null,
            Element::Bool(b) => Value::Bool(b),
            Element::Unsigned(u) => Value::from(u),
            Element::Signed(i) => Value::from(i),
            Element::Float(f) => Value::from(f),
            Element::Str(s) => Value::String(s.to_owned()),
            Element::Object => return "{…}".to_owned(),
        };
        value.to_string()
    }
}

/// Where the elements go: the tensor's buffer, sized once, and the count.
struct Sink {
    datatype: DataType,
    count: usize,
    nulls: NullFloats,
    raw: Vec<u8>,
    items: Vec<Vec<u8>>,
    /// Elements seen so far, stored or not.
    seen: usize,
    /// The first bad element: its index and rendering.
    bad: Option<(usize, String)>,
}

impl Sink {
    fn new(datatype: DataType, count: usize, nulls: NullFloats) -> Sink {
        let (raw, items) = match datatype.size() {
            Some(size) => (Vec::with_capacity(count.saturating_mul(size)), Vec::new()),
            None => (Vec::new(), Vec::with_capacity(count)),
        };
        Sink { datatype, count, nulls, raw, items, seen: 0, bad: None }
    }

    fn element(&mut self, element: Element<'_>) {
        let index = self.seen;
        self.seen += 1;
        if index >= self.count || self.bad.is_some() {
            return;
        }
        if self.store(element).is_none() {
            self.bad = Some((index, element.render()));
        }
    }

    /// Appends one element; `None` when it is not a valid value.
    fn store(&mut self, element: Element<'_>) -> Option<()> {
        let out = &mut self.raw;
        match self.datatype {
            DataType::Bool => match element {
                Element::Bool(b) => out.push(u8::from(b)),
                _ => return None,
            },
            DataType::Uint8 => out.push(element.int::<u8>()?),
            DataType::Int8 => out.extend_from_slice(&element.int::<i8>()?.to_le_bytes()),
            DataType::Uint16 => out.extend_from_slice(&element.int::<u16>()?.to_le_bytes()),
            DataType::Int16 => out.extend_from_slice(&element.int::<i16>()?.to_le_bytes()),
            DataType::Uint32 => out.extend_from_slice(&element.int::<u32>()?.to_le_bytes()),
            DataType::Int32 => out.extend_from_slice(&element.int::<i32>()?.to_le_bytes()),
            DataType::Uint64 => out.extend_from_slice(&element.int::<u64>()?.to_le_bytes()),
            DataType::Int64 => out.extend_from_slice(&element.int::<i64>()?.to_le_bytes()),
            DataType::Fp16 => out.extend_from_slice(&f32_to_f16(element.float(self.nulls)? as f32).to_le_bytes()),
            DataType::Fp32 => out.extend_from_slice(&(element.float(self.nulls)? as f32).to_le_bytes()),
            DataType::Fp64 => out.extend_from_slice(&element.float(self.nulls)?.to_le_bytes()),
            DataType::Bytes => match element {
                Element::Str(s) => self.items.push(s.as_bytes().to_vec()),
                _ => return None,
            },
        }
        Some(())
    }

    fn finish(self) -> Result<TensorData, ElementsError> {
        if self.seen != self.count {
            return Err(ElementsError::Count { found: self.seen });
        }
        if let Some((index, found)) = self.bad {
            return Err(ElementsError::Element { index, found });
        }
        Ok(match self.datatype {
            DataType::Bytes => TensorData::Bytes(self.items),
            _ => TensorData::Raw(self.raw),
        })
    }
}

/// Walks one JSON value: arrays are descended, anything else is an element.
struct Walk<'s>(&'s mut Sink);

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("tensor data: an element or a flat or nested array of elements")
    }

    fn visit_bool<E>(self, v: bool) -> Result<(), E> {
        self.0.element(Element::Bool(v));
        Ok(())
    }

    fn visit_i64<E>(self, v: i64) -> Result<(), E> {
        self.0.element(Element::Signed(v));
        Ok(())
    }

    fn visit_u64<E>(self, v: u64) -> Result<(), E> {
        self.0.element(Element::Unsigned(v));
        Ok(())
    }

    fn visit_f64<E>(self, v: f64) -> Result<(), E> {
        self.0.element(Element::Float(v));
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.0.element(Element::Str(v));
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        self.0.element(Element::Null);
        Ok(())
    }

    fn visit_none<E>(self) -> Result<(), E> {
        self.0.element(Element::Null);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Walk(&mut *self.0))?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        // Skipped without building it: an object is never an element.
        IgnoredAny.visit_map(map)?;
        self.0.element(Element::Object);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn raw(text: &str, datatype: DataType, count: usize) -> Result<Vec<u8>, ElementsError> {
        match elements_from_json(text, datatype, count, NullFloats::Reject)? {
            TensorData::Raw(bytes) => Ok(bytes),
            TensorData::Bytes(_) => panic!("fixed-size data came back as BYTES"),
        }
    }

    #[test]
    fn text_and_value_decode_alike() {
        for (text, datatype) in [("[[1, 2], [3, 300]]", DataType::Uint16), ("[true, [false]]", DataType::Bool)] {
            let value: Value = serde_json::from_str(text).unwrap();
            let from_value = elements_from_value(&value, datatype, count_value(&value), NullFloats::Reject).unwrap();
            let from_text = elements_from_json(text, datatype, count_value(&value), NullFloats::Reject).unwrap();
            assert_eq!(from_text, from_value, "{text}");
        }
    }

    #[test]
    fn the_buffer_is_exactly_the_tensor() {
        let bytes = raw("[0.5, [1, -2]]", DataType::Fp64, 3).unwrap();
        assert_eq!((bytes.len(), bytes.capacity()), (24, 24));
        assert_eq!(bytes[16..], (-2.0f64).to_le_bytes());
        match elements_from_json(r#"["a", "b\u00e9"]"#, DataType::Bytes, 2, NullFloats::Reject).unwrap() {
            TensorData::Bytes(items) => {
                assert_eq!(items, vec![b"a".to_vec(), "bé".as_bytes().to_vec()]);
                assert_eq!(items.capacity(), 2);
            }
            TensorData::Raw(_) => panic!("BYTES came back raw"),
        }
    }

    #[test]
    fn counts_win_over_bad_elements_and_are_exact() {
        let e = raw(r#"[1, "x", 3, 4]"#, DataType::Int32, 3).unwrap_err();
        assert!(matches!(e, ElementsError::Count { found: 4 }), "{e:?}");
        let e = raw(r#"[1, "x", 3]"#, DataType::Int32, 3).unwrap_err();
        assert!(matches!(&e, ElementsError::Element { index: 1, found } if found == "\"x\""), "{e:?}");
        let e = raw(r#"[1, {"a": [1, 2]}]"#, DataType::Fp32, 2).unwrap_err();
        assert!(matches!(&e, ElementsError::Element { index: 1, found } if found == "{…}"), "{e:?}");
        let e = check_json_count("[1,2]", 1 << 40).unwrap_err();
        assert!(matches!(e, ElementsError::Count { found: 2 }), "{e:?}");
        assert!(check_json_count("[1,2]", 3).is_ok(), "3 elements could fit in 5 bytes as far as the bound knows");
    }

    #[test]
    fn nulls_are_nan_only_when_asked_and_only_for_floats() {
        let e = raw("[null]", DataType::Fp32, 1).unwrap_err();
        assert!(matches!(&e, ElementsError::Element { index: 0, found } if found == "null"), "{e:?}");
        let nan = elements_from_json("[null]", DataType::Fp16, 1, NullFloats::AsNan).unwrap();
        assert_eq!(nan, TensorData::Raw(f32_to_f16(f32::NAN).to_le_bytes().to_vec()));
        assert!(elements_from_json("[null]", DataType::Int8, 1, NullFloats::AsNan).is_err());
    }

    #[test]
    fn integers_keep_their_ranges_and_reject_fractions() {
        assert_eq!(raw("[-128, 127]", DataType::Int8, 2).unwrap(), vec![0x80, 0x7f]);
        assert!(raw("[128]", DataType::Int8, 1).is_err());
        assert!(raw("[1.0]", DataType::Int32, 1).is_err());
        assert!(raw("[1e2]", DataType::Uint8, 1).is_err());
        assert_eq!(raw("[18446744073709551615]", DataType::Uint64, 1).unwrap(), u64::MAX.to_le_bytes());
        let e = raw("[18446744073709551616]", DataType::Uint64, 1).unwrap_err();
        assert!(matches!(&e, ElementsError::Element { found, .. } if found == "1.8446744073709552e+19"), "{e:?}");
    }

    #[test]
    fn bad_json_is_a_json_error() {
        assert!(matches!(raw("[1e400]", DataType::Fp64, 1), Err(ElementsError::Json(_))));
        let deep = format!("{}1{}", "[".repeat(200), "]".repeat(200));
        assert!(matches!(raw(&deep, DataType::Fp64, 1), Err(ElementsError::Json(_))));
        assert!(elements_from_value(&json!([[1], 2]), DataType::Fp64, 2, NullFloats::Reject).is_ok());
    }
}
