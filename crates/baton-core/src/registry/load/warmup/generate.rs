//! Warmup inputs generated from a model's signature, integer inputs only
//! within the values the backend says they may take.

use crate::run::backend::{InputRange, ValueRange};
use crate::tensors::signature::Signature;
use crate::tensors::tensor::{DataType, Tensor, TensorData, element_count};

use super::Sample;

/// The most bytes warmup generates for one input: a batch size of
/// `model.toml` times the model's shape may ask for more than the machine
/// has, and then no inputs are generated (see [`generated`]).
pub const MAX_GENERATED_BYTES: usize = 1 << 30;

/// Why inputs cannot be generated for a model with this signature and
/// these input ranges: the first integer input whose valid values are
/// unknown (left out of `ranges`, or [`ValueRange::Unknown`]).
pub fn ungenerable(signature: &Signature, ranges: &[InputRange]) -> Option<String> {
    signature.inputs.iter().filter(|spec| integer_bounds(spec.datatype).is_some()).find_map(|spec| {
        match range_of(ranges, &spec.name) {
            ValueRange::Unknown(why) => Some(format!("input '{}': {why}", spec.name)),
            ValueRange::Within { low, high } if clamp(spec.datatype, low, high).is_none() => {
                Some(format!("input '{}': no value of {} is in [{low}, {high})", spec.name, spec.datatype))
            }
            _ => None,
        }
    })
}

/// What `ranges` says of input `name`; an input left out is unknown.
fn range_of(ranges: &[InputRange], name: &str) -> ValueRange {
    ranges.iter().find(|r| r.name == name).map_or_else(
        || ValueRange::Unknown("the backend does not say which of its values are valid".into()),
        |r| r.range.clone(),
    )
}

/// Inputs generated from the signature: the first variable dimension takes
/// the batch size, other variable ones 1. Floats are spread over [-1, 1];
/// integers over their range ([`ValueRange::Within`]: its ends first, then
/// values spread between them), or 0 where any value is safe. Fails with
/// the reason of [`ungenerable`], or when an input would take more than
/// [`MAX_GENERATED_BYTES`].
pub fn generated(signature: &Signature, ranges: &[InputRange], batch_sizes: &[usize]) -> Result<Vec<Sample>, String> {
    if let Some(reason) = ungenerable(signature, ranges) {
        return Err(reason);
    }
    let batched = signature.inputs.iter().any(|s| s.shape.first().is_some_and(|d| *d < 0));
    let sizes: Vec<usize> = if batched { batch_sizes.to_vec() } else { vec![1] };
    let mut samples = Vec::with_capacity(sizes.len());
    for batch in sizes {
        let mut inputs = Vec::with_capacity(signature.inputs.len());
        for spec in &signature.inputs {
            let shape: Vec<i64> = spec
                .shape
                .iter()
                .enumerate()
                .map(|(i, d)| {
                    if *d >= 0 {
                        *d
                    } else if i == 0 {
                        i64::try_from(batch).unwrap_or(-1)
                    } else {
                        1
                    }
                })
                .collect();
            let element = spec.datatype.size().unwrap_or(size_of::<Vec<u8>>() + b"warmup".len());
            let count =
                element_count(&shape).filter(|n| n.checked_mul(element).is_some_and(|b| b <= MAX_GENERATED_BYTES));
            let Some(count) = count else {
                return Err(format!(
                    "input '{}' at batch size {batch} (shape {shape:?}) would take more than the {MAX_GENERATED_BYTES} \
                     bytes warmup generates for one input",
                    spec.name
                ));
            };
            let data = fill(spec.datatype, count, &range_of(ranges, &spec.name));
            inputs.push(Tensor { name: spec.name.clone(), datatype: spec.datatype, shape, data });
        }
        samples.push(Sample { name: format!("generated-b{batch}"), inputs });
    }
    Ok(samples)
}

/// The values an integer type holds, `None` for other types.
fn integer_bounds(datatype: DataType) -> Option<(i64, i64)> {
    Some(match datatype {
        DataType::Int8 => (i8::MIN.into(), i8::MAX.into()),
        DataType::Uint8 => (0, u8::MAX.into()),
        DataType::Int16 => (i16::MIN.into(), i16::MAX.into()),
        DataType::Uint16 => (0, u16::MAX.into()),
        DataType::Int32 => (i32::MIN.into(), i32::MAX.into()),
        DataType::Uint32 => (0, u32::MAX.into()),
        DataType::Int64 => (i64::MIN, i64::MAX),
        DataType::Uint64 => (0, i64::MAX),
        _ => return None,
    })
}

/// `[low, high)` narrowed to what `datatype` holds, as inclusive ends;
/// `None` if nothing is left.
fn clamp(datatype: DataType, low: i64, high: i64) -> Option<(i64, i64)> {
    let (min, max) = integer_bounds(datatype)?;
    let (low, last) = (low.max(min), high.saturating_sub(1).min(max));
    (low <= last).then_some((low, last))
}

fn fill(datatype: DataType, count: usize, range: &ValueRange) -> TensorData {
    let wave = |i: usize| ((i as f64) * 0.618_033_988_75).fract();
    let spread = |i: usize| wave(i) * 2.0 - 1.0;
    match (datatype, range) {
        (DataType::Bytes, _) => TensorData::Bytes(vec![b"warmup".to_vec(); count]),
        (DataType::Fp32, _) => TensorData::Raw((0..count).flat_map(|i| (spread(i) as f32).to_le_bytes()).collect()),
        (DataType::Fp64, _) => TensorData::Raw((0..count).flat_map(|i| spread(i).to_le_bytes()).collect()),
        (DataType::Fp16, _) => TensorData::Raw(
            (0..count).flat_map(|i| crate::tensors::tensor_json::f32_to_f16(spread(i) as f32).to_le_bytes()).collect(),
        ),
        (other, &ValueRange::Within { low, high }) => {
            let size = other.size().unwrap_or(1);
            let Some((low, last)) = clamp(other, low, high) else {
                return TensorData::Raw(vec![0; count * size]);
            };
            let span = (last - low) as f64;
            let value = |i: usize| match i {
                0 => low,
                1 => last,
                // At most `last`: wave() < 1, and the float product rounds down to an integer.
                _ => low + ((wave(i) * (span + 1.0)).floor() as i64).min(last - low),
            };
            // Little-endian two's complement, cut to the element's width.
            TensorData::Raw((0..count).flat_map(|i| value(i).to_le_bytes().into_iter().take(size)).collect())
        }
        (other, _) => TensorData::Raw(vec![0; count * other.size().unwrap_or(1)]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensors::signature::TensorSpec;

    fn ints(t: &Tensor) -> Vec<i64> {
        let TensorData::Raw(bytes) = &t.data else { panic!("raw data") };
        match t.datatype {
            DataType::Int64 => bytes.chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap())).collect(),
            DataType::Int8 => bytes.iter().map(|b| i64::from(*b as i8)).collect(),
            other => panic!("{other}"),
        }
    }

    fn within(name: &str, low: i64, high: i64) -> InputRange {
        InputRange { name: name.into(), range: ValueRange::Within { low, high } }
    }

    #[test]
    fn generated_samples_follow_the_signature() {
        let sig = Signature {
            inputs: vec![
                TensorSpec { name: "x".into(), datatype: DataType::Fp32, shape: vec![-1, 3] },
                TensorSpec { name: "ids".into(), datatype: DataType::Int64, shape: vec![-1, -1] },
            ],
            outputs: vec![],
        };
        let samples = generated(&sig, &[within("ids", 0, 1000)], &[1, 8]).unwrap();
        assert_eq!(samples.len(), 2);
        assert_eq!(samples[1].inputs[0].shape, vec![8, 3]);
        assert_eq!(samples[1].inputs[1].shape, vec![8, 1]);
        for t in &samples[1].inputs {
            t.check_consistent().unwrap();
        }
        let fixed = Signature {
            inputs: vec![TensorSpec { name: "x".into(), datatype: DataType::Fp32, shape: vec![2, 3] }],
            outputs: vec![],
        };
        assert_eq!(generated(&fixed, &[], &[1, 8, 32]).unwrap().len(), 1, "no batch dimension, one sample");
    }

    #[test]
    fn batch_sizes_past_memory_generate_nothing() {
        let sig = Signature {
            inputs: vec![TensorSpec { name: "x".into(), datatype: DataType::Fp32, shape: vec![-1, 256] }],
            outputs: vec![],
        };
        for batch in [1 << 40, usize::MAX, (MAX_GENERATED_BYTES / 1024) + 1] {
            let e = generated(&sig, &[], &[1, batch]).unwrap_err();
            assert!(e.contains("input 'x'") && e.contains(&format!("batch size {batch}")), "{e}");
        }
    }

    #[test]
    fn integer_inputs_are_generated_within_their_range_or_not_at_all() {
        let spec = |name: &str, datatype| TensorSpec { name: name.into(), datatype, shape: vec![-1] };
        let sig = Signature {
            inputs: vec![spec("ids", DataType::Int64), spec("mask", DataType::Int64), spec("small", DataType::Int8)],
            outputs: vec![],
        };
        let any = InputRange { name: "mask".into(), range: ValueRange::Any };
        let ranges = vec![within("ids", 3, 1000), any.clone(), within("small", -5, 1000)];
        let samples = generated(&sig, &ranges, &[64]).unwrap();
        let ids = ints(&samples[0].inputs[0]);
        assert!(ids.iter().all(|v| (3..1000).contains(v)), "{ids:?}");
        assert_eq!((ids[0], ids[1]), (3, 999), "the range's ends come first");
        let mut distinct = ids.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 40, "values spread over the range: {distinct:?}");
        assert!(ints(&samples[0].inputs[1]).iter().all(|v| *v == 0));
        let small = ints(&samples[0].inputs[2]);
        assert!(small.iter().all(|v| (-5..=127).contains(v)) && small[1] == 127, "cut to INT8: {small:?}");

        let unknown = InputRange { name: "mask".into(), range: ValueRange::Unknown("it is a shape".into()) };
        let reason = generated(&sig, &[within("ids", 0, 9), unknown, within("small", 0, 9)], &[1]).unwrap_err();
        assert_eq!(reason, "input 'mask': it is a shape");
        let reason = generated(&sig, &[within("ids", 0, 9), any], &[1]).unwrap_err();
        assert!(reason.starts_with("input 'small'") && reason.contains("does not say"), "{reason}");
        let empty = [within("ids", 0, 9), within("mask", 0, 9), within("small", 200, 300)];
        assert!(ungenerable(&sig, &empty).unwrap().contains("no value of INT8"));
        assert_eq!(ungenerable(&sig, &ranges), None);
    }
}
