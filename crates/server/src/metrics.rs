//! `/metrics` in Prometheus' text format: requests by endpoint and status, tokens, queue
//! depth and active slots (from the engine's live counters), decode-step latency and time to
//! first token.

use engine::scheduler::{Histogram, Stats};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds, in seconds, of the time-to-first-token histogram.
const TTFT_BUCKETS: [f64; 12] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

#[derive(Debug)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    prompt_tokens: AtomicU64,
    generated_tokens: AtomicU64,
    ttft: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            requests: Mutex::default(),
            prompt_tokens: AtomicU64::new(0),
            generated_tokens: AtomicU64::new(0),
            ttft: Histogram::new(&TTFT_BUCKETS),
        }
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
        self.ttft.observe(seconds);
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
        counter(
            &mut out,
            "mlx_iree_prefix_cache_hits_total",
            "Requests that found the start of their prompt in a slot (prefix cache).",
            stats.prefix_hits(),
        );
        counter(
            &mut out,
            "mlx_iree_prefix_cache_tokens_total",
            "Prompt tokens read from the prefix cache instead of prefilled.",
            stats.cached_tokens(),
        );
        counter(
            &mut out,
            "mlx_iree_verify_calls_total",
            "Calls that checked draft tokens (speculative decoding).",
            stats.verify_calls(),
        );
        counter(&mut out, "mlx_iree_draft_tokens_total", "Draft tokens checked.", stats.drafted());
        counter(&mut out, "mlx_iree_draft_accepted_tokens_total", "Draft tokens accepted.", stats.accepted());
        gauge(&mut out, "mlx_iree_queue_depth", "Requests waiting for a slot.", stats.queued());
        gauge(&mut out, "mlx_iree_active_slots", "Requests holding a KV slot.", stats.running());
        gauge(&mut out, "mlx_iree_slots", "KV slots (sequences decoded together).", slots);
        gauge(&mut out, "mlx_iree_requests_in_flight", "Generation requests being answered.", in_flight);
        histogram(&mut out, "mlx_iree_decode_step_seconds", "Duration of one batched decode step.", stats.steps());
        histogram(
            &mut out,
            "mlx_iree_time_to_first_token_seconds",
            "From a request's arrival to its first token.",
            &self.ttft,
        );
        out
    }
}

/// `h` as a Prometheus histogram (its per-bucket counts made cumulative).
fn histogram(out: &mut String, name: &str, help: &str, h: &Histogram) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    let (counts, mut cumulative) = (h.counts(), 0);
    for (bound, n) in h.bounds().iter().zip(&counts) {
        cumulative += n;
        let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {cumulative}");
    }
    let (total, sum) = (counts.iter().sum::<u64>(), h.sum_seconds());
    let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {total}\n{name}_sum {sum}\n{name}_count {total}");
}
