# The broker image (the default target) and the dispatcher image (target `dispatcher`).
# Build: docker build -t kafka-rs .   and   docker build --target dispatcher -t kafka-rs-dispatcher .
FROM rust:1-bookworm AS build
# libclang-dev: RocksDB's bindings; libssl-dev: librdkafka's TLS (the dispatcher's Kafka client).
RUN apt-get update && apt-get install -y --no-install-recommends libclang-dev libssl-dev \
  && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --bin broker --bin dispatcher

FROM debian:bookworm-slim AS dispatcher
RUN apt-get update && apt-get install -y --no-install-recommends libssl3 ca-certificates \
  && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/dispatcher /usr/local/bin/dispatcher
WORKDIR /etc/dispatcher
EXPOSE 8080 8081 8082
ENTRYPOINT ["/usr/local/bin/dispatcher"]
CMD ["--config", "/etc/dispatcher/dispatcher.toml"]

FROM debian:bookworm-slim AS broker
COPY --from=build /src/target/release/broker /usr/local/bin/broker
WORKDIR /var/lib/kafka-rs
EXPOSE 9092 9404
ENTRYPOINT ["/usr/local/bin/broker"]
CMD ["--override", "listeners=PLAINTEXT://0.0.0.0:9092", "--override", "advertised.listeners=PLAINTEXT://localhost:9092", "--override", "log.dirs=/var/lib/kafka-rs/data", "--override", "metrics.listen.address=0.0.0.0:9404"]
