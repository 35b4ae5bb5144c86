#![no_main]
//! libFuzzer entry of the `request` target: [`specfit_fuzz::request`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| specfit_fuzz::request(data));
