module kafka-rs/bench/dispatcher/loadgen

go 1.22
