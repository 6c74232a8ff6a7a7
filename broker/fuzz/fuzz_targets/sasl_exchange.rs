#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| broker::fuzzing::sasl_exchange(data));
