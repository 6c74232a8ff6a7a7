module kafka-rs/bench/push/pushbench

go 1.22
