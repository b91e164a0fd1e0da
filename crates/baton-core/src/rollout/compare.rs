//! Comparing two answers to the same request, output by output: max
//! absolute difference, relative L2, cosine similarity and, for class
//! scores, top-1 agreement.
//!
//! Elements are read straight from the little-endian bytes and compared in
//! `f64`, whatever their numeric datatype (booleans count as 0 and 1); the
//! two sides may differ in numeric datatype (an FP16 candidate against an
//! FP32 stable version compares value by value). `BYTES` outputs are not
//! compared.
//!
//! Elements that are not finite are compared as values, not computed
//! with: NaN against NaN, and an infinity against the same infinity, agree
//! (they add nothing to the sums); a NaN or an infinity against anything
//! else is a mismatch of the whole output. A candidate that answers NaN
//! where the stable version has a number is as wrong as it gets, and the
//! guards must fail it, not shrug.
//!
//! Outputs that cannot be compared element by element are *mismatched*:
//! the candidate left the output out, its shape differs, one side is
//! `BYTES` and the other is not, the data does not fill the shape, or an
//! element is not finite on one side only (see above). A
//! mismatch is the worst drift there is, and counts as such: infinite max
//! difference and relative L2, cosine −1, and no agreeing row.

use crate::tensors::tensor::{DataType, Tensor, TensorData, element_count, f16_to_f32};

/// How one output of one request compares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// The largest |candidate − stable| of any element.
    pub max_abs_diff: f64,
    /// ‖candidate − stable‖ / ‖stable‖; 0 when both are zero vectors,
    /// infinite when only the stable one is.
    pub rel_l2: f64,
    /// The cosine similarity; 1 when both are zero vectors, 0 when exactly
    /// one is.
    pub cosine: f64,
    /// Top-1 agreement, when the stable output looks like class scores.
    pub top1: Option<Top1>,
    /// Whether the output could not be compared element by element (see
    /// the module documentation); the statistics then say worst drift.
    pub mismatched: bool,
}

/// Rows of class scores with the same top class on both sides.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Top1 {
    /// Rows compared.
    pub rows: u64,
    /// Rows whose highest score is the same class on both sides (the first
    /// one, on a tie).
    pub agreeing: u64,
    /// Rows whose agreement is unknown. Nothing counts here any more (a NaN
    /// on one side only is a mismatch, on both sides agreement); kept so
    /// that sums a server of an earlier version publishes still merge.
    pub unknown: u64,
}

impl Comparison {
    /// The worst drift, for an output that could not be compared; `stable`
    /// says how many rows of class scores it had.
    pub fn mismatch(stable: &Tensor) -> Comparison {
        Comparison {
            max_abs_diff: f64::INFINITY,
            rel_l2: f64::INFINITY,
            cosine: -1.0,
            top1: class_rows(stable).map(|(rows, _)| Top1 { rows: rows as u64, agreeing: 0, unknown: 0 }),
            mismatched: true,
        }
    }
}

/// Compares the candidate's outputs with the stable version's, matched by
/// name, calling `each` with the name and comparison of each stable output
/// that was compared (a `BYTES` output on both sides is skipped). A stable
/// output the candidate lacks is a mismatch; an output only the candidate
/// has is ignored, there being nothing to compare it with.
pub fn compare_outputs<'a>(stable: &'a [Tensor], candidate: &[Tensor], mut each: impl FnMut(&'a str, Comparison)) {
    for s in stable {
        let comparison = match candidate.iter().find(|c| c.name == s.name) {
            Some(c) => compare(s, c),
            None => Some(Comparison::mismatch(s)),
        };
        if let Some(comparison) = comparison {
            each(&s.name, comparison);
        }
    }
}

/// Compares one output; `None` when both sides are `BYTES`, which are not
/// compared.
pub fn compare(stable: &Tensor, candidate: &Tensor) -> Option<Comparison> {
    let (s_bytes, c_bytes) = match (&stable.data, &candidate.data) {
        (TensorData::Bytes(_), TensorData::Bytes(_)) => return None,
        (TensorData::Raw(s), TensorData::Raw(c)) => (s, c),
        _ => return Some(Comparison::mismatch(stable)),
    };
    let (Some(s_size), Some(c_size)) = (stable.datatype.size(), candidate.datatype.size()) else {
        return Some(Comparison::mismatch(stable));
    };
    let count = element_count(&stable.shape);
    let filled = |bytes: &[u8], size: usize| count.and_then(|n| n.checked_mul(size)) == Some(bytes.len());
    if stable.shape != candidate.shape || !filled(s_bytes, s_size) || !filled(c_bytes, c_size) {
        return Some(Comparison::mismatch(stable));
    }
    let classes = if candidate.datatype.is_float() { class_rows(stable).map(|(_, c)| c) } else { None };
    let s_values = s_bytes.chunks_exact(s_size).map(|b| decode(stable.datatype, b));
    let c_values = c_bytes.chunks_exact(c_size).map(|b| decode(candidate.datatype, b));
    let sums = Sums::over(s_values.zip(c_values), classes);
    Some(if sums.one_sided { Comparison::mismatch(stable) } else { sums.finish() })
}

/// The rows and classes of an output that looks like class scores: a float
/// output shaped `[rows, classes]`, or `[classes]` unbatched, with at least
/// two classes and one row.
fn class_rows(tensor: &Tensor) -> Option<(usize, usize)> {
    if !tensor.datatype.is_float() {
        return None;
    }
    let (rows, classes) = match tensor.shape[..] {
        [classes] => (1, classes),
        [rows, classes] => (rows, classes),
        _ => return None,
    };
    let (rows, classes) = (usize::try_from(rows).ok()?, usize::try_from(classes).ok()?);
    (rows >= 1 && classes >= 2).then_some((rows, classes))
}

/// One element as `f64`, from exactly `datatype.size()` little-endian bytes.
fn decode(datatype: DataType, b: &[u8]) -> f64 {
    let b2 = || [b[0], b[1]];
    let b4 = || [b[0], b[1], b[2], b[3]];
    let b8 = || [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
    match datatype {
        DataType::Bool | DataType::Uint8 => f64::from(b[0]),
        DataType::Int8 => f64::from(b[0] as i8),
        DataType::Uint16 => f64::from(u16::from_le_bytes(b2())),
        DataType::Int16 => f64::from(i16::from_le_bytes(b2())),
        DataType::Uint32 => f64::from(u32::from_le_bytes(b4())),
        DataType::Int32 => f64::from(i32::from_le_bytes(b4())),
        DataType::Uint64 => u64::from_le_bytes(b8()) as f64,
        DataType::Int64 => i64::from_le_bytes(b8()) as f64,
        DataType::Fp16 => f64::from(f16_to_f32(u16::from_le_bytes(b2()))),
        DataType::Fp32 => f64::from(f32::from_le_bytes(b4())),
        DataType::Fp64 => f64::from_le_bytes(b8()),
        // Never reached: BYTES has no fixed size and is turned away before.
        DataType::Bytes => f64::NAN,
    }
}

/// The running sums of one comparison, in one pass over the elements.
#[derive(Default)]
struct Sums {
    /// An element was not finite on one side only: a mismatch.
    one_sided: bool,
    max_abs: f64,
    diff2: f64,
    stable2: f64,
    candidate2: f64,
    dot: f64,
    top1: Option<Top1>,
}

/// The running top class of the current row, on one side.
#[derive(Clone, Copy)]
struct Best {
    index: usize,
    value: f64,
}

impl Sums {
    /// Sums the pairs `(stable, candidate)`; with `classes`, also the top-1
    /// agreement of each row of that many elements.
    fn over(pairs: impl Iterator<Item = (f64, f64)>, classes: Option<usize>) -> Sums {
        let mut sums = Sums { top1: classes.map(|_| Top1::default()), ..Sums::default() };
        let classes = classes.unwrap_or(0);
        let mut row: Option<(Best, Best)> = None;
        for (i, (s, c)) in pairs.enumerate() {
            let (s, c) = if s.is_finite() && c.is_finite() {
                (s, c)
            } else if s.is_nan() && c.is_nan() || s == c {
                // NaN against NaN, an infinity against the same infinity:
                // equal, and nothing to add. As class scores, both sides
                // rank it the lowest.
                (f64::NEG_INFINITY, f64::NEG_INFINITY)
            } else {
                sums.one_sided = true;
                return sums;
            };
            if s.is_finite() {
                let d = c - s;
                if d.abs() > sums.max_abs {
                    sums.max_abs = d.abs();
                }
                sums.diff2 += d * d;
                sums.stable2 += s * s;
                sums.candidate2 += c * c;
                sums.dot += s * c;
            }
            if classes == 0 {
                continue;
            }
            let column = i % classes;
            row = Some(match row {
                Some((bs, bc)) if column > 0 => (
                    if s > bs.value { Best { index: column, value: s } } else { bs },
                    if c > bc.value { Best { index: column, value: c } } else { bc },
                ),
                _ => (Best { index: 0, value: s }, Best { index: 0, value: c }),
            });
            if column + 1 == classes
                && let (Some(top1), Some((bs, bc))) = (&mut sums.top1, row)
            {
                top1.rows += 1;
                if bs.index == bc.index {
                    top1.agreeing += 1;
                }
            }
        }
        sums
    }

    fn finish(self) -> Comparison {
        let (stable, candidate) = (self.stable2.sqrt(), self.candidate2.sqrt());
        let rel_l2 = match (stable == 0.0, candidate == 0.0) {
            (true, true) => 0.0,
            (true, false) => f64::INFINITY,
            (false, _) => self.diff2.sqrt() / stable,
        };
        let cosine = match (stable == 0.0, candidate == 0.0) {
            (true, true) => 1.0,
            (true, false) | (false, true) => 0.0,
            // Rounding may step just outside [-1, 1]; NaN stays NaN.
            (false, false) => (self.dot / (stable * candidate)).clamp(-1.0, 1.0),
        };
        Comparison { max_abs_diff: self.max_abs, rel_l2, cosine, top1: self.top1, mismatched: false }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(shape: Vec<i64>, values: &[f32]) -> Tensor {
        Tensor::from_f32("y", shape, values)
    }

    fn raw(datatype: DataType, shape: Vec<i64>, bytes: Vec<u8>) -> Tensor {
        Tensor { name: "y".into(), datatype, shape, data: TensorData::Raw(bytes) }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn identical_outputs_do_not_drift() {
        let s = f32s(vec![2], &[3.0, -4.0]);
        let c = compare(&s, &s).unwrap();
        assert_eq!((c.max_abs_diff, c.rel_l2, c.cosine, c.mismatched), (0.0, 0.0, 1.0, false));
        assert_eq!(c.top1, Some(Top1 { rows: 1, agreeing: 1, unknown: 0 }));
    }

    #[test]
    fn statistics_of_a_known_difference() {
        // stable (3, 4): norm 5; candidate (3, 0): diff (0, -4).
        let c = compare(&f32s(vec![2, 1], &[3.0, 4.0]), &f32s(vec![2, 1], &[3.0, 0.0])).unwrap();
        assert_eq!(c.max_abs_diff, 4.0);
        assert!(close(c.rel_l2, 0.8), "{}", c.rel_l2);
        assert!(close(c.cosine, 0.6), "{}", c.cosine);
        assert_eq!(c.top1, None, "one class per row is not class scores");
    }

    #[test]
    fn zero_vectors_follow_the_documented_rules() {
        let zero = f32s(vec![3], &[0.0; 3]);
        let one = f32s(vec![3], &[0.0, 1.0, 0.0]);
        let both = compare(&zero, &zero).unwrap();
        assert_eq!((both.rel_l2, both.cosine), (0.0, 1.0));
        let stable_zero = compare(&zero, &one).unwrap();
        assert_eq!((stable_zero.rel_l2, stable_zero.cosine), (f64::INFINITY, 0.0));
        let candidate_zero = compare(&one, &zero).unwrap();
        assert_eq!((candidate_zero.rel_l2, candidate_zero.cosine), (1.0, 0.0));
    }

    #[test]
    fn a_value_that_is_not_finite_on_one_side_only_is_a_mismatch() {
        let s = f32s(vec![2, 2], &[0.1, 0.9, 0.8, 0.2]);
        for odd in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let c = f32s(vec![2, 2], &[0.1, 0.9, odd, 0.2]);
            for got in [compare(&s, &c).unwrap(), compare(&c, &s).unwrap()] {
                assert!(got.mismatched, "{odd} against a number: {got:?}");
                assert_eq!((got.rel_l2, got.cosine), (f64::INFINITY, -1.0));
            }
        }
        let inf_against_minus = compare(&f32s(vec![1], &[f32::INFINITY]), &f32s(vec![1], &[f32::NEG_INFINITY]));
        assert!(inf_against_minus.unwrap().mismatched);
    }

    #[test]
    fn the_same_value_that_is_not_finite_on_both_sides_agrees() {
        let s = f32s(vec![2, 2], &[0.1, 0.9, f32::NAN, f32::INFINITY]);
        let got = compare(&s, &s).unwrap();
        assert!(!got.mismatched, "{got:?}");
        assert_eq!((got.max_abs_diff, got.rel_l2, got.cosine), (0.0, 0.0, 1.0));
        assert_eq!(got.top1, Some(Top1 { rows: 2, agreeing: 2, unknown: 0 }));
        // The finite elements are still compared.
        let c = f32s(vec![2, 2], &[0.1, 0.5, f32::NAN, f32::INFINITY]);
        let got = compare(&s, &c).unwrap();
        assert!(!got.mismatched && (got.max_abs_diff - 0.4).abs() < 1e-6, "{got:?}");
    }

    #[test]
    fn top1_counts_rows_whose_best_class_agrees() {
        let s = f32s(vec![3, 3], &[0.1, 0.7, 0.2, 0.5, 0.3, 0.2, 0.0, 0.0, 1.0]);
        let c = f32s(vec![3, 3], &[0.2, 0.6, 0.2, 0.3, 0.5, 0.2, 0.1, 0.0, 0.9]);
        assert_eq!(compare(&s, &c).unwrap().top1, Some(Top1 { rows: 3, agreeing: 2, unknown: 0 }));
        // Integer and rank-3 outputs are not class scores.
        let ints = raw(DataType::Int32, vec![1, 2], [1i32, 2].iter().flat_map(|v| v.to_le_bytes()).collect());
        assert_eq!(compare(&ints, &ints).unwrap().top1, None);
        assert_eq!(compare(&f32s(vec![1, 1, 2], &[0.0, 1.0]), &f32s(vec![1, 1, 2], &[0.0, 1.0])).unwrap().top1, None);
    }

    #[test]
    fn datatypes_are_read_as_numbers_and_may_differ_between_sides() {
        let fp16 = raw(DataType::Fp16, vec![2], [0x3c00u16, 0xc000].iter().flat_map(|v| v.to_le_bytes()).collect()); // 1, -2
        let fp64 = raw(DataType::Fp64, vec![2], [1.0f64, -2.5].iter().flat_map(|v| v.to_le_bytes()).collect());
        let got = compare(&fp16, &fp64).unwrap();
        assert_eq!((got.max_abs_diff, got.mismatched), (0.5, false));
        let i64s = raw(DataType::Int64, vec![2], [-3i64, 7].iter().flat_map(|v| v.to_le_bytes()).collect());
        let u8s = raw(DataType::Uint8, vec![2], vec![0, 7]);
        assert_eq!(compare(&i64s, &u8s).unwrap().max_abs_diff, 3.0);
        let int8 = raw(DataType::Int8, vec![1], vec![0xff]);
        assert_eq!(compare(&int8, &raw(DataType::Bool, vec![1], vec![1])).unwrap().max_abs_diff, 2.0);
    }

    #[test]
    fn mismatches_count_as_worst_drift() {
        let s = f32s(vec![1, 2], &[0.3, 0.7]);
        let worst = |c: Comparison| {
            assert!(c.mismatched);
            assert_eq!((c.max_abs_diff, c.rel_l2, c.cosine), (f64::INFINITY, f64::INFINITY, -1.0));
            assert_eq!(c.top1, Some(Top1 { rows: 1, agreeing: 0, unknown: 0 }));
        };
        worst(compare(&s, &f32s(vec![2, 1], &[0.3, 0.7])).unwrap());
        worst(compare(&s, &f32s(vec![1, 2], &[0.3])).unwrap());
        worst(compare(&s, &Tensor { data: TensorData::Bytes(vec![vec![1], vec![2]]), ..s.clone() }).unwrap());
        let mut seen = Vec::new();
        compare_outputs(std::slice::from_ref(&s), &[], |name, c| seen.push((name.to_owned(), c)));
        assert_eq!(seen.len(), 1);
        worst(seen[0].1);
    }

    #[test]
    fn bytes_are_skipped_and_extra_candidate_outputs_ignored() {
        let text = Tensor {
            name: "t".into(),
            datatype: DataType::Bytes,
            shape: vec![1],
            data: TensorData::Bytes(vec![b"a".to_vec()]),
        };
        let y = f32s(vec![1], &[1.0]);
        let mut seen = Vec::new();
        compare_outputs(
            &[text.clone(), y.clone()],
            &[text, y.clone(), Tensor { name: "extra".into(), ..y }],
            |name, _| seen.push(name.to_owned()),
        );
        assert_eq!(seen, ["y"]);
    }
}
