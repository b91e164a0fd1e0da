//! Access control over gRPC: each call's method (its HTTP/2 path) gives its
//! [`Scope`], its `authorization` metadata the token, and
//! [`Access::check`] decides, as for REST. A refused call is answered at
//! once with the refusal's status and `baton-error-kind`, before its
//! message is read.

use std::future::{Ready, ready};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::http::{Request, Response, header};
use futures_util::future::Either;
use tonic::Status;

use crate::access::{Access, Listener, Privileged, Scope};

/// The scope of a gRPC method, from its path `/package.Service/Method`.
/// Reads and health are open; the repository's load and unload and every
/// management RPC but `Status`, `RolloutStatus` and `Events` manage; the rest of the
/// inference service is inference. Paths of no service baton serves are
/// open, so that they are answered `UNIMPLEMENTED`.
pub fn scope(path: &str) -> Scope {
    let Some((service, method)) = path.strip_prefix('/').and_then(|p| p.split_once('/')) else {
        return Scope::Open;
    };
    match (service, method) {
        ("inference.GRPCInferenceService", "ServerLive" | "ServerReady" | "ServerMetadata" | "RepositoryIndex") => {
            Scope::Open
        }
        ("inference.GRPCInferenceService", "RepositoryModelLoad" | "RepositoryModelUnload") => Scope::Management,
        ("inference.GRPCInferenceService", _) => Scope::Inference,
        ("baton.v1.Management", "Status" | "RolloutStatus" | "Events") => Scope::Open,
        ("baton.v1.Management", _) => Scope::Management,
        _ => Scope::Open,
    }
}

/// Puts [`GuardService`] in front of a listener's services.
#[derive(Clone)]
pub struct GuardLayer {
    access: Arc<Access>,
    listener: Listener,
}

impl GuardLayer {
    /// The guard of a listener of the given role.
    pub fn new(access: Arc<Access>, listener: Listener) -> GuardLayer {
        GuardLayer { access, listener }
    }
}

impl<S> tower::Layer<S> for GuardLayer {
    type Service = GuardService<S>;

    fn layer(&self, inner: S) -> GuardService<S> {
        GuardService { inner, access: Arc::clone(&self.access), listener: self.listener }
    }
}

/// Passes allowed calls on to the services, answers the others itself.
#[derive(Clone)]
pub struct GuardService<S> {
    inner: S,
    access: Arc<Access>,
    listener: Listener,
}

impl<S, B> tower::Service<Request<B>> for GuardService<S>
where
    S: tower::Service<Request<B>, Response = Response<tonic::body::Body>>,
{
    type Response = Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = Either<Ready<Result<Self::Response, S::Error>>, S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        if request.uri().path() == "/baton.v1.Management/Status" {
            let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
            let privileged =
                Privileged(self.access.privileged(crate::access::Front::Grpc, self.listener, authorization));
            request.extensions_mut().insert(privileged);
        }
        let path = request.uri().path();
        let scope = scope(path);
        if self.access.is_open(self.listener, scope) {
            return Either::Right(self.inner.call(request));
        }
        let authorization = request.headers().get(header::AUTHORIZATION).map(|v| v.as_bytes());
        match self.access.check(self.listener, scope, authorization, path) {
            Ok(()) => Either::Right(self.inner.call(request)),
            Err(refused) => Either::Left(ready(Ok(Status::from(refused).into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rpc_has_its_scope() {
        let inference = |m: &str| scope(&format!("/inference.GRPCInferenceService/{m}"));
        let management = |m: &str| scope(&format!("/baton.v1.Management/{m}"));
        for open in ["ServerLive", "ServerReady", "ServerMetadata", "RepositoryIndex"] {
            assert_eq!(inference(open), Scope::Open, "{open}");
        }
        for serve in ["ModelReady", "ModelMetadata", "ModelInfer", "ModelStreamInfer", "ModelConfig", "ModelStatistics"]
        {
            assert_eq!(inference(serve), Scope::Inference, "{serve}");
        }
        for manage in ["RepositoryModelLoad", "RepositoryModelUnload"] {
            assert_eq!(inference(manage), Scope::Management, "{manage}");
        }
        assert_eq!((management("Status"), management("Events")), (Scope::Open, Scope::Open));
        assert_eq!((management("Load"), management("Rollback")), (Scope::Management, Scope::Management));
        assert_eq!((management("Pin"), management("Unpin")), (Scope::Management, Scope::Management));
        assert_eq!(management("RolloutStatus"), Scope::Open);
        for manage in ["RolloutStart", "RolloutPause", "RolloutResume", "RolloutPromote", "RolloutAbort"] {
            assert_eq!(management(manage), Scope::Management, "{manage}");
        }
        assert_eq!(management("Anything"), Scope::Management, "an RPC added later is guarded until classified");
        assert_eq!(scope("/other.Service/X"), Scope::Open);
    }
}
