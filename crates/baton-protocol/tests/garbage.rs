//! Decoding never panics: every truncation and many mutations of valid
//! bodies, with right and wrong header lengths, must come back as `Ok` or a
//! `CodecError`.

mod common;

use baton_core::tensors::tensor::DataType;
use baton_protocol::{InferRequest, RequestedOutput, decode_request, decode_response, encode_request, encode_response};
use common::{every_datatype, sample};

/// Valid bodies of every kind, each with its header length.
fn seeds() -> Vec<(Vec<u8>, Option<usize>)> {
    let small = vec![sample("a", DataType::Fp32), sample("b", DataType::Bytes), sample("c", DataType::Bool)];
    let mixed = r#"{"id":"m","inputs":[{"name":"a","datatype":"UINT8","shape":[2],"data":[[1],[2]]},
        {"name":"s","datatype":"BYTES","shape":[1],"parameters":{"binary_data_size":6}}],
        "outputs":[{"name":"y","parameters":{"binary_data":true}}],"parameters":{"binary_data_output":false}}"#;
    let mut mixed_body = mixed.as_bytes().to_vec();
    mixed_body.extend([2, 0, 0, 0, b'o', b'k']);
    let mut seeds = vec![(mixed_body, Some(mixed.len()))];
    for binary in [false, true] {
        let request = encode_request(&small, binary, &[RequestedOutput::new("a")], Some("id"));
        seeds.push((request.body, request.header_length));
        let response = encode_response(
            "m",
            1,
            Some("id"),
            small.clone(),
            &InferRequest { binary_data_output: binary, ..Default::default() },
        )
        .unwrap();
        seeds.push((response.body, response.header_length));
    }
    let all = encode_request(&every_datatype(), true, &[], None);
    seeds.push((all.body, all.header_length));
    seeds
}

/// Runs both decoders; the result does not matter, only that they return.
fn decode_both(body: &[u8], header_length: Option<usize>) -> usize {
    let a = decode_request(body, header_length).is_ok();
    let b = decode_response(body, header_length).is_ok();
    usize::from(a) + usize::from(b)
}

fn header_lengths(original: Option<usize>, len: usize) -> Vec<Option<usize>> {
    let mut out = vec![None, Some(len), Some(len + 1), Some(0)];
    if let Some(n) = original {
        out.extend([Some(n), Some(n.saturating_sub(1)), Some(n + 1)]);
    }
    out
}

#[test]
fn seeds_are_valid() {
    for (body, header_length) in seeds() {
        assert_eq!(decode_both(&body, header_length), 1, "{}", String::from_utf8_lossy(&body));
    }
}

#[test]
fn truncations_never_panic() {
    for (body, header_length) in seeds() {
        for cut in 0..=body.len() {
            let prefix = &body[..cut];
            for n in header_lengths(header_length, cut) {
                decode_both(prefix, n);
            }
        }
    }
}

#[test]
fn byte_mutations_never_panic() {
    let replacements = [0u8, 0xff, b'"', b'[', b']', b'{', b'-', b'9', b'e', b',', b':', b'n', 0x80];
    for (body, header_length) in seeds() {
        let mut mutated = body.clone();
        for i in 0..body.len() {
            for &r in &replacements {
                mutated[i] = r;
                decode_both(&mutated, header_length);
            }
            mutated[i] = body[i];
            // Delete and duplicate the byte too, shifting everything after it.
            let mut deleted = body.clone();
            deleted.remove(i);
            decode_both(&deleted, header_length.map(|n| if i < n { n - 1 } else { n }));
            let mut doubled = body.clone();
            doubled.insert(i, body[i]);
            decode_both(&doubled, header_length);
        }
    }
}

#[test]
fn random_bytes_and_splices_never_panic() {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let seeds = seeds();
    for _ in 0..20_000 {
        let (body, header_length) = &seeds[(next() % seeds.len() as u64) as usize];
        let mut body = body.clone();
        // A few random overwrites with random bytes, plus a random splice
        // of another seed's tail.
        for _ in 0..(next() % 4) {
            if !body.is_empty() {
                let i = (next() % body.len() as u64) as usize;
                body[i] = next() as u8;
            }
        }
        if next() % 3 == 0 {
            let (other, _) = &seeds[(next() % seeds.len() as u64) as usize];
            let from = (next() % (other.len() as u64 + 1)) as usize;
            let at = (next() % (body.len() as u64 + 1)) as usize;
            body.truncate(at);
            body.extend_from_slice(&other[from..]);
        }
        let n = match next() % 3 {
            0 => None,
            1 => *header_length,
            _ => Some((next() % (body.len() as u64 + 2)) as usize),
        };
        decode_both(&body, n);
    }
    let noise: Vec<u8> = (0..4096).map(|_| next() as u8).collect();
    for cut in 0..64 {
        decode_both(&noise[..cut * 64], Some(cut));
    }
}

#[test]
fn decoded_garbage_encodes_without_panicking() {
    // Whatever decodes must also encode back (the server echoes inputs in
    // tests and tools), and decode again to the same tensors.
    for (body, header_length) in seeds() {
        for cut in 0..=body.len() {
            if let Ok(request) = decode_request(&body[..cut], header_length.filter(|&n| n <= cut)) {
                let again = encode_request(&request.inputs, true, &request.outputs, request.id.as_deref());
                assert_eq!(decode_request(&again.body, again.header_length).unwrap().inputs, request.inputs);
            }
        }
    }
}
