//! The warmup stage: run representative inputs through every instance
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

mod generate;

pub use generate::{generated, ungenerable};

use crate::files::spec::ModelSpec;
use crate::run::backend::Model;
use crate::run::warmed::{Sample, Warmed};
use crate::tensors::signature::Signature;
use crate::tensors::tensor::{DataType, Tensor, TensorData};
use crate::tensors::tensor_json::tensor_from_json;

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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SampleFile {
    inputs: Vec<SampleTensor>,
}

/// One tensor of a sample file, in the KServe V2 JSON form.
#[derive(Deserialize)]
pub(crate) struct SampleTensor {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    data: serde_json::Value,
}

impl SampleTensor {
    /// The tensor, its elements checked against its datatype and shape.
    pub(crate) fn into_tensor(self) -> Result<Tensor, String> {
        tensor_from_json(&self.name, self.datatype, self.shape, &self.data)
    }
}

/// The version's shipped samples followed by generated ones, unless inputs
/// cannot be generated for `model` (see [`ungenerable`]); that is logged.
pub fn samples(dir: &Path, spec: &ModelSpec, model: &dyn Model) -> Result<Vec<Sample>, WarmupError> {
    let mut out = shipped(dir)?;
    if spec.warmup.generated {
        match generated(model.signature(), &model.input_ranges(), &spec.warmup.batch_sizes) {
            Ok(samples) => out.extend(samples),
            Err(reason) => {
                // On a lowered loading thread: logged through the registry's agent.
                let (version, shipped) = (dir.display().to_string(), out.len());
                crate::threads::agent::at_serving_priority(move || {
                    tracing::warn!(
                        %version,
                        shipped,
                        %reason,
                        "Warmup generates no inputs for this version: the valid values of an integer input are \
                         unknown. Only its shipped warmup samples run."
                    );
                });
            }
        }
    }
    Ok(out)
}

fn shipped(version: &Path) -> Result<Vec<Sample>, WarmupError> {
    json_files(version, "warmup")
        .into_iter()
        .map(|(file, text)| {
            let text = text.map_err(|e| WarmupError::BadSample { file: file.clone(), reason: e.to_string() })?;
            parse_sample(file, &text)
        })
        .collect()
}

/// The `*.json` files of the version's directory `folder`, sorted, each
/// named by its path in the version (`warmup/a.json`) with its text; none
/// when the version has no such directory. Read by path: see
/// docs/hot-swap.md, "What the verify stage guarantees".
pub(crate) fn json_files(version: &Path, folder: &str) -> Vec<(String, std::io::Result<String>)> {
    let Ok(entries) = std::fs::read_dir(version.join(folder)) else {
        return Vec::new();
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
            let file = format!("{folder}/{}", path.file_name().unwrap_or_default().to_string_lossy());
            (file, std::fs::read_to_string(&path))
        })
        .collect()
}

/// Parses the text of a shipped sample file, named `file` (its path in
/// the version), checking every tensor's elements against its datatype
/// and shape.
pub fn parse_sample(file: String, text: &str) -> Result<Sample, WarmupError> {
    let bad = |reason: String| WarmupError::BadSample { file: file.clone(), reason };
    let parsed: SampleFile = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
    let inputs =
        parsed.inputs.into_iter().map(SampleTensor::into_tensor).collect::<Result<Vec<_>, _>>().map_err(bad)?;
    Ok(Sample { name: file, inputs })
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
/// waiting for a CPU ([`crate::threads::sys::thread_run_delay`]) and stepped aside
/// for threads that wait for one ([`crate::threads::step_aside::paused_here`]).
fn off_cpu() -> Option<Duration> {
    crate::threads::sys::thread_run_delay().map(|waited| waited + crate::threads::step_aside::paused_here())
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

    #[test]
    fn a_runs_time_leaves_out_its_wait_for_a_cpu() {
        let ms = Duration::from_millis;
        assert_eq!(without_waits(ms(2_200), Some(ms(500)), Some(ms(2_400))), ms(300));
        assert_eq!(without_waits(ms(2_200), None, Some(ms(2_400))), ms(2_200));
        assert_eq!(without_waits(ms(2_200), Some(ms(500)), None), ms(2_200));
        assert_eq!(without_waits(ms(10), Some(ms(0)), Some(ms(50))), ms(0));
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
        let got = shipped(dir.path()).unwrap();
        assert_eq!(got[0].name, "warmup/a.json");
        assert_eq!(got[0].inputs[0].to_f32().unwrap(), vec![0.5, 1.0]);
        std::fs::write(warm.join("b.json"), r#"{"inputs":[{"name":"x","datatype":"FP32","shape":[1,2],"data":[1]}]}"#)
            .unwrap();
        let e = shipped(dir.path()).unwrap_err();
        assert!(e.to_string().contains("warmup/b.json") && e.to_string().contains("needs 2 elements"), "{e}");
    }
}
