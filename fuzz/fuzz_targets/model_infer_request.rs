//! libFuzzer target: arbitrary bytes through `pacpriv_service::fuzz::model_infer_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pacpriv_service::fuzz::model_infer_request(data));
