//! The arithmetic of each transform, one value at a time, in `f64`. A
//! value reaches it present and not NaN: defaults are applied before.

use super::hash;

/// What a numeric feature does to its (defaulted, clipped) value.
#[derive(Clone, Debug, PartialEq)]
pub enum NumericOp {
    /// The value itself, as a float.
    Identity,
    /// `(x - mean) / std`, as `tft.scale_to_z_score`.
    ZScore {
        /// The training mean.
        mean: f64,
        /// The training standard deviation, > 0.
        std: f64,
    },
    /// `(x - min) / (max - min) * (output_max - output_min) + output_min`,
    /// as `tft.scale_by_min_max`.
    MinMax {
        /// The training minimum.
        min: f64,
        /// The training maximum, > `min`.
        max: f64,
        /// What `min` maps to (0 by default).
        output_min: f64,
        /// What `max` maps to (1 by default).
        output_max: f64,
    },
    /// The number of boundaries `<=` the value, as `tf.raw_ops.Bucketize`:
    /// a value equal to a boundary falls in the bucket above it.
    Bucketize {
        /// Strictly increasing, finite, at least one.
        boundaries: Vec<f64>,
    },
}

/// Clipping bounds, applied before the transform; `None` is unbounded.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Clip {
    /// The lower bound.
    pub min: Option<f64>,
    /// The upper bound.
    pub max: Option<f64>,
}

impl Clip {
    /// The value within the bounds (`x` is not NaN).
    pub fn apply(self, x: f64) -> f64 {
        let x = self.min.map_or(x, |min| x.max(min));
        self.max.map_or(x, |max| x.min(max))
    }
}

/// One transformed value: a float for a scaled feature, an id for a
/// bucketized or hashed one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    /// Goes to a float graph input.
    Float(f64),
    /// Goes to an integer graph input (embedding ids).
    Id(i64),
}

impl NumericOp {
    /// Whether the output is an id rather than a float.
    pub fn gives_ids(&self) -> bool {
        matches!(self, NumericOp::Bucketize { .. })
    }

    /// The transformed value of `x` (clipped, not NaN).
    pub fn apply(&self, x: f64) -> Value {
        match self {
            NumericOp::Identity => Value::Float(x),
            NumericOp::ZScore { mean, std } => Value::Float((x - mean) / std),
            NumericOp::MinMax { min, max, output_min, output_max } => {
                Value::Float((x - min) / (max - min) * (output_max - output_min) + output_min)
            }
            NumericOp::Bucketize { boundaries } => {
                // At most the boundary count, which validation bounds.
                Value::Id(i64::try_from(boundaries.partition_point(|b| *b <= x)).unwrap_or(i64::MAX))
            }
        }
    }
}

/// What a categorical feature does to its (defaulted) bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashOp {
    /// MurmurHash3 x86_32 seed.
    pub seed: u32,
    /// The bucket count, 1..=2^32.
    pub buckets: u64,
}

impl HashOp {
    /// The bucket of one value.
    pub fn apply(self, bytes: &[u8]) -> Value {
        Value::Id(hash::bucket(bytes, self.seed, self.buckets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn z_score_subtracts_the_mean_and_divides_by_std() {
        let op = NumericOp::ZScore { mean: 10.0, std: 4.0 };
        assert_eq!(op.apply(10.0), Value::Float(0.0));
        assert_eq!(op.apply(18.0), Value::Float(2.0));
        assert_eq!(op.apply(4.0), Value::Float(-1.5));
        assert!(!op.gives_ids());
    }

    #[test]
    fn min_max_maps_the_range_onto_the_output_range() {
        let unit = NumericOp::MinMax { min: 2.0, max: 6.0, output_min: 0.0, output_max: 1.0 };
        assert_eq!(unit.apply(2.0), Value::Float(0.0));
        assert_eq!(unit.apply(5.0), Value::Float(0.75));
        assert_eq!(unit.apply(10.0), Value::Float(2.0), "no implicit clipping: clip says so");
        let signed = NumericOp::MinMax { min: 0.0, max: 10.0, output_min: -1.0, output_max: 1.0 };
        assert_eq!(signed.apply(5.0), Value::Float(0.0));
        assert_eq!(signed.apply(0.0), Value::Float(-1.0));
    }

    #[test]
    fn bucketize_puts_a_boundary_value_in_the_bucket_above() {
        // tf.raw_ops.Bucketize's documented example.
        let op = NumericOp::Bucketize { boundaries: vec![0.0, 10.0, 100.0] };
        let ids: Vec<Value> = [-5.0, 10000.0, 150.0, 10.0, 5.0, 100.0].into_iter().map(|x| op.apply(x)).collect();
        let want = [0, 3, 3, 2, 1, 3].map(Value::Id);
        assert_eq!(ids, want);
        assert_eq!(op.apply(0.0), Value::Id(1));
        assert_eq!(op.apply(-0.0), Value::Id(1), "-0 equals the boundary 0");
        assert_eq!(op.apply(f64::NEG_INFINITY), Value::Id(0));
        assert_eq!(op.apply(f64::INFINITY), Value::Id(3));
        assert!(op.gives_ids());
    }

    #[test]
    fn identity_keeps_the_value_and_clip_bounds_it() {
        assert_eq!(NumericOp::Identity.apply(-3.5), Value::Float(-3.5));
        let clip = Clip { min: Some(0.0), max: Some(100.0) };
        assert_eq!(clip.apply(-1.0), 0.0);
        assert_eq!(clip.apply(50.0), 50.0);
        assert_eq!(clip.apply(f64::INFINITY), 100.0);
        let below = Clip { min: None, max: Some(1.0) };
        assert_eq!(below.apply(f64::NEG_INFINITY), f64::NEG_INFINITY);
        assert_eq!(below.apply(7.0), 1.0);
    }

    #[test]
    fn hashing_gives_the_bucket_id() {
        let op = HashOp { seed: 0, buckets: 1000 };
        assert_eq!(op.apply(b"foo"), Value::Id(784));
    }
}
