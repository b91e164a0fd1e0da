//! A replica's observation sums go through the fleet's records as JSON,
//! where an infinity cannot be written: sums of posted outcome values
//! saturate, so a record decodes what it wrote, and a record in which an
//! earlier server wrote an overflowed sum (as null) still decodes.

use baton_cluster::records::StepSums;
use baton_cluster::store::{decode, encode};
use baton_core::rollout::Role;
use baton_core::rollout::window::Observations;

#[test]
fn a_record_of_huge_outcome_sums_decodes_what_it_wrote() {
    let observations = Observations::default();
    for _ in 0..4 {
        observations.record_outcomes(Role::Candidate, 1, f64::MAX / 2.0);
    }
    let mut sums = observations.take_sums();
    sums.merge(&sums.clone());
    let written = encode(&StepSums { rollout: 7, step: 0, sums }).expect("encoded");
    let read: StepSums = decode("sums/m/r1", &written).expect("a record decodes what it wrote");
    let value = read.sums.window().candidate.outcome_value;
    assert!(value.is_finite() && value > 1e300, "{value}");

    let text = String::from_utf8(written).expect("JSON");
    let older = text.replacen(&serde_json::to_string(&f64::MAX).expect("a number"), "null", 1);
    assert!(older.contains("null"), "{older}");
    let read: StepSums = decode("sums/m/r1", older.as_bytes()).expect("an overflowed sum written as null decodes");
    assert_eq!(read.sums.window().candidate.outcome_value, f64::MAX);
}
