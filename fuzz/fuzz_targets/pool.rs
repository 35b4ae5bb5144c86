#![no_main]
//! libFuzzer entry of the `pool` target: [`specfit_fuzz::pool`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| specfit_fuzz::pool(data));
