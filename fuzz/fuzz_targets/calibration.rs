#![no_main]
//! libFuzzer entry of the `calibration` target: [`specfit_fuzz::calibration`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| specfit_fuzz::calibration(data));
