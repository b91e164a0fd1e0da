//! `GET /baton/v1/fleet`: on a replica of a fleet, every replica and what
//! it serves, each model's committed version and rollout with its
//! coordinator, prepares and switches ([`crate::fleet_view`]). The records
//! name the replicas' addresses and the rollouts' reasons, so, like the
//! fleet's details in the status, they are shown only to a caller the
//! management scope would let in.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde_json::Value;

use super::error::ApiError;
use crate::access::Privileged;
use crate::app::App;
use crate::error::Class;

/// The fleet, read from etcd now.
pub async fn view(
    State(app): State<Arc<App>>,
    privileged: Option<axum::Extension<Privileged>>,
) -> Result<Json<Value>, ApiError> {
    let Some(fleet) = app.fleet.get() else {
        return Err(ApiError::new(
            Class::NotFound,
            "not_in_fleet",
            "this server is not a replica of a fleet (baton serve --cluster)",
        ));
    };
    if !privileged.is_some_and(|p| p.0.0) {
        return Err(ApiError::new(
            Class::Unauthorized,
            "unauthorized",
            "the fleet's records are shown to management only: send 'Authorization: Bearer <token>' with the \
             server's admin token, on the listener that serves management",
        ));
    }
    Ok(Json(fleet.read().await?))
}
