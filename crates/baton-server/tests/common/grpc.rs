//! gRPC clients for the black-box tests: a runtime, bounded waits,
//! connections to an address baton printed, and error assertions.

use std::future::Future;

use baton_protocol::grpc::pb::grpc_inference_service_client::GrpcInferenceServiceClient;
use baton_protocol::grpc::pb_baton::management_client::ManagementClient;
use baton_testkit::server::{PATIENCE, Server};
use tonic::transport::Channel;
use tonic::{Code, Status};

/// A runtime whose worker threads drive the client's connections between
/// the `block_on` calls of a test.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime")
}

/// Awaits `f`, failing the test after [`PATIENCE`] instead of hanging.
pub async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, f).await.unwrap_or_else(|_| panic!("{what}: no answer within {PATIENCE:?}"))
}

/// A connection to `address`, e.g. `127.0.0.1:41235`.
pub async fn channel_to(address: &str) -> Channel {
    let endpoint = Channel::from_shared(format!("http://{address}")).expect("a valid URL");
    within("connecting", endpoint.connect()).await.expect("connecting to the gRPC port")
}

/// A connection to the server's gRPC port.
pub async fn channel(server: &Server) -> Channel {
    channel_to(server.grpc_address()).await
}

/// An inference-service client of the server's gRPC port.
pub async fn client(server: &Server) -> GrpcInferenceServiceClient<Channel> {
    GrpcInferenceServiceClient::new(channel(server).await).max_decoding_message_size(usize::MAX)
}

/// Both services' clients at `address`.
pub async fn clients_at(address: &str) -> (GrpcInferenceServiceClient<Channel>, ManagementClient<Channel>) {
    let channel = channel_to(address).await;
    (GrpcInferenceServiceClient::new(channel.clone()), ManagementClient::new(channel))
}

/// `message` with `authorization: Bearer <token>` in its metadata.
pub fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("ASCII metadata"));
    request
}

/// Asserts an error status: the code, and that the message contains every
/// one of `needles`; returns the stable kind baton attaches.
pub fn assert_status<T: std::fmt::Debug>(
    result: Result<T, Status>,
    code: Code,
    needles: &[&str],
    what: &str,
) -> String {
    let status = result.expect_err(what);
    assert_eq!(status.code(), code, "{what}: {status:?}");
    for needle in needles {
        assert!(status.message().contains(needle), "{what}: the message should mention {needle:?}: {status:?}");
    }
    let kind = status.metadata().get("baton-error-kind").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(!kind.is_empty(), "{what}: no baton-error-kind in {status:?}");
    kind.to_owned()
}
