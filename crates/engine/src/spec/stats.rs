//! What a decode produced and cost, plain or speculative ([`DecodeStats`]), and the clock that
//! splits a cycle's wall time into its phases ([`Clock`]). It decodes nothing.

use std::time::Instant;

use crate::experts::LayerStats;

/// What one generation produced and cost. Plain decoding fills it too: each decoded token is a
/// cycle that is a plain step, verifies nothing and commits one token.
#[derive(Debug, Clone, Default)]
pub struct DecodeStats {
    pub tokens: Vec<u32>,
    /// Prompt tokens (the whole prompt, also when decoding from a [`crate::Prefix`]).
    pub prompt_tokens: usize,
    /// Cycles after the prefill: speculative draft–verify cycles plus plain steps.
    pub cycles: usize,
    /// Draft nodes verified, summed over cycles.
    pub verified_nodes: usize,
    /// Levels drafted (the pool's depth), summed over cycles.
    pub drafted_levels: usize,
    /// Cycles that were plain decoding steps, included in `cycles`.
    pub plain_steps: usize,
    /// Tokens committed per cycle, summed (accepted drafts + bonus; 1 per plain step).
    pub committed: usize,
    /// `accept_counts[a]`: speculative cycles that accepted `a` draft tokens (gpt-fast's
    /// `accept_counts`; plain steps are not counted).
    pub accept_counts: Vec<usize>,
    /// Microseconds of each decision of a searching policy (the exact search and stop rule).
    pub select_us: Vec<f64>,
    pub draft_seconds: f64,
    pub select_seconds: f64,
    /// Verify forwards and plain steps (drafter feeding included).
    pub verify_seconds: f64,
    pub prefill_seconds: f64,
    /// Decode wall time after the prefill, atlas routing excluded.
    pub decode_seconds: f64,
    /// Time spent computing atlas routes (outside the decode clock).
    pub atlas_seconds: f64,
    /// Expert copies of the prefill forward.
    pub prefill_copies: LayerStats,
    /// Expert copies while decoding (after the prefill).
    pub copies: LayerStats,
}

impl DecodeStats {
    /// Decoded tokens per second (the first token comes from the prefill forward).
    pub fn tokens_per_second(&self) -> f64 {
        decode_rate(self.tokens.len(), self.decode_seconds)
    }

    /// Tokens committed per cycle (0 without cycles).
    pub fn tokens_per_cycle(&self) -> f64 {
        per_cycle(self.committed, self.cycles)
    }

    /// Counts one speculative cycle that verified `verified` nodes of a pool `levels` deep and
    /// committed `committed` tokens (`committed - 1` accepted drafts and the bonus).
    pub(crate) fn count_cycle(&mut self, verified: usize, levels: usize, committed: usize) {
        self.cycles += 1;
        self.verified_nodes += verified;
        self.drafted_levels += levels;
        self.committed += committed;
        let accepted = committed.saturating_sub(1);
        if self.accept_counts.len() <= accepted {
            self.accept_counts.resize(accepted + 1, 0);
        }
        self.accept_counts[accepted] += 1;
    }

    /// Counts one plain decoding step.
    pub(crate) fn count_plain_step(&mut self) {
        self.cycles += 1;
        self.plain_steps += 1;
        self.committed += 1;
    }
}

/// Tokens decoded per second after the first of `tokens` (which the prompt's forward produces)
/// in `seconds` of decoding; 0 without decode time.
pub fn decode_rate(tokens: usize, seconds: f64) -> f64 {
    match seconds > 0.0 {
        true => tokens.saturating_sub(1) as f64 / seconds,
        false => 0.0,
    }
}

/// Tokens committed per cycle; 0 without cycles.
pub fn per_cycle(committed: usize, cycles: usize) -> f64 {
    match cycles {
        0 => 0.0,
        n => committed as f64 / n as f64,
    }
}

/// The phases a cycle's wall time is split into.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    Draft,
    Select,
    Verify,
}

/// Splits wall time into phases as they end: each lap charges the time since the previous lap
/// to a phase, less the routing done outside the clock meanwhile (the atlas), which it charges
/// to `atlas_seconds`. `outside` is the route source's running total of outside seconds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    lap: Instant,
    outside: f64,
    /// Seconds inside the clock over every lap so far.
    inside: f64,
}

impl Clock {
    pub(crate) fn start(outside: f64) -> Clock {
        Clock {
            lap: Instant::now(),
            outside,
            inside: 0.0,
        }
    }

    /// Milliseconds inside the clock over its laps so far.
    pub(crate) fn total_ms(&self) -> f64 {
        1e3 * self.inside
    }

    /// Ends the current lap as `phase`; returns its seconds inside the clock.
    pub(crate) fn lap(&mut self, phase: Phase, outside: f64, stats: &mut DecodeStats) -> f64 {
        let now = Instant::now();
        let away = outside - self.outside;
        let inside = (now - self.lap).as_secs_f64() - away;
        *match phase {
            Phase::Draft => &mut stats.draft_seconds,
            Phase::Select => &mut stats.select_seconds,
            Phase::Verify => &mut stats.verify_seconds,
        } += inside;
        stats.atlas_seconds += away;
        (self.lap, self.outside) = (now, outside);
        self.inside += inside;
        inside
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_counts_histogram_the_accepted_drafts_of_speculative_cycles_only() {
        let mut s = DecodeStats::default();
        s.count_cycle(3, 2, 1); // bonus only
        s.count_cycle(5, 4, 4); // three accepted + bonus
        s.count_cycle(0, 1, 1);
        s.count_plain_step();
        assert_eq!(s.accept_counts, vec![2, 0, 0, 1]);
        assert_eq!(
            s.accept_counts.iter().sum::<usize>() + s.plain_steps,
            s.cycles
        );
        assert_eq!((s.cycles, s.committed, s.verified_nodes), (4, 7, 8));
        assert_eq!(s.drafted_levels, 7);
        assert_eq!(s.tokens_per_cycle(), 7.0 / 4.0);
    }

    #[test]
    fn a_lap_charges_its_phase_and_moves_outside_time_to_the_atlas() {
        let mut s = DecodeStats::default();
        let mut clock = Clock::start(1.0);
        std::thread::sleep(std::time::Duration::from_millis(20));
        // 5 ms of the lap were atlas routing, outside the clock.
        let inside = clock.lap(Phase::Select, 1.005, &mut s);
        assert!(inside >= 0.015 - 1e-9, "{inside}");
        assert_eq!(s.select_seconds, inside);
        assert!((s.atlas_seconds - 0.005).abs() < 1e-12);
        assert_eq!((s.draft_seconds, s.verify_seconds), (0.0, 0.0));
        // The next lap starts where this one ended, outside time included.
        let next = clock.lap(Phase::Draft, 1.005, &mut s);
        assert!(next < inside, "{next} vs {inside}");
        assert!((s.atlas_seconds - 0.005).abs() < 1e-12);
        // The total is the laps' inside time, the atlas's left out.
        assert_eq!(clock.total_ms(), 1e3 * (inside + next));
    }
}
