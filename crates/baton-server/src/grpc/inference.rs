//! `inference.GRPCInferenceService`: health, metadata, inference (unary and
//! streaming), Triton's model configuration and statistics, and the model
//! repository extension.
//!
//! Inference goes through the serving path REST uses: admitted or refused
//! at once, queued for the version's session threads, answered within its
//! deadline (`grpc-timeout`, Triton's `timeout` parameter, or the server's
//! default). Its body was counted against the request memory budget frame
//! by frame as it arrived ([`super::admission`]).

use std::sync::Arc;
use std::time::Instant;

use baton_core::rollout::Role;
use baton_protocol::grpc::convert;
use prost::Message;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::admission::{Arrived, Frames};
use super::pb::grpc_inference_service_server::GrpcInferenceService;
use super::pb::infer_parameter::ParameterChoice;
use super::pb::model_metadata_response::TensorMetadata;
use super::pb::*;
use super::{inbound_error, model_config, parse_version, repository};
use crate::app::App;
use crate::error::{Class, ServeError};
use crate::serve::conn::state::{ConnHandle, quiet_until_making_room};
use crate::serving::Ticket;
use crate::{deadline, serving};

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

/// How a message of a call is to be admitted: when it arrived, the call's
/// deadline, and the room its call's frames hold in the memory budget.
struct Arrival<'a> {
    at: Instant,
    call_deadline: Option<Instant>,
    frames: Option<&'a Frames>,
    /// The call's sticky key (`baton-sticky-key` metadata), if it has one.
    key: Option<&'a [u8]>,
}

/// Runs one inference request on the routing snapshot taken when it
/// arrived, through the serving path REST uses.
/// Answers with the role of the version that answered, which the
/// response's parameters also carry.
async fn infer(
    app: &App,
    request: ModelInferRequest,
    arrival: Arrival<'_>,
) -> Result<(ModelInferResponse, Role), ServeError> {
    let model = request.model_name.clone();
    // Whatever becomes of the request, its message's room in the call's
    // frames is given back: once decoded, or when it is refused.
    let mut message = MessageRoom { frames: arrival.frames, bytes: request.encoded_len() as u64 };
    let _in_flight = app.admit(&model).inspect_err(|e| app.metrics.rejected(&model, e.kind))?;
    let mut ticket = Ticket::new(app, None);
    // The snapshot is held until the answer is encoded, as over REST.
    let (_snapshot, target, mut decoded) = receive(app, &model, request, &arrival, &mut ticket, &mut message).await?;
    let inputs = std::mem::take(&mut decoded.inputs);
    let outputs = serving::infer(app, &model, &target, inputs, &mut ticket).await?;
    let number = target.version.number();
    let encoded = serving::work_on(serving::tensor_bytes(&outputs) as usize, move || {
        convert::encode_response(&model, number, decoded.id, outputs, &decoded.outputs, decoded.raw)
    });
    let mut response = encoded.await?;
    let role = InferParameter { parameter_choice: Some(ParameterChoice::StringParam(target.role.as_str().to_owned())) };
    response.parameters.insert(serving::ROLE_PARAMETER.to_owned(), role);
    if let Some(id) = target.outcome_id() {
        let id = InferParameter { parameter_choice: Some(ParameterChoice::StringParam(id)) };
        response.parameters.insert(serving::OUTCOME_ID_PARAMETER.to_owned(), id);
    }
    Ok((response, target.role))
}

/// A request's sticky key: the call's metadata, else its parameter.
fn sticky_key<'a>(request: &'a ModelInferRequest, arrival: &Arrival<'a>) -> Option<&'a [u8]> {
    arrival.key.or_else(|| match request.parameters.get(serving::STICKY_KEY_PARAMETER)?.parameter_choice.as_ref()? {
        ParameterChoice::StringParam(key) => Some(key.as_bytes()),
        _ => None,
    })
}

/// Everything before the request is queued: its version and deadline, and
/// its decoded tensors within the memory budget, in place of the room its
/// message's frames held. Counts what it refuses.
async fn receive(
    app: &App,
    model: &str,
    request: ModelInferRequest,
    arrival: &Arrival<'_>,
    ticket: &mut Ticket,
    message: &mut MessageRoom<'_>,
) -> Result<(baton_core::registry::routing::Snapshot, serving::Target, convert::Decoded), ServeError> {
    let rejected = |e: ServeError| {
        app.metrics.rejected(model, e.kind);
        e
    };
    let version = version_and_deadline(app, &request, arrival, ticket).map_err(rejected)?;
    // A model paused by a resource swap is waited for.
    let snapshot = serving::snapshot(app, model, arrival.at, ticket.deadline).await.map_err(rejected)?;
    // Checked against the version before any tensor is packed, and the
    // tensors' room reserved before they are.
    let target = serving::target_of(app, &snapshot, model, version, sticky_key(&request, arrival)).map_err(rejected)?;
    let parsed = convert::parse_request(request).map_err(|e| rejected(e.into()))?;
    parsed
        .check(target.version.signature(), target.max_batch)
        .map_err(|e| serving::refused_by(app, model, &target, arrival.at, e.into()))?;
    ticket.reserve(app, model, parsed.tensor_bytes() as u64).await.map_err(rejected)?;
    let decoded =
        serving::work_on(message.bytes as usize, move || parsed.decode()).await.map_err(|e| rejected(e.into()))?;
    message.release();
    Ok((snapshot, target, decoded))
}

/// The version the request names; sets its deadline.
fn version_and_deadline(
    app: &App,
    request: &ModelInferRequest,
    arrival: &Arrival<'_>,
    ticket: &mut Ticket,
) -> Result<Option<u64>, ServeError> {
    let version = parse_version(&request.model_version)?;
    let asked = match request.parameters.get(deadline::TIMEOUT_PARAMETER).and_then(|p| p.parameter_choice.as_ref()) {
        None => None,
        Some(ParameterChoice::Int64Param(us)) => deadline::from_parameter_us(Some(i128::from(*us)))?,
        Some(ParameterChoice::Uint64Param(us)) => deadline::from_parameter_us(Some(i128::from(*us)))?,
        Some(_) => {
            return Err(ServeError::bad_request(
                "invalid_parameter",
                "parameter 'timeout' must be an integer number of microseconds",
            ));
        }
    };
    ticket.deadline = deadline::earliest(
        arrival.call_deadline,
        deadline::earliest(deadline::after(arrival.at, asked), deadline::after(arrival.at, app.limits.request_timeout)),
    );
    Ok(version)
}

/// The room a message holds among its call's frames, given back once.
struct MessageRoom<'a> {
    frames: Option<&'a Frames>,
    bytes: u64,
}

impl MessageRoom<'_> {
    fn release(&mut self) {
        if let Some(frames) = self.frames.take() {
            frames.release(self.bytes);
        }
    }
}

impl Drop for MessageRoom<'_> {
    fn drop(&mut self) {
        self.release();
    }
}

/// One answer on an inference stream: the response, or the error's message
/// with the request's model and id so the client can tell which failed.
async fn stream_answer(app: &App, request: ModelInferRequest, arrival: Arrival<'_>) -> ModelStreamInferResponse {
    let (model_name, id) = (request.model_name.clone(), request.id.clone());
    match infer(app, request, arrival).await {
        Ok((response, _)) => ModelStreamInferResponse { error_message: String::new(), infer_response: Some(response) },
        Err(e) => ModelStreamInferResponse {
            error_message: e.message,
            infer_response: Some(ModelInferResponse { model_name, id, ..ModelInferResponse::default() }),
        },
    }
}

/// When a call arrived and what its frames hold, from the admission layer.
/// What a streaming call waits on between its requests.
struct Waiting<'a> {
    app: &'a App,
    conn: Option<&'a ConnHandle>,
    frames: Option<&'a Frames>,
}

/// What the wait ends with.
enum Next {
    /// The next message, the end of the stream, or an error reading it.
    Message(Result<Option<ModelInferRequest>, Status>),
    /// The stream is to end with this status.
    End(Status),
}

impl Waiting<'_> {
    /// The stream's next message, quiet until it begins to arrive; or the
    /// stream's end, when the server drains or the connection makes room
    /// while no message arrives.
    async fn next(self, inbound: &mut Streaming<ModelInferRequest>) -> Next {
        let draining = super::draining(self.app.shutdown_signal());
        let mut draining = std::pin::pin!(draining);
        let shutting_down = || {
            let ending =
                ServeError::new(Class::Unavailable, "shutting_down", "the server is shutting down; the stream ends");
            Next::End(ending.into())
        };
        {
            // Quiet while this lives.
            let making_room = quiet_until_making_room(self.conn.cloned());
            tokio::select! {
                biased;
                () = &mut draining => return shutting_down(),
                () = making_room => {
                    // A message under way is read, not cut.
                    if !self.frames.is_some_and(Frames::receiving) {
                        return Next::End(super::making_room());
                    }
                }
                next = inbound.message() => return Next::Message(next),
            }
        }
        tokio::select! {
            biased;
            () = &mut draining => shutting_down(),
            next = inbound.message() => Next::Message(next),
        }
    }
}

fn arrival_of<T>(request: &Request<T>) -> (Instant, Option<Instant>, Option<Frames>) {
    let at = request.extensions().get::<Arrived>().map_or_else(Instant::now, |a| a.0);
    let call_deadline = request
        .metadata()
        .get("grpc-timeout")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| deadline::from_grpc_timeout(v).ok())
        .and_then(|t| at.checked_add(t));
    (at, call_deadline, request.extensions().get::<Frames>().cloned())
}

fn tensor_metadata(specs: &[baton_core::tensors::signature::TensorSpec]) -> Vec<TensorMetadata> {
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
        let ready = snapshot.resolve(&request.name, version).is_ok_and(|v| v.alive());
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> Result<Response<ServerMetadataResponse>, Status> {
        Ok(Response::new(ServerMetadataResponse {
            name: "baton".to_owned(),
            version: crate::build::version(),
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
        let (at, call_deadline, frames) = arrival_of(&request);
        let key = request.metadata().get(serving::STICKY_KEY_HEADER).map(|v| v.as_bytes().to_vec());
        let arrival = Arrival { at, call_deadline, frames: frames.as_ref(), key: key.as_deref() };
        let (response, role) = infer(&self.app, request.into_inner(), arrival).await?;
        let version = tonic::metadata::MetadataValue::try_from(response.model_version.as_str()).ok();
        let mut response = Response::new(response);
        let metadata = response.metadata_mut();
        metadata.insert(serving::ROLE_HEADER, tonic::metadata::MetadataValue::from_static(role.as_str()));
        if let Some(version) = version {
            metadata.insert(serving::VERSION_HEADER, version);
        }
        Ok(response)
    }

    type ModelStreamInferStream = ReceiverStream<Result<ModelStreamInferResponse, Status>>;

    /// Answers each request of the stream in order, each from the routing
    /// snapshot taken when it arrived: a swap between two requests shows in
    /// the second answer, never inside one. Errors of one request are that
    /// request's `error_message`; the stream goes on. When the server shuts
    /// down, the stream ends with `UNAVAILABLE` after the answer in progress.
    /// Between requests the stream is quiet: at its listener's bound, with
    /// no message arriving, it ends with `UNAVAILABLE` (kind `making_room`)
    /// to make room for another client.
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> Result<Response<Self::ModelStreamInferStream>, Status> {
        // The call's deadline covers every request of the stream; each
        // request's own timeout counts from when it arrived.
        let (_, call_deadline, frames) = arrival_of(&request);
        let key = request.metadata().get(serving::STICKY_KEY_HEADER).map(|v| v.as_bytes().to_vec());
        let conn = request.extensions().get::<ConnHandle>().cloned();
        let mut inbound = request.into_inner();
        let app = Arc::clone(&self.app);
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            loop {
                let waiting = Waiting { app: &app, conn: conn.as_ref(), frames: frames.as_ref() };
                let next = match waiting.next(&mut inbound).await {
                    Next::Message(next) => next,
                    Next::End(ending) => {
                        let _ = tx.send(Err(ending)).await;
                        return;
                    }
                };
                let answer = match next {
                    Ok(Some(request)) => {
                        let arrival =
                            Arrival { at: Instant::now(), call_deadline, frames: frames.as_ref(), key: key.as_deref() };
                        stream_answer(&app, request, arrival).await
                    }
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
