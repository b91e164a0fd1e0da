//! What every request carries: the input tensors, from the options, from
//! the model's metadata or from a request file, filled with deterministic
//! data and encoded once. Every request of a drill is the same bytes.

use std::time::Duration;

use anyhow::{Context, bail, ensure};
use baton_core::tensors::tensor::{DataType, Tensor, TensorData, element_count};
use serde_json::Value;

use super::args::{DrillArgs, Protocol};
use super::target::Endpoint;

/// One input of the request: name, datatype and concrete shape.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct InputSpec {
    /// Input name.
    pub name: String,
    /// Datatype, e.g. `FP32`.
    pub datatype: String,
    /// Concrete shape.
    pub shape: Vec<i64>,
}

/// Parses `NAME:DATATYPE:SHAPE` with the shape as `1,8` or `1x8`.
pub fn parse_input(text: &str) -> anyhow::Result<InputSpec> {
    let mut parts = text.rsplitn(3, ':');
    let (Some(shape), Some(datatype), Some(name)) = (parts.next(), parts.next(), parts.next()) else {
        bail!("--input '{text}' is not NAME:DATATYPE:SHAPE (e.g. input:FP32:1,8)");
    };
    ensure!(DataType::parse(datatype).is_some(), "--input '{text}': unknown datatype '{datatype}'");
    let shape = shape
        .split([',', 'x'])
        .filter(|d| !d.trim().is_empty())
        .map(|d| d.trim().parse::<i64>().ok().filter(|&d| d >= 0))
        .collect::<Option<Vec<i64>>>()
        .with_context(|| format!("--input '{text}': the shape must be non-negative integers, e.g. 1,8"))?;
    Ok(InputSpec { name: name.to_owned(), datatype: datatype.to_owned(), shape })
}

/// The inputs of `GET /v2/models/{m}[/versions/{v}]`, variable dimensions
/// set to `batch`.
pub fn inputs_from_metadata(http: &Endpoint, args: &DrillArgs) -> anyhow::Result<Vec<InputSpec>> {
    let path = match &args.model_version {
        Some(v) => format!("/v2/models/{}/versions/{v}", args.model),
        None => format!("/v2/models/{}", args.model),
    };
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into();
    let url = http.url(&path);
    let mut response = agent.get(&url).call().with_context(|| {
        format!("reading the model's metadata at {url} (give the inputs with --input to skip this)")
    })?;
    let status = response.status().as_u16();
    let text = response.body_mut().read_to_string().with_context(|| format!("reading {url}"))?;
    ensure!(status == 200, "GET {url} answered {status}: {}", text.trim());
    let metadata: Value = serde_json::from_str(&text).with_context(|| format!("{url} did not answer JSON"))?;
    let inputs = metadata["inputs"].as_array().with_context(|| format!("{url} lists no inputs"))?;
    let specs = inputs
        .iter()
        .map(|input| {
            let name = input["name"].as_str().context("an input without a name")?;
            let datatype = input["datatype"].as_str().with_context(|| format!("input '{name}' has no datatype"))?;
            ensure!(DataType::parse(datatype).is_some(), "input '{name}': unknown datatype '{datatype}'");
            let shape = input["shape"]
                .as_array()
                .with_context(|| format!("input '{name}' has no shape"))?
                .iter()
                .map(|d| d.as_i64().map(|d| if d < 0 { args.batch } else { d }))
                .collect::<Option<Vec<i64>>>()
                .with_context(|| format!("input '{name}' has a shape that is not integers"))?;
            Ok(InputSpec { name: name.to_owned(), datatype: datatype.to_owned(), shape })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    ensure!(!specs.is_empty(), "{url} lists no inputs; give them with --input");
    Ok(specs)
}

/// A tensor of `spec` filled with small deterministic values.
pub fn fill(spec: &InputSpec) -> anyhow::Result<Tensor> {
    let datatype = DataType::parse(&spec.datatype).with_context(|| format!("unknown datatype {}", spec.datatype))?;
    let count = element_count(&spec.shape).with_context(|| format!("input '{}': bad shape", spec.name))?;
    ensure!(count <= 1 << 28, "input '{}' has {count} elements; that is too large for a drill", spec.name);
    // A small linear congruential sequence: the same data every run.
    let mut state: u32 = 0x2545_f491;
    let mut next = move || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        state >> 8
    };
    let unit = |x: u32| (x as f32 / (1u32 << 24) as f32) * 2.0 - 1.0;
    let data = match datatype {
        DataType::Bytes => TensorData::Bytes((0..count).map(|i| format!("drill-{i}").into_bytes()).collect()),
        DataType::Bool => TensorData::Raw((0..count).map(|i| (i % 2) as u8).collect()),
        DataType::Fp32 => TensorData::Raw((0..count).flat_map(|_| unit(next()).to_le_bytes()).collect()),
        DataType::Fp64 => TensorData::Raw((0..count).flat_map(|_| f64::from(unit(next())).to_le_bytes()).collect()),
        // FP16 values in [-1, 1): sign, exponent 14 (0.5..1) and a random mantissa.
        DataType::Fp16 => TensorData::Raw(
            (0..count)
                .flat_map(|_| {
                    let x = next();
                    ((((x & 1) as u16) << 15) | (14 << 10) | ((x >> 1) & 0x3ff) as u16).to_le_bytes()
                })
                .collect(),
        ),
        other => {
            let size = other.size().unwrap_or(1);
            let mut bytes = Vec::with_capacity(count * size);
            for _ in 0..count {
                let value = (next() % 8) as u64;
                bytes.extend_from_slice(&value.to_le_bytes()[..size]);
            }
            TensorData::Raw(bytes)
        }
    };
    Ok(Tensor { name: spec.name.clone(), datatype, shape: spec.shape.clone(), data })
}

/// The input tensors of every request, from --request, --input or the metadata.
pub fn tensors(http: &Endpoint, args: &DrillArgs) -> anyhow::Result<Vec<Tensor>> {
    if let Some(path) = &args.request {
        let body = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let request = baton_protocol::decode_request(&body, None)
            .map_err(|e| anyhow::anyhow!("{} is not a KServe V2 JSON request: {e}", path.display()))?;
        ensure!(!request.inputs.is_empty(), "{} has no inputs", path.display());
        return Ok(request.inputs);
    }
    let specs = if args.inputs.is_empty() {
        inputs_from_metadata(http, args)?
    } else {
        args.inputs.iter().map(|text| parse_input(text)).collect::<anyhow::Result<Vec<_>>>()?
    };
    specs.iter().map(fill).collect()
}

/// The specs of tensors, for the report.
pub fn specs_of(tensors: &[Tensor]) -> Vec<InputSpec> {
    tensors
        .iter()
        .map(|t| InputSpec { name: t.name.clone(), datatype: t.datatype.as_str().to_owned(), shape: t.shape.clone() })
        .collect()
}

/// The complete HTTP/1.1 request (head and body) every HTTP request sends.
pub fn http_request(endpoint: &Endpoint, args: &DrillArgs, inputs: &[Tensor]) -> Vec<u8> {
    let binary = args.protocol == Protocol::HttpBinary;
    let encoded = baton_protocol::encode_request(inputs, binary, &[], None);
    let path = match &args.model_version {
        Some(v) => format!("{}/v2/models/{}/versions/{v}/infer", endpoint.prefix, args.model),
        None => format!("{}/v2/models/{}/infer", endpoint.prefix, args.model),
    };
    let mut head = format!("POST {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: baton-drill\r\n", endpoint.host);
    match encoded.header_length {
        Some(n) => head
            .push_str(&format!("Content-Type: application/octet-stream\r\nInference-Header-Content-Length: {n}\r\n")),
        None => head.push_str("Content-Type: application/json\r\n"),
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", encoded.body.len()));
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(&encoded.body);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_options() {
        let spec = parse_input("input:FP32:1,8").unwrap();
        assert_eq!(spec, InputSpec { name: "input".into(), datatype: "FP32".into(), shape: vec![1, 8] });
        assert_eq!(parse_input("a:b:INT64:2x3").unwrap().name, "a:b");
        assert!(parse_input("input:FLOAT:1").is_err());
        assert!(parse_input("input:FP32:-1,8").is_err());
        assert!(parse_input("input").is_err());
    }

    #[test]
    fn filled_tensors_are_consistent() {
        for datatype in DataType::ALL {
            let spec = InputSpec { name: "x".into(), datatype: datatype.as_str().into(), shape: vec![2, 3] };
            let tensor = fill(&spec).unwrap();
            tensor.check_consistent().unwrap();
        }
        let spec = InputSpec { name: "x".into(), datatype: "FP32".into(), shape: vec![4] };
        let values = fill(&spec).unwrap().to_f32().unwrap();
        assert!(values.iter().all(|v| (-1.0..1.0).contains(v)), "{values:?}");
        assert_eq!(fill(&spec).unwrap(), fill(&spec).unwrap());
    }
}
