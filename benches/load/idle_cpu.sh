#!/usr/bin/env bash
# CPU a second of an idle gateway (docs/performance.md, "The idle background"):
# the release binary BIN started on a fresh SQLite file with the defaults, left
# 5 s to start, then utime + stime from /proc/PID/stat read twice SECONDS apart
# (default 60), and the context switches of every thread. Binds 127.0.0.1 on
# PORT and PORT + 1 (default 19900) only and stops by itself.
#   benches/load/idle_cpu.sh BIN [PORT]
set -euo pipefail
bin=$1
port=${2:-19900}
seconds=${SECONDS_IDLE:-60}
db=$(mktemp -d)
trap 'rm -rf "$db"' EXIT
PHONES_GATEWAY__SERVER__PUBLIC_ADDR=127.0.0.1:$port \
PHONES_GATEWAY__SERVER__ADMIN_ADDR=127.0.0.1:$((port + 1)) \
PHONES_GATEWAY__ADMIN__TOKEN=idle-$RANDOM$RANDOM \
PHONES_GATEWAY__LOG__FILTER=error \
PHONES_GATEWAY__DATABASE__URL="sqlite://$db/gw.db" \
    "$bin" serve >/dev/null 2>"$db/log" &
pid=$!
sleep 5
ticks() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
switches() { cat /proc/"$pid"/task/*/status | awk '/ctxt_switches/ {s += $2} END {print s}'; }
t0=$(ticks); s0=$(switches)
sleep "$seconds"
t1=$(ticks); s1=$(switches)
kill "$pid"; wait "$pid" 2>/dev/null || true
hz=$(getconf CLK_TCK)
awk -v t=$((t1 - t0)) -v s=$((s1 - s0)) -v hz="$hz" -v n="$seconds" -v bin="$bin" \
    'BEGIN {printf "%s: %.1f ms CPU a second idle, %.0f context switches a second (%d s)\n", bin, t * 1000 / hz / n, s / n, n}'
