# Shared by scripts/up and scripts/test. Source it; do not run it.
#
# install_deps      installs what is missing (Debian/Ubuntu, root or sudo)
# free_port         prints a free TCP port on 127.0.0.1
# start_postgres D  starts a private Postgres in D on a free port; sets PG_URL, PG_PID_DIR
# start_redis D     starts a private Redis in D on a free port; sets REDIS_URL
# stop_stores       stops both

set -euo pipefail

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root or sudo to run: $*"; fi
}

pg_bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return 0; }
  return 1
}

install_deps() {
  local missing=()
  pg_bindir >/dev/null || missing+=(postgresql)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  command -v python3 >/dev/null 2>&1 || missing+=(python3)
  command -v cc >/dev/null 2>&1 || missing+=(build-essential)
  command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
  command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  if [ "${PROXYNET_INSTALL_TEST_TOOLS:-0}" = 1 ]; then
    # Only the test suite needs these: a real Prometheus (and promtool),
    # headless Chromium, Node for the browser and client tests, HAProxy,
    # and what the network-namespace harness runs.
    command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
    command -v chromium >/dev/null 2>&1 || missing+=(chromium)
    command -v node >/dev/null 2>&1 || missing+=(nodejs)
    command -v npm >/dev/null 2>&1 || missing+=(npm)
    python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || missing+=(python3-venv)
    # The network-namespace harness builds exit hosts with iproute2 and puts
    # some behind NAT with nftables (tests/src/netns.rs).
    command -v ip >/dev/null 2>&1 || missing+=(iproute2)
    command -v nft >/dev/null 2>&1 || missing+=(nftables)
    # The PROXY protocol test puts a real HAProxy in front of the superproxy.
    command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
    # Partner gateways behind upstream exits: Squid (HTTP) and microsocks
    # (SOCKS5). The squid package starts a system Squid; the tests run
    # their own.
    command -v squid >/dev/null 2>&1 || missing+=(squid)
    command -v microsocks >/dev/null 2>&1 || missing+=(microsocks)
  fi
  if [ "${#missing[@]}" -gt 0 ]; then
    say "installing: ${missing[*]}"
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # The Debian package starts cluster-wide services on the default ports; we
  # never use them (our stores are private, on free ports).
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  command -v cargo >/dev/null 2>&1 || die "cargo not found: install Rust (https://rustup.rs) first"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# Postgres refuses to run as root: when we are root, it runs as the 'postgres'
# system user (created by the Debian package) from a directory it can reach.
pg_run() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start_postgres() {
  local dir="$1" bindir port password
  bindir="$(pg_bindir)" || die "PostgreSQL server binaries not found"
  if [ "$(id -u)" -eq 0 ] && ! runuser -u postgres -- test -x "$(dirname "$dir")"; then
    # The repository lives where the postgres user cannot reach: use /tmp.
    dir="$(mktemp -d /tmp/proxynet-pg.XXXXXX)"
  fi
  mkdir -p "$dir"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$dir"
  password="$(python3 -c 'import secrets; print(secrets.token_hex(16))')"
  if [ ! -f "$dir/data/PG_VERSION" ]; then
    printf '%s\n' "$password" > "$dir/.pw"
    [ "$(id -u)" -eq 0 ] && chown postgres: "$dir/.pw"
    pg_run "$bindir/initdb" -D "$dir/data" -U proxynet --pwfile="$dir/.pw" \
      --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 >"$dir/initdb.log" 2>&1 \
      || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  fi
  password="$(cat "$dir/.pw")"
  port="$(free_port)"
  pg_run "$bindir/pg_ctl" -D "$dir/data" -l "$dir/postgres.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=${PG_FSYNC:-on}" start >/dev/null \
    || { cat "$dir/postgres.log" >&2; die "Postgres did not start"; }
  PG_DIR="$dir"
  PG_URL="postgres://proxynet:${password}@127.0.0.1:${port}/postgres"
  export PG_DIR PG_URL
}

stop_postgres() {
  [ -n "${PG_DIR:-}" ] || return 0
  local bindir; bindir="$(pg_bindir)" || return 0
  pg_run "$bindir/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
}

start_redis() {
  local dir="$1" port
  mkdir -p "$dir"
  port="$(free_port)"
  redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" --save "" --appendonly no \
    --daemonize yes --pidfile "$dir/redis.pid" --logfile "$dir/redis.log" >/dev/null
  local i
  for i in $(seq 1 100); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    [ "$i" -eq 100 ] && { cat "$dir/redis.log" >&2; die "Redis did not start"; }
    sleep 0.1
  done
  REDIS_DIR="$dir"
  REDIS_PORT="$port"
  REDIS_URL="redis://127.0.0.1:${port}/"
  export REDIS_DIR REDIS_PORT REDIS_URL
}

stop_redis() {
  [ -n "${REDIS_PORT:-}" ] || return 0
  redis-cli -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
}

# start_redis_cluster D   starts a private 3-master Redis Cluster in D (each
# node and its cluster bus on free ports); sets REDIS_CLUSTER_URL to the
# comma-separated seed list the binaries take with --redis-cluster.
start_redis_cluster() {
  local dir="$1" node port bus seeds=() urls=() i
  REDIS_CLUSTER_PORTS=""
  for node in 1 2 3; do
    mkdir -p "$dir/$node"
    port="$(free_port)"; bus="$(free_port)"
    redis-server --bind 127.0.0.1 --port "$port" --cluster-enabled yes --cluster-port "$bus" \
      --cluster-config-file "$dir/$node/nodes.conf" --cluster-node-timeout 5000 \
      --dir "$dir/$node" --save "" --appendonly no \
      --daemonize yes --pidfile "$dir/$node/redis.pid" --logfile "$dir/$node/redis.log" >/dev/null
    for i in $(seq 1 100); do
      redis-cli -p "$port" ping >/dev/null 2>&1 && break
      [ "$i" -eq 100 ] && { cat "$dir/$node/redis.log" >&2; die "Redis Cluster node $node did not start"; }
      sleep 0.1
    done
    seeds+=("127.0.0.1:$port"); urls+=("redis://127.0.0.1:$port/")
    REDIS_CLUSTER_PORTS="$REDIS_CLUSTER_PORTS $port"
  done
  redis-cli --cluster create "${seeds[@]}" --cluster-replicas 0 --cluster-yes >"$dir/create.log" 2>&1 \
    || { cat "$dir/create.log" >&2; die "redis-cli --cluster create failed"; }
  # Every node must agree the cluster is whole before anyone uses it.
  for port in $REDIS_CLUSTER_PORTS; do
    for i in $(seq 1 200); do
      redis-cli -p "$port" cluster info 2>/dev/null | grep -q '^cluster_state:ok' && break
      [ "$i" -eq 200 ] && die "Redis Cluster did not reach cluster_state:ok"
      sleep 0.1
    done
  done
  REDIS_CLUSTER_URL="$(IFS=,; echo "${urls[*]}")"
  export REDIS_CLUSTER_PORTS REDIS_CLUSTER_URL
}

stop_redis_cluster() {
  local port
  for port in ${REDIS_CLUSTER_PORTS:-}; do
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  done
}
