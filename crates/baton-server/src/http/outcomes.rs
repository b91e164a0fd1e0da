//! Business outcomes over REST: `POST /baton/v1/models/{name}/outcomes`,
//! a scope of its own ([`crate::access::Scope::Outcomes`]), with a batch
//! of the outcome ids answers carried (`baton_outcome_id`) and what
//! followed each:
//!
//! ```json
//! {"outcomes": [{"id": "o1f2e…", "value": 1.0}, {"id": "o1f2e…"}]}
//! ```
//!
//! What a client posts decides a canary, so a post is held to what an
//! inference request is, and more:
//!
//! - It is admitted like one (`--max-in-flight`), its body must arrive
//!   within `--request-timeout`, and its body and then its decoded items
//!   are reserved in the request memory budget before they are held (503
//!   when the server is full).
//! - Its body has a limit of its own, [`MAX_BODY`], far below
//!   `--max-request-bytes` (413 beyond it, unread).
//! - It is decoded item by item ([`decode`]): the item after the
//!   [`MAX_BATCH`]th, or an item that is not an outcome (an id of the
//!   wrong shape, a value that is not a finite number from 0 to
//!   [`outcome::MAX_VALUE`]), stops the decoding there with a 400 that names it;
//!   nothing of the batch is counted.
//! - Without an outcomes token, posting is open to every inference client
//!   and a value may be at most [`crate::app::OPEN_OUTCOME_VALUE_MAX`]
//!   (one click): a batch with a larger one is refused whole, naming it.
//!
//! A value left out is 1 (a click, a conversion). Ids of no rollout in
//! progress (an ended one, an earlier rollout of the same candidate, a
//! made-up one) are not errors; the answer counts them apart:
//! `{"accepted": 2, "duplicate": 0, "unknown": 0}`.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use baton_core::rollout::outcome::{self, MAX_BATCH, PostError, Posted};
use serde::Deserialize;
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::body::{self, Limit};
use crate::app::App;
use crate::deadline;
use crate::error::{Class, ServeError};
use crate::serving::{self, Ticket};

/// The largest body of a post: room for [`MAX_BATCH`] outcomes with their
/// values and some spacing (an item is about 60 bytes).
pub const MAX_BODY: usize = 1 << 20;

/// Bodies up to this size are decoded and checked on the async worker;
/// larger ones (up to [`MAX_BATCH`] codes to verify) on the blocking pool.
const INLINE_BODY: usize = 8 << 10;

/// The fewest bytes an item that decodes can take: `{"id":"…"}` with an
/// id of [`outcome::ID_LEN`] characters, and the comma after it.
const MIN_ITEM_BYTES: usize = 10 + outcome::ID_LEN;

/// Bytes one decoded item holds: its id and value.
const ITEM_BYTES: usize = std::mem::size_of::<(String, f64)>() + outcome::ID_LEN;

/// `POST /baton/v1/models/{name}/outcomes`.
pub async fn post(State(app): State<Arc<App>>, Path(model): Path<String>, request: Request) -> Response {
    let arrived = Instant::now();
    let (parts, mut body) = request.into_parts();
    let limit = Limit { bytes: MAX_BODY, by: "the limit of an outcomes post" };
    let in_flight = match app.admit(&model) {
        Ok(in_flight) => in_flight,
        Err(e) => return body::refuse_unread(e, &parts.headers, &mut body, MAX_BODY).await,
    };
    let deadline = deadline::after(arrived, app.limits.request_timeout);
    let mut ticket = Ticket::new(&app, deadline);
    let reading = body::read_within(&app, &model, &parts.headers, &mut body, &mut ticket, limit);
    let read = match deadline {
        None => reading.await,
        Some(deadline) => {
            tokio::time::timeout_at(deadline.into(), reading).await.unwrap_or_else(|_| Err(deadline::exceeded()))
        }
    };
    let bytes = match read {
        Ok(bytes) => bytes,
        Err(e) => {
            drop(ticket);
            return body::refuse_unread(e, &parts.headers, &mut body, MAX_BODY).await;
        }
    };
    let answer = count(&app, &model, bytes, &mut ticket).await;
    drop((ticket, in_flight));
    match answer {
        Ok(posted) => Json(posted).into_response(),
        Err(e) => e.into_response(),
    }
}

/// Decodes, checks and counts a post's body, the decoded items' room
/// reserved in `ticket` first.
async fn count(app: &Arc<App>, model: &str, bytes: Vec<u8>, ticket: &mut Ticket) -> Result<Posted, ServeError> {
    let items = (bytes.len() / MIN_ITEM_BYTES + 1).min(MAX_BATCH);
    ticket.reserve(app, model, (items * ITEM_BYTES) as u64).await?;
    let inline = bytes.len() <= INLINE_BODY;
    let work = {
        let (app, model) = (Arc::clone(app), model.to_owned());
        move || {
            let batch = decode(&bytes)?;
            above_open_bound(&batch, app.limits.outcome_value_max)?;
            let posted: Vec<(&str, f64)> = batch.iter().map(|(id, value)| (id.as_str(), *value)).collect();
            let counted = app.registry.post_outcomes(&model, &posted).map_err(|e| match e {
                PostError::UnknownModel(_) => ServeError::unknown_model(&model),
                PostError::Malformed { .. } => ServeError::new(Class::BadRequest, e.kind(), e.to_string()),
            })?;
            app.metrics.outcomes(&model, &counted);
            Ok(counted)
        }
    };
    if inline { work() } else { serving::blocking(work).await }
}

/// Refuses a batch with a value above `max`, the bound on a post without
/// the outcomes token: anyone who may infer may post then, and one large
/// value would outweigh every click of a window.
fn above_open_bound(batch: &[(String, f64)], max: f64) -> Result<(), ServeError> {
    let Some((index, (_, value))) = batch.iter().enumerate().find(|(_, (_, value))| *value > max) else {
        return Ok(());
    };
    let reason = format!(
        "its value {value} is above {max}, the most an outcome may carry when posting is open to every \
         inference client; give the server --outcomes-token-file to post larger values (an order's amount)"
    );
    let refused = PostError::Malformed { index, reason };
    Err(ServeError::new(Class::BadRequest, refused.kind(), refused.to_string()))
}

/// Decodes a post's body item by item: each item is checked as it is
/// read, and the decoding stops at the first that is wrong, or at the
/// item after the [`MAX_BATCH`]th.
pub fn decode(bytes: &[u8]) -> Result<Vec<(String, f64)>, ServeError> {
    let mut failure = None;
    let mut items = Vec::new();
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let decoded = Body { items: &mut items, failure: &mut failure }.deserialize(&mut deserializer);
    let decoded = decoded.and_then(|()| deserializer.end());
    match (decoded, failure) {
        (Ok(()), _) => Ok(items),
        (Err(_), Some(failure)) => Err(ServeError::new(Class::BadRequest, failure.kind(), failure.to_string())),
        (Err(e), None) => Err(ServeError::bad_request(
            "invalid_json",
            format!("request body: {e}; expected {{\"outcomes\": [{{\"id\": …, \"value\": …}}]}}"),
        )),
    }
}

/// One outcome as posted.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Item<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(default = "one")]
    value: f64,
}

fn one() -> f64 {
    1.0
}

/// The body: an object with `outcomes` and nothing else.
struct Body<'a> {
    items: &'a mut Vec<(String, f64)>,
    /// Why an item was refused, when one was: the decoding stops there.
    failure: &'a mut Option<PostError>,
}

impl<'de> DeserializeSeed<'de> for Body<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Body<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an object with \"outcomes\"")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = false;
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            if key != "outcomes" {
                return Err(de::Error::unknown_field(&key, &["outcomes"]));
            }
            if seen {
                return Err(de::Error::duplicate_field("outcomes"));
            }
            seen = true;
            map.next_value_seed(Items { items: &mut *self.items, failure: &mut *self.failure })?;
        }
        if seen { Ok(()) } else { Err(de::Error::missing_field("outcomes")) }
    }
}

/// The `outcomes` array, visited one item at a time.
struct Items<'a> {
    items: &'a mut Vec<(String, f64)>,
    failure: &'a mut Option<PostError>,
}

impl<'de> DeserializeSeed<'de> for Items<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Items<'_> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of outcomes")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut refuse = |index: usize, reason: String| {
            *self.failure = Some(PostError::Malformed { index, reason });
            de::Error::custom("refused")
        };
        loop {
            let index = self.items.len();
            if index == MAX_BATCH {
                return match seq.next_element::<IgnoredAny>() {
                    Ok(None) => Ok(()),
                    Ok(Some(_)) => {
                        Err(refuse(index, format!("a batch holds at most {MAX_BATCH} outcomes; post the rest apart")))
                    }
                    Err(e) => Err(refuse(index, e.to_string())),
                };
            }
            let item = match seq.next_element::<Item<'de>>() {
                Ok(Some(item)) => item,
                Ok(None) => return Ok(()),
                Err(e) => return Err(refuse(index, e.to_string())),
            };
            if let Err(reason) = outcome::check(&item.id, item.value) {
                return Err(refuse(index, reason));
            }
            self.items.push((item.id.into_owned(), item.value));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u64) -> String {
        format!("o00000000s{n:016x}00000000")
    }

    #[test]
    fn a_batch_decodes_item_by_item_and_stops_at_the_first_wrong_one() {
        let body = format!(r#"{{"outcomes": [{{"id": "{}"}}, {{"id": "{}", "value": 2.5}}]}}"#, id(1), id(2));
        assert_eq!(decode(body.as_bytes()).unwrap(), vec![(id(1), 1.0), (id(2), 2.5)]);
        let too_many: Vec<String> = (0..=MAX_BATCH as u64).map(|n| format!(r#"{{"id": "{}"}}"#, id(n))).collect();
        let body = format!(r#"{{"outcomes": [{}, garbage"#, too_many.join(","));
        let error = decode(body.as_bytes()).unwrap_err();
        assert_eq!(error.kind, "invalid_outcome");
        assert!(error.message.starts_with(&format!("outcome {MAX_BATCH}: a batch holds at most")), "{}", error.message);
        let huge = format!(r#"{{"outcomes": [{{"id": "{}", "value": {}}}, garbage"#, id(1), outcome::MAX_VALUE * 10.0);
        assert!(decode(huge.as_bytes()).unwrap_err().message.starts_with("outcome 0: its value"), "huge");
        for (body, needle) in [
            (r#"{"outcome": []}"#.to_owned(), "unknown field `outcome`"),
            ("{}".to_owned(), "missing field `outcomes`"),
            (format!(r#"{{"outcomes": [{{"id": "{}", "weight": 2}}]}}"#, id(1)), "outcome 0: unknown field `weight`"),
            (r#"{"outcomes": [{"id": 7}]}"#.to_owned(), "outcome 0: invalid type"),
            (r#"{"outcomes": [{"id": "click-42"}]}"#.to_owned(), "outcome 0: 'click-42' is not an outcome id"),
            (r#"{"outcomes": []} trailing"#.to_owned(), "trailing"),
        ] {
            let error = decode(body.as_bytes()).unwrap_err();
            assert!(error.message.contains(needle), "{body}: {}", error.message);
        }
    }
}
