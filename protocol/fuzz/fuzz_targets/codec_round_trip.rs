#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| protocol::fuzzing::codec_round_trip(data));
