#!/usr/bin/env bash
# System calls per cache miss, by name, and the connections the gateway opens:
# the gateway under `strace -f -c` (every thread) against the simulator at 0 ms,
# N1 and then N2 cold requests at concurrency 8 (every request a new seller and
# ad, as callgrind_miss.sh sends them), in two separate runs; the difference of
# each system call's count divided by N2 - N1 is its figure per miss (start-up
# and shutdown cancel out). `connect` counts the connections opened to the
# upstreams (the callers' own come in by `accept4`). Callgrind counts no kernel
# time; this says where a miss's kernel time could differ between builds.
#   benches/load/strace_miss.sh BIN [CATEGORY REMAINDER]
# CATEGORY 1 / REMAINDER 1 (default): one upstream call; CATEGORY 9: two.
# N1 (300), N2 (1200) and OUT from the environment. Binds 127.0.0.1 on
# PORT_BASE (default 19800) to PORT_BASE + 2 only and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=$1
category=${2:-1}
remainder=${3:-1}
N1=${N1:-300}
N2=${N2:-1200}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
P=${PORT_BASE:-19800}
"$bin" simulate --addr 127.0.0.1:$((P)) --latency-ms 0 >/dev/null 2>&1 &
sim=$!
trap 'kill $sim 2>/dev/null || true' EXIT
run() { # N label -> leaves $OUT/label.txt (strace -c's table)
    local n=$1 label=$2 db
    db=$(mktemp -d)
    PHONES_GATEWAY__SERVER__PUBLIC_ADDR=127.0.0.1:$((P + 1)) \
    PHONES_GATEWAY__SERVER__ADMIN_ADDR=127.0.0.1:$((P + 2)) \
    PHONES_GATEWAY__ADMIN__TOKEN=strace-$RANDOM$RANDOM \
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
        strace -f -c -o "$OUT/$label.txt" "$bin" serve >/dev/null 2>"$OUT/$label.log" &
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
}
run "$N1" "n1-c$category"
run "$N2" "n2-c$category"
python3 - "$OUT/n1-c$category.txt" "$OUT/n2-c$category.txt" "$N1" "$N2" "$bin" "$category" <<'PY'
import sys
def calls(path):  # strace -c: "% time seconds usecs/call calls errors syscall"
    out = {}
    for line in open(path):
        f = line.split()
        if len(f) >= 5 and f[0][0].isdigit() and f[-1] != "total":
            out[f[-1]] = int(f[3])
    return out
a, b = calls(sys.argv[1]), calls(sys.argv[2])
n = int(sys.argv[4]) - int(sys.argv[3])
per = {k: (b.get(k, 0) - a.get(k, 0)) / n for k in set(a) | set(b)}
total = sum(per.values())
print(f"bin={sys.argv[5]} category={sys.argv[6]} syscalls_per_miss={total:.2f} connect_per_miss={per.get('connect', 0):.3f} "
      + " ".join(f"{k}={v:.2f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.01))
PY
