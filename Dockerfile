# One image with all three proxynet binaries; compose.yaml picks the command.
# The proxynet user's uid and gid are pinned to 999 (the first id Debian's
# `useradd --system` hands out): deploy/kubernetes runs the containers with
# runAsUser/runAsGroup 999 and must name the number.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --workspace --bins \
 && mkdir /out \
 && cp target/release/superproxy target/release/control-api target/release/exit-agent target/release/whoami target/release/proxynetctl /out/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl python3 \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 999 --user-group --home /var/lib/proxynet --create-home proxynet \
 && mkdir -p /var/lib/proxynet/state /var/lib/proxynet/spill /bootstrap \
 && chown proxynet: /var/lib/proxynet/state /var/lib/proxynet/spill /bootstrap
COPY --from=build /out/ /usr/local/bin/
COPY deploy/compose-bootstrap.sh /usr/local/bin/proxynet-compose-bootstrap
USER proxynet
