#!/usr/bin/env bash
# User-space instructions per cached answer, deterministic (no hardware counters
# needed), beside a bare axum hello-world: the gateway under
# `valgrind --tool=callgrind --separate-threads=no` (every thread in one count,
# the reveal log's writer included) against the simulator at 0 ms. Each run
# first warms K keys (every key answered once: a miss each), then sends N
# requests of those cached keys at concurrency C, each with an X-Viewer-Id (one
# of 1,000 viewers, as benches/load/viewer.lua), so each answer is a reveal
# recorded by the reveal log as shipped. Two runs, N1 and then N2; the
# difference of the totals divided by N2 - N1 is the figure (start-up, the
# warming and shutdown cancel out). The idle background (the timers that run
# whatever the load) is taken out: two more runs warm the keys and then send
# nothing for 0 and for T seconds; their difference over the difference of
# their wall time is the instructions a second idle, and that rate times the
# difference of the N2 and N1 runs' wall time is subtracted. hello-world gets
# the same requests (path `/`, the same query and header) and the same
# arithmetic, so the difference of the two figures is what a cached answer does
# beyond HTTP.
#   benches/load/callgrind_hit.sh BIN [HELLO_BIN]
# HELLO_BIN (default $CARGO_TARGET_DIR/release/examples/hello, or target/...):
# examples/hello.rs built in release; `none`: the gateway alone. K (500), N1 (500), N2 (2500), C (8),
# T (10) and OUT (where the callgrind files are kept, for callgrind_annotate)
# from the environment; extra settings of the gateway (the reveal log off:
# PHONES_GATEWAY__REVEALS__ENABLED=false) pass through the environment as well.
# For a before/after gate set PHONES_GATEWAY__REVEALS__FLUSH_INTERVAL_MS=60000:
# each run's reveals are then one write at shutdown, so the writer's batches,
# and its cost an answer with them, do not follow the run's timing (with the
# shipped 500 ms the rounds of one build spread by a quarter; BENCHMARKS.md).
# Binds 127.0.0.1 on PORT_BASE (default 19700) to PORT_BASE + 3 only and stops
# by itself. Prints any answer but a 200 and, for each gateway run, its upstream
# calls (phones_gateway_upstream_requests_total on /metrics, read in every run
# so that its cost cancels): equal in all four runs, or the answers were not
# all cached.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$1
hello=${2:-${CARGO_TARGET_DIR:-target}/release/examples/hello}
K=${K:-500}
N1=${N1:-500}
N2=${N2:-2500}
C=${C:-8}
T=${T:-10}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
sim_bin=${SIM_BIN:-$bin}
P=${PORT_BASE:-19700}
"$sim_bin" simulate --addr 127.0.0.1:$((P)) --latency-ms 0 >/dev/null 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT

send() { # PORT PATH N WARM -> sends WARM warming requests then N, at concurrency C
    python3 - "$1" "$2" "$3" "$4" "$K" "$C" <<'PY'
import http.client, sys, threading
port, path, n, warm, k, conc = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
bad = []
def get(c, i, viewer):
    key = 700_000_000 + i % k + 1
    c.request("GET", f"{path}?user_id={key * 4 + 1}&ad_id={key}&category_id=1",
              headers={"X-Viewer-Id": f"viewer-{viewer % 1000}"})
    r = c.getresponse(); body = r.read()
    if r.status != 200: bad.append((r.status, body[:300]))
def worker(t, lo, hi):
    c = http.client.HTTPConnection("127.0.0.1", int(port))
    for i in range(lo + t, hi, conc):
        get(c, i, i)
    c.close()
def phase(lo, hi):
    ts = [threading.Thread(target=worker, args=(t, lo, hi)) for t in range(conc)]
    [t.start() for t in ts]; [t.join() for t in ts]
phase(0, warm)       # every key once: the misses that fill the cache
phase(warm, warm + n)  # then n answers of cached keys, cycling over them
if bad: print(f"warning: {len(bad)} non-200 answers, e.g. {bad[:3]}", file=sys.stderr)
PY
}

run() { # KIND N IDLE_S LABEL -> prints "TOTAL_IR WALL_S" of one run
    local kind=$1 n=$2 idle=$3 label=$4 db start end ready
    db=$(mktemp -d)
    start=$(date +%s.%N)
    if [ "$kind" = gw ]; then
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
            valgrind --tool=callgrind --separate-threads=no --callgrind-out-file="$OUT/$label.out" \
            "$bin" serve >/dev/null 2>"$OUT/$label.log" &
        ready=http://127.0.0.1:$((P + 2))/readyz
    else
        valgrind --tool=callgrind --separate-threads=no --callgrind-out-file="$OUT/$label.out" \
            "$hello" 127.0.0.1:$((P + 3)) 1 >/dev/null 2>"$OUT/$label.log" &
        ready=http://127.0.0.1:$((P + 3))/
    fi
    local pid=$!
    for _ in $(seq 1200); do
        curl -sf "$ready" >/dev/null && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    curl -sf "$ready" >/dev/null || { echo "$label: not ready in 120 s (see $OUT/$label.log)" >&2; kill $pid; exit 1; }
    if [ "$kind" = gw ]; then send $((P + 1)) /v1/public-phone "$n" "$K"
    else send $((P + 3)) / "$n" "$K"; fi
    sleep "$idle"
    if [ "$kind" = gw ]; then
        curl -sf http://127.0.0.1:$((P + 2))/metrics |
            awk '/^phones_gateway_upstream_requests_total/ {s += $NF} END {print "'"$label"' upstream calls:", s + 0}' >&2
    fi
    kill -TERM $pid; wait $pid || true
    end=$(date +%s.%N)
    rm -rf "$db"
    echo "$(grep -E '^(summary|totals):' "$OUT/$label.out" | head -1 | awk '{print $2}') $(echo "$end - $start" | bc)"
}

figure() { # KIND -> prints "PER_ANSWER IDLE_RATE" and the runs on stderr
    local kind=$1 i0 i1 a b
    i0=$(run "$kind" 0 0 "$kind-idle0"); i1=$(run "$kind" 0 "$T" "$kind-idle$T")
    a=$(run "$kind" "$N1" 0 "$kind-n1"); b=$(run "$kind" "$N2" 0 "$kind-n2")
    echo "$kind: idle 0 s: $i0; idle $T s: $i1; N1=$N1: $a; N2=$N2: $b (Ir, wall s)" >&2
    python3 - "$i0" "$i1" "$a" "$b" "$N1" "$N2" <<'PY'
import sys
(i0, w0), (i1, w1), (a, wa), (b, wb) = [tuple(map(float, s.split())) for s in sys.argv[1:5]]
rate = max(0.0, (i1 - i0) / (w1 - w0))
print(f"{((b - a) - rate * (wb - wa)) / (int(sys.argv[6]) - int(sys.argv[5])):.0f} {rate:.0f}")
PY
}

# SQLite's statement preparation (inclusive, the outermost call: it does
# not nest) in a run's file. sqlx caches each statement text, so a replica
# prepares each of the writer's chunk sizes once (store/reveals/inserts.rs);
# which sizes a short run meets follows the flush's timing, so the N2 run
# may prepare sizes the N1 run did not. Printed apart (prepares_per_answer)
# and taken out (steady_per_answer): a long-running replica has them all.
prepared() {
    callgrind_annotate --inclusive=yes --auto=no --tree=none "$1" 2>/dev/null |
        awk '/sqlite3LockAndPrepare/ {gsub(",", "", $1); if ($1 + 0 > m) m = $1 + 0} END {print m + 0}'
}

read -r gw gw_idle < <(figure gw)
prepares=$(( ($(prepared "$OUT/gw-n2.out") - $(prepared "$OUT/gw-n1.out")) / (N2 - N1) ))
steady="per_answer=$gw prepares_per_answer=$prepares steady_per_answer=$((gw - prepares))"
if [ "$hello" = none ]; then
    echo "bin=$bin K=$K N1=$N1 N2=$N2 C=$C T=$T $steady idle_ir_per_s=$gw_idle out=$OUT"
    exit
fi
read -r hw hw_idle < <(figure hello)
echo "bin=$bin K=$K N1=$N1 N2=$N2 C=$C T=$T $steady hello_per_answer=$hw beyond_hello=$((gw - hw)) idle_ir_per_s=$gw_idle hello_idle_ir_per_s=$hw_idle out=$OUT"
