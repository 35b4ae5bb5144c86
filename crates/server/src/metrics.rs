//! The server's counters and their Prometheus text exposition (`GET /metrics`): requests by
//! endpoint and outcome, tokens, decode rate, tokens committed and nodes verified per cycle,
//! expert copies and bytes per token, queue length, resident memory. It does not time anything
//! itself; handlers and the decoding thread report to it.

use std::fmt::Write;
use std::sync::Mutex;

use crate::decoder::RequestStats;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Completed (length or stop).
    Ok,
    /// A 4xx for a bad request.
    Invalid,
    /// Refused for load or shutdown (429/503).
    Refused,
    /// The client went away or the server stopped it.
    Cancelled,
    /// The engine failed (500).
    Failed,
}

impl Outcome {
    const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Invalid,
        Outcome::Refused,
        Outcome::Cancelled,
        Outcome::Failed,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Invalid => "invalid",
            Outcome::Refused => "refused",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
        }
    }
}

const ENDPOINTS: [&str; 2] = ["chat", "completions"];

#[derive(Debug, Default)]
struct Totals {
    /// `[endpoint][outcome]`.
    requests: [[u64; 5]; 2],
    prompt_tokens: u64,
    cached_prompt_tokens: u64,
    completion_tokens: u64,
    decode_seconds: f64,
    prefill_seconds: f64,
    cycles: u64,
    committed: u64,
    verified_nodes: u64,
    expert_copies: u64,
    expert_bytes: u64,
    /// Decode rate of the latest completed request.
    last_tokens_per_second: f64,
}

/// Everything `/metrics` reports.
#[derive(Debug, Default)]
pub struct Metrics {
    totals: Mutex<Totals>,
}

/// Gauges read at scrape time.
#[derive(Debug, Clone, Copy, Default)]
pub struct Live {
    pub queue_length: usize,
    pub in_flight: usize,
}

impl Metrics {
    /// Counts a request that ended with `outcome` on `endpoint` (`chat` or `completions`).
    pub fn request(&self, endpoint: &str, outcome: Outcome) {
        let e = ENDPOINTS.iter().position(|&x| x == endpoint).unwrap_or(0);
        let o = Outcome::ALL.iter().position(|&x| x == outcome).unwrap_or(0);
        self.lock().requests[e][o] += 1;
    }

    /// Adds what a decode did (completed or cancelled).
    pub fn decoded(&self, s: &RequestStats) {
        let mut t = self.lock();
        t.prompt_tokens += s.prompt_tokens as u64;
        t.cached_prompt_tokens += s.cached_prompt_tokens as u64;
        t.completion_tokens += s.completion_tokens as u64;
        t.decode_seconds += s.decode_seconds;
        t.prefill_seconds += s.prefill_seconds;
        t.cycles += s.cycles as u64;
        t.committed += s.committed as u64;
        t.verified_nodes += s.verified_nodes as u64;
        t.expert_copies += s.expert_copies;
        t.expert_bytes += s.expert_bytes;
        if s.decode_seconds > 0.0 {
            t.last_tokens_per_second = s.decode_tokens_per_second();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Totals> {
        self.totals.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The Prometheus text format (version 0.0.4).
    pub fn render(&self, live: Live) -> String {
        let t = self.lock();
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, samples: &[(String, f64)]| {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for (labels, v) in samples {
                let _ = writeln!(out, "{name}{labels} {v}");
            }
        };
        let one = |v: f64| vec![(String::new(), v)];
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let mut requests = Vec::new();
        for (e, endpoint) in ENDPOINTS.iter().enumerate() {
            for (o, outcome) in Outcome::ALL.iter().enumerate() {
                requests.push((
                    format!(
                        "{{endpoint=\"{endpoint}\",outcome=\"{}\"}}",
                        outcome.label()
                    ),
                    t.requests[e][o] as f64,
                ));
            }
        }
        metric(
            "specfit_requests_total",
            "counter",
            "Generation requests by endpoint and outcome.",
            &requests,
        );
        let decoded = t.completion_tokens as f64;
        // Metrics with one unlabelled sample: name, type, help, value.
        let singles: [(&str, &str, &str, f64); 16] = [
            (
                "specfit_prompt_tokens_total",
                "counter",
                "Prompt tokens of decoded requests.",
                t.prompt_tokens as f64,
            ),
            (
                "specfit_prompt_tokens_cached_total",
                "counter",
                "Prompt tokens taken from the previous request's prefill.",
                t.cached_prompt_tokens as f64,
            ),
            (
                "specfit_completion_tokens_total",
                "counter",
                "Generated tokens.",
                t.completion_tokens as f64,
            ),
            (
                "specfit_prefill_seconds_total",
                "counter",
                "Time in prompt forwards.",
                t.prefill_seconds,
            ),
            (
                "specfit_decode_seconds_total",
                "counter",
                "Time decoding after the prompt forward.",
                t.decode_seconds,
            ),
            (
                "specfit_tokens_per_second",
                "gauge",
                "Decode rate of the latest completed request (tokens after the first per decode second).",
                t.last_tokens_per_second,
            ),
            (
                "specfit_cycles_total",
                "counter",
                "Draft-verify cycles (plain decoding: one per token).",
                t.cycles as f64,
            ),
            (
                "specfit_tokens_per_cycle",
                "gauge",
                "Tokens committed per cycle, over all requests.",
                ratio(t.committed as f64, t.cycles as f64),
            ),
            (
                "specfit_nodes_verified_per_cycle",
                "gauge",
                "Draft nodes verified per cycle, over all requests.",
                ratio(t.verified_nodes as f64, t.cycles as f64),
            ),
            (
                "specfit_expert_copies_total",
                "counter",
                "Routed-expert copies into slots (misses).",
                t.expert_copies as f64,
            ),
            (
                "specfit_expert_bytes_copied_total",
                "counter",
                "Bytes of routed-expert copies.",
                t.expert_bytes as f64,
            ),
            (
                "specfit_expert_copies_per_token",
                "gauge",
                "Expert copies per generated token, over all requests.",
                ratio(t.expert_copies as f64, decoded),
            ),
            (
                "specfit_expert_bytes_per_token",
                "gauge",
                "Expert bytes copied per generated token, over all requests.",
                ratio(t.expert_bytes as f64, decoded),
            ),
            (
                "specfit_queue_length",
                "gauge",
                "Requests waiting for the engine.",
                live.queue_length as f64,
            ),
            (
                "specfit_requests_in_flight",
                "gauge",
                "Requests being decoded (0 or 1).",
                live.in_flight as f64,
            ),
            (
                "process_resident_memory_bytes",
                "gauge",
                "Resident memory of the server process.",
                resident_bytes() as f64,
            ),
        ];
        for (name, kind, help, v) in singles {
            metric(name, kind, help, &one(v));
        }
        out
    }
}

/// The process's resident set (Linux `/proc/self/statm`; 0 elsewhere).
pub fn resident_bytes() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = text
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `name{labels}` in an exposition.
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{series} not in\n{text}"))
    }

    #[test]
    fn the_exposition_sums_decodes_and_derives_per_cycle_and_per_token_rates() {
        let m = Metrics::default();
        m.request("chat", Outcome::Ok);
        m.request("chat", Outcome::Ok);
        m.request("completions", Outcome::Refused);
        let stats = RequestStats {
            prompt_tokens: 10,
            cached_prompt_tokens: 4,
            completion_tokens: 9,
            cycles: 4,
            verified_nodes: 6,
            committed: 8,
            expert_copies: 18,
            expert_bytes: 1800,
            prefill_seconds: 0.5,
            decode_seconds: 2.0,
        };
        m.decoded(&stats);
        m.decoded(&stats);
        let text = m.render(Live {
            queue_length: 3,
            in_flight: 1,
        });
        assert_eq!(
            value(
                &text,
                "specfit_requests_total{endpoint=\"chat\",outcome=\"ok\"}"
            ),
            2.0
        );
        assert_eq!(
            value(
                &text,
                "specfit_requests_total{endpoint=\"completions\",outcome=\"refused\"}"
            ),
            1.0
        );
        assert_eq!(value(&text, "specfit_completion_tokens_total"), 18.0);
        assert_eq!(value(&text, "specfit_prompt_tokens_cached_total"), 8.0);
        assert_eq!(value(&text, "specfit_tokens_per_cycle"), 2.0);
        assert_eq!(value(&text, "specfit_nodes_verified_per_cycle"), 1.5);
        assert_eq!(value(&text, "specfit_expert_copies_per_token"), 2.0);
        assert_eq!(value(&text, "specfit_expert_bytes_per_token"), 200.0);
        assert_eq!(value(&text, "specfit_tokens_per_second"), 4.0);
        assert_eq!(value(&text, "specfit_queue_length"), 3.0);
        assert!(value(&text, "process_resident_memory_bytes") > 1e6);
        // Every sample line belongs to a declared metric.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let name = line.split(['{', ' ']).next().unwrap();
            assert!(text.contains(&format!("# TYPE {name} ")), "{line}");
        }
    }
}
