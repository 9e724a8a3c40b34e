#!/usr/bin/env bash
# The servers the test suites run against: PostgreSQL and redis-server on 127.0.0.1, on free
# ports, with throw-away data under target/services (PROTOPROMPT_SERVICES_DIR to move it).
# scripts/test.sh starts them for CI and stops them when it ends; for a local pytest run:
#
#   scripts/services.sh start            # install what is missing (apt-get), start both
#   eval "$(scripts/services.sh env)"    # export the URLs into this shell
#   target/dev/bin/python -m pytest tests/recall/test_memory.py
#   scripts/services.sh stop             # stop both, delete their data
#
#   scripts/services.sh status           # what runs, where
#
# What is installed, only when it is missing (as root, through apt-get; Debian's packages):
#   postgresql            the distribution's PostgreSQL (15 on Debian 12), its contrib modules
#   postgresql-N-pgvector where Debian ships it for that major version (Debian 12 does not:
#                         there a MemoryStore with an embedder ranks vectors in the client)
#   redis-server
# Installing PostgreSQL creates no cluster of its own here (createcluster.conf is preset when it
# does not exist yet), and nothing is started as a system service by this script.
#
# PostgreSQL runs as an unprivileged user when this runs as root (initdb refuses root): the
# 'postgres' user of Debian's package, else 'nobody'. It has a superuser 'protoprompt' with a
# random password, scram-sha-256 over TCP only, fsync off (the data is thrown away).
# The URLs exported:
#   PROTOPROMPT_TEST_POSTGRES_URL   postgresql://protoprompt:<password>@127.0.0.1:<port>/protoprompt
#   PROTOPROMPT_TEST_REDIS_URL      redis://127.0.0.1:<port>/0
#   PROTOPROMPT_TEST_PGVECTOR       1 when the pgvector extension is installed on that server
#                                   (then created in the database: MemoryStore ranks vectors there)
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${PROTOPROMPT_SERVICES_DIR:-target/services}
mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
ENV_FILE=$DIR/env
umask 077 # the env file holds the password

say() { printf -- '-- services: %s\n' "$*" >&2; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# dpkg_installed PKG: the package is installed (not only known or half-configured).
dpkg_installed() {
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2> /dev/null || true)" = installed ]
}

# apt_has PKG: the package archive offers PKG (after apt-get update).
apt_has() {
  local candidate
  candidate=$(apt-cache policy "$1" 2> /dev/null | sed -n 's/^ *Candidate: //p')
  [ -n "$candidate" ] && [ "$candidate" != "(none)" ]
}

# The newest PostgreSQL server binaries Debian's packages put under /usr/lib/postgresql/N/bin.
pg_bindir() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2> /dev/null | sort -V | tail -n 1)
  [ -n "$dir" ] && [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ] && [ -x "$dir/postgres" ] && echo "$dir"
}

APT_UPDATED=0
apt_install() {
  if [ "$(id -u)" != 0 ]; then
    say "cannot install $* (not root): install them, or run this as root"
    return 1
  fi
  if [ "$APT_UPDATED" = 0 ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  say "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "$@" > /dev/null
}

install_missing() {
  local want=()
  if [ -z "$(pg_bindir)" ]; then
    want+=(postgresql)
    # No default cluster (initdb + a started system server) that nothing here would use.
    if [ "$(id -u)" = 0 ] && [ ! -e /etc/postgresql-common/createcluster.conf ]; then
      mkdir -p /etc/postgresql-common
      echo "create_main_cluster = false" > /etc/postgresql-common/createcluster.conf
    fi
  fi
  command -v redis-server > /dev/null || dpkg_installed redis-server || want+=(redis-server)
  if [ "${#want[@]}" -gt 0 ]; then
    apt_install "${want[@]}"
  fi
  local bindir major
  bindir=$(pg_bindir) || { say "no PostgreSQL server binaries under /usr/lib/postgresql"; return 1; }
  major=$(basename "$(dirname "$bindir")")
  if ! dpkg_installed "postgresql-$major-pgvector" && [ "$(id -u)" = 0 ] &&
    [ ! -f "/usr/share/postgresql/$major/extension/vector.control" ]; then
    if [ "$APT_UPDATED" = 0 ] && ! apt_has "postgresql-$major-pgvector"; then
      apt-get update -qq && APT_UPDATED=1
    fi
    if apt_has "postgresql-$major-pgvector"; then
      apt_install "postgresql-$major-pgvector"
    else
      say "Debian ships no postgresql-$major-pgvector here: vectors are ranked in the client"
    fi
  fi
  command -v redis-server > /dev/null || { say "redis-server is not on PATH"; return 1; }
}

# as_pg_user CMD...: CMD as the unprivileged server user when this runs as root.
PG_USER=""
as_pg_user() {
  if [ -n "$PG_USER" ]; then
    runuser -u "$PG_USER" -- "$@"
  else
    "$@"
  fi
}

start_postgres() {
  local bindir data=$DIR/pg port password
  bindir=$(pg_bindir)
  if [ "$(id -u)" = 0 ]; then
    if id postgres > /dev/null 2>&1; then PG_USER=postgres; else PG_USER=nobody; fi
  fi
  rm -rf "$data"
  mkdir -p "$data"
  # The server user must reach the data directory; target/ may sit under a private home.
  if [ -n "$PG_USER" ]; then
    chown "$PG_USER" "$data"
    if ! runuser -u "$PG_USER" -- test -w "$data"; then
      rm -rf "$data"
      data=$(mktemp -d /tmp/protoprompt-pg.XXXXXX)
      chown "$PG_USER" "$data"
      ln -s "$data" "$DIR/pg"
    fi
  fi
  chmod 700 "$data"
  password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
  printf '%s\n' "$password" > "$DIR/pg.pw"
  [ -n "$PG_USER" ] && chown "$PG_USER" "$DIR/pg.pw"
  as_pg_user "$bindir/initdb" -D "$data/data" -U protoprompt --pwfile="$DIR/pg.pw" \
    --auth-local=scram-sha-256 --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 \
    --no-sync > "$DIR/initdb.log" 2>&1 || { cat "$DIR/initdb.log" >&2; return 1; }
  rm -f "$DIR/pg.pw"
  port=$(free_port)
  as_pg_user "$bindir/pg_ctl" -D "$data/data" -l "$data/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$data \
-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
    start > /dev/null || { cat "$data/server.log" >&2; return 1; }
  PGPASSWORD=$password "$bindir/createdb" -h 127.0.0.1 -p "$port" -U protoprompt protoprompt
  local url="postgresql://protoprompt:$password@127.0.0.1:$port/protoprompt" pgvector=0
  if [ -f "$("$bindir/pg_config" --sharedir 2> /dev/null || echo /nonexistent)/extension/vector.control" ]; then
    # pgvector is not a trusted extension: its owner (here the superuser) creates it.
    PGPASSWORD=$password "$bindir/psql" -q -h 127.0.0.1 -p "$port" -U protoprompt -d protoprompt \
      -c "CREATE EXTENSION IF NOT EXISTS vector" > /dev/null
    pgvector=1
  fi
  {
    echo "export PROTOPROMPT_TEST_POSTGRES_URL='$url'"
    echo "export PROTOPROMPT_TEST_PGVECTOR=$pgvector"
  } >> "$ENV_FILE"
  echo "$bindir" > "$DIR/pg.bindir"
  echo "$PG_USER" > "$DIR/pg.user"
  say "PostgreSQL $(basename "$(dirname "$bindir")") on 127.0.0.1:$port (data $data, user ${PG_USER:-$(id -un)}, pgvector $pgvector)"
}

start_redis() {
  local port
  port=$(free_port)
  mkdir -p "$DIR/redis"
  redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes --save "" \
    --appendonly no --dir "$DIR/redis" --daemonize yes --pidfile "$DIR/redis/redis.pid" \
    --logfile "$DIR/redis/redis.log"
  local deadline=$((SECONDS + 20))
  until [ -s "$DIR/redis/redis.pid" ] && redis_ping "$port"; do
    [ $SECONDS -lt $deadline ] || { cat "$DIR/redis/redis.log" >&2; say "redis-server did not start"; return 1; }
    sleep 0.1
  done
  echo "export PROTOPROMPT_TEST_REDIS_URL='redis://127.0.0.1:$port/0'" >> "$ENV_FILE"
  say "redis-server $(redis-server --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') on 127.0.0.1:$port"
}

redis_ping() {
  python3 - "$1" <<'EOF'
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5) as s:
        s.sendall(b"PING\r\n")
        sys.exit(0 if s.recv(16).startswith(b"+PONG") else 1)
except OSError:
    sys.exit(1)
EOF
}

stop_all() {
  if [ -s "$DIR/redis/redis.pid" ]; then
    local pid
    pid=$(cat "$DIR/redis/redis.pid")
    if kill "$pid" 2> /dev/null; then
      while kill -0 "$pid" 2> /dev/null; do sleep 0.1; done
    fi
  fi
  if [ -f "$DIR/pg.bindir" ] && [ -d "$DIR/pg/data" ]; then
    PG_USER=$(cat "$DIR/pg.user" 2> /dev/null || true)
    as_pg_user "$(cat "$DIR/pg.bindir")/pg_ctl" -D "$DIR/pg/data" -m fast -w stop > /dev/null 2>&1 || true
  fi
  if [ -L "$DIR/pg" ]; then
    rm -rf "$(readlink "$DIR/pg")"
  fi
  rm -rf "$DIR/pg" "$DIR/redis" "$DIR/env" "$DIR/pg.bindir" "$DIR/pg.user" "$DIR/pg.pw" "$DIR/initdb.log"
}

case "${1:-}" in
  start)
    stop_all
    t0=$SECONDS
    install_missing
    t1=$SECONDS
    : > "$ENV_FILE"
    start_postgres
    start_redis
    say "installed what was missing in $((t1 - t0)) s, started in $((SECONDS - t1)) s"
    cat "$ENV_FILE"
    ;;
  stop)
    stop_all
    say "stopped"
    ;;
  env)
    [ -s "$ENV_FILE" ] || { say "not started (scripts/services.sh start)"; exit 1; }
    cat "$ENV_FILE"
    ;;
  status)
    if [ -s "$ENV_FILE" ]; then sed 's/:[^:@]*@/:***@/' "$ENV_FILE"; else echo "not started"; fi
    ;;
  *)
    echo "usage: $0 start|stop|env|status" >&2
    exit 2
    ;;
esac
