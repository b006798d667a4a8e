# syntax=docker/dockerfile:1
#
# phones-gateway container image.
#
#   docker build -t phones-gateway .
#   docker run --rm --read-only -p 8080:8080 -p 8081:8081 \
#     -v "$PWD/config/default.toml:/etc/phones-gateway/config.toml:ro" \
#     -e PHONES_GATEWAY__ADMIN__TOKEN=change-me phones-gateway
#
# Two stages: a Rust toolchain builds the release binary; the final image is
# distroless (glibc and libgcc, no shell, no package manager) holding only that
# binary, and runs as the distroless "nonroot" user (uid/gid 65532).
#
# Read-only root filesystem: the binary writes nothing under / by itself, so the
# image runs with `readOnlyRootFilesystem: true`. The one thing that writes files
# is a SQLite database (`database.url = "sqlite://...?mode=rwc"`): with SQLite,
# mount a writable volume at /var/lib/phones-gateway (an emptyDir, or a PVC to
# keep the status set across restarts) and set
#   database.url = "sqlite:///var/lib/phones-gateway/phones-gateway.db?mode=rwc"
# SQLite is for a single replica only. The Helm chart (helm/phones-gateway) does
# this when `persistence.enabled` is set; its default is PostgreSQL, the URL read
# from a Secret into PHONES_GATEWAY__DATABASE__URL. It also mounts an emptyDir at
# /tmp for any library that wants a scratch directory.

ARG RUST_IMAGE=rust:1-slim-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

# ---------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS builder
WORKDIR /src

# Dependency caching uses BuildKit cache mounts rather than a "dummy main.rs"
# layer: Cargo.toml names its bench and test targets explicitly, so cargo refuses
# a manifest whose target files are missing, and a stub layer would have to track
# every target. The registry, git checkouts and the target directory persist
# between builds on the same builder, so a source-only change downloads nothing
# and recompiles this crate only. A cache mount is not part of the image, so the
# binary is copied out of it in the same step.
COPY . .
# The commit `--version`, the start log and phones_gateway_build_info show
# (build.rs): the context has no .git, so pass it, e.g.
# `--build-arg PHONES_GATEWAY_COMMIT=$(git rev-parse --short HEAD)`; "unknown"
# without it.
ARG PHONES_GATEWAY_COMMIT=""
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin phones-gateway \
    && install -D -m 0755 target/release/phones-gateway /out/phones-gateway

# ---------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE}

LABEL org.opencontainers.image.title="phones-gateway" \
      org.opencontainers.image.description="Decides which phone number a buyer sees for a classified ad."

COPY --from=builder --chown=0:0 /out/phones-gateway /phones-gateway

# mimalloc (the process's allocator) gives the pages it frees back to the
# system at once. By default (`purge_delay`, 1000 ms) it gives them back a
# second later at the earliest, and then only at its next housekeeping (a page
# freed, or every so many allocations; no timer does it): the process's
# memory, seen between bursts of work (a flush of the reveal log, a run of
# requests), then holds whatever the last burst freed, 10 to 25 MiB under the
# recorded stream: from the fifth million reveals to the twentieth it moved by
# 9.4 to 13.7% where it moves by 3 to 4% with this (docs/reveal-log.md,
# "Memory"; BENCHMARKS.md, "The reveal log's memory as it ages"). Set in the
# image rather than by the binary: mimalloc reads its options from the
# environment, and setting one from Rust is an unsafe call, which the crate's
# lints forbid. A pod's own `env` (the chart's extraEnv) overrides it.
ENV MIMALLOC_PURGE_DELAY=0

# distroless "nonroot"; numeric so Kubernetes' runAsNonRoot can verify it.
USER 65532:65532

# 8080: public API. 8081: admin API, /healthz, /readyz, /metrics (keep private).
EXPOSE 8080 8081

ENTRYPOINT ["/phones-gateway"]
# The chart mounts its ConfigMap here; without a file there, pass another CMD.
CMD ["serve", "--config", "/etc/phones-gateway/config.toml"]
