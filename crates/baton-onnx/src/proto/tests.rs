//! Unit tests for the protobuf reader, on hand-built messages.

use super::*;

fn vint(mut v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
    out
}

fn key(field: u32, wire: u8) -> Vec<u8> {
    vint(u64::from(field) << 3 | u64::from(wire))
}

/// A varint field.
fn fv(field: u32, v: u64) -> Vec<u8> {
    [key(field, 0), vint(v)].concat()
}

/// A length-delimited field.
fn fb(field: u32, b: &[u8]) -> Vec<u8> {
    [key(field, 2), vint(b.len() as u64), b.to_vec()].concat()
}

/// One unknown field of each wire type.
fn unknown() -> Vec<u8> {
    [fv(100, 5), key(101, 1), vec![7; 8], fb(102, b"junk"), key(103, 5), vec![9; 4]].concat()
}

fn value_info(name: &str, elem: i32, dims: &[Option<i64>]) -> Vec<u8> {
    let dim = |d: &Option<i64>| match d {
        Some(v) => fb(1, &[fv(1, *v as u64), unknown()].concat()),
        None => fb(1, &fb(2, b"batch")),
    };
    let shape: Vec<u8> = dims.iter().flat_map(dim).collect();
    let tensor_type = [fv(1, elem as u64), unknown(), fb(2, &shape)].concat();
    [fb(1, name.as_bytes()), unknown(), fb(2, &[unknown(), fb(1, &tensor_type)].concat())].concat()
}

fn tensor(name: &str, dt: i32, dims: &[i64], body: &[u8]) -> Vec<u8> {
    let dims: Vec<u8> = dims.iter().flat_map(|&d| fv(1, d as u64)).collect();
    [dims, fv(2, dt as u64), fb(8, name.as_bytes()), unknown(), body.to_vec()].concat()
}

fn model(graph: &[u8]) -> Vec<u8> {
    [fv(1, 7), unknown(), fb(8, &[fb(1, b""), fv(2, 13)].concat()), fb(7, graph)].concat()
}

/// A small graph: input x [batch, 3], output y [batch, 2], one raw FLOAT initializer.
fn small_graph() -> Vec<u8> {
    let w = tensor("w", elem::FLOAT, &[3, 2], &fb(9, &[0u8; 24]));
    [
        fb(1, &[fb(1, b"x"), fb(1, b"w"), fb(2, b"y"), fb(4, b"MatMul"), unknown()].concat()),
        fb(2, b"g"),
        fb(5, &w),
        unknown(),
        fb(11, &value_info("x", elem::FLOAT, &[None, Some(3)])),
        fb(11, &value_info("w", elem::FLOAT, &[Some(3), Some(2)])),
        fb(12, &value_info("y", elem::FLOAT, &[None, Some(2)])),
    ]
    .concat()
}

#[test]
fn varint_edge_cases() {
    let max = [vec![0xff; 9], vec![0x01]].concat();
    let ok: &[(&[u8], u64)] = &[
        (&[0x00], 0),
        (&[0x01], 1),
        (&[0x7f], 127),
        (&[0x80, 0x01], 128),
        (&[0xac, 0x02], 300),
        (&[0x80, 0x00], 0), // non-canonical but valid
        (&max, u64::MAX),
    ];
    for (bytes, want) in ok {
        let mut r = Reader::new(bytes);
        assert_eq!(r.varint("t").unwrap(), *want, "{bytes:?}");
        assert_eq!(r.pos, bytes.len());
    }
    for v in [0, 1, 127, 128, 16383, 16384, u64::MAX / 3, u64::MAX, -1i64 as u64] {
        assert_eq!(Reader::new(&vint(v)).varint("t").unwrap(), v);
    }
    let overflow = [vec![0xff; 9], vec![0x02]].concat();
    let too_long = [vec![0x80; 10], vec![0x00]].concat();
    for bad in [&overflow, &too_long] {
        assert!(matches!(Reader::new(bad).varint("t"), Err(ProtoError::Malformed(_))));
    }
    for trunc in [&[][..], &[0x80], &[0xff; 9]] {
        let err = Reader::new(trunc).varint("ctx").unwrap_err();
        assert!(matches!(err, ProtoError::Truncated { ref context } if context == "ctx"), "{err}");
    }
}

#[test]
fn parses_small_model_skipping_unknown_fields() {
    let m = parse(&model(&small_graph())).unwrap();
    assert_eq!(m.ir_version, 7);
    // "w" is both an input and an initializer (old IR): excluded from inputs.
    let x = ValueInfo { name: "x".into(), elem_type: elem::FLOAT, dims: Some(vec![-1, 3]) };
    let y = ValueInfo { name: "y".into(), elem_type: elem::FLOAT, dims: Some(vec![-1, 2]) };
    assert_eq!(m.graph_inputs, vec![x]);
    assert_eq!(m.graph_outputs, vec![y]);
    assert_eq!(m.initializers.len(), 1);
    let w = &m.initializers[0];
    assert_eq!((w.name.as_str(), w.data_type, &w.dims[..]), ("w", elem::FLOAT, &[3, 2][..]));
    let InitData::Raw(r) = &w.data else { panic!("{:?}", w.data) };
    assert_eq!(r.len(), 24);
    assert_eq!(bytes_of(w, &model(&small_graph()), Path::new(".")).unwrap().len(), 24);
}

#[test]
fn packed_dims_and_missing_shape() {
    let t = [fb(1, &[vint(2), vint(300)].concat()), fv(1, 4), fv(2, 7), fb(8, b"t")].concat();
    let no_shape = [fb(1, b"s"), fb(2, &fb(1, &fv(1, 7)))].concat();
    let m = parse(&model(&[fb(5, &t), fb(11, &no_shape)].concat())).unwrap();
    assert_eq!(m.initializers[0].dims, vec![2, 300, 4]);
    assert_eq!(m.initializers[0].data, InitData::Inline(vec![]));
    assert_eq!(m.graph_inputs[0].dims, None);
    assert_eq!(m.graph_inputs[0].elem_type, elem::INT64);
}

#[test]
fn groups_bad_wire_types_and_missing_graph_are_rejected() {
    for wire in [3u8, 4, 6, 7] {
        let bytes = [key(20, wire), vec![0; 8]].concat();
        assert!(matches!(parse(&bytes), Err(ProtoError::Malformed(_))), "wire {wire}");
    }
    let err = parse(&fb(1, b"x")).unwrap_err();
    assert!(matches!(err, ProtoError::BadWireType { field: 1, wire_type: 2, .. }), "{err}");
    assert!(matches!(parse(&fv(1, 8)), Err(ProtoError::Malformed(_))));
    assert!(matches!(parse(&[0x00, 0x01]), Err(ProtoError::Malformed(_))), "field 0");
    let bad_utf8 = model(&fb(11, &fb(1, &[0xff, 0xfe])));
    assert!(matches!(parse(&bad_utf8), Err(ProtoError::InvalidUtf8 { .. })));
}

#[test]
fn every_truncation_is_an_error() {
    let full = model(&small_graph()); // the graph is the last field
    for n in 0..full.len() {
        assert!(parse(&full[..n]).is_err(), "prefix {n} of {}", full.len());
    }
    assert!(parse(&full).is_ok());
}

#[test]
fn inner_length_overrun_names_the_tensor() {
    let t = [fb(8, b"weights"), key(9, 2), vint(100), vec![0; 4]].concat();
    let err = parse(&model(&fb(5, &t))).unwrap_err();
    assert!(err.to_string().contains("initializer 'weights'"), "{err}");
}

#[test]
fn garbage_and_mutations_never_panic() {
    let mut s = 0x1234_5678u64;
    let mut next = || {
        s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (s ^ (s >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z ^ (z >> 31)
    };
    for _ in 0..3000 {
        let len = (next() % 64) as usize;
        let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        let _ = parse(&bytes);
        let _ = parse(&model(&bytes));
    }
    let full = model(&small_graph());
    for i in 0..full.len() {
        for v in [0x00, 0xff, 0x80, 0x7f, full[i] ^ 1, full[i].wrapping_add(1)] {
            let mut m = full.clone();
            m[i] = v;
            if let Ok(model) = parse(&m) {
                for init in &model.initializers {
                    let _ = bytes_of(init, &m, Path::new("/nonexistent"));
                }
            }
        }
    }
}

/// [`initializer_bytes`] of a whole model file.
fn bytes_of(init: &Initializer, model: &[u8], dir: &Path) -> Result<Vec<u8>> {
    let mut scratch = Vec::new();
    initializer_bytes(init, RawData::InBytes(model), dir, &mut scratch).map(<[u8]>::to_vec)
}

fn one_init(t: &[u8]) -> Result<Initializer> {
    parse(&model(&fb(5, t))).map(|mut m| m.initializers.remove(0))
}

#[test]
fn typed_fields_decode_to_element_width() {
    let packed = |f: u32, vals: &[u64]| fb(f, &vals.iter().flat_map(|&v| vint(v)).collect::<Vec<_>>());
    let floats: Vec<u8> = [1.0f32, -2.5].iter().flat_map(|f| f.to_le_bytes()).collect();
    let unpacked_float =
        [key(4, 5), 1.0f32.to_le_bytes().to_vec(), key(4, 5), (-2.5f32).to_le_bytes().to_vec()].concat();
    let m1 = -1i64 as u64;
    let cases: Vec<(i32, Vec<u8>, Vec<u8>)> = vec![
        (elem::FLOAT, fb(4, &floats), floats.clone()),
        (elem::FLOAT, unpacked_float, floats.clone()),
        (
            elem::DOUBLE,
            [key(10, 1), 7f64.to_le_bytes().to_vec(), fb(10, &8f64.to_le_bytes())].concat(),
            [7f64, 8.0].iter().flat_map(|d| d.to_le_bytes()).collect(),
        ),
        (elem::INT32, packed(5, &[m1, 2]), [(-1i32).to_le_bytes(), 2i32.to_le_bytes()].concat()),
        (elem::FLOAT16, packed(5, &[0x3c00, 0xc000]), vec![0x00, 0x3c, 0x00, 0xc0]),
        (elem::UINT16, [fv(5, 65535), fv(5, 1)].concat(), vec![0xff, 0xff, 1, 0]),
        (elem::BOOL, packed(5, &[1, 0]), vec![1, 0]),
        (elem::INT8, packed(5, &[m1, 5]), vec![0xff, 5]),
        (elem::INT64, packed(7, &[m1, 3]), [(-1i64).to_le_bytes(), 3i64.to_le_bytes()].concat()),
        (elem::UINT32, packed(11, &[u32::MAX as u64, 4]), [u32::MAX.to_le_bytes(), 4u32.to_le_bytes()].concat()),
        (elem::UINT64, packed(11, &[u64::MAX, 6]), [u64::MAX.to_le_bytes(), 6u64.to_le_bytes()].concat()),
    ];
    for (dt, body, want) in cases {
        let init = one_init(&tensor("t", dt, &[2], &body)).unwrap();
        assert_eq!(init.data, InitData::Inline(want.clone()), "dtype {dt}");
        assert_eq!(&bytes_of(&init, &[], Path::new(".")).unwrap()[..], &want[..]);
    }
    let err = one_init(&tensor("mixed", elem::FLOAT, &[1], &packed(7, &[1]))).unwrap_err();
    assert!(err.to_string().contains("'mixed'") && err.to_string().contains("int64_data"), "{err}");
    let err = one_init(&tensor("odd", elem::FLOAT, &[1], &fb(4, &[0; 5]))).unwrap_err();
    assert!(err.to_string().contains("'odd'"), "{err}");
}

#[test]
fn initializer_bytes_checks_sizes_and_types() {
    let dir = Path::new(".");
    let short = one_init(&tensor("short", elem::FLOAT, &[2, 3], &fb(9, &[0; 20]))).unwrap();
    let bytes = model(&fb(5, &tensor("short", elem::FLOAT, &[2, 3], &fb(9, &[0; 20]))));
    let err = bytes_of(&short, &bytes, dir).unwrap_err();
    assert!(err.to_string().contains("'short'") && err.to_string().contains("24"), "{err}");
    // The same from the file, through a skeleton.
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.onnx");
    std::fs::write(&path, &bytes).unwrap();
    let file = File::open(&path).unwrap();
    let from_file = parse(&read_skeleton(&file, &path).unwrap()).unwrap().initializers.remove(0);
    let err = initializer_bytes(&from_file, RawData::InFile(&file), dir, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("'short'") && err.to_string().contains("24"), "{err}");
    let s = one_init(&tensor("names", elem::STRING, &[1], &fb(6, b"hello"))).unwrap();
    assert!(matches!(bytes_of(&s, &[], dir), Err(ProtoError::Unsupported(_))));
    let neg = Initializer { dims: vec![-1], ..short.clone() };
    assert!(matches!(bytes_of(&neg, &bytes, dir), Err(ProtoError::Malformed(_))));
    let huge = Initializer { dims: vec![i64::MAX, i64::MAX], ..short.clone() };
    assert!(matches!(bytes_of(&huge, &bytes, dir), Err(ProtoError::Malformed(_))));
    let scalar = Initializer { dims: vec![], data: InitData::Inline(vec![0; 4]), ..short };
    assert_eq!(bytes_of(&scalar, &[], dir).unwrap().len(), 4);
}

#[test]
fn external_locations_outside_the_model_dir_are_rejected() {
    for bad in ["", "/etc/passwd", "../x.bin", "a/../../x.bin", "a/..", "..\\x.bin", "C:\\x.bin", "c:x", "\\\\srv\\x"] {
        assert!(!location_ok(bad), "{bad:?} accepted");
    }
    for good in ["w.bin", "sub/w.bin", "./w.bin", "a..b.bin"] {
        assert!(location_ok(good), "{good:?} rejected");
    }
    let dir = tempfile::tempdir().unwrap();
    let data: Vec<u8> = (0u8..32).collect();
    std::fs::write(dir.path().join("w.bin"), &data).unwrap();
    let ext = |location: &str, offset, length| Initializer {
        name: "ext".into(),
        data_type: elem::FLOAT,
        dims: vec![2],
        data: InitData::External { location: location.into(), offset, length },
    };
    let got = bytes_of(&ext("w.bin", 4, Some(8)), &[], dir.path()).unwrap();
    assert_eq!(&got[..], &data[4..12]);
    let got = bytes_of(&ext("./w.bin", 24, None), &[], dir.path()).unwrap();
    assert_eq!(&got[..], &data[24..]);
    for (init, what) in [
        (ext("../w.bin", 0, Some(8)), "relative path"),
        (ext("/w.bin", 0, Some(8)), "relative path"),
        (ext("w.bin", 0, Some(12)), "need 8"),
        (ext("w.bin", 30, Some(8)), "past its end"),
        (ext("w.bin", u64::MAX, Some(8)), "past its end"),
        (ext("w.bin", 0, None), "need 8"),
    ] {
        let err = bytes_of(&init, &[], dir.path()).unwrap_err();
        assert!(err.to_string().contains(what) && err.to_string().contains("'ext'"), "{err}");
    }
    let err = bytes_of(&ext("missing.bin", 0, None), &[], dir.path()).unwrap_err();
    assert!(matches!(err, ProtoError::Io { .. }), "{err}");
}

#[test]
fn external_data_keys_are_parsed() {
    let entry = |k: &str, v: &str| fb(13, &[fb(1, k.as_bytes()), fb(2, v.as_bytes())].concat());
    let body = [entry("location", "w.bin"), entry("offset", "16"), entry("checksum", "x"), fv(14, 1)].concat();
    let init = one_init(&tensor("e", elem::FLOAT, &[2], &body)).unwrap();
    let want = InitData::External { location: "w.bin".into(), offset: 16, length: None };
    assert_eq!(init.data, want);
    let body = [entry("location", "w.bin"), entry("length", "-3"), fv(14, 1)].concat();
    assert!(one_init(&tensor("e", elem::FLOAT, &[2], &body)).is_err());
    let err = one_init(&tensor("e", elem::FLOAT, &[2], &fv(14, 1))).unwrap_err();
    assert!(err.to_string().contains("location"), "{err}");
}

/// A model whose initializers come in every order and shape the skeleton
/// reader must follow: raw data before the name, an unknown field after it,
/// an inline tensor, and nodes with bytes of their own.
fn varied_model() -> Vec<u8> {
    let payload =
        |n: usize, seed: u8| (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>();
    let raw_first = [fb(9, &payload(4000 * 4, 7)), fv(2, elem::FLOAT as u64), fv(1, 4000), fb(8, b"first")].concat();
    let graph = [
        fb(1, &fb(1, b"a node, skipped whole")),
        fb(5, &raw_first),
        fb(5, &[tensor("second", elem::INT8, &[3, 5], &fb(9, &payload(15, 1))), unknown()].concat()),
        fb(5, &tensor("inline", elem::FLOAT, &[1], &fb(4, &2.5f32.to_le_bytes()))),
        small_graph(),
    ]
    .concat();
    model(&graph)
}

#[test]
fn a_skeleton_parses_as_the_whole_file_and_its_payloads_are_read_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let whole = varied_model();
    let path = dir.path().join("model.onnx");
    std::fs::write(&path, &whole).unwrap();
    let file = File::open(&path).unwrap();
    let skeleton = read_skeleton(&file, &path).unwrap();
    assert_eq!(skeleton.len(), whole.len());
    let (from_whole, from_skeleton) = (parse(&whole).unwrap(), parse(&skeleton).unwrap());
    assert_eq!(from_skeleton, from_whole);
    let mut left_out = 0;
    let mut scratch = Vec::new();
    for init in &from_whole.initializers {
        if let InitData::Raw(r) = &init.data {
            assert!(skeleton[r.clone()].iter().all(|&b| b == 0), "payload of {} was read", init.name);
            left_out += r.len();
        }
        let want = bytes_of(init, &whole, dir.path()).unwrap();
        assert_eq!(initializer_bytes(init, RawData::InFile(&file), dir.path(), &mut scratch).unwrap(), &want[..]);
    }
    assert_eq!(left_out, 4000 * 4 + 15 + 24);
    // Everything but the payloads is as in the file.
    let differs = whole.iter().zip(&skeleton).filter(|(a, b)| a != b).count();
    assert!(differs > 0 && differs <= left_out);
}

#[test]
fn a_skeleton_fails_only_where_parsing_fails_and_parses_the_same_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("model.onnx");
    let check = |m: &[u8], what: &str| {
        std::fs::write(&path, m).unwrap();
        let file = File::open(&path).unwrap();
        match read_skeleton(&file, &path) {
            Ok(skeleton) => assert_eq!(format!("{:?}", parse(&skeleton)), format!("{:?}", parse(m)), "{what}"),
            Err(e) => assert!(parse(m).is_err(), "{what}: the skeleton failed ({e}), parsing did not"),
        }
    };
    let full = varied_model();
    // Every byte but those of the first, large payload.
    let InitData::Raw(first) = parse(&full).unwrap().initializers.remove(0).data else { panic!("no raw data") };
    for i in (0..full.len()).filter(|i| !first.contains(i)) {
        for v in [0x00, 0xff, 0x80, full[i] ^ 1] {
            let mut m = full.clone();
            m[i] = v;
            check(&m, &format!("byte {i} = {v:#x}"));
        }
    }
    for cut in [1, 10, 100, full.len() / 2, full.len() - 1] {
        check(&full[..cut], &format!("cut at {cut}"));
    }
}

#[test]
fn externalize_moves_only_large_inline_payloads_and_keeps_everything_else() {
    let payload =
        |seed: u8, n: usize| (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect::<Vec<u8>>();
    let (big, odd, small) = (payload(1, 8192), payload(2, 8192), payload(3, 24));
    let entry = fb(13, &[fb(1, b"note"), fb(2, b"kept")].concat());
    let graph = [
        fb(1, &[fb(1, b"x"), fb(2, b"node-kept"), fb(4, b"Relu")].concat()),
        fb(5, &tensor("big", elem::FLOAT, &[2048], &fb(9, &big))),
        // Any external_data entry means "leave it alone", even with raw_data.
        fb(5, &tensor("odd", elem::FLOAT, &[2048], &[entry, fb(9, &odd)].concat())),
        fb(5, &tensor("small", elem::FLOAT, &[6], &fb(9, &small))),
        fb(
            5,
            &tensor(
                "ext",
                elem::FLOAT,
                &[4],
                &[fb(13, &[fb(1, b"location"), fb(2, b"w.bin")].concat()), fv(14, 1)].concat(),
            ),
        ),
        unknown(),
        fb(11, &value_info("x", elem::FLOAT, &[None, Some(3)])),
        fb(12, &value_info("y", elem::FLOAT, &[None, Some(2)])),
    ]
    .concat();
    let bytes = model(&graph);
    let before = parse(&bytes).unwrap();
    let out = externalize(&bytes, "data.bin", 4096, 4096, None).unwrap().expect("one payload is large enough");
    let after = parse(&out.model).unwrap();
    assert_eq!(
        (after.ir_version, &after.graph_inputs, &after.graph_outputs),
        (7, &before.graph_inputs, &before.graph_outputs)
    );
    let InitData::Raw(big_range) = &before.initializers[0].data else { panic!() };
    assert_eq!(out.moves, vec![Move { from: Origin::Inline(big_range.clone()), to: 0 }]);
    assert_eq!(out.data_len, 8192);
    assert_eq!(
        after.initializers[0].data,
        InitData::External { location: "data.bin".into(), offset: 0, length: Some(8192) }
    );
    for (i, want) in [(1, &odd), (2, &small)] {
        let got = bytes_of(&after.initializers[i], &out.model, Path::new(".")).unwrap();
        assert_eq!(&got, want, "{}", after.initializers[i].name);
    }
    assert_eq!(after.initializers[3], before.initializers[3]);
    for (b, a) in before.initializers.iter().zip(&after.initializers) {
        assert_eq!((&b.name, b.data_type, &b.dims), (&a.name, a.data_type, &a.dims));
    }
    // The graph's other fields, and the model's, are kept byte for byte.
    for kept in [&b"node-kept"[..], &unknown()] {
        assert!(out.model.windows(kept.len()).any(|w| w == kept));
    }
    // Offsets are aligned; with nothing large enough, nothing is rewritten.
    let two = model(
        &[
            fb(5, &tensor("a", elem::FLOAT, &[1025], &fb(9, &payload(4, 4100)))),
            fb(5, &tensor("b", elem::FLOAT, &[1024], &fb(9, &big[..4096]))),
        ]
        .concat(),
    );
    let out = externalize(&two, "d", 4096, 4096, None).unwrap().unwrap();
    assert_eq!(out.moves.iter().map(|m| m.to).collect::<Vec<_>>(), vec![0, 8192]);
    assert_eq!(out.data_len, 8192 + 4096);
    assert!(externalize(&model(&small_graph()), "d", 4096, 4096, None).unwrap().is_none());
}

#[test]
fn externalize_moves_external_data_of_any_size_when_given_the_files_lengths() {
    let entry = |k: &str, v: &str| fb(13, &[fb(1, k.as_bytes()), fb(2, v.as_bytes())].concat());
    let external = |name: &str, location: &str, offset: &str, length: Option<&str>| {
        let mut body = [entry("location", location), entry("offset", offset), entry("checksum", "x")].concat();
        if let Some(length) = length {
            body.extend(entry("length", length));
        }
        body.extend(fv(14, 1));
        fb(5, &tensor(name, elem::FLOAT, &[2], &body))
    };
    let graph = [
        external("a", "w.bin", "8", Some("8")),
        // No length: to the end of the file.
        external("b", "./w.bin", "24", None),
        fb(5, &tensor("small", elem::FLOAT, &[2], &fb(9, &[1; 8]))),
    ]
    .concat();
    let bytes = model(&graph);
    let lengths = |location: &str| matches!(location, "w.bin" | "./w.bin").then_some(32);
    let out = externalize(&bytes, "data.bin", 4096, 4096, Some(&lengths)).unwrap().expect("external data moves");
    let origin = |location: &str, offset, len| Origin::External { location: location.into(), offset, len };
    assert_eq!(
        out.moves,
        vec![Move { from: origin("w.bin", 8, 8), to: 0 }, Move { from: origin("./w.bin", 24, 8), to: 4096 }]
    );
    let after = parse(&out.model).unwrap();
    for (init, offset) in after.initializers.iter().zip([0, 4096]) {
        assert_eq!(init.data, InitData::External { location: "data.bin".into(), offset, length: Some(8) });
    }
    assert!(matches!(after.initializers[2].data, InitData::Raw(_)), "small inline data stays");
    assert_eq!(bytes_of(&after.initializers[2], &out.model, Path::new(".")).unwrap(), [1; 8]);
    // Without the lengths, external data is left alone; a file it does not
    // know, or a range past the file's end, is an error.
    assert!(externalize(&bytes, "data.bin", 4096, 4096, None).unwrap().is_none());
    let none = |_: &str| None;
    assert!(externalize(&bytes, "data.bin", 4096, 4096, Some(&none)).is_err());
    let short = |_: &str| Some(20);
    let err = externalize(&bytes, "data.bin", 4096, 4096, Some(&short)).unwrap_err();
    assert!(err.to_string().contains("past its end"), "{err}");
}

#[test]
fn external_data_outside_the_graphs_initializers_is_found() {
    let external_tensor = |name: &str| tensor(name, elem::FLOAT, &[1], &[fb(13, &fb(2, b"x.bin")), fv(14, 1)].concat());
    let inline_tensor = tensor("fine", elem::FLOAT, &[1], &fb(9, &[0; 4]));
    let main_init = fb(5, &external_tensor("main"));
    let attribute = |body: Vec<u8>| fb(1, &fb(5, &body));
    let cases: Vec<(&str, Vec<u8>, Option<&str>)> = vec![
        ("the graph's own initializer", main_init.clone(), None),
        ("an inline attribute", attribute(fb(5, &inline_tensor)), None),
        ("an attribute tensor", attribute(fb(5, &external_tensor("t"))), Some("t")),
        ("an attribute's tensors", attribute(fb(10, &external_tensor("ts"))), Some("ts")),
        ("a subgraph's initializer", attribute(fb(6, &fb(5, &external_tensor("sub")))), Some("sub")),
        ("a sparse initializer", fb(15, &fb(1, &external_tensor("sparse"))), Some("sparse")),
        ("a node in a subgraph", attribute(fb(11, &attribute(fb(5, &external_tensor("deep"))))), Some("deep")),
    ];
    for (what, graph, found) in cases {
        let bytes = model(&[main_init.clone(), graph].concat());
        assert_eq!(nested_external_data(&bytes).unwrap().as_deref(), found, "{what}");
    }
    // A function's node.
    let function = fb(25, &fb(7, &fb(5, &fb(5, &external_tensor("f")))));
    let bytes = [model(&main_init), function].concat();
    assert_eq!(nested_external_data(&bytes).unwrap().as_deref(), Some("f"));
}

#[test]
fn relative_locations_are_normalised_and_escapes_refused() {
    assert_eq!(relative_location("./sub//w.bin").as_deref(), Some("sub/w.bin"));
    assert_eq!(relative_location("w.bin").as_deref(), Some("w.bin"));
    for bad in ["", ".", "/etc/passwd", "../w.bin", "sub/../../w.bin", "C:\\w.bin"] {
        assert_eq!(relative_location(bad), None, "{bad:?}");
    }
}

#[test]
fn nodes_constants_and_subgraphs_are_read() {
    let attr_int = |name: &[u8], v: u64| fb(5, &[fb(1, name), fv(3, v), fv(20, 2)].concat());
    let constant = |output: &[u8], attr: Vec<u8>| fb(1, &[fb(2, output), fb(4, b"Constant"), fb(5, &attr)].concat());
    let float = [fb(1, b"value_float"), key(2, 5), 2.5f32.to_le_bytes().to_vec()].concat();
    let ints = [fb(1, b"value_ints"), fb(8, &[vint(3), vint(7)].concat())].concat();
    let tensor_attr = [fb(1, b"value"), fb(5, &tensor("", elem::FLOAT, &[2], &fb(9, &[0u8; 8])))].concat();
    let inner = fb(1, &[fb(1, b"outer_value"), fb(2, b"inner_out"), fb(4, b"MatMul")].concat());
    let branch = fb(5, &[fb(1, b"then_branch"), fb(6, &inner), fv(20, 5)].concat());
    let graph = [
        fb(
            1,
            &[fb(1, b"x"), fb(1, b""), fb(2, b"g"), fb(3, b"gather"), fb(4, b"Gather"), attr_int(b"axis", 1)].concat(),
        ),
        constant(b"f", float),
        constant(b"n", ints),
        constant(b"t", tensor_attr),
        fb(1, &[fb(1, b"cond"), fb(2, b"if_out"), fb(4, b"If"), branch].concat()),
    ]
    .concat();
    let m = parse(&model(&graph)).unwrap();
    let ops: Vec<&str> = m.nodes.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(ops, ["Gather", "Constant", "Constant", "Constant", "If", "MatMul"], "subgraph nodes come last");
    let gather = &m.nodes[0];
    assert_eq!(
        (gather.name.as_str(), gather.int("axis"), &gather.inputs[..]),
        ("gather", Some(1), &["x".to_owned(), String::new()][..])
    );
    let constants: Vec<&Initializer> = m.nodes.iter().filter_map(|n| n.constant.as_ref()).collect();
    assert_eq!(constants.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["f", "n", "t"]);
    assert_eq!((constants[0].data_type, &constants[0].dims[..]), (elem::FLOAT, &[][..]));
    assert_eq!(bytes_of(constants[0], &model(&graph), Path::new(".")).unwrap(), 2.5f32.to_le_bytes());
    let n = bytes_of(constants[1], &model(&graph), Path::new(".")).unwrap();
    assert_eq!(n, [3i64.to_le_bytes(), 7i64.to_le_bytes()].concat());
    assert_eq!((constants[2].data_type, &constants[2].dims[..]), (elem::FLOAT, &[2][..]));
    assert_eq!(m.nodes[5].inputs, ["outer_value"]);
}
