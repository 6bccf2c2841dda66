# syntax=docker/dockerfile:1
#
# egressd container image.
#
#   docker build -t egressd:0.1.0 .     # the tag deploy/kubernetes uses (the version in Cargo.toml)
#   docker run --rm -v "$PWD/my-config:/etc/egressd:ro" egressd
#
# The image reads its config from /etc/egressd (a directory, watched for changes; SIGHUP also
# reloads). The default config baked in is config/egressd.yaml: a sidecar that listens on
# 127.0.0.1:15001 with the admin server on 127.0.0.1:15000, so both are reachable only from the
# same network namespace (the application's pod). A central gateway, or kubelet probes of
# /ready and /healthz, need a config whose listener and admin addresses are not loopback (mount
# it over /etc/egressd, e.g. a ConfigMap), or `--admin-address 0.0.0.0:15000` in the command.
#
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

ARG RUST_VERSION=1

# ---- build ------------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
# The whole tree (minus .dockerignore): Cargo checks that every target Cargo.toml declares
# (tests, benches, examples) exists even when building only the binary, so a manifest-only
# "dependencies first" layer would break as soon as one is declared. Dependencies are cached
# instead by the cache mounts below: the registry and target/ survive between builds, so a
# source change rebuilds only egressd itself.
COPY . .
# target/ is a cache mount, not part of the image: copy the binary out in the same step. The
# release profile keeps line tables for local profiling; the image does not need them
# (--strip-debug keeps the symbols, so backtraces still name functions).
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --features otel --bin egressd \
    && objcopy --strip-debug target/release/egressd /usr/local/bin/egressd

# ---- runtime ----------------------------------------------------------------------------------
# glibc, libgcc and CA certificates (/etc/ssl/certs), no shell or package manager. Debian 12,
# the same glibc as the bookworm builder.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /usr/local/bin/egressd /usr/local/bin/egressd
# Only the default config; config/examples/ is documentation, not part of the image.
COPY config/egressd.yaml /etc/egressd/egressd.yaml
# distroless "nonroot" is uid/gid 65532; numeric so Kubernetes runAsNonRoot can verify it.
USER 65532:65532
# 15001: proxy listener, 15000: admin (/ready, /healthz, /metrics, /status, /config).
EXPOSE 15001 15000
ENTRYPOINT ["/usr/local/bin/egressd"]
CMD ["run", "--config", "/etc/egressd"]
