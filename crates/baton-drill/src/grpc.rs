//! The gRPC side: `inference.GRPCInferenceService/ModelInfer` through the
//! tonic client generated from `proto/grpc_service.proto`, one HTTP/2
//! connection per worker, inputs as `raw_input_contents`.

use std::time::Duration;

use anyhow::Context;
use baton_core::tensors::tensor::{Tensor, TensorData};
use tonic::transport::{Channel, Endpoint as TonicEndpoint};

use super::args::DrillArgs;
use super::caller::Failure;
use super::target::Endpoint;

use baton_protocol::grpc::pb;
use pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use pb::model_infer_request::InferInputTensor;

/// The largest answer accepted.
const MAX_MESSAGE: usize = 1 << 30;

/// One worker's gRPC connection and the request it sends.
pub struct GrpcCaller {
    endpoint: TonicEndpoint,
    client: Option<GrpcInferenceServiceClient<Channel>>,
    request: pb::ModelInferRequest,
    version: String,
}

/// A tensor's elements as raw contents: little-endian bytes, or framed
/// BYTES elements.
pub fn raw_contents(tensor: &Tensor) -> Vec<u8> {
    match &tensor.data {
        TensorData::Raw(bytes) => bytes.clone(),
        TensorData::Bytes(items) => {
            let mut out = Vec::new();
            baton_core::tensors::tensor::append_framed(items, &mut out);
            out
        }
    }
}

impl GrpcCaller {
    /// A caller for the server at `endpoint` (its resolved address).
    pub fn new(endpoint: &Endpoint, args: &DrillArgs, inputs: &[Tensor]) -> anyhow::Result<GrpcCaller> {
        let uri = format!("http://{}", endpoint.addr);
        let endpoint = TonicEndpoint::from_shared(uri.clone())
            .with_context(|| format!("'{uri}' is not a gRPC address"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(10));
        let request = pb::ModelInferRequest {
            model_name: args.model.clone(),
            model_version: args.model_version.clone().unwrap_or_default(),
            inputs: inputs
                .iter()
                .map(|t| InferInputTensor {
                    name: t.name.clone(),
                    datatype: t.datatype.as_str().to_owned(),
                    shape: t.shape.clone(),
                    ..InferInputTensor::default()
                })
                .collect(),
            raw_input_contents: inputs.iter().map(raw_contents).collect(),
            ..pb::ModelInferRequest::default()
        };
        Ok(GrpcCaller { endpoint, client: None, request, version: String::new() })
    }

    /// Opens the connection.
    pub async fn connect(&mut self) -> Result<(), Failure> {
        let channel =
            self.endpoint.connect().await.map_err(|e| Failure::new("connect", format!("connecting: {}", chain(&e))))?;
        self.client = Some(
            GrpcInferenceServiceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE)
                .max_encoding_message_size(MAX_MESSAGE),
        );
        Ok(())
    }

    /// Sends the request; the version that answered and the role it named.
    pub async fn call(&mut self, timeout: Duration) -> Result<(&str, u8), Failure> {
        if self.client.is_none() {
            self.connect().await?;
        }
        let client = self.client.as_mut().expect("a client was just connected");
        let request = tonic::Request::new(self.request.clone());
        match tokio::time::timeout(timeout, client.model_infer(request)).await {
            Err(_) => {
                self.client = None;
                Err(Failure::new("timeout", format!("no answer within {timeout:?}")))
            }
            Ok(Err(status)) => Err(Failure::new(format!("grpc {:?}", status.code()), status.message().to_owned())),
            Ok(Ok(response)) => {
                let role = response
                    .metadata()
                    .get(crate::role::HEADER)
                    .map_or(crate::role::NONE, |v| crate::role::parse(v.as_bytes()));
                self.version = response.into_inner().model_version;
                Ok((&self.version, role))
            }
        }
    }
}

/// An error with its sources, on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use baton_core::tensors::tensor::DataType;

    use super::*;

    #[test]
    fn raw_contents_of_bytes_are_length_prefixed() {
        let t = Tensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![2],
            data: TensorData::Bytes(vec![b"ab".to_vec(), Vec::new()]),
        };
        assert_eq!(raw_contents(&t), [2, 0, 0, 0, b'a', b'b', 0, 0, 0, 0]);
        assert_eq!(raw_contents(&Tensor::from_f32("x", vec![1], &[1.0])), 1.0f32.to_le_bytes());
    }
}
