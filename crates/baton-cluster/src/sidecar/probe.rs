//! A prepare's trial load: the candidate is loaded by the target server
//! beside what it serves, under a name of its own
//! ([`super::area::probe_name`]), asked whether it is ready, and sent one
//! inference request; then it is unloaded and its files go back to
//! staging.
//!
//! Why under another name: a KServe V2 server answers a request that names
//! no version from one of the model's versions it chooses (Triton the
//! newest ready one, MLServer the one it made the default), so loading the
//! candidate as a version of the model itself would give it traffic before
//! the fleet commits. Under the probe's name it gets none.

use std::time::Instant;

use serde_json::{Value, json};

use super::area::probe_name;
use super::{SidecarNode, blocking, refusal};
use crate::node::Refusal;

/// The most values an inference request of a probe carries; a signature
/// that asks for more is not tried.
const MOST_VALUES: u64 = 1 << 16;

/// One request of zeros for the inputs the metadata declares, each
/// variable dimension 1; `None` when there are no inputs, or one whose
/// datatype or size a probe does not try.
pub fn request_from_metadata(metadata: &Value) -> Option<Value> {
    let inputs = metadata.get("inputs")?.as_array()?;
    if inputs.is_empty() {
        return None;
    }
    let mut tensors = Vec::with_capacity(inputs.len());
    for input in inputs {
        let name = input.get("name")?.as_str()?;
        let datatype = input.get("datatype")?.as_str()?;
        let shape: Vec<u64> = input
            .get("shape")?
            .as_array()?
            .iter()
            .map(|d| d.as_i64().map(|d| if d > 0 { d as u64 } else { 1 }))
            .collect::<Option<_>>()?;
        let count = shape.iter().try_fold(1u64, |n, d| n.checked_mul(*d)).filter(|n| *n <= MOST_VALUES)?;
        let zero = match datatype {
            "BOOL" => json!(false),
            "BYTES" => json!(""),
            "FP16" | "FP32" | "FP64" | "BF16" => json!(0.0),
            "INT8" | "INT16" | "INT32" | "INT64" | "UINT8" | "UINT16" | "UINT32" | "UINT64" => json!(0),
            _ => return None,
        };
        let data = vec![zero; count as usize];
        tensors.push(json!({ "name": name, "datatype": datatype, "shape": shape, "data": data }));
    }
    Some(json!({ "inputs": tensors }))
}

impl SidecarNode {
    /// Loads staged `version` of `model` in the target under the probe's
    /// name and checks that it serves: ready (the model and the version),
    /// then one request answered. A refusal names the target's reason:
    /// stage `load` when the server would not load it or it did not become
    /// ready, `validate` when it could not answer. The probe is unloaded
    /// and the version back in staging in every case.
    pub(super) async fn probe(&self, model: &str, version: u64) -> Result<(), Refusal> {
        let probe = probe_name(model);
        let (area, layout, name) = (self.area.clone(), self.layout, model.to_owned());
        let source_model = self.specs.join(model);
        let lent = blocking("load", move || {
            let place = |e: std::io::Error| refusal("load", format!("putting version {version} on trial: {e}"));
            let dir = area.lend(&name, version).map_err(place)?;
            let probe = probe_name(&name);
            layout
                .finish_probe(&dir, &area.probe_dir(&name), &area.model_dir(&name), &source_model, &name)
                .map_err(place)?;
            layout.name_version(&dir, &probe, version).map_err(place)
        })
        .await;
        let attempted = lent.is_ok();
        let tried = match lent {
            Ok(()) => self.try_probe(&probe, version).await,
            Err(refused) => Err(refused),
        };
        let (target, area, layout, name) = (self.target.clone(), self.area.clone(), self.layout, model.to_owned());
        let cleaned = blocking("load", move || {
            // A load that failed may leave the probe known to the server
            // (Triton keeps it, unavailable): it is unloaded all the same.
            if attempted && let Err(error) = target.unload(&probe_name(&name)) {
                tracing::warn!(model = %name, version, %error, "Could not unload a probe of a candidate.");
            }
            let place = |e: std::io::Error| refusal("load", format!("taking version {version} off trial: {e}"));
            area.take_from_probe(&name, version).map_err(place)?;
            layout.name_version(&area.staged_dir(&name, version), &name, version).map_err(place)?;
            tried
        })
        .await;
        match &cleaned {
            Ok(()) => {
                tracing::info!(model, version, target = %self.target.base(), "The target server loaded the candidate on trial and answered with it.")
            }
            Err(refused) => {
                tracing::warn!(model, version, %refused, "The target server could not serve the candidate.")
            }
        }
        cleaned
    }

    /// Has the target load `probe` and checks it serves `version`, all
    /// within one load timeout: a server that hangs at any call fails the
    /// trial, as one that answers with an error does.
    async fn try_probe(&self, probe: &str, version: u64) -> Result<(), Refusal> {
        let (target, probe, body) = (self.target.clone(), probe.to_owned(), self.layout.load_body(version));
        let until = Instant::now() + self.target.load_timeout();
        blocking("load", move || {
            let load = |e: String| refusal("load", format!("the target could not load version {version}: {e}"));
            target.load(&probe, &body, until).map_err(load)?;
            target.wait_ready(&probe, version, until).map_err(load)?;
            let metadata = target.metadata(&probe, version, until).map_err(|e| {
                refusal("validate", format!("version {version} loaded but gave no metadata to try it with: {e}"))
            })?;
            match request_from_metadata(&metadata) {
                Some(request) => target
                    .infer(&probe, version, &request, until)
                    .map_err(|e| refusal("validate", format!("version {version} loaded but did not answer: {e}"))),
                None => {
                    tracing::info!(
                        version,
                        "The candidate's metadata names no inputs a probe can send; readiness only."
                    );
                    Ok(())
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_of_zeros_fills_each_declared_input() {
        let metadata = json!({ "inputs": [
            { "name": "input", "datatype": "FP32", "shape": [-1, 8] },
            { "name": "ids", "datatype": "INT64", "shape": [2] },
            { "name": "text", "datatype": "BYTES", "shape": [-1] },
        ]});
        let request = request_from_metadata(&metadata).unwrap();
        let inputs = request["inputs"].as_array().unwrap();
        assert_eq!(inputs[0]["shape"], json!([1, 8]));
        assert_eq!(inputs[0]["data"].as_array().unwrap().len(), 8);
        assert_eq!(inputs[1]["data"], json!([0, 0]));
        assert_eq!(inputs[2]["data"], json!([""]));
    }

    #[test]
    fn no_request_is_made_up_for_what_a_probe_cannot_send() {
        assert!(request_from_metadata(&json!({ "inputs": [] })).is_none());
        assert!(request_from_metadata(&json!({ "name": "m" })).is_none());
        let strange = json!({ "inputs": [{ "name": "x", "datatype": "COMPLEX", "shape": [1] }] });
        assert!(request_from_metadata(&strange).is_none());
        let huge = json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [100000, 100000] }] });
        assert!(request_from_metadata(&huge).is_none());
        let overflow = json!({ "inputs": [{ "name": "x", "datatype": "FP32", "shape": [i64::MAX, i64::MAX] }] });
        assert!(request_from_metadata(&overflow).is_none());
    }
}
