//! What every Troupe server serves besides its own service, and how its
//! binary learns to stop.

use tonic_reflection::server::{
    v1::{ServerReflection, ServerReflectionServer},
    v1alpha::{
        ServerReflection as ServerReflectionV1Alpha,
        ServerReflectionServer as ServerReflectionServerV1Alpha,
    },
};

/// Server reflection over Troupe's protocol and gRPC health: v1, and
/// v1alpha for older tools (grpcurl 1.8 speaks only v1alpha).
#[allow(clippy::type_complexity)]
pub fn reflection() -> anyhow::Result<(
    ServerReflectionServer<impl ServerReflection>,
    ServerReflectionServerV1Alpha<impl ServerReflectionV1Alpha>,
)> {
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(crate::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;
    Ok((v1, v1alpha))
}

/// Completes on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
}
