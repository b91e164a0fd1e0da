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
use baton_core::registry::routing::Routing;
use baton_core::run::version::Version;
use baton_core::tensors::signature::InputShape;
use baton_protocol::{InferRequest, encode_response_with, parse_request};

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
    let Call { app, model, arrived, .. } = *call;
    // A model paused by a resource swap is waited for, its body unread.
    let snapshot = serving::snapshot(app, model, arrived, ticket.deadline).await.map_err(|e| {
        app.metrics.rejected(model, e.kind);
        (e, true)
    })?;
    let (target, mut request) = receive(call, &snapshot, body, ticket).await?;
    let inputs = std::mem::take(&mut request.inputs);
    let fail = |e: ApiError| (e, false);
    let outputs = serving::infer(app, model, &target, inputs, ticket).await.map_err(fail)?;
    let (name, number, role) = (model.to_owned(), target.version.number(), target.role.as_str());
    let outcome_id = target.outcome_id();
    let sent_id = outcome_id.clone();
    let encoded = serving::work_on(serving::tensor_bytes(&outputs) as usize, move || {
        let mut parameters = vec![(serving::ROLE_PARAMETER, role)];
        if let Some(id) = &sent_id {
            parameters.push((serving::OUTCOME_ID_PARAMETER, id.as_str()));
        }
        encode_response_with(&name, number, request.id.as_deref(), outputs, &request, &parameters)
    })
    .await
    .map_err(|e| fail(e.into()))?;
    let mut response = encoded.body.into_response();
    let headers = response.headers_mut();
    headers.insert(serving::ROLE_HEADER, HeaderValue::from_static(role));
    headers.insert(serving::VERSION_HEADER, HeaderValue::from(number));
    if let Some(id) = outcome_id.and_then(|id| HeaderValue::from_str(&id).ok()) {
        headers.insert(serving::OUTCOME_ID_HEADER, id);
    }
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

/// The body, read within the memory budget and the deadline, checked
/// against the version it names and decoded; the tensors' room is reserved
/// before they are allocated, and the body's is given back once they are
/// decoded out of it. Counts what it refuses.
async fn receive(
    call: &Call<'_>,
    snapshot: &Routing,
    body: &mut Body,
    ticket: &mut Ticket,
) -> Result<(serving::Target, InferRequest), (ApiError, bool)> {
    let Call { app, model, version, headers, header_length, arrived } = *call;
    let rejected = |unread: bool| {
        move |e: ApiError| {
            app.metrics.rejected(model, e.kind);
            (e, unread)
        }
    };
    let deadline = ticket.deadline;
    let reading = body::read(app, model, headers, body, ticket);
    let body = match deadline {
        None => reading.await,
        Some(deadline) => tokio::time::timeout_at(deadline.into(), reading).await.unwrap_or_else(|_| {
            app.metrics.expired(model, "arrival");
            Err(deadline::exceeded())
        }),
    }
    .map_err(rejected(true))?;
    let key = headers.get(serving::STICKY_KEY_HEADER).map(HeaderValue::as_bytes);
    let mut target = serving::target_of(app, snapshot, model, version, key).map_err(rejected(false))?;
    let max_batch = target.max_batch;
    let mut body = body;
    let mut reserved = false;
    let request = loop {
        // The memory reservation goes along to the decoding thread, which
        // grows it by the tensors' bytes, if they fit now, before decoding.
        let memory = std::mem::replace(&mut ticket.memory, app.budget.empty());
        let version = Arc::clone(&target.version);
        let (returned, memory, outcome) = serving::work_on(body.len(), move || {
            let mut memory = memory;
            let outcome = decode_checked(&body, header_length, &version, max_batch, &mut memory, reserved);
            (body, memory, outcome)
        })
        .await;
        body = returned;
        ticket.memory = memory;
        let outcome = outcome.map_err(|refusal| match refusal {
            Refusal::Malformed(e) => rejected(false)(e),
            Refusal::ByVersion(e) => (serving::refused_by(app, model, &target, arrived, e), false),
        })?;
        match outcome {
            Decoded::Request(request) => break request,
            Decoded::NeedsRoom(bytes) => {
                // Rare: the budget was full. Wait for room, then parse again.
                ticket.reserve(app, model, bytes).await.map_err(rejected(false))?;
                reserved = true;
            }
        }
    };
    let asked = deadline::from_json_parameters(&request.parameters).map_err(rejected(false))?;
    ticket.deadline = deadline::earliest(ticket.deadline, deadline::after(arrived, asked));
    let body_bytes = body.len() as u64;
    drop(body);
    ticket.memory.release(body_bytes);
    if key.is_none() && version.is_none() && target.rollout.is_some() {
        target = by_parameter(call, snapshot, target, &request).map_err(rejected(false))?;
    }
    Ok((target, request))
}

/// Assigns a request that carries its sticky key as a parameter rather
/// than a header to its key's side of the rollout: known only once the body
/// is decoded. A request moved to the other version is checked against
/// that version's signature and batch limit, as every request is before it
/// is decoded.
fn by_parameter(
    call: &Call<'_>,
    snapshot: &Routing,
    target: serving::Target,
    request: &InferRequest,
) -> Result<serving::Target, ApiError> {
    let Some(key) = request.parameters.get(serving::STICKY_KEY_PARAMETER).and_then(|v| v.as_str()) else {
        return Ok(target);
    };
    let keyed = serving::target_of(call.app, snapshot, call.model, None, Some(key.as_bytes()))?;
    let shapes: Vec<InputShape<'_>> = request.inputs.iter().map(InputShape::of).collect();
    keyed.version.signature().check_request(&shapes, keyed.max_batch)?;
    Ok(keyed)
}

/// What decoding a body came to.
enum Decoded {
    /// The request, its tensors' room reserved.
    Request(InferRequest),
    /// Its tensors need this many bytes more than the budget holds now.
    NeedsRoom(u64),
}

/// Why a body was refused: it does not parse, or the version cannot take
/// its inputs (counted as the version's failure).
enum Refusal {
    Malformed(ApiError),
    ByVersion(ApiError),
}

/// Parses the body's header, checks it against `target` (inputs, datatypes,
/// shapes, batch), reserves the tensors' bytes (unless `reserved`), then
/// decodes the tensors straight into their buffers.
fn decode_checked(
    body: &[u8],
    header_length: Option<usize>,
    target: &Version,
    max_batch: usize,
    memory: &mut crate::budget::Reservation,
    reserved: bool,
) -> Result<Decoded, Refusal> {
    let malformed = |e| Refusal::Malformed(ApiError::from(e));
    let header = parse_request(body, header_length).map_err(malformed)?;
    header.check(target.signature(), max_batch).map_err(|e| Refusal::ByVersion(e.into()))?;
    let bytes = header.tensor_bytes() as u64;
    if !reserved && !memory.try_grow(bytes) {
        return Ok(Decoded::NeedsRoom(bytes));
    }
    Ok(Decoded::Request(header.decode().map_err(malformed)?))
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
