//! Shared test harness: the brute-force oracle, the seed table, and the random pool generator the
//! property tests draw from. Reachable to `pub(crate)` items; compiled only for tests.

mod naive;
mod oracle;
mod seeds;
