#![no_main]
//! libFuzzer entry of the `safetensors` target: [`specfit_fuzz::safetensors`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| specfit_fuzz::safetensors(data));
