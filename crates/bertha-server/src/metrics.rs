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
        let mut registry = Registry::with_prefix("bertha");
        let requests = Family::<RouteLabels, Counter>::default();
        let latency = Family::<RouteOnly, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram,
        );
        let batch_texts = Histogram::new(exponential_buckets(1.0, 2.0, 10));
        let batch_tokens = Histogram::new(exponential_buckets(16.0, 2.0, 12));
        let queue_depth = Gauge::<i64, AtomicI64>::default();
        let input_tokens = Counter::default();
        registry.register(
            "requests",
            "HTTP requests by route and status",
            requests.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Request latency by route",
            latency.clone(),
        );
        registry.register("batch_size", "Texts per model batch", batch_texts.clone());
        registry.register(
            "batch_tokens",
            "Tokens per model batch",
            batch_tokens.clone(),
        );
        registry.register(
            "queue_depth",
            "Requests waiting for the model",
            queue_depth.clone(),
        );
        registry.register(
            "input_tokens",
            "Tokens of all inputs run through the model",
            input_tokens.clone(),
        );
        Self {
            registry,
            requests,
            latency,
            batch_texts,
            batch_tokens,
            queue_depth,
            input_tokens,
        }
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
