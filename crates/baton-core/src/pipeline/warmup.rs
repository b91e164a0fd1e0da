//! The warmup stage (R9): run representative inputs through every instance
//! of the candidate before it sees traffic, so the first real request finds
//! caches warm and memory allocated, and a model that fails or is too slow on
//! realistic inputs never gets committed.
//!
//! Samples come from two places: files the version ships in `warmup/*.json`
//! (`{"inputs": [{"name", "datatype", "shape", "data"}]}`, the KServe V2 JSON
//! request body), and inputs generated from the signature at each configured
//! batch size.
//!
//! An integer input is often an index: token ids into a vocabulary, say,
//! where a value past the table's end makes the engine fail or read
//! garbage. So integer inputs are generated only from what the backend
//! knows of their values ([`Model::input_ranges`]): within a known range,
//! or 0 where any value is safe. When the backend cannot tell for one of
//! them, baton does not guess: it generates no inputs for that model, says
//! why in a warning and in [`Warmed::generated_skipped`], and warms the
//! version with its shipped samples alone (none, if it ships none).

use std::path::Path;
use std::time::{Duration, Instant};

use serde::Deserialize;
use thiserror::Error;

use crate::backend::{InputRange, Model, ValueRange};
use crate::signature::Signature;
use crate::spec::ModelSpec;
use crate::tensor::{DataType, Tensor, TensorData, element_count};
use crate::tensor_json::tensor_from_json;

/// One warmup request.
#[derive(Clone, Debug)]
pub struct Sample {
    /// Where it came from: the file name, or `generated-b{batch}`.
    pub name: String,
    /// Its inputs.
    pub inputs: Vec<Tensor>,
}

/// Why warmup failed.
#[derive(Debug, Error)]
pub enum WarmupError {
    /// A shipped sample file could not be read or parsed.
    #[error("sample {file}: {reason}")]
    BadSample {
        /// The file.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The model returned an error on a sample.
    #[error("sample {sample} on instance {instance}: {message}")]
    Failed {
        /// The sample.
        sample: String,
        /// Which pooled instance.
        instance: usize,
        /// The engine's error.
        message: String,
    },
    /// The model returned NaN or Inf.
    #[error("sample {sample}: output '{output}' holds NaN or Inf")]
    NonFinite {
        /// The sample.
        sample: String,
        /// The output.
        output: String,
    },
    /// The outputs do not match the signature.
    #[error("sample {sample}: {message}")]
    WrongOutputs {
        /// The sample.
        sample: String,
        /// What differs.
        message: String,
    },
    /// A run took longer than the budget.
    #[error("sample {sample} took {took_ms:.1} ms, over the {budget_ms} ms budget")]
    TooSlow {
        /// The sample.
        sample: String,
        /// How long it took.
        took_ms: f64,
        /// The budget, `warmup.max_latency_ms`.
        budget_ms: u64,
    },
}

impl WarmupError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            WarmupError::BadSample { .. } => "bad_sample",
            WarmupError::Failed { .. } => "inference_failed",
            WarmupError::NonFinite { .. } => "non_finite_output",
            WarmupError::WrongOutputs { .. } => "wrong_outputs",
            WarmupError::TooSlow { .. } => "too_slow",
        }
    }
}

/// What warmup did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Warmed {
    /// Inference runs made.
    pub runs: usize,
    /// The slowest run.
    pub slowest: Duration,
    /// The fastest run: about what the smallest request costs.
    pub fastest: Duration,
    /// Why no inputs were generated although `warmup.generated` is on: an
    /// integer input whose valid values the backend cannot tell.
    pub generated_skipped: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleFile {
    inputs: Vec<SampleTensor>,
}

#[derive(Deserialize)]
struct SampleTensor {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    data: serde_json::Value,
}

/// The version's shipped samples followed by generated ones, unless inputs
/// cannot be generated for `model` (see [`ungenerable`]); that is logged.
pub fn samples(dir: &Path, spec: &ModelSpec, model: &dyn Model) -> Result<Vec<Sample>, WarmupError> {
    let mut out = shipped(&dir.join("warmup"))?;
    if spec.warmup.generated {
        match generated(model.signature(), &model.input_ranges(), &spec.warmup.batch_sizes) {
            Ok(samples) => out.extend(samples),
            Err(reason) => tracing::warn!(
                version = %dir.display(),
                shipped = out.len(),
                reason,
                "Warmup generates no inputs for this version: the valid values of an integer input are \
                 unknown. Only its shipped warmup samples run."
            ),
        }
    }
    Ok(out)
}

fn shipped(dir: &Path) -> Result<Vec<Sample>, WarmupError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut files: Vec<_> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let file = format!("warmup/{}", path.file_name().unwrap_or_default().to_string_lossy());
            let bad = |reason: String| WarmupError::BadSample { file: file.clone(), reason };
            let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
            let parsed: SampleFile = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
            let inputs = parsed
                .inputs
                .into_iter()
                .map(|t| tensor_from_json(&t.name, t.datatype, t.shape, &t.data))
                .collect::<Result<Vec<_>, _>>()
                .map_err(bad)?;
            Ok(Sample { name: file, inputs })
        })
        .collect()
}

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
/// the reason of [`ungenerable`].
pub fn generated(signature: &Signature, ranges: &[InputRange], batch_sizes: &[usize]) -> Result<Vec<Sample>, String> {
    if let Some(reason) = ungenerable(signature, ranges) {
        return Err(reason);
    }
    let batched = signature.inputs.iter().any(|s| s.shape.first().is_some_and(|d| *d < 0));
    let sizes: Vec<usize> = if batched { batch_sizes.to_vec() } else { vec![1] };
    Ok(sizes
        .into_iter()
        .map(|batch| {
            let inputs = signature
                .inputs
                .iter()
                .map(|spec| {
                    let shape: Vec<i64> = spec
                        .shape
                        .iter()
                        .enumerate()
                        .map(|(i, d)| {
                            if *d >= 0 {
                                *d
                            } else if i == 0 {
                                batch as i64
                            } else {
                                1
                            }
                        })
                        .collect();
                    let count = element_count(&shape).unwrap_or(0);
                    let data = fill(spec.datatype, count, &range_of(ranges, &spec.name));
                    Tensor { name: spec.name.clone(), datatype: spec.datatype, shape, data }
                })
                .collect();
            Sample { name: format!("generated-b{batch}"), inputs }
        })
        .collect())
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
            (0..count).flat_map(|i| crate::tensor_json::f32_to_f16(spread(i) as f32).to_le_bytes()).collect(),
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

/// Runs every sample on every instance; checks outputs and latency.
pub fn run(model: &dyn Model, samples: &[Sample], spec: &ModelSpec) -> Result<Warmed, WarmupError> {
    let budget = Duration::from_millis(spec.warmup.max_latency_ms);
    let signature = model.signature();
    let mut warmed = Warmed {
        generated_skipped: spec.warmup.generated.then(|| ungenerable(signature, &model.input_ranges())).flatten(),
        ..Warmed::default()
    };
    for instance in 0..model.instances() {
        for sample in samples {
            let (started, waited) = (Instant::now(), off_cpu());
            let outputs = model.infer_on(instance, &sample.inputs).map_err(|e| WarmupError::Failed {
                sample: sample.name.clone(),
                instance,
                message: e.message,
            })?;
            let took = without_waits(started.elapsed(), waited, off_cpu());
            warmed.runs += 1;
            warmed.slowest = warmed.slowest.max(took);
            warmed.fastest = if warmed.runs == 1 { took } else { warmed.fastest.min(took) };
            if took > budget {
                return Err(WarmupError::TooSlow {
                    sample: sample.name.clone(),
                    took_ms: took.as_secs_f64() * 1000.0,
                    budget_ms: spec.warmup.max_latency_ms,
                });
            }
            check_outputs(signature, sample, &outputs)?;
        }
    }
    Ok(warmed)
}

/// How long the calling thread has been off the CPU on others' account:
/// waiting for a CPU ([`crate::sys::thread_run_delay`]) and stepped aside
/// for threads that wait for one ([`crate::step_aside::paused_here`]).
fn off_cpu() -> Option<Duration> {
    crate::sys::thread_run_delay().map(|waited| waited + crate::step_aside::paused_here())
}

/// A warmup run's wall time less the time its thread was off the CPU on
/// others' account (`before` and `after`: [`off_cpu`] around the run).
/// Warmup runs on the loader thread at the lowest priority, stepping aside
/// for waiting threads: under full load it can wait seconds for a core,
/// which says nothing about the model and must neither fail the budget nor
/// make a light model look heavy.
fn without_waits(elapsed: Duration, before: Option<Duration>, after: Option<Duration>) -> Duration {
    match (before, after) {
        (Some(before), Some(after)) => elapsed.saturating_sub(after.saturating_sub(before)),
        _ => elapsed,
    }
}

fn check_outputs(signature: &Signature, sample: &Sample, outputs: &[Tensor]) -> Result<(), WarmupError> {
    let wrong = |message: String| WarmupError::WrongOutputs { sample: sample.name.clone(), message };
    for spec in &signature.outputs {
        let Some(out) = outputs.iter().find(|o| o.name == spec.name) else {
            return Err(wrong(format!("output '{}' is missing", spec.name)));
        };
        if out.datatype != spec.datatype || !spec.accepts(&out.shape) {
            return Err(wrong(format!(
                "output '{}' is {} {:?}, the signature says {} {:?}",
                out.name, out.datatype, out.shape, spec.datatype, spec.shape
            )));
        }
        out.check_consistent().map_err(wrong)?;
        if out.datatype.is_float() && !all_finite(out) {
            return Err(WarmupError::NonFinite { sample: sample.name.clone(), output: out.name.clone() });
        }
    }
    Ok(())
}

fn all_finite(t: &Tensor) -> bool {
    let TensorData::Raw(bytes) = &t.data else {
        return true;
    };
    match t.datatype {
        DataType::Fp32 => bytes.chunks_exact(4).all(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]).is_finite()),
        DataType::Fp64 => {
            bytes.chunks_exact(8).all(|c| f64::from_le_bytes(c.try_into().unwrap_or_default()).is_finite())
        }
        DataType::Fp16 => bytes.chunks_exact(2).all(|c| (u16::from_le_bytes([c[0], c[1]]) & 0x7c00) != 0x7c00),
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::signature::TensorSpec;

    #[test]
    fn a_runs_time_leaves_out_its_wait_for_a_cpu() {
        let ms = Duration::from_millis;
        assert_eq!(without_waits(ms(2_200), Some(ms(500)), Some(ms(2_400))), ms(300));
        assert_eq!(without_waits(ms(2_200), None, Some(ms(2_400))), ms(2_200));
        assert_eq!(without_waits(ms(2_200), Some(ms(500)), None), ms(2_200));
        assert_eq!(without_waits(ms(10), Some(ms(0)), Some(ms(50))), ms(0));
    }

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

    #[test]
    fn shipped_samples_parse_and_bad_ones_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let warm = dir.path().join("warmup");
        std::fs::create_dir(&warm).unwrap();
        std::fs::write(
            warm.join("a.json"),
            r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[[0.5,1]]}]}"#,
        )
        .unwrap();
        let got = shipped(&warm).unwrap();
        assert_eq!(got[0].name, "warmup/a.json");
        assert_eq!(got[0].inputs[0].to_f32().unwrap(), vec![0.5, 1.0]);
        std::fs::write(warm.join("b.json"), r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1]}]}"#)
            .unwrap();
        let e = shipped(&warm).unwrap_err();
        assert!(e.to_string().contains("warmup/b.json") && e.to_string().contains("needs 2 elements"), "{e}");
    }
}
