//! Prometheus metrics for `/metrics`: requests, latencies, batches,
//! queue depth and tokens.

use std::sync::atomic::AtomicI64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    pub route: String,
    pub status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteOnly {
    pub route: String,
}

pub struct Metrics {
    registry: Registry,
    pub requests: Family<RouteLabels, Counter>,
    pub latency: Family<RouteOnly, Histogram, fn() -> Histogram>,
    pub batch_texts: Histogram,
    pub batch_tokens: Histogram,
    pub queue_depth: Gauge<i64, AtomicI64>,
    pub input_tokens: Counter,
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 16))
}

impl Metrics {
    pub fn new() -> Self {
        let mut metrics = Self {
            registry: Registry::with_prefix("bertha"),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            batch_texts: Histogram::new(exponential_buckets(1.0, 2.0, 10)),
            batch_tokens: Histogram::new(exponential_buckets(16.0, 2.0, 12)),
            queue_depth: Gauge::default(),
            input_tokens: Counter::default(),
        };
        let mut registry = Registry::with_prefix("bertha");
        metrics.register(&mut registry);
        metrics.registry = registry;
        metrics
    }

    /// Registers these metrics (handles to the same counters) in
    /// `registry`: a server of several models registers each model's under
    /// its own `model` label in one registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "HTTP requests by route and status",
            self.requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request latency by route",
            self.latency.clone(),
        );
        registry.register(
            "batch_size",
            "Texts per model batch",
            self.batch_texts.clone(),
        );
        registry.register(
            "batch_tokens",
            "Tokens per model batch",
            self.batch_tokens.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for the model",
            self.queue_depth.clone(),
        );
        registry.register(
            "input_tokens",
            "Tokens of all inputs run through the model",
            self.input_tokens.clone(),
        );
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
