# The broker image. Build: docker build -t kafka-rs .
FROM rust:1-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libclang-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cargo build --release --bin broker

FROM debian:bookworm-slim
COPY --from=build /src/target/release/broker /usr/local/bin/broker
WORKDIR /var/lib/kafka-rs
EXPOSE 9092 9404
ENTRYPOINT ["/usr/local/bin/broker"]
CMD ["--override", "listeners=PLAINTEXT://0.0.0.0:9092", "--override", "advertised.listeners=PLAINTEXT://localhost:9092", "--override", "log.dirs=/var/lib/kafka-rs/data", "--override", "metrics.listen.address=0.0.0.0:9404"]
