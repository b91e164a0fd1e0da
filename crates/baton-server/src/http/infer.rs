//! `POST /v2/models/{name}[/versions/{v}]/infer`: KServe V2 inference, JSON
//! or with the binary tensor data extension.
//!
//! A request is admitted in steps, each refusing it at once when the server
//! holds as much as it takes: the server-wide count of requests in flight,
//! the version's queue (a hint, before the body is read), the request
//! memory budget for its body and then for its decoded tensors, and the
//! version's queue again when it is queued. It takes one routing snapshot
//! and is answered by one of the version's session threads, within its
//! deadline (see [`crate::deadline`]).

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use baton_protocol::{InferRequest, decode_request, encode_response};

use super::body;
use super::error::ApiError;
use crate::app::App;
use crate::metrics::InFlight;
use crate::serving::{Ticket, parse_version};
use crate::{deadline, serving};

/// The binary extension's header naming the JSON part's length.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// Inference on the stable version.
pub async fn infer(State(app): State<Arc<App>>, Path(model): Path<String>, request: Request) -> Response {
    run(&app, &model, None, request).await
}

/// Inference on a named version.
pub async fn infer_version(
    State(app): State<Arc<App>>,
    Path((model, version)): Path<(String, String)>,
    request: Request,
) -> Response {
    run(&app, &model, Some(&version), request).await
}

async fn run(app: &App, model: &str, version: Option<&str>, request: Request) -> Response {
    let arrived = Instant::now();
    let (parts, mut body) = request.into_parts();
    let limit = app.max_request_bytes;
    // A request refused before all of its body is read gets its answer
    // once the rest is read and dropped (see `body::refuse_unread`).
    let admitted = match admit(app, model, version, &parts.headers, arrived) {
        Ok(admitted) => admitted,
        Err(e) => {
            app.metrics.rejected(model, e.kind);
            return body::refuse_unread(e, &parts.headers, &mut body, limit).await;
        }
    };
    let (in_flight, version, header_length, mut ticket) = admitted;
    let call = Call { app, model, version, headers: &parts.headers, header_length, arrived };
    let answer = match answer(&call, &mut body, &mut ticket).await {
        Ok(response) => response,
        Err((e, false)) => e.into_response(),
        Err((e, true)) => {
            // The request's room is given back before its body is drained.
            drop(ticket);
            body::refuse_unread(e, &parts.headers, &mut body, limit).await
        }
    };
    drop(in_flight);
    answer
}

type Admitted<'a> = (InFlight<'a>, Option<u64>, Option<usize>, Ticket);

/// What is decided from the head alone: the server's room, the version
/// named and its room (a hint), the headers, the deadline.
fn admit<'a>(
    app: &'a App,
    model: &str,
    version: Option<&str>,
    headers: &HeaderMap,
    arrived: Instant,
) -> Result<Admitted<'a>, ApiError> {
    let in_flight = app.admit(model)?;
    let version = version.map(parse_version).transpose()?;
    let header_length = header_length(headers)?;
    let client = deadline::from_header(headers)?;
    let deadline =
        deadline::earliest(deadline::after(arrived, client), deadline::after(arrived, app.limits.request_timeout));
    serving::precheck(app, model, version)?;
    Ok((in_flight, version, header_length, Ticket::new(app, deadline)))
}

/// An admitted request, as its head described it.
struct Call<'a> {
    app: &'a App,
    model: &'a str,
    version: Option<u64>,
    headers: &'a HeaderMap,
    header_length: Option<usize>,
    arrived: Instant,
}

/// Reads, decodes, runs and encodes. An error says whether the body was
/// left partly unread.
async fn answer(call: &Call<'_>, body: &mut Body, ticket: &mut Ticket) -> Result<Response, (ApiError, bool)> {
    let Call { app, model, version, .. } = *call;
    let mut request = receive(call, body, ticket).await.map_err(|(e, unread)| {
        app.metrics.rejected(model, e.kind);
        (e, unread)
    })?;
    let inputs = std::mem::take(&mut request.inputs);
    let snapshot = app.registry.snapshot();
    let fail = |e: ApiError| (e, false);
    let (target, outputs) = serving::infer(app, &snapshot, model, version, inputs, ticket).await.map_err(fail)?;
    let (name, number) = (model.to_owned(), target.number());
    let encoded = serving::work_on(serving::tensor_bytes(&outputs) as usize, move || {
        encode_response(&name, number, request.id.as_deref(), outputs, &request)
    })
    .await
    .map_err(|e| fail(e.into()))?;
    let mut response = encoded.body.into_response();
    let headers = response.headers_mut();
    match encoded.header_length {
        Some(n) => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
            headers.insert(HEADER_LENGTH, HeaderValue::from(n));
        }
        None => {
            headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        }
    }
    Ok(response)
}

/// The body, read within the memory budget and the deadline, and decoded;
/// the body's room is given back once the tensors are decoded out of it.
async fn receive(call: &Call<'_>, body: &mut Body, ticket: &mut Ticket) -> Result<InferRequest, (ApiError, bool)> {
    let Call { app, model, headers, header_length, arrived, .. } = *call;
    let deadline = ticket.deadline;
    let reading = body::read(app, model, headers, body, ticket);
    let body = match deadline {
        None => reading.await,
        Some(deadline) => tokio::time::timeout_at(deadline.into(), reading).await.unwrap_or_else(|_| {
            app.metrics.expired(model, "arrival");
            Err(deadline::exceeded())
        }),
    }
    .map_err(|e| (e, true))?;
    let (body, decoded) = serving::work_on(body.len(), move || {
        let decoded = decode_request(&body, header_length);
        (body, decoded)
    })
    .await;
    let decoded = decoded.map_err(ApiError::from).and_then(|request| {
        let asked = deadline::from_json_parameters(&request.parameters)?;
        Ok((request, asked))
    });
    let (request, asked) = decoded.map_err(|e| (e, false))?;
    ticket.deadline = deadline::earliest(ticket.deadline, deadline::after(arrived, asked));
    ticket.reserve(app, model, serving::tensor_bytes(&request.inputs)).await.map_err(|e| (e, false))?;
    let body_bytes = body.len() as u64;
    drop(body);
    ticket.memory.release(body_bytes);
    Ok(request)
}

fn header_length(headers: &HeaderMap) -> Result<Option<usize>, ApiError> {
    let Some(value) = headers.get(HEADER_LENGTH) else { return Ok(None) };
    let parsed = value.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok());
    parsed.map(Some).ok_or_else(|| {
        ApiError::bad_request(
            "invalid_header",
            format!("header Inference-Header-Content-Length is not a length: {value:?}"),
        )
    })
}
