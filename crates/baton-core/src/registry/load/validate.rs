//! The validate stage: the model's declared inputs and outputs against
//! `model.toml`, and every weight tensor read from the model file against the
//! model's validation policy ([`crate::files::spec::ValidationPolicy`] says which
//! checks a tensor gets, by its role and content). The version's golden set
//! ([`crate::registry::load::golden`]) runs in this stage too, after these checks.

use thiserror::Error;

mod rule;
mod stats;

use crate::files::spec::ModelSpec;
use crate::registry::load::golden::GoldenError;
use crate::run::backend::{Model, Weight, WeightsError};
use crate::tensors::tensor::DataType;

use rule::Checks;
use stats::{Float, Stats};

/// Why validation refused a candidate.
#[derive(Debug, Error)]
pub enum ValidateError {
    /// The model's inputs or outputs contradict `model.toml`.
    #[error("signature contradicts model.toml: {}", .0.join("; "))]
    Signature(Vec<String>),
    /// A weight tensor failed a check.
    #[error("tensor '{tensor}': {problem}")]
    Tensor {
        /// Stable kind of the check that failed.
        kind: &'static str,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        problem: String,
    },
    /// A tensor declared in `model.toml` is not in the model.
    #[error("tensor '{0}' is declared in model.toml but not in the model")]
    MissingTensor(String),
    /// The weights could not be read.
    #[error("{0}")]
    Read(String),
    /// The golden set refused the model, or could not be used.
    #[error("{0}")]
    Golden(#[from] GoldenError),
}

impl ValidateError {
    /// Stable kind string.
    pub fn kind(&self) -> &'static str {
        match self {
            ValidateError::Signature(_) => "signature_mismatch",
            ValidateError::Tensor { kind, .. } => kind,
            ValidateError::MissingTensor(_) => "missing_tensor",
            ValidateError::Read(_) => "unreadable_weights",
            ValidateError::Golden(e) => e.kind(),
        }
    }
}

/// What validation looked at.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checked {
    /// Weight tensors visited.
    pub tensors: usize,
    /// Elements whose values were checked (those of floating-point tensors).
    pub elements: u64,
}

/// Runs every configured check; stops at the first failure.
pub fn validate(model: &dyn Model, spec: &ModelSpec) -> Result<Checked, ValidateError> {
    let contradictions = model.signature().contradictions(&spec.declared_signature());
    if !contradictions.is_empty() {
        return Err(ValidateError::Signature(contradictions));
    }
    let policy = &spec.validation;
    let mut checked = Checked::default();
    let mut seen = Vec::new();
    let mut failure: Option<ValidateError> = None;
    let outcome = model.visit_weights(&mut |w: &Weight<'_>| {
        checked.tensors += 1;
        seen.push(w.name.to_owned());
        match check_tensor(w, spec) {
            Ok(elements) => {
                checked.elements += elements;
                Ok(())
            }
            Err(e) => {
                let message = e.to_string();
                failure = Some(e);
                Err(message)
            }
        }
    });
    if let Some(e) = failure {
        return Err(e);
    }
    match outcome {
        Ok(()) => {}
        Err(WeightsError::Read(m) | WeightsError::Refused(m)) => {
            return Err(ValidateError::Read(m));
        }
    }
    if let Some(missing) = policy.tensors.iter().find(|d| !seen.contains(&d.name)) {
        return Err(ValidateError::MissingTensor(missing.name.clone()));
    }
    Ok(checked)
}

fn refuse(kind: &'static str, tensor: &str, problem: String) -> ValidateError {
    ValidateError::Tensor { kind, tensor: tensor.to_owned(), problem }
}

/// Checks one tensor; returns how many of its elements had their values
/// checked (those of floating-point tensors).
fn check_tensor(w: &Weight<'_>, spec: &ModelSpec) -> Result<u64, ValidateError> {
    let policy = &spec.validation;
    if let Some(declared) = policy.tensors.iter().find(|d| d.name == w.name)
        && (w.datatype != Some(declared.datatype) || !declared.accepts(w.shape))
    {
        let got = w.datatype.map_or("an unsupported type", DataType::as_str);
        return Err(refuse(
            "declared_mismatch",
            w.name,
            format!(
                "model.toml declares {} {:?}, the model has {} {:?}",
                declared.datatype, declared.shape, got, w.shape
            ),
        ));
    }
    // Integer tensors are indices, shapes and quantized codes: no value of
    // theirs says the file is corrupt.
    let Some((datatype, float)) = w.datatype.and_then(|d| Float::of(d).map(|f| (d, f))) else {
        return Ok(0);
    };
    let count = (w.data.len() / float.size()) as u64;
    // Most weights pass: one pass decides that (for FP32, the common case,
    // a branch-free one over the bits), and only a tensor it flags goes
    // through `scan`, which names the element.
    let stats = match datatype {
        DataType::Fp32 => Stats::fp32(w.data),
        other => Stats::by_elements(other, float, w.data),
    };
    if Checks::new(policy, w.role, w.shape, count, &stats).pass(float, &stats) {
        return Ok(count);
    }
    rule::scan(policy, w.role, w.shape, datatype, float, w.data)
        .map_err(|(kind, problem)| refuse(kind, w.name, problem))?;
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::backend::WeightRole;
    use crate::tensors::signature::TensorSpec;

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn check(values: &[f32], shape: &[i64], role: WeightRole, spec: &ModelSpec) -> Option<&'static str> {
        let data = bytes(values);
        let w = Weight { name: "w", datatype: Some(DataType::Fp32), shape, data: &data, role };
        check_tensor(&w, spec).err().map(|e| e.kind())
    }

    fn kind(values: &[f32], shape: &[i64], spec: &ModelSpec) -> Option<&'static str> {
        check(values, shape, WeightRole::Compute, spec)
    }

    /// Ordinary weights: 64 values from 0.01 to 0.64.
    fn ordinary() -> Vec<f32> {
        (1..=64).map(|i| i as f32 / 100.0).collect()
    }

    fn with(mut values: Vec<f32>, index: usize, value: f32) -> Vec<f32> {
        values[index] = value;
        values
    }

    #[test]
    fn each_check_fires_and_can_be_turned_off() {
        let on = ModelSpec::parse("").unwrap();
        assert_eq!(kind(&[1.0, f32::NAN], &[2], &on), Some("nan"));
        assert_eq!(kind(&[f32::INFINITY, 1.0], &[2], &on), Some("inf"));
        assert_eq!(kind(&with(ordinary(), 5, -3e7), &[64], &on), Some("magnitude"));
        assert_eq!(kind(&[0.0; 4], &[2, 2], &on), Some("all_zero"));
        assert_eq!(kind(&[0.0; 4], &[4], &on), None, "a zero bias vector is legitimate");
        assert_eq!(kind(&[0.5, -0.5], &[1, 2], &on), None);
        let off = ModelSpec::parse("[validation]\nnan = false\ninf = false\nmagnitude = false\nzero_tensors = false")
            .unwrap();
        assert_eq!(kind(&with(ordinary(), 1, 2e30), &[64], &off), None);
        assert_eq!(kind(&[f32::NAN, f32::INFINITY, 2e6], &[3], &off), None);
        assert_eq!(kind(&[0.0; 4], &[2, 2], &off), None);
        let tight = ModelSpec::parse("[validation]\nmax_abs = 0.25").unwrap();
        assert_eq!(kind(&[0.5], &[1], &tight), Some("magnitude"));
        let tight_off = ModelSpec::parse("[validation]\nmax_abs = 0.25\nmagnitude = false").unwrap();
        assert_eq!(kind(&[0.5], &[1], &tight_off), None, "magnitude = false turns the absolute bound off too");
    }

    #[test]
    fn the_bound_is_relative_to_the_tensors_own_scale() {
        let spec = ModelSpec::parse("").unwrap();
        // Large weights are not refused for being large, only for being
        // far larger than the rest of their tensor.
        let large: Vec<f32> = ordinary().iter().map(|v| v * 1e9).collect();
        assert_eq!(kind(&large, &[8, 8], &spec), None, "weights of 1e7..6e8 throughout");
        assert_eq!(kind(&with(large.clone(), 9, 3e16), &[8, 8], &spec), Some("magnitude"));
        // Around the limit (2^19.9): the mean exponent of `ordinary` is
        // -2.9; 6554 (exponent 12) passes, 838861 (exponent 19) does not.
        assert_eq!(kind(&with(ordinary(), 0, 0.1 * 65536.0), &[64], &spec), None);
        assert_eq!(kind(&with(ordinary(), 0, 0.1 * 8388608.0), &[64], &spec), Some("magnitude"));
        let loose = ModelSpec::parse("[validation]\nmax_ratio = 1e9").unwrap();
        assert_eq!(kind(&with(ordinary(), 0, 0.1 * 8388608.0), &[64], &loose), None);
        // Zeros and subnormals do not drag the typical magnitude down.
        let sparse: Vec<f32> = (0..64).map(|i| if i % 8 == 0 { 0.5 } else { 0.0 }).collect();
        assert_eq!(kind(&sparse, &[8, 8], &spec), None);
        let tiny = with(vec![f32::MIN_POSITIVE / 8.0; 64], 0, 1.0);
        assert_eq!(kind(&tiny, &[8, 8], &spec), None);
    }

    #[test]
    fn masks_pass_and_corruption_among_ordinary_values_does_not() {
        let spec = ModelSpec::parse("").unwrap();
        let constant = |values: &[f32], shape: &[i64]| check(values, shape, WeightRole::Constant, &spec);
        // A scalar fill value, a causal mask, a padding mask.
        assert_eq!(constant(&[f32::MIN], &[]), None);
        assert_eq!(constant(&[f32::NEG_INFINITY], &[1]), None);
        assert_eq!(constant(&[0.0, f32::NEG_INFINITY, 0.0, 0.0], &[1, 1, 2, 2]), None);
        assert_eq!(constant(&[0.0, f32::MIN, f32::MIN, 0.0], &[1, 1, 2, 2]), None);
        assert_eq!(constant(&[0.0; 4], &[2, 2]), None, "a zero constant is no all-zero weight");
        // NaN never; an infinity or an outlier among ordinary values is
        // corruption whatever the role.
        assert_eq!(constant(&[f32::NAN], &[]), Some("nan"));
        assert_eq!(constant(&[0.0, f32::NAN, f32::NEG_INFINITY, 0.0], &[2, 2]), Some("nan"));
        assert_eq!(constant(&with(ordinary(), 7, f32::INFINITY), &[64]), Some("inf"));
        assert_eq!(constant(&with(ordinary(), 7, f32::MIN), &[64]), Some("magnitude"));
        // The same mask as a compute weight is refused.
        assert_eq!(kind(&[0.0, f32::NEG_INFINITY, 0.0, 0.0], &[2, 2], &spec), Some("inf"));
        assert_eq!(
            kind(&[f32::MIN], &[1], &ModelSpec::parse("[validation]\nmax_abs = 1e6").unwrap()),
            Some("magnitude")
        );
        // An absolute bound leaves masks alone too.
        let bounded = ModelSpec::parse("[validation]\nmax_abs = 1e6").unwrap();
        assert_eq!(check(&[0.0, f32::MIN], &[2], WeightRole::Constant, &bounded), None);
        assert_eq!(check(&[0.5, 2e6], &[2], WeightRole::Constant, &bounded), Some("magnitude"));
    }

    #[test]
    fn integer_tensors_are_not_checked_for_values() {
        let spec = ModelSpec::parse("").unwrap();
        let ends: Vec<u8> = [i64::MAX, 0, i64::MIN].iter().flat_map(|v| v.to_le_bytes()).collect();
        let w = Weight {
            name: "ends",
            datatype: Some(DataType::Int64),
            shape: &[3],
            data: &ends,
            role: WeightRole::Compute,
        };
        assert_eq!(check_tensor(&w, &spec).unwrap(), 0);
        let zeros = [0u8; 16];
        let w = Weight {
            name: "q",
            datatype: Some(DataType::Int8),
            shape: &[4, 4],
            data: &zeros,
            role: WeightRole::Compute,
        };
        assert_eq!(check_tensor(&w, &spec).unwrap(), 0);
    }

    #[test]
    fn other_float_types_get_the_same_checks() {
        let spec = ModelSpec::parse("").unwrap();
        let fp64 = |values: &[f64], role| {
            let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let w = Weight { name: "d", datatype: Some(DataType::Fp64), shape: &[1, 4], data: &data, role };
            check_tensor(&w, &spec).err().map(|e| e.kind())
        };
        assert_eq!(fp64(&[0.1, 0.2, 0.3, 1e300], WeightRole::Compute), Some("magnitude"));
        assert_eq!(fp64(&[0.0, f64::MIN, 0.0, f64::NEG_INFINITY], WeightRole::Constant), None);
        assert_eq!(fp64(&[0.1, 0.2, f64::NAN, 0.3], WeightRole::Constant), Some("nan"));
        // FP16: 0x3c00 is 1.0, 0x7c00 infinity, 0xfbff its lowest (-65504).
        let fp16 = |halves: &[u16], role| {
            let data: Vec<u8> = halves.iter().flat_map(|v| v.to_le_bytes()).collect();
            let w = Weight { name: "h", datatype: Some(DataType::Fp16), shape: &[2, 2], data: &data, role };
            check_tensor(&w, &spec).err().map(|e| e.kind())
        };
        assert_eq!(fp16(&[0x3c00, 0x3c00, 0x7c00, 0x3c00], WeightRole::Constant), Some("inf"));
        assert_eq!(fp16(&[0, 0xfbff, 0x7c00, 0], WeightRole::Constant), None);
        assert_eq!(fp16(&[0, 0, 0, 0], WeightRole::Compute), Some("all_zero"));
    }

    #[test]
    fn the_fp32_pass_agrees_with_the_element_loop() {
        let specials = [
            0.0,
            -0.0,
            1.0,
            -3.5,
            0.25,
            2e6,
            -2e6,
            1e-40,
            f32::MIN,
            f32::MAX,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ];
        // Every pair of special values, in both orders, among ordinary
        // ones or alone, in both roles and at two ranks, under every
        // combination of checks and bounds.
        for bits in 0..64u32 {
            let on = |i: u32| bits & (1 << i) != 0;
            let bound = if on(4) { "max_abs = 0.5" } else { "" };
            let ratio = if on(5) { 4.0 } else { 1e6 };
            let toml = format!(
                "[validation]\nnan = {}\ninf = {}\nmagnitude = {}\nzero_tensors = {}\nmax_ratio = {ratio}\n{bound}",
                on(0),
                on(1),
                on(2),
                on(3)
            );
            let policy = ModelSpec::parse(&toml).unwrap().validation;
            let float = Float::of(DataType::Fp32).unwrap();
            for a in specials {
                for b in specials {
                    for (rest, shape) in [(vec![0.0], vec![1, 3]), (ordinary(), vec![66])] {
                        let mut values = vec![a, b];
                        values.extend(&rest);
                        let data = bytes(&values);
                        for role in [WeightRole::Compute, WeightRole::Constant] {
                            let stats = Stats::fp32(&data);
                            let fast =
                                Checks::new(&policy, role, &shape, values.len() as u64, &stats).pass(float, &stats);
                            let slow = rule::scan(&policy, role, &shape, DataType::Fp32, float, &data);
                            assert_eq!(
                                fast,
                                slow.is_ok(),
                                "[{a}, {b}, ..{}] {role:?} under {toml:?}: {slow:?}",
                                rest.len()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn declared_tensors_must_match() {
        let mut spec = ModelSpec::parse("").unwrap();
        spec.validation.tensors.push(TensorSpec { name: "w".into(), datatype: DataType::Fp32, shape: vec![2, 2] });
        assert_eq!(kind(&[1.0; 4], &[2, 2], &spec), None);
        assert_eq!(kind(&[1.0; 6], &[2, 3], &spec), Some("declared_mismatch"));
    }
}
