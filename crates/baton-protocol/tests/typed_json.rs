//! The typed JSON decoder, which writes tensor data straight into the
//! tensor's buffer, against a straightforward reference: the body parsed
//! into a `serde_json::Value` and converted element by element, as baton
//! decoded requests before. Random tensors of every datatype, flat and
//! nested, valid and not, decode to the same tensors or the same error
//! message; random damage is refused, never a panic; and a request the
//! model cannot take is refused after parsing, before anything is decoded.

use baton_core::tensors::signature::{Signature, TensorSpec};
use baton_core::tensors::tensor::{DataType, TensorData, element_count};
use baton_core::tensors::tensor_json::f32_to_f16;
use baton_protocol::{CodecError, decode_request, decode_response, parse_request};
use proptest::prelude::*;
use serde_json::Value;

/// The reference: tensor data from a parsed JSON value, by the element
/// rules baton has always had, with the same messages.
fn reference(name: &str, datatype: DataType, shape: &[i64], data: &Value) -> Result<TensorData, String> {
    fn flatten<'a>(value: &'a Value, out: &mut Vec<&'a Value>) {
        match value {
            Value::Array(items) => items.iter().for_each(|v| flatten(v, out)),
            other => out.push(other),
        }
    }
    fn int<T: TryFrom<i64> + TryFrom<u64>>(v: &Value) -> Option<T> {
        match v.as_i64() {
            Some(i) => T::try_from(i).ok(),
            None => v.as_u64().and_then(|u| T::try_from(u).ok()),
        }
    }
    let count = element_count(shape).expect("the reference takes valid shapes");
    let mut flat = Vec::new();
    flatten(data, &mut flat);
    if flat.len() != count {
        return Err(format!("input '{name}': shape {shape:?} needs {count} elements, 'data' has {}", flat.len()));
    }
    if datatype == DataType::Bytes {
        let mut items = Vec::new();
        for (i, v) in flat.iter().enumerate() {
            let s = v.as_str().ok_or_else(|| format!("input '{name}': element {i} ({v}) is not a valid BYTES"))?;
            items.push(s.as_bytes().to_vec());
        }
        return Ok(TensorData::Bytes(items));
    }
    let mut out = Vec::new();
    for (i, v) in flat.iter().enumerate() {
        let bytes: Option<Vec<u8>> = match datatype {
            DataType::Bool => v.as_bool().map(|b| vec![u8::from(b)]),
            DataType::Uint8 => int::<u8>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Int8 => int::<i8>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Uint16 => int::<u16>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Int16 => int::<i16>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Uint32 => int::<u32>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Int32 => int::<i32>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Uint64 => int::<u64>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Int64 => int::<i64>(v).map(|x| x.to_le_bytes().to_vec()),
            DataType::Fp16 => v.as_f64().map(|f| f32_to_f16(f as f32).to_le_bytes().to_vec()),
            DataType::Fp32 => v.as_f64().map(|f| (f as f32).to_le_bytes().to_vec()),
            DataType::Fp64 => v.as_f64().map(|f| f.to_le_bytes().to_vec()),
            DataType::Bytes => None,
        };
        out.extend(bytes.ok_or_else(|| format!("input '{name}': element {i} ({v}) is not a valid {datatype}"))?);
    }
    Ok(TensorData::Raw(out))
}

/// A request body with one JSON input.
fn body(datatype: DataType, shape: &[i64], data: &str) -> String {
    format!(r#"{{"inputs":[{{"name":"x","datatype":"{datatype}","shape":{shape:?},"data":{data}}}]}}"#)
}

/// The text of an element valid for the datatype, in one of the forms a
/// client may write it.
fn valid_element(datatype: DataType) -> BoxedStrategy<String> {
    fn int<T: Arbitrary + ToString + 'static>() -> BoxedStrategy<String> {
        any::<T>().prop_map(|v| v.to_string()).boxed()
    }
    let finite = any::<f64>().prop_filter("finite", |v| v.is_finite());
    match datatype {
        DataType::Bool => any::<bool>().prop_map(|b| b.to_string()).boxed(),
        DataType::Uint8 => int::<u8>(),
        DataType::Int8 => int::<i8>(),
        DataType::Uint16 => int::<u16>(),
        DataType::Int16 => int::<i16>(),
        DataType::Uint32 => int::<u32>(),
        DataType::Int32 => int::<i32>(),
        DataType::Uint64 => int::<u64>(),
        DataType::Int64 => int::<i64>(),
        DataType::Fp16 | DataType::Fp32 | DataType::Fp64 => prop_oneof![
            finite.clone().prop_map(|v| format!("{v:?}")),
            finite.prop_map(|v| format!("{v:e}")),
            any::<f32>().prop_filter("finite", |v| v.is_finite()).prop_map(|v| v.to_string()),
            any::<i64>().prop_map(|v| v.to_string()),
            any::<u64>().prop_map(|v| v.to_string()),
        ]
        .boxed(),
        DataType::Bytes => any::<String>().prop_map(|s| Value::String(s).to_string()).boxed(),
    }
}

/// The text of an element that may or may not be valid for the datatype.
fn any_element(datatype: DataType) -> BoxedStrategy<String> {
    let other = prop_oneof![
        Just("null".to_owned()),
        Just("true".to_owned()),
        Just("-0".to_owned()),
        Just("0.0".to_owned()),
        Just("1e2".to_owned()),
        Just("-1.5".to_owned()),
        Just("18446744073709551616".to_owned()),
        Just("-9223372036854775809".to_owned()),
        Just("300".to_owned()),
        Just("-129".to_owned()),
        "[a-z\"\\\\]{0,4}".prop_map(|s| Value::String(s).to_string()),
    ];
    prop_oneof![6 => valid_element(datatype), 1 => other].boxed()
}

/// Elements written flat, nested along the shape, each in an array of its
/// own, or (one element) bare; with varying whitespace.
fn layout(shape: &[i64], elements: &[String], form: u8, gap: &str) -> String {
    fn nest(dims: &[i64], elements: &[String], gap: &str) -> String {
        match dims.split_first() {
            None => elements.first().cloned().unwrap_or_else(|| "[]".to_owned()),
            Some((_, [])) => format!("[{}]", elements.join(&format!(",{gap}"))),
            Some((_, rest)) => {
                let inner = rest.iter().product::<i64>().max(1) as usize;
                let parts: Vec<String> = elements.chunks(inner).map(|c| nest(rest, c, gap)).collect();
                format!("[{}]", parts.join(&format!(",{gap}")))
            }
        }
    }
    match form {
        0 => format!("[{}]", elements.join(&format!(",{gap}"))),
        1 if !shape.is_empty() && shape.iter().all(|&d| d > 0) => nest(shape, elements, gap),
        2 => format!("[{}]", elements.iter().map(|e| format!("[{gap}{e}]")).collect::<Vec<_>>().join(",")),
        _ if elements.len() == 1 => format!("{gap}{}", elements[0]),
        _ => format!("[{gap}{}{gap}]", elements.join(",")),
    }
}

fn datatype() -> impl Strategy<Value = DataType> {
    proptest::sample::select(DataType::ALL.to_vec())
}

/// A datatype, a shape of up to 3 dimensions of up to 4, and elements for
/// it laid out in some form: valid ones, as many as the shape needs; or
/// (not `valid`) any, and sometimes one too many or too few.
fn tensor(valid: bool) -> impl Strategy<Value = (DataType, Vec<i64>, String)> {
    let miscount =
        if valid { Just(0).boxed() } else { prop_oneof![4 => Just(0isize), 1 => Just(1), 1 => Just(-1)].boxed() };
    (datatype(), prop::collection::vec(0i64..=4, 0..=3), miscount).prop_flat_map(move |(datatype, shape, miscount)| {
        let count = element_count(&shape).unwrap_or(0).saturating_add_signed(miscount);
        let element = if valid { valid_element(datatype) } else { any_element(datatype) };
        let gap = proptest::sample::select(vec!["", " ", "\n  "]);
        (Just(datatype), Just(shape.clone()), prop::collection::vec(element, count), 0u8..4, gap).prop_map(
            |(datatype, shape, elements, form, gap)| {
                let data = layout(&shape, &elements, form, gap);
                (datatype, shape, data)
            },
        )
    })
}

fn decoded(body: &str) -> Result<TensorData, String> {
    match decode_request(body.as_bytes(), None) {
        Ok(mut request) => Ok(request.inputs.remove(0).data),
        Err(e) => {
            assert!(e.is_client_error(), "{e}");
            Err(e.to_string())
        }
    }
}

proptest! {
    // No failure files in the source tree: a failure prints its minimal case.
    #![proptest_config(ProptestConfig { cases: 384, failure_persistence: None, ..ProptestConfig::default() })]

    /// Valid or not, the typed decoder and the reference agree: the same
    /// bytes, or the same message.
    #[test]
    fn typed_decoding_agrees_with_the_reference((datatype, shape, data) in tensor(false)) {
        let text = body(datatype, &shape, &data);
        let value: Value = serde_json::from_str(&data).expect("generated data is JSON");
        let expected = if value.is_null() {
            // `"data": null` is no data, as it always was.
            Err("input 'x' has neither 'data' nor parameters.binary_data_size".to_owned())
        } else {
            reference("x", datatype, &shape, &value)
        };
        prop_assert_eq!(decoded(&text), expected, "{}", text);
    }

    /// Valid data decodes, into a buffer of exactly the tensor's size.
    #[test]
    fn valid_data_fills_exactly_the_tensor((datatype, shape, data) in tensor(true)) {
        let text = body(datatype, &shape, &data);
        let header = parse_request(text.as_bytes(), None).unwrap();
        let expected = header.inputs().next().unwrap().tensor_bytes();
        let request = header.decode().unwrap();
        let count = element_count(&shape).unwrap();
        match &request.inputs[0].data {
            TensorData::Raw(bytes) => {
                let size = datatype.size().unwrap();
                prop_assert_eq!((bytes.len(), bytes.capacity(), expected), (count * size, count * size, count * size));
            }
            TensorData::Bytes(items) => {
                prop_assert_eq!((items.len(), items.capacity()), (count, count));
                let used = count * size_of::<Vec<u8>>() + items.iter().map(Vec::len).sum::<usize>();
                prop_assert!(used <= expected, "{} > {}", used, expected);
            }
        }
    }

    /// FP64 data reads back exactly, and FP32 data written from an `f32`
    /// too, through requests and (where null is NaN) responses.
    #[test]
    fn floats_read_back_exactly(values in prop::collection::vec(any::<f64>(), 1..8)) {
        let text: Vec<String> = values.iter().map(|v| if v.is_finite() { format!("{v:?}") } else { "null".into() }).collect();
        let response = format!(
            r#"{{"model_name":"m","outputs":[{{"name":"y","datatype":"FP64","shape":[{}],"data":[{}]}}]}}"#,
            values.len(),
            text.join(",")
        );
        let outputs = decode_response(response.as_bytes(), None).unwrap().outputs;
        let TensorData::Raw(bytes) = &outputs[0].data else { panic!("FP64 came back as BYTES") };
        for (got, want) in bytes.chunks_exact(8).zip(&values) {
            let got = f64::from_le_bytes(got.try_into().unwrap());
            prop_assert!(got.to_bits() == want.to_bits() || (got.is_nan() && !want.is_finite()), "{} vs {}", got, want);
        }
        let singles: Vec<f32> = values.iter().map(|&v| v as f32).filter(|v| v.is_finite()).collect();
        let text: Vec<String> = singles.iter().map(f32::to_string).collect();
        let request = body(DataType::Fp32, &[singles.len() as i64], &format!("[{}]", text.join(",")));
        let expected: Vec<u8> = singles.iter().flat_map(|v| v.to_le_bytes()).collect();
        prop_assert_eq!(decoded(&request), Ok(TensorData::Raw(expected)));
    }

    /// Damaged bodies are refused with a client error, never a panic:
    /// truncated, with elements added, removed or of the wrong type, or
    /// with a shape far larger than the data.
    #[test]
    fn damage_is_refused(
        (datatype, shape, elements) in (datatype(), prop::collection::vec(1i64..=4, 1..=3)).prop_flat_map(|(d, s)| {
            let count = element_count(&s).unwrap();
            (Just(d), Just(s), prop::collection::vec(valid_element(d), count))
        }),
        damage in 0u8..5,
        at in any::<prop::sample::Index>(),
        extra in 1usize..4,
    ) {
        let mut elements = elements;
        let mut shape = shape;
        let count = elements.len();
        let needle = match damage {
            0 => {
                let text = body(datatype, &shape, &layout(&shape, &elements, 0, ""));
                let cut = at.index(text.len());
                let e = decode_request(&text.as_bytes()[..cut], None).unwrap_err();
                prop_assert_eq!(e.kind(), "invalid_json");
                return Ok(());
            }
            1 => {
                elements.extend(std::iter::repeat_n(elements[0].clone(), extra));
                format!("needs {count} elements, 'data' has {}", count + extra)
            }
            2 => {
                elements.remove(at.index(count));
                format!("needs {count} elements, 'data' has {}", count - 1)
            }
            3 => {
                let i = at.index(count);
                elements[i] = if datatype == DataType::Bytes { "5".into() } else { "\"5\"".into() };
                format!("element {i} ")
            }
            _ => {
                shape.insert(0, 1 << 40);
                format!("needs {} elements, 'data' has {count}", count << 40)
            }
        };
        let text = body(datatype, &shape, &layout(&shape, &elements, 0, " "));
        let e = decode_request(text.as_bytes(), None).unwrap_err();
        prop_assert!(e.is_client_error());
        prop_assert!(e.to_string().contains(&needle), "{} lacks {}", e, needle);
        if damage == 4 {
            // Refused while parsing: no buffer was ever sized by the shape.
            let parsed = parse_request(text.as_bytes(), None);
            prop_assert!(matches!(parsed, Err(CodecError::InvalidTensor(_))), "{:?}", parsed.map(|h| h.tensor_bytes()));
        }
    }

    /// Parsing says what decoding will take, and the model check refuses a
    /// batch over the limit before anything is decoded.
    #[test]
    fn the_model_check_comes_before_decoding(batch in 0i64..12, max in 1usize..8, width in 1i64..4) {
        let spec = |name: &str, shape: Vec<i64>| TensorSpec { name: name.into(), datatype: DataType::Fp32, shape };
        let signature = Signature { inputs: vec![spec("x", vec![-1, width])], outputs: vec![spec("y", vec![-1])] };
        let elements = vec!["0.5".to_owned(); (batch * width) as usize];
        let text = body(DataType::Fp32, &[batch, width], &layout(&[batch, width], &elements, 1, ""));
        let header = parse_request(text.as_bytes(), None).unwrap();
        prop_assert_eq!(header.tensor_bytes(), elements.len() * 4);
        match header.check(&signature, max) {
            Ok(()) => {
                prop_assert!(batch as usize <= max);
                prop_assert_eq!(header.decode().unwrap().inputs[0].shape.clone(), vec![batch, width]);
            }
            Err(e) => {
                prop_assert!(batch as usize > max);
                prop_assert_eq!(e.kind(), "batch_too_large");
            }
        }
    }
}
