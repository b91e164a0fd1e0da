//! One pass over a floating-point tensor: what the checks need to know of
//! its elements, without keeping or sorting any of them.
//!
//! [`Stats::fp32`] is the pass most weights take, written without branches
//! so that it vectorises; [`Stats::by_elements`] decodes each element of
//! any floating-point type and must agree with it exactly.

use crate::tensors::tensor::{DataType, f16_to_f32};

/// What one pass over a floating-point tensor found.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct Stats {
    /// Some element is NaN.
    pub nan: bool,
    /// Some element is infinite.
    pub inf: bool,
    /// Some element is not ±0 (NaN and infinities count).
    pub nonzero: bool,
    /// Some element is finite, non-zero and below the type's extreme
    /// magnitude ([`Float::extreme`]): the tensor is not mask-like.
    pub ordinary: bool,
    /// The largest finite magnitude; 0 when there is none.
    pub max_abs: f64,
    /// How many elements are finite, non-zero and normal for their type.
    pub normals: u64,
    /// The sum of those elements' binary exponents (`floor(log2 |v|)`).
    pub exponent_sum: i64,
}

/// What the checks need to know of a floating-point type.
#[derive(Clone, Copy, Debug)]
pub(super) struct Float {
    /// Bytes per element.
    size: usize,
    /// The smallest normal magnitude; smaller non-zero ones are subnormal.
    min_normal: f64,
    /// From this magnitude on, a value is extreme: what exports fill masks
    /// with, never a trained weight.
    extreme: f64,
}

impl Float {
    /// The floating-point types baton checks; `None` for the others.
    pub(super) fn of(datatype: DataType) -> Option<Float> {
        let (size, min_normal, extreme) = match datatype {
            DataType::Fp16 => (2, 2f64.powi(-14), 2f64.powi(15)),
            DataType::Fp32 => (4, 2f64.powi(-126), 2f64.powi(64)),
            DataType::Fp64 => (8, f64::MIN_POSITIVE, 2f64.powi(64)),
            _ => return None,
        };
        Some(Float { size, min_normal, extreme })
    }

    /// Bytes per element.
    pub(super) fn size(self) -> usize {
        self.size
    }

    /// Whether a finite value is normal for this type (and so not zero).
    pub(super) fn is_normal(self, magnitude: f64) -> bool {
        magnitude >= self.min_normal
    }

    /// Whether a value is zero, infinite or extreme: what masks hold.
    pub(super) fn is_mask_value(self, value: f64) -> bool {
        value == 0.0 || value.abs() >= self.extreme
    }
}

/// `floor(log2 |v|)` of a finite, non-zero value whose f64 form is normal
/// (every FP16 and FP32 value, and FP64 values at least `f64::MIN_POSITIVE`).
pub(super) fn binary_exponent(value: f64) -> i32 {
    ((value.to_bits() >> 52) & 0x7ff) as i32 - 1023
}

/// Decodes element `b` (little-endian bytes) of a floating-point type.
pub(super) fn decode(datatype: DataType, b: &[u8]) -> f64 {
    match datatype {
        DataType::Fp16 => f64::from(f16_to_f32(u16::from_le_bytes([b[0], b[1]]))),
        DataType::Fp32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        _ => f64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
    }
}

/// FP32 bit patterns, sign cleared.
const INF_BITS: u32 = 0x7f80_0000;
const MIN_NORMAL_BITS: u32 = 0x0080_0000;
/// 2^64, FP32's extreme magnitude ([`Float::of`]).
const EXTREME_BITS: u32 = (127 + 64) << 23;
/// FP32 exponent bias.
const BIAS: i64 = 127;
/// Elements per block of [`Stats::fp32`]: few enough that a block's sum of
/// biased exponents (at most 254 each) fits in a `u32`.
const BLOCK: usize = 1 << 20;
/// From this many bytes on, [`Stats::fp32`] splits a tensor between cores:
/// 16 MiB, where a thread's start is a small part of the pass.
const PARALLEL_MIN: usize = 16 << 20;
/// The most threads one tensor's pass takes.
const MAX_THREADS: usize = 4;

/// The pass of [`Stats::fp32`] over `words`; `max_abs` is left 0 and the
/// largest finite magnitude's bits returned beside.
fn fp32_words(words: &[[u8; 4]]) -> (Stats, u32) {
    let mut stats = Stats::default();
    let mut max_bits = 0u32;
    for block in words.chunks(BLOCK) {
        let (mut nan, mut inf, mut nonzero, mut ordinary) = (0u32, 0u32, 0u32, 0u32);
        let (mut max, mut sum, mut normals) = (0i32, 0u32, 0u32);
        for word in block {
            let a = u32::from_le_bytes(*word) & 0x7fff_ffff;
            // Conditions as 0 or 1 and masks, not branches.
            let finite = u32::from(a < INF_BITS);
            let normal = finite & u32::from(a >= MIN_NORMAL_BITS);
            nan |= u32::from(a > INF_BITS);
            inf |= u32::from(a == INF_BITS);
            nonzero |= a;
            ordinary |= u32::from(a != 0) & u32::from(a < EXTREME_BITS);
            // Below 2^31, so a signed maximum is exact and vectorises
            // on every x86-64.
            max = max.max((a & finite.wrapping_neg()) as i32);
            sum += (a >> 23) & normal.wrapping_neg();
            normals += normal;
        }
        stats.nan |= nan != 0;
        stats.inf |= inf != 0;
        stats.nonzero |= nonzero != 0;
        stats.ordinary |= ordinary != 0;
        max_bits = max_bits.max(max as u32);
        stats.normals += u64::from(normals);
        stats.exponent_sum += i64::from(sum) - BIAS * i64::from(normals);
    }
    (stats, max_bits)
}

impl Stats {
    /// The stats of FP32 little-endian `data`, in one branch-free pass over
    /// the bits. Equal to [`Stats::by_elements`] of the same data. A large
    /// tensor is split between the machine's cores ([`PARALLEL_MIN`]).
    pub(super) fn fp32(data: &[u8]) -> Stats {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS));
        let parts = if data.len() >= PARALLEL_MIN { cores } else { 1 };
        Stats::fp32_in(data, parts)
    }

    /// [`Stats::fp32`] in `parts` pieces, all but the first on threads of
    /// their own, merged.
    fn fp32_in(data: &[u8], parts: usize) -> Stats {
        let (words, _) = data.as_chunks::<4>();
        // Whole blocks per piece, so that the pieces' blocks are the pass's.
        let per = words.len().div_ceil(BLOCK).div_ceil(parts.max(1)).max(1) * BLOCK;
        let mut pieces = words.chunks(per);
        let first = pieces.next().unwrap_or_default();
        let (mut stats, max_bits) = std::thread::scope(|scope| {
            let others: Vec<_> = pieces.map(|piece| scope.spawn(move || fp32_words(piece))).collect();
            let mut total = fp32_words(first);
            for other in others {
                // A pass over bits does not panic; if a thread could not say, scan here.
                let (part, bits) = other.join().unwrap_or_else(|_| fp32_words(&[]));
                total.0.merge(&part);
                total.1 = total.1.max(bits);
            }
            total
        });
        stats.max_abs = f64::from(f32::from_bits(max_bits));
        stats
    }

    /// Adds what `other` found in other elements of the same tensor,
    /// except `max_abs`.
    fn merge(&mut self, other: &Stats) {
        self.nan |= other.nan;
        self.inf |= other.inf;
        self.nonzero |= other.nonzero;
        self.ordinary |= other.ordinary;
        self.normals += other.normals;
        self.exponent_sum += other.exponent_sum;
    }

    /// The stats of `data`, elements of the floating-point type `float`
    /// (`datatype`), decoded one by one.
    pub(super) fn by_elements(datatype: DataType, float: Float, data: &[u8]) -> Stats {
        let mut stats = Stats::default();
        for chunk in data.chunks_exact(float.size()) {
            stats.add(float, decode(datatype, chunk));
        }
        stats
    }

    /// Counts one element.
    pub(super) fn add(&mut self, float: Float, value: f64) {
        self.nan |= value.is_nan();
        self.inf |= value.is_infinite();
        self.nonzero |= value != 0.0;
        if !value.is_finite() {
            return;
        }
        let magnitude = value.abs();
        self.ordinary |= !float.is_mask_value(value);
        self.max_abs = self.max_abs.max(magnitude);
        if float.is_normal(magnitude) {
            self.normals += 1;
            self.exponent_sum += i64::from(binary_exponent(value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    /// Values at every boundary the pass tests bits against.
    const SPECIALS: [f32; 16] = [
        0.0,
        -0.0,
        1.0,
        -3.5,
        0.1,
        2e6,
        f32::MIN_POSITIVE,
        f32::MIN_POSITIVE / 2.0, // subnormal
        1.8446744e19,            // 2^64, the first extreme value
        1.8446743e19,            // just below it
        f32::MAX,
        f32::MIN,
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        -1e-30,
    ];

    #[test]
    fn the_fp32_pass_equals_the_element_loop() {
        let float = Float::of(DataType::Fp32).unwrap();
        for a in SPECIALS {
            for b in SPECIALS {
                for values in [vec![a, b], vec![a, b, 0.5]] {
                    let data = bytes(&values);
                    let loop_stats = Stats::by_elements(DataType::Fp32, float, &data);
                    assert_eq!(Stats::fp32(&data), loop_stats, "{values:?}");
                }
            }
        }
        // A tensor over several blocks, with a sign flip in every word.
        let many: Vec<f32> = (0..(BLOCK + 4099)).map(|i| (i as f32 - 3.0e5) * 1.7e-3).collect();
        let data = bytes(&many);
        assert_eq!(Stats::fp32(&data), Stats::by_elements(DataType::Fp32, float, &data));
    }

    #[test]
    fn a_pass_split_between_threads_equals_one_pass() {
        // Three blocks and a bit; the largest value and a NaN in the last.
        let mut many: Vec<f32> = (0..(3 * BLOCK + 777)).map(|i| (i as f32 - 2.0e6) * 1.3e-4).collect();
        let last = many.len() - 1;
        many[last - 5] = 9.5e3;
        let data = bytes(&many);
        let one = Stats::fp32_in(&data, 1);
        for parts in 2..=5 {
            assert_eq!(Stats::fp32_in(&data, parts), one, "{parts} parts");
        }
        many[last] = f32::NAN;
        let data = bytes(&many);
        let (one, split) = (Stats::fp32_in(&data, 1), Stats::fp32_in(&data, 3));
        assert!(one.nan && split.nan);
        assert_eq!(split, one);
        assert_eq!(Stats::fp32_in(&[], 3), Stats::fp32_in(&[], 1), "an empty tensor");
    }

    #[test]
    fn exponents_are_floors_of_log2() {
        assert_eq!(binary_exponent(1.0), 0);
        assert_eq!(binary_exponent(-3.9), 1);
        assert_eq!(binary_exponent(0.1), -4);
        assert_eq!(binary_exponent(f64::from(f32::MAX)), 127);
        let float = Float::of(DataType::Fp32).unwrap();
        let stats = Stats::by_elements(DataType::Fp32, float, &bytes(&[0.25, 8.0, 0.0, f32::MIN_POSITIVE / 4.0]));
        assert_eq!((stats.normals, stats.exponent_sum), (2, 1), "subnormals and zeros are left out");
    }

    #[test]
    fn masks_are_told_from_ordinary_values_in_every_type() {
        let fp32 = Float::of(DataType::Fp32).unwrap();
        let mask = Stats::fp32(&bytes(&[0.0, f32::MIN, f32::NEG_INFINITY, -1e30]));
        assert!(!mask.ordinary && mask.inf && mask.nonzero);
        assert!(Stats::by_elements(DataType::Fp32, fp32, &bytes(&[0.0, -3.4e38, 0.5])).ordinary);
        let fp16 = Float::of(DataType::Fp16).unwrap();
        // -65504 (FP16's lowest) and 0.
        let half: Vec<u8> = [0xfbffu16, 0x0000].iter().flat_map(|v| v.to_le_bytes()).collect();
        assert!(!Stats::by_elements(DataType::Fp16, fp16, &half).ordinary);
        let fp64 = Float::of(DataType::Fp64).unwrap();
        let double: Vec<u8> = [f64::MIN, 0.0, 1e-310].iter().flat_map(|v| v.to_le_bytes()).collect();
        let stats = Stats::by_elements(DataType::Fp64, fp64, &double);
        assert!(stats.ordinary, "a subnormal is an ordinary value");
        assert_eq!(stats.normals, 1);
        assert!(Float::of(DataType::Int64).is_none());
    }
}
