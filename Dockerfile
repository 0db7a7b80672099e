# The image of the Kubernetes launcher's pods: `sluice` on the PATH, and a sample dataset of one
# million rows at /data/sample for examples/kubernetes.yaml. Trainer images build FROM it (or copy
# /usr/local/bin/sluice) and add their own code.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release -p sluice-cli \
    && target/release/sluice gen --out /data/sample --rows 1000000 --files 8

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/sluice /usr/local/bin/sluice
COPY --from=build /data/sample /data/sample
