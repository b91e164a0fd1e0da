//! `baton.v1.Management`: the registry's event stream, status, load,
//! rollback, pin, unpin and the rollout operations over gRPC. Payloads are the JSON the REST management API
//! writes, so there is one format for both.

use std::pin::Pin;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use baton_core::registry::events::{Event as CoreEvent, LoadReport};
use serde_json::{Value, json};
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::wrappers::{BroadcastStream, WatchStream};
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use super::pb_baton::management_server;
use super::pb_baton::{
    DecisionResponse, Event, EventsRequest, LoadRequest, OperationReport, PinRequest, RollbackRequest,
    RolloutPauseRequest, RolloutRequest, RolloutResponse, RolloutStartRequest, StatusRequest, StatusResponse,
    UnpinRequest,
};
use crate::app::App;
use crate::decisions::{operate, rollout};
use crate::error::ServeError;
use crate::serve::conn::state::{ConnHandle, quiet_until_making_room};

/// The service, sharing the app with every other front end.
pub struct Management {
    app: Arc<App>,
}

impl Management {
    /// The service over `app`.
    pub fn new(app: Arc<App>) -> Management {
        Management { app }
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// A registry event as a message: its kind is the JSON's `event` field.
pub fn event_message(event: &CoreEvent) -> Event {
    // As `GET /baton/v1/events` sends it, the time in RFC 3339 beside.
    let mut json = to_json(event);
    crate::clock::add_rfc3339(&mut json, "at");
    Event {
        model: event.model.clone(),
        version: event.version,
        at: event.at.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs_f64(),
        kind: json.get("event").and_then(Value::as_str).unwrap_or("event").to_owned(),
        json: json.to_string(),
    }
}

fn report_message(report: &LoadReport) -> OperationReport {
    let json = to_json(report);
    OperationReport {
        model: report.model.clone(),
        operation: json.get("operation").and_then(Value::as_str).unwrap_or_default().to_owned(),
        version: report.version,
        replaced: report.replaced,
        json: json.to_string(),
    }
}

fn decision_message(model: &str, answer: &Value) -> DecisionResponse {
    DecisionResponse { model: model.to_owned(), serving: answer["serving"].as_u64(), json: answer.to_string() }
}

#[tonic::async_trait]
impl management_server::Management for Management {
    type EventsStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;

    /// Every event from the moment of the call (the subscription is in place
    /// before the response headers go out), filtered to one model if asked.
    /// A client too slow to keep up gets a `lagged` event saying how many it
    /// missed. Ends when the server starts shutting down. The stream is
    /// quiet: at its listener's bound it ends with `UNAVAILABLE` (kind
    /// `making_room`) to make room for another client, which may call
    /// again.
    async fn events(&self, request: Request<EventsRequest>) -> Result<Response<Self::EventsStream>, Status> {
        let conn = request.extensions().get::<ConnHandle>().cloned();
        let model = request.into_inner().model;
        let shutdown = WatchStream::new(self.app.shutdown_signal()).filter(|stop| *stop).map(|_| None);
        let making_room =
            futures_util::stream::once(quiet_until_making_room(conn)).map(|()| Some(Err(super::making_room())));
        let events = BroadcastStream::new(self.app.registry.subscribe()).map(|item| Some(Ok(item)));
        let ends = shutdown.merge(making_room);
        let stream = events.merge(ends).take_while(Option::is_some).filter_map(move |item| match item? {
            Ok(Ok(event)) if model.is_empty() || event.model == model => Some(Ok(event_message(&event))),
            Ok(Ok(_)) => None,
            Ok(Err(BroadcastStreamRecvError::Lagged(missed))) => Some(Ok(Event {
                kind: "lagged".to_owned(),
                json: json!({ "event": "lagged", "missed": missed }).to_string(),
                ..Event::default()
            })),
            Err(ending) => Some(Err(ending)),
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn status(&self, request: Request<StatusRequest>) -> Result<Response<StatusResponse>, Status> {
        let privileged = request.extensions().get::<crate::access::Privileged>().is_some_and(|p| p.0);
        let model = request.into_inner().model;
        let json = if model.is_empty() {
            crate::status::server(&self.app, privileged)
        } else {
            crate::status::model_as(&self.app, &model, privileged).ok_or_else(|| ServeError::unknown_model(&model))?
        };
        Ok(Response::new(StatusResponse {
            ready: self.app.ready(),
            draining: self.app.draining(),
            json: json.to_string(),
        }))
    }

    async fn load(&self, request: Request<LoadRequest>) -> Result<Response<OperationReport>, Status> {
        let request = request.into_inner();
        let report = super::repository::load(&self.app, &request.model, request.version).await?;
        Ok(Response::new(report_message(&report)))
    }

    async fn rollback(&self, request: Request<RollbackRequest>) -> Result<Response<OperationReport>, Status> {
        let model = request.into_inner().model;
        let report = operate::rollback(&self.app, &model).await?;
        Ok(Response::new(report_message(&report)))
    }

    async fn pin(&self, request: Request<PinRequest>) -> Result<Response<DecisionResponse>, Status> {
        let request = request.into_inner();
        let answer = operate::pin(&self.app, &request.model, request.version).await?;
        Ok(Response::new(decision_message(&request.model, &answer)))
    }

    async fn unpin(&self, request: Request<UnpinRequest>) -> Result<Response<DecisionResponse>, Status> {
        let model = request.into_inner().model;
        let answer = operate::unpin(&self.app, &model).await?;
        Ok(Response::new(decision_message(&model, &answer)))
    }

    async fn rollout_start(&self, request: Request<RolloutStartRequest>) -> Result<Response<RolloutResponse>, Status> {
        let message = request.into_inner();
        let model = message.model.clone();
        let start = super::rollout::start_request(message)?;
        let answer = rollout::start(&self.app, &model, start.version, start.overrides).await?;
        Ok(Response::new(super::rollout::response(&answer)))
    }

    async fn rollout_status(&self, request: Request<RolloutRequest>) -> Result<Response<RolloutResponse>, Status> {
        let answer = rollout::status(&self.app, &request.into_inner().model)?;
        Ok(Response::new(super::rollout::response(&answer)))
    }

    async fn rollout_pause(&self, request: Request<RolloutPauseRequest>) -> Result<Response<RolloutResponse>, Status> {
        let request = request.into_inner();
        let answer = rollout::pause(&self.app, &request.model, request.reason).await?;
        Ok(Response::new(super::rollout::response(&answer)))
    }

    async fn rollout_resume(&self, request: Request<RolloutRequest>) -> Result<Response<RolloutResponse>, Status> {
        let answer = rollout::resume(&self.app, &request.into_inner().model).await?;
        Ok(Response::new(super::rollout::response(&answer)))
    }

    async fn rollout_promote(&self, request: Request<RolloutRequest>) -> Result<Response<RolloutResponse>, Status> {
        let answer = rollout::promote(&self.app, &request.into_inner().model).await?;
        Ok(Response::new(super::rollout::response(&answer)))
    }

    async fn rollout_abort(&self, request: Request<RolloutRequest>) -> Result<Response<RolloutResponse>, Status> {
        let answer = rollout::abort(&self.app, &request.into_inner().model).await?;
        Ok(Response::new(super::rollout::response(&answer)))
    }
}
