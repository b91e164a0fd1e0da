//! `inference.GRPCInferenceService`: health, metadata, inference (unary and
//! streaming), Triton's model configuration and statistics, and the model
//! repository extension.
//!
//! Inference runs inline on the async worker, as over REST: for the small,
//! fast models baton is built around, a hand-off to a blocking pool would
//! cost more than the inference itself.

use std::sync::Arc;

use baton_protocol::grpc::convert;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::pb::grpc_inference_service_server::GrpcInferenceService;
use super::pb::model_metadata_response::TensorMetadata;
use super::pb::*;
use super::{inbound_error, model_config, parse_version, repository};
use crate::app::App;
use crate::error::{Class, ServeError};
use crate::serving;

/// Extensions the gRPC front end speaks, as `ServerMetadata` lists them.
/// (`binary_tensor_data` is REST's; gRPC has raw contents built in.)
pub const EXTENSIONS: [&str; 4] = ["model_repository", "model_configuration", "statistics", "baton_management"];

/// The service, sharing the app with every other front end.
pub struct Inference {
    app: Arc<App>,
}

impl Inference {
    /// The service over `app`.
    pub fn new(app: Arc<App>) -> Inference {
        Inference { app }
    }
}

/// Runs one inference request on the routing snapshot taken when it
/// arrived, through the serving path REST uses.
async fn infer(app: &App, request: ModelInferRequest) -> Result<ModelInferResponse, ServeError> {
    let snapshot = app.registry.snapshot();
    let _in_flight = app.metrics.in_flight();
    let model = request.model_name.clone();
    let refused = |e: ServeError| {
        app.metrics.rejected(&model, e.kind);
        e
    };
    let version = parse_version(&request.model_version).map_err(refused)?;
    let mut decoded = convert::decode_request(request).map_err(|e| refused(e.into()))?;
    let inputs = std::mem::take(&mut decoded.inputs);
    let (target, outputs) = serving::infer(app, &snapshot, &model, version, inputs).await?;
    Ok(convert::encode_response(&model, target.number(), decoded.id, outputs, &decoded.outputs, decoded.raw)?)
}

/// One answer on an inference stream: the response, or the error's message
/// with the request's model and id so the client can tell which failed.
async fn stream_answer(app: &App, request: ModelInferRequest) -> ModelStreamInferResponse {
    let (model_name, id) = (request.model_name.clone(), request.id.clone());
    match infer(app, request).await {
        Ok(response) => ModelStreamInferResponse { error_message: String::new(), infer_response: Some(response) },
        Err(e) => ModelStreamInferResponse {
            error_message: e.message,
            infer_response: Some(ModelInferResponse { model_name, id, ..ModelInferResponse::default() }),
        },
    }
}

fn tensor_metadata(specs: &[baton_core::signature::TensorSpec]) -> Vec<TensorMetadata> {
    specs
        .iter()
        .map(|s| TensorMetadata {
            name: s.name.clone(),
            datatype: s.datatype.as_str().to_owned(),
            shape: s.shape.clone(),
        })
        .collect()
}

#[tonic::async_trait]
impl GrpcInferenceService for Inference {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
        Ok(Response::new(ServerLiveResponse { live: true }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
        Ok(Response::new(ServerReadyResponse { ready: self.app.ready() }))
    }

    /// Ready when the version asked for serves, as over REST. Unlike REST
    /// (404), a model baton does not know is simply not ready: the answer
    /// has no room for more than a bool, and Triton's clients poll
    /// `is_model_ready` for a model that has yet to appear, expecting
    /// `false`, not an error (Triton answers so too).
    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
        let request = request.into_inner();
        let version = parse_version(&request.version)?;
        let snapshot = self.app.registry.snapshot();
        let ready = snapshot.resolve(&request.name, version).is_ok();
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "baton".to_owned(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            extensions: EXTENSIONS.iter().map(|e| (*e).to_owned()).collect(),
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> Result<Response<ModelMetadataResponse>, Status> {
        let request = request.into_inner();
        let version = parse_version(&request.version)?;
        let snapshot = self.app.registry.snapshot();
        let target = serving::resolve(&self.app, &snapshot, &request.name, version)?;
        let route = snapshot.model(&request.name).ok_or_else(|| serving::not_serving(&self.app, &request.name))?;
        let mut versions: Vec<u64> = route.versions().map(|v| v.number()).collect();
        versions.sort_unstable();
        let (platform, _) = serving::platform(target);
        let signature = target.signature();
        Ok(Response::new(ModelMetadataResponse {
            name: request.name,
            versions: versions.iter().map(u64::to_string).collect(),
            platform: platform.to_owned(),
            inputs: tensor_metadata(&signature.inputs),
            outputs: tensor_metadata(&signature.outputs),
        }))
    }

    async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
        Ok(Response::new(infer(&self.app, request.into_inner()).await?))
    }

    type ModelStreamInferStream = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

    /// Answers each request of the stream in order, each from the routing
    /// snapshot taken when it arrived: a swap between two requests shows in
    /// the second answer, never inside one. Errors of one request are that
    /// request's `error_message`; the stream goes on. When the server shuts
    /// down, the stream ends with `UNAVAILABLE` after the answer in progress.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        let mut inbound = request.into_inner();
        let app = Arc::clone(&self.app);
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    biased;
                    () = super::draining(app.shutdown_signal()) => {
                        let ending = ServeError::new(
                            Class::Unavailable,
                            "shutting_down",
                            "the server is shutting down; the stream ends",
                        );
                        let _ = tx.send(Err(ending.into())).await;
                        return;
                    }
                    next = inbound.message() => next,
                };
                let answer = match next {
                    Ok(Some(request)) => stream_answer(&app, request).await,
                    Ok(None) => return,
                    Err(status) => {
                        let _ = tx.send(Err(inbound_error(status))).await;
                        return;
                    }
                };
                if tx.send(Ok(answer)).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> Result<Response<ModelConfigResponse>, Status> {
        let request = request.into_inner();
        let version = parse_version(&request.version)?;
        let snapshot = self.app.registry.snapshot();
        let target = serving::resolve(&self.app, &snapshot, &request.name, version)?;
        let (platform, backend) = serving::platform(target);
        let json = baton_protocol::model_config(
            &request.name,
            platform,
            &backend,
            serving::max_batch_size(target),
            target.signature(),
        );
        Ok(Response::new(ModelConfigResponse { config: Some(model_config::from_json(&json)?) }))
    }

    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> Result<Response<ModelStatisticsResponse>, Status> {
        let request = request.into_inner();
        let version = parse_version(&request.version)?;
        let model_stats = repository::statistics(&self.app, &request.name, version)?;
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> Result<Response<RepositoryIndexResponse>, Status> {
        let models = repository::index(&self.app, request.into_inner().ready)?;
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> Result<Response<RepositoryModelLoadResponse>, Status> {
        let request = request.into_inner();
        let version = repository::requested_version(&request.parameters)?;
        repository::load(&self.app, &request.model_name, version).await?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> Result<Response<RepositoryModelUnloadResponse>, Status> {
        let request = request.into_inner();
        repository::unload(&self.app, &request.model_name, &request.parameters).await?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }
}
