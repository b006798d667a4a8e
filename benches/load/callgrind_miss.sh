#!/usr/bin/env bash
# User-space instructions per cache miss, deterministic (no hardware counters on
# the bench VM): the gateway under callgrind against the simulator at 0 ms,
# N1 then N2 cold requests at concurrency 8 (every request a new seller, real
# number only: category 1, call tracking off), the difference of the totals
# divided by N2-N1 so start-up and shutdown cancel out. Configured as
# harness.py's gateway(): one worker thread, cold admission off, SQLite.
#   benches/load/callgrind_miss.sh BINARY [OUT_DIR]     (N1, N2 from the env)
# Leaves callgrind.out.N1 / .N2 in OUT_DIR for callgrind_annotate --inclusive=yes.
set -euo pipefail
bin=$1; out=${2:-$(mktemp -d)}; N1=${N1:-200}; N2=${N2:-1200}
mkdir -p "$out"
"$bin" simulate --addr 127.0.0.1:29417 --latency-ms 0 >/dev/null 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
run() {  # $1 requests; prints the total Ir of the run
  local n=$1 f=$out/callgrind.out.$1
  PHONES_GATEWAY__SERVER__PUBLIC_ADDR=127.0.0.1:28397 \
  PHONES_GATEWAY__SERVER__ADMIN_ADDR=127.0.0.1:28398 \
  PHONES_GATEWAY__ADMIN__TOKEN=bench-$RANDOM \
  PHONES_GATEWAY__LOG__FILTER=error \
  PHONES_GATEWAY__RUNTIME__WORKER_THREADS=1 \
  PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS=0 \
  PHONES_GATEWAY__DATABASE__URL="sqlite://$out/gw-$n.db" \
  PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL=http://127.0.0.1:29417 \
  PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL=http://127.0.0.1:29417 \
  PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL=http://127.0.0.1:29417 \
    valgrind --tool=callgrind --callgrind-out-file="$f" "$bin" serve >/dev/null 2>&1 &
  local gw=$!
  for _ in $(seq 600); do curl -sf http://127.0.0.1:28398/readyz >/dev/null && break; sleep 0.2; done
  python3 - "$n" <<'PY'
import sys, urllib.request
from concurrent.futures import ThreadPoolExecutor
n = int(sys.argv[1])
def one(k):
    urllib.request.urlopen(f"http://127.0.0.1:28397/v1/public-phone?user_id={k*4+1}&ad_id={k}&category_id=1", timeout=60).read()
with ThreadPoolExecutor(8) as ex:
    list(ex.map(one, range(1, n + 1)))
PY
  kill -INT $gw; wait $gw || true
  grep -m1 '^totals:\|^summary:' "$f" | awk '{print $2}'
}
t1=$(run "$N1"); t2=$(run "$N2")
echo "$bin: totals $t1 ($N1) $t2 ($N2); instructions per miss: $(( (t2 - t1) / (N2 - N1) ))"
