# shellcheck shell=bash
# The CI's throwaway PostgreSQL cluster (sourced by .ci/run; tests/workers/test_ci_postgres.py runs it for real).
#
#   ci_pg_start   stop the clusters earlier runs left behind, then initdb + start one on a free loopback port;
#                 exports PACKYARD_TEST_POSTGRES_URL (returns 0 without it when no PostgreSQL is installable)
#   ci_pg_stop    stop this run's cluster and remove its directory (.ci/run's EXIT trap)
#
# Each cluster lives in $CI_PG_TMP/packyard-ci-pg.XXXXXX (CI_PG_TMP: default /tmp) with a marker file,
# packyard-ci.owner, naming the shell that started it (pid and its start time, from /proc). A run killed
# with SIGKILL never runs its EXIT trap and leaves its server running: the next ci_pg_start finds that
# directory through its marker, sees the owner gone, and stops the server through its data directory
# (pg_ctl stop -D, which reads postmaster.pid), never by process name. A cluster whose owner is still
# alive (a concurrent run) is left alone. The port is one the kernel just handed out free (bind to port 0);
# if the server still does not start, the server log's last lines are printed.

ci_pg_log() { printf '[ci] %s\n' "$*"; }

# The start time (clock ticks since boot) of process $1, or nothing when it does not exist.
ci_pg_proc_start() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
  stat=${stat##*) }            # after "pid (comm) ": field 3 onwards
  # shellcheck disable=SC2086
  set -- $stat
  printf '%s\n' "${20}"        # field 22: starttime
}

# Run "${@:2}" as user $1 when root (pg_ctl and initdb refuse to run as root).
ci_pg_as() {
  local user=$1; shift
  if [ "$(id -u)" = 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi
}

ci_pg_find_bin() {
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true
}

# Stop and remove the clusters in $CI_PG_TMP whose owner (by the marker) is no longer running.
ci_pg_reap_leftovers() {
  local base=${CI_PG_TMP:-/tmp} dir marker pid start pgbin user
  for dir in "$base"/packyard-ci-pg.*; do
    marker="$dir/packyard-ci.owner"
    [ -f "$marker" ] || continue
    pid=$(sed -n 's/^owner_pid=//p' "$marker")
    start=$(sed -n 's/^owner_start=//p' "$marker")
    if [ -n "$pid" ] && [ -n "$start" ] && [ "$(ci_pg_proc_start "$pid")" = "$start" ]; then
      continue                 # its run is still going
    fi
    pgbin=$(sed -n 's/^pg_bin=//p' "$marker")
    user=$(sed -n 's/^pg_user=//p' "$marker")
    if [ -f "$dir/data/postmaster.pid" ] && [ -x "$pgbin/pg_ctl" ]; then
      ci_pg_log "stopping the PostgreSQL server an earlier run left behind ($dir/data, owner pid $pid gone)"
      ci_pg_as "$user" "$pgbin/pg_ctl" -D "$dir/data" -m immediate -w -t 60 stop >/dev/null 2>&1 \
        || ci_pg_log "WARNING: pg_ctl could not stop the server in $dir/data"
    fi
    rm -rf "$dir"
  done
}

ci_pg_free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

ci_pg_start() {
  local pgbin
  pgbin=$(ci_pg_find_bin)
  if [ -z "$pgbin" ] || [ ! -x "$pgbin/initdb" ]; then
    ci_pg_log "PostgreSQL server not found; installing Debian's postgresql package"
    if command -v apt-get >/dev/null 2>&1; then
      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null) || true
    fi
    pgbin=$(ci_pg_find_bin)
  fi
  if [ -z "$pgbin" ] || [ ! -x "$pgbin/initdb" ]; then
    ci_pg_log "WARNING: no PostgreSQL available; PostgreSQL tests will be skipped"
    return 0
  fi
  local pguser=postgres
  if [ "$(id -u)" != 0 ]; then
    pguser=$(id -un)
  elif ! id "$pguser" >/dev/null 2>&1; then
    id packyard-pg >/dev/null 2>&1 || useradd --system --no-create-home packyard-pg
    pguser=packyard-pg
  fi
  ci_pg_reap_leftovers
  local base=${CI_PG_TMP:-/tmp}
  PGDATA_DIR=$(mktemp -d "$base/packyard-ci-pg.XXXXXX")
  PG_BIN=$pgbin PG_USER=$pguser
  # the marker first: a run killed from here on leaves a directory the next run can find and clean
  printf 'packyard .ci/postgres.sh\nowner_pid=%s\nowner_start=%s\npg_bin=%s\npg_user=%s\n' \
    "$$" "$(ci_pg_proc_start $$)" "$pgbin" "$pguser" > "$PGDATA_DIR/packyard-ci.owner"
  chown "$pguser" "$PGDATA_DIR"
  chmod 0755 "$PGDATA_DIR"
  ci_pg_as "$pguser" "$pgbin/initdb" -D "$PGDATA_DIR/data" -U postgres -A trust --no-sync >/dev/null
  local port attempt
  for attempt in 1 2 3; do      # a port another process took between the pick and the start: pick again
    port=$(ci_pg_free_port)
    if ci_pg_as "$pguser" "$pgbin/pg_ctl" -D "$PGDATA_DIR/data" -l "$PGDATA_DIR/log" -w -t 60 \
        -o "-p $port -k $PGDATA_DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null; then
      export PACKYARD_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
      ci_pg_log "PostgreSQL up on 127.0.0.1:$port ($PGDATA_DIR)"
      return 0
    fi
    ci_pg_log "PostgreSQL did not start on 127.0.0.1:$port (attempt $attempt of 3); the server log's last lines:"
    tail -n 20 "$PGDATA_DIR/log" 2>/dev/null | sed 's/^/[ci]   | /' || true
  done
  ci_pg_log "ERROR: PostgreSQL would not start (log: $PGDATA_DIR/log)"
  return 1
}

ci_pg_stop() {
  if [ -n "${PGDATA_DIR:-}" ] && [ -d "$PGDATA_DIR" ]; then
    if [ -f "$PGDATA_DIR/data/postmaster.pid" ]; then
      ci_pg_as "$PG_USER" "$PG_BIN/pg_ctl" -D "$PGDATA_DIR/data" -m immediate -w -t 60 stop >/dev/null 2>&1 || true
    fi
    rm -rf "$PGDATA_DIR"
  fi
}
