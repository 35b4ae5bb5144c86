#![no_main]
//! libFuzzer entry of the `gguf` target: [`specfit_fuzz::gguf`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| specfit_fuzz::gguf(data));
