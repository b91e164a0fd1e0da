//! Which checks a floating-point tensor gets, decided by its role and its
//! content (see [`ValidationPolicy`]), and the verdict on it: from its
//! [`Stats`] alone, which is all a passing tensor costs, or element by
//! element, which names the first element that fails.

use crate::files::spec::ValidationPolicy;
use crate::run::backend::WeightRole;
use crate::tensors::tensor::DataType;

use super::stats::{Float, Stats, binary_exponent, decode};

/// The checks one tensor gets.
#[derive(Clone, Copy, Debug)]
pub(super) struct Checks {
    nan: bool,
    inf: bool,
    /// `log2(max_ratio)`, when the relative bound applies.
    max_ratio_log2: Option<f64>,
    max_abs: Option<f64>,
    all_zero: bool,
}

/// Why an element or the tensor failed: the error's kind and what is wrong.
pub(super) type Failure = (&'static str, String);

impl Checks {
    /// The checks `policy` gives a tensor of `role` and `shape` whose
    /// elements `stats` describes: a mask-like constant (one element, or
    /// only zeros, infinities and extreme values) is checked for NaN only;
    /// only compute weights of rank 2 or more are refused for being all zero.
    pub(super) fn new(
        policy: &ValidationPolicy,
        role: WeightRole,
        shape: &[i64],
        elements: u64,
        stats: &Stats,
    ) -> Checks {
        let compute = role == WeightRole::Compute;
        let mask_like = !compute && (elements <= 1 || !stats.ordinary);
        let values = !mask_like;
        Checks {
            nan: policy.nan,
            inf: policy.inf && values,
            max_ratio_log2: (policy.magnitude && values).then(|| policy.max_ratio.log2()),
            max_abs: policy.max_abs.filter(|_| policy.magnitude && values),
            all_zero: policy.zero_tensors && compute && shape.len() >= 2 && elements > 0,
        }
    }

    /// Whether a tensor whose elements `stats` describes passes.
    pub(super) fn pass(&self, float: Float, stats: &Stats) -> bool {
        let largest_over = float.is_normal(stats.max_abs) && self.over_ratio(binary_exponent(stats.max_abs), stats);
        !(self.nan && stats.nan
            || self.inf && stats.inf
            || largest_over
            || self.max_abs.is_some_and(|bound| stats.max_abs > bound)
            || self.all_zero && !stats.nonzero)
    }

    /// Whether an element of binary exponent `exponent` is beyond the
    /// relative bound: its exponent exceeds the mean exponent of the normal
    /// elements by more than `log2(max_ratio)`.
    fn over_ratio(&self, exponent: i32, stats: &Stats) -> bool {
        let Some(limit) = self.max_ratio_log2 else {
            return false;
        };
        // n * (e - mean) > n * limit, with n * e - sum exact in integers.
        let n = stats.normals as i64;
        let excess = n * i64::from(exponent) - stats.exponent_sum;
        n > 0 && excess as f64 > n as f64 * limit
    }

    /// Why the element at `index` with `value` fails, if it does.
    fn element(&self, float: Float, stats: &Stats, index: usize, value: f64) -> Option<Failure> {
        if value.is_nan() {
            return self.nan.then(|| ("nan", format!("element {index} is NaN")));
        }
        if value.is_infinite() {
            return self.inf.then(|| ("inf", format!("element {index} is {value}")));
        }
        let magnitude = value.abs();
        if float.is_normal(magnitude) && self.over_ratio(binary_exponent(value), stats) {
            let mean = stats.exponent_sum as f64 / stats.normals as f64;
            let times = f64::from(binary_exponent(value)) - mean;
            let problem = format!(
                "element {index} is {value}, about 2^{times:.1} times the tensor's typical magnitude 2^{mean:.1} \
                 (the limit is max_ratio = 2^{:.1})",
                self.max_ratio_log2.unwrap_or_default()
            );
            return Some(("magnitude", problem));
        }
        match self.max_abs {
            Some(bound) if magnitude > bound => {
                Some(("magnitude", format!("element {index} is {value}, beyond the bound ±{bound}")))
            }
            _ => None,
        }
    }
}

/// Checks a floating-point tensor element by element, in order, and names
/// the first failure. Computes its own stats: the FP32 pass's verdict must
/// agree with this one, which shares nothing with it but [`Checks`].
pub(super) fn scan(
    policy: &ValidationPolicy,
    role: WeightRole,
    shape: &[i64],
    datatype: DataType,
    float: Float,
    data: &[u8],
) -> Result<(), Failure> {
    let stats = Stats::by_elements(datatype, float, data);
    let elements = (data.len() / float.size()) as u64;
    let checks = Checks::new(policy, role, shape, elements, &stats);
    for (index, chunk) in data.chunks_exact(float.size()).enumerate() {
        if let Some(failure) = checks.element(float, &stats, index, decode(datatype, chunk)) {
            return Err(failure);
        }
    }
    if checks.all_zero && !stats.nonzero {
        let rank = shape.len();
        return Err(("all_zero", format!("all {elements} elements of this rank-{rank} tensor are zero")));
    }
    Ok(())
}
