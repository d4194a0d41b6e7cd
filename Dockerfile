# The narad container image (OPERATIONS.md §7): a non-root user and group 10001 (`narad`), workdir and
# volume /var/lib/narad, ports 7942 (API; node RPC also on 7942/udp), 7943 (Raft) and 6060 (pprof,
# when enabled), entrypoint `narad`, default args `serve --addr=0.0.0.0:7942 --data-dir=/var/lib/narad`
# (security on: the root admin's password is written to /var/lib/narad/admin-password).
#
#   docker build -t narad:dev .       # NARAD_RELEASE / NARAD_COMMIT build args name the build
#
# Two runtime requirements, or the broker refuses to start (it exits 2 at once with this message):
#
# 1. io_uring must be allowed. Docker's default seccomp profile (Docker 25 and later) refuses
#    io_uring_setup:
#      narad: io_uring is not available (Operation not permitted (os error 1)). Narad needs io_uring: ...
#    Run with the Helm chart's profile (path from the repository root), which allows io_uring and
#    denies ~55 kernel-attack-surface syscalls:  --security-opt seccomp=helm/narad/files/narad-seccomp.json
# 2. The locked-memory limit must be at least 512 KiB; Docker's default is often 64 KiB:
#      narad: the locked-memory limit (ulimit -l) is 65536 bytes; Narad needs at least 524288 bytes. ...
#    Run with  --ulimit memlock=-1  (unlimited; or a number of bytes, e.g. 16777216).
#
# The node id defaults to the host name (the container id); a data directory keeps the id it was
# first started with, so a new container on the same volume goes on under it. A fixed one
# (-e NARAD_NODE_ID=narad-0) must match the volume's. tests/container_check.sh checks this file
# and runs the binary the way the image does.
#
#   docker run -d --name narad -p 127.0.0.1:7942:7942 -v narad-data:/var/lib/narad \
#     -e NARAD_NODE_ID=narad-0 --ulimit memlock=-1 \
#     --security-opt seccomp=helm/narad/files/narad-seccomp.json narad:dev

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
ARG NARAD_RELEASE=
ARG NARAD_COMMIT=
RUN cargo build --release --locked --bin narad -p narad \
    && install -m 0755 target/release/narad /narad

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 narad \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/narad --no-create-home \
        --shell /usr/sbin/nologin narad \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/narad
COPY --from=builder /narad /usr/local/bin/narad
WORKDIR /var/lib/narad
VOLUME ["/var/lib/narad"]
EXPOSE 7942/tcp 7942/udp 7943/tcp 6060/tcp
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
ENTRYPOINT ["narad"]
CMD ["serve", "--addr=0.0.0.0:7942", "--data-dir=/var/lib/narad"]
