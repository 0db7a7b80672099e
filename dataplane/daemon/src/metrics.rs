//! The daemon's Prometheus endpoint: `/metrics` with every stage's figures and the figures of the
//! rings of the registration being served.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use sluice_proto::NodeId;

use crate::error::{DaemonError, Result};
use crate::feeder::Pipeline;
use crate::rings::ring_stats;
use crate::stats;
use crate::writer::RingState;

/// A ring's rank and state.
type RankState = (u32, Arc<RingState>);

/// The rings the metrics endpoint reports: those of the registration being served.
#[derive(Debug, Clone, Default)]
pub(crate) struct ServedRings(Arc<Mutex<Vec<RankState>>>);

impl ServedRings {
    /// Reports these rings, by rank, from now on.
    pub(crate) fn set(&self, rings: Vec<RankState>) {
        *self.lock() = rings;
    }

    /// Reports no ring from now on.
    pub(crate) fn clear(&self) {
        self.lock().clear();
    }

    /// How many rings are served, how long their trainers waited on empty rings (summed), and the
    /// least any of their writers waited on a full ring: what the tuning looks at.
    pub(crate) fn waits(&self) -> (usize, Duration, Duration) {
        let rings = self.lock();
        let waits: Vec<(Duration, Duration)> =
            rings.iter().map(|(_, state)| state.waits()).collect();
        let trainer = waits.iter().map(|(trainer, _)| *trainer).sum();
        let least_writer = waits
            .iter()
            .map(|(_, writer)| *writer)
            .min()
            .unwrap_or_default();
        (rings.len(), trainer, least_writer)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<RankState>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Serves `/metrics` on `address` for as long as the daemon runs; prints the address it got.
pub(crate) async fn serve_metrics(
    address: std::net::SocketAddr,
    node: NodeId,
    pipeline: Arc<Pipeline>,
    rings: ServedRings,
) -> Result<tokio::task::JoinHandle<()>> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|error| DaemonError::MetricsBind { address, error })?;
    let bound = listener.local_addr().map_err(DaemonError::MetricsAddress)?;
    let metrics = move || {
        let rings = ring_stats(
            rings
                .lock()
                .iter()
                .map(|(rank, state)| (*rank, state.as_ref())),
        );
        let cache = pipeline.cache.as_ref().map(|cache| cache.figures());
        let tuning = pipeline.tuning.figures();
        let text = stats::prometheus(
            node.0,
            &pipeline.stage_stats(),
            &rings,
            cache.as_ref(),
            &tuning,
        );
        async move {
            (
                [(
                    axum::http::header::CONTENT_TYPE,
                    "text/plain; version=0.0.4",
                )],
                text,
            )
        }
    };
    let router = axum::Router::new().route("/metrics", axum::routing::get(metrics));
    println!("sluice daemon: {node} metrics on http://{bound}/metrics");
    Ok(tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, router).await {
            tracing::warn!(%error, "the metrics server stopped");
        }
    }))
}
