#!/usr/bin/env bash
# User-space instructions per cache miss, deterministic (no hardware counters
# needed): the gateway under `valgrind --tool=callgrind` against the simulator at
# 0 ms, N1 and then N2 cold requests at concurrency 8 (every request a new seller
# and ad, as benches/load/cold.lua), in two separate runs; the difference of the
# totals divided by N2 - N1 is the figure (start-up and shutdown cancel out).
#   benches/load/callgrind_miss.sh BIN [CATEGORY REMAINDER]
# CATEGORY 1 / REMAINDER 1 (default): one upstream call (real number only);
# CATEGORY 9: two (anonymous, then real). N1, N2 and OUT (where the callgrind
# files are kept, for callgrind_annotate) from the environment. Binds 127.0.0.1
# on PORT_BASE (default 19600) to PORT_BASE + 2 only and stops by itself. The
# upstream timeouts are raised to 10 s: under callgrind a call runs some 50 times
# slower, and at the default 300 ms some calls time out and the adaptive limit
# comes down toward its minimum (4), so cheap 503s would count as misses (the
# script prints any answer but a 200). Each run's wall time is printed too: the
# idle background (timers that run whatever the load, some million instructions
# a second; benches/load/callgrind_hit.sh measures it) runs for the difference
# of the two runs' wall time, and with IDLE_IR_PER_S set it is taken out
# (per_miss_idle_out).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$1
category=${2:-1}
remainder=${3:-1}
N1=${N1:-300}
N2=${N2:-1200}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
sim_bin=${SIM_BIN:-$bin}
P=${PORT_BASE:-19600}
"$sim_bin" simulate --addr 127.0.0.1:$((P)) --latency-ms 0 >/dev/null 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
run() { # N label -> prints the total Ir of the run and its wall time (s)
    local n=$1 label=$2 db start
    db=$(mktemp -d)
    start=$(date +%s.%N)
    PHONES_GATEWAY__SERVER__PUBLIC_ADDR=127.0.0.1:$((P + 1)) \
    PHONES_GATEWAY__SERVER__ADMIN_ADDR=127.0.0.1:$((P + 2)) \
    PHONES_GATEWAY__ADMIN__TOKEN=callgrind-$RANDOM$RANDOM \
    PHONES_GATEWAY__LOG__FILTER=error \
    PHONES_GATEWAY__RUNTIME__WORKER_THREADS=1 \
    PHONES_GATEWAY__DATABASE__URL="sqlite://$db/gw.db" \
    PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS=${MAX_QUEUE_DELAY_MS:-0} \
    PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__TIMEOUT_MS=10000 \
    PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__TIMEOUT_MS=10000 \
    PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__TIMEOUT_MS=10000 \
    PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL=http://127.0.0.1:$((P)) \
    PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL=http://127.0.0.1:$((P)) \
    PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL=http://127.0.0.1:$((P)) \
        valgrind --tool=callgrind --callgrind-out-file="$OUT/$label.out" \
        "$bin" serve >/dev/null 2>"$OUT/$label.log" &
    local gw=$!
    for _ in $(seq 600); do curl -sf http://127.0.0.1:$((P + 2))/readyz >/dev/null && break; sleep 0.1; done
    python3 - "$n" "$category" "$remainder" "$label" "$((P + 1))" <<'PY'
import http.client, sys, threading, zlib
n, category, remainder = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
base = zlib.crc32(sys.argv[4].encode()) % 1000 * 1_000_000  # keys of this run only
bad = []
def worker(t):
    c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[5]))
    for i in range(t, n, 8):
        k = base + i + 1
        c.request("GET", f"/v1/public-phone?user_id={k * 4 + remainder}&ad_id={k}&category_id={category}")
        r = c.getresponse(); body = r.read()
        if r.status != 200: bad.append((r.status, body[:300]))
ts = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
if bad: print(f"warning: {len(bad)} non-200 answers, e.g. {bad[:3]}", file=sys.stderr)
PY
    kill -TERM $gw; wait $gw || true
    rm -rf "$db"
    echo "$(grep -E '^(summary|totals):' "$OUT/$label.out" | head -1 | awk '{print $2}') $(echo "$(date +%s.%N) - $start" | bc)"
}
read -r a wa < <(run "$N1" "n1-c$category")
read -r b wb < <(run "$N2" "n2-c$category")
idle=$(echo "scale=0; (${IDLE_IR_PER_S:-0} * ($wb - $wa)) / 1" | bc)
echo "bin=$bin category=$category N1=$N1 total=$a wall=${wa}s N2=$N2 total=$b wall=${wb}s per_miss=$(( (b - a) / (N2 - N1) ))${IDLE_IR_PER_S:+ per_miss_idle_out=$(( (b - a - idle) / (N2 - N1) ))} out=$OUT"
