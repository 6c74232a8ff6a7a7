#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| dispatcher_sidecar::fuzzing::values(data));
