//! libFuzzer target: arbitrary bytes through `pacpriv_service::fuzz::teacher_response`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| pacpriv_service::fuzz::teacher_response(data));
