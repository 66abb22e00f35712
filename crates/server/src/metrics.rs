//! `/metrics` in Prometheus' text format: requests by endpoint and status, tokens, queue
//! depth and active slots (from the engine's live counters), decode-step latency and time to
//! first token.

use engine::scheduler::{STEP_BUCKETS, Stats};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds, in seconds, of the time-to-first-token histogram.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    ttft: Histogram<{ TTFT_BUCKETS.len() + 1 }>,
}

/// Counts per bucket (not cumulative; the last counts values above the last bound).
#[derive(Debug)]
struct Histogram<const N: usize> {
    counts: [AtomicU64; N],
    sum_micros: AtomicU64,
}

impl<const N: usize> Default for Histogram<N> {
    fn default() -> Self {
        Histogram { counts: std::array::from_fn(|_| AtomicU64::new(0)), sum_micros: AtomicU64::new(0) }
    }
}

impl<const N: usize> Histogram<N> {
    fn observe(&self, bounds: &[f64], seconds: f64) {
        let i = bounds.iter().position(|b| seconds <= *b).unwrap_or(bounds.len());
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add((seconds * 1e6) as u64, Ordering::Relaxed);
    }
}

impl Metrics {
    /// One answered request.
    pub fn request(&self, endpoint: &'static str, status: u16) {
        let mut requests = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *requests.entry((endpoint, status)).or_default() += 1;
    }

    /// One finished generation's token counts.
    pub fn tokens(&self, prompt: usize, generated: usize) {
        self.prompt_tokens.fetch_add(prompt as u64, Ordering::Relaxed);
        self.generated_tokens.fetch_add(generated as u64, Ordering::Relaxed);
    }

    pub fn first_token(&self, seconds: f64) {
        self.ttft.observe(&TTFT_BUCKETS, seconds);
    }

    /// The exposition text, with the engine's `stats`, `slots` in all and requests in flight.
    pub fn render(&self, stats: &Stats, slots: usize, in_flight: usize) -> String {
        let mut out = String::new();
        let requests = self.requests.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let _ = writeln!(out, "# HELP mlx_iree_requests_total Requests answered, by endpoint and HTTP status.");
        let _ = writeln!(out, "# TYPE mlx_iree_requests_total counter");
        for ((endpoint, status), n) in requests {
            let _ = writeln!(out, "mlx_iree_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}");
        }
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {value}");
        };
        let gauge = |out: &mut String, name: &str, help: &str, value: usize| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        };
        counter(
            &mut out,
            "mlx_iree_prompt_tokens_total",
            "Prompt tokens of finished requests.",
            self.prompt_tokens.load(Ordering::Relaxed),
        );
        counter(
            &mut out,
            "mlx_iree_generated_tokens_total",
            "Tokens generated.",
            self.generated_tokens.load(Ordering::Relaxed),
        );
        gauge(&mut out, "mlx_iree_queue_depth", "Requests waiting for a slot.", stats.queued());
        gauge(&mut out, "mlx_iree_active_slots", "Requests holding a KV slot.", stats.running());
        gauge(&mut out, "mlx_iree_slots", "KV slots (sequences decoded together).", slots);
        gauge(&mut out, "mlx_iree_requests_in_flight", "Generation requests being answered.", in_flight);
        let (steps, seconds, buckets) = stats.steps();
        histogram(
            &mut out,
            "mlx_iree_decode_step_seconds",
            "Duration of one batched decode step.",
            &STEP_BUCKETS,
            &buckets,
            seconds,
            steps,
        );
        let ttft: Vec<u64> = self.ttft.counts.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let total = ttft.iter().sum();
        let sum = self.ttft.sum_micros.load(Ordering::Relaxed) as f64 * 1e-6;
        histogram(
            &mut out,
            "mlx_iree_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
            &TTFT_BUCKETS,
            &ttft,
            sum,
            total,
        );
        out
    }
}

/// A Prometheus histogram from per-bucket counts (made cumulative here).
fn histogram(out: &mut String, name: &str, help: &str, bounds: &[f64], counts: &[u64], sum: f64, total: u64) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let mut cumulative = 0;
    for (bound, n) in bounds.iter().zip(counts) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}\n{name}_sum {sum}\n{name}_count {total}");
}
