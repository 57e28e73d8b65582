# syntax=docker/dockerfile:1
# The kube-leader sidecar image: one statically linked binary (musl) on an empty base, run as
# the numeric non-root user 65532. The same file builds amd64 and arm64; the builder stage runs
# on the build machine's platform and cross-compiles (no emulation):
#
#   docker buildx build --platform linux/amd64,linux/arm64 -t kube-leader:0.1.0 .
#   podman build --platform linux/arm64 -t kube-leader:0.1.0 .
#
# From a binary built beforehand (scripts/static.sh amd64 arm64 writes target/dist/<arch>/),
# without the builder stage and without pulling anything:
#
#   buildah build --target prebuilt --platform linux/arm64 -t kube-leader:0.1.0 .
#   docker build --target prebuilt -t kube-leader:0.1.0 .
#
# scripts/image.sh does the second offline with buildah; the real-node tests run its result.
# The image holds /usr/local/bin/kube-leader and nothing else (no shell, no CA bundle: in a Pod
# the API server's CA comes from the service-account mount). Put it next to your program with
# `COPY --from=` or an initContainer running `kube-leader install DIR`: README.md, "Run it next
# to your program", and deploy/patterns/.

# A Rust image of the build platform (Debian based, with rustup); any registry mirror of it works.
ARG RUST_IMAGE=rust:1.89-bookworm

# --- builder: the static binary for TARGETARCH, cross-compiled on BUILDPLATFORM ---------------
FROM --platform=$BUILDPLATFORM ${RUST_IMAGE} AS builder
ARG TARGETARCH
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      musl-tools gcc-aarch64-linux-gnu libc6-dev-arm64-cross file \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/cache/target,sharing=locked \
    KUBE_LEADER_STATIC_TARGET_DIR=/cache/target scripts/static.sh "${TARGETARCH:-amd64}" \
 && mkdir -p /out && cp "target/dist/${TARGETARCH:-amd64}/kube-leader" /out/kube-leader

# --- prebuilt: the binary scripts/static.sh made (target/dist/<arch>/kube-leader) ------------
FROM scratch AS prebuilt
ARG TARGETARCH
ARG DIST=target/dist
COPY --chmod=0755 ${DIST}/${TARGETARCH}/kube-leader /usr/local/bin/kube-leader
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kube-leader"]
CMD ["--help"]
LABEL org.opencontainers.image.title="kube-leader" \
      org.opencontainers.image.description="Run a program only while it leads: Kubernetes leader election sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kube-leader/kube-leader"

# --- the default stage: the binary of the builder stage ---------------------------------------
FROM scratch AS kube-leader
COPY --from=builder /out/kube-leader /usr/local/bin/kube-leader
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/kube-leader"]
CMD ["--help"]
LABEL org.opencontainers.image.title="kube-leader" \
      org.opencontainers.image.description="Run a program only while it leads: Kubernetes leader election sidecar" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/kube-leader/kube-leader"
