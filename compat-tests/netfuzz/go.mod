module kafka-rs/compat-tests/netfuzz

go 1.26.0
