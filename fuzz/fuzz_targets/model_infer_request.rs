//! libFuzzer target: arbitrary bytes through `pacpriv::fuzz::model_infer_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pacpriv::fuzz::model_infer_request(data));
