#![no_main]
//! libFuzzer entry of the `config` target: [`specfit_fuzz::config`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| specfit_fuzz::config(data));
