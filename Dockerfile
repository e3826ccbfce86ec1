# syntax=docker/dockerfile:1
# tollgate's container image. `make image` builds it as tollgate:<appVersion of charts/tollgate>,
# the image the chart runs by default; `make test` checks this file (scripts/image_check.py).
#
# Build stage: Rust on Debian bookworm, so the binary needs no newer glibc than the runtime's
# (distroless cc-debian12 is bookworm: glibc 2.36). RUST_VERSION is the toolchain the suite runs on.
ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src
# Only what `cargo build --release` reads (.dockerignore keeps the rest out of the context):
# the manifest and lockfile, the sources, lua/ (the Redis scripts are compiled in with
# include_str!) and benches/ (Cargo.toml declares [[bench]] targets, and Cargo refuses a
# manifest whose target files are missing, even for a build that does not compile them).
COPY Cargo.toml Cargo.lock ./
COPY lua ./lua
COPY benches ./benches
COPY src ./src
# Cache mounts (BuildKit, podman and buildah) keep the downloaded crates and the compiled
# dependencies between builds, so a source change recompiles only tollgate. The cached target/
# is not part of the image: the binary is copied out of it in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked \
    && install -D -m 0555 target/release/tollgate /out/tollgate \
    && mkdir -p /out/bin && ln -s /usr/local/bin/tollgate /out/bin/ratelimit

# Runtime: glibc, libgcc and the CA certificates (for rediss:// and an OTLP collector over
# TLS); no shell, no package manager. The :nonroot variant's user is 65532, which the chart's
# securityContext (runAsUser: 65532, readOnlyRootFilesystem) also names: tollgate writes no file.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=unknown
ARG REVISION=unknown
LABEL org.opencontainers.image.title="tollgate" \
      org.opencontainers.image.description="An Envoy-compatible global rate-limit service (one quota across every replica, kept in Redis)" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=build /out/tollgate /usr/local/bin/tollgate
# /bin/ratelimit, a link to the binary: the command Envoy Gateway's rate-limit Deployment runs
# (with no args). Started under that name, tollgate reads envoyproxy/ratelimit's environment
# (docs/migrating.md), so swapping the image is the whole migration.
# A directory is copied so the link stays a link (a COPY of the link itself would copy the file).
COPY --from=build /out/bin/ /bin/
USER 65532:65532
# gRPC RateLimitService (Envoy) and the admin port (/healthz /readyz /metrics /config /json).
# tollgate's defaults already listen on 0.0.0.0:8081 and 0.0.0.0:8080 and read the rules from
# /etc/tollgate/rules (mount a directory or a ConfigMap there); every setting is a TOLLGATE_* variable.
EXPOSE 8081 8080
# The chart sets `args: ["serve"]` and no `command`, so it runs this entrypoint with those args.
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve"]
