#!/usr/bin/env bash
# Cold-path latency: the simulator at 50 ms per upstream, every request a new
# seller (nothing cached), wrk at a modest concurrency. Prints wrk's latency
# distribution for (a) the full chain, (b) the real number alone.
# Binds 127.0.0.1 only and stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
LATENCY_MS=${LATENCY_MS:-50}
DURATION=${DURATION:-15s}
CONNECTIONS=${CONNECTIONS:-20}
cargo build --release --quiet
bin=target/release/phones-gateway
token=bench-$RANDOM$RANDOM
"$bin" simulate --addr 127.0.0.1:19100 --latency-ms "$LATENCY_MS" >/dev/null 2>&1 &
sim=$!
PHONES_GATEWAY__SERVER__PUBLIC_ADDR=127.0.0.1:18080 \
PHONES_GATEWAY__SERVER__ADMIN_ADDR=127.0.0.1:18081 \
PHONES_GATEWAY__ADMIN__TOKEN=$token \
PHONES_GATEWAY__LOG__FILTER=warn \
PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL=http://127.0.0.1:19100 \
PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL=http://127.0.0.1:19100 \
PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL=http://127.0.0.1:19100 \
  "$bin" serve >/dev/null 2>&1 &
gw=$!
trap 'kill $sim $gw 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf http://127.0.0.1:18081/readyz >/dev/null && break; sleep 0.1; done
# Call tracking on for sellers 4, 8, ... (the ids cold.lua uses), 10,000 per delivery.
python3 - "$token" <<'PY'
import json, sys, urllib.request
token = sys.argv[1]
for chunk in range(8):
    items = [{"user_id": 4 * k, "enabled": True, "version": 1}
             for k in range(chunk * 10000 + 1, chunk * 10000 + 10001)]
    for t in range(2):  # two wrk threads: ids t*1e6 + n
        items_t = [dict(i, user_id=i["user_id"] + 4 * t * 1000000) for i in items]
        req = urllib.request.Request("http://127.0.0.1:18081/admin/v1/calltracking/statuses",
            data=json.dumps({"items": items_t}).encode(), method="POST",
            headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
        urllib.request.urlopen(req).read()
PY
echo "== full chain: anonymous || (real -> calltracking), each at ${LATENCY_MS} ms"
wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s benches/load/cold.lua http://127.0.0.1:18080 -- 9 0
echo "== real number only: no anonymous in the category, call tracking off (${LATENCY_MS} ms)"
wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s benches/load/cold.lua http://127.0.0.1:18080 -- 1 1
