#!/usr/bin/env bash
# A CPU profile of the gateway under load: the simulator behind it, wrk driving a
# Zipf-like mix (hot.lua: most requests for a few ads), and the admin profile
# endpoint sampling meanwhile. Prints the functions with most own samples and
# writes the flamegraph to target/profile.svg. 127.0.0.1 only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/../.."
SECONDS_TO_PROFILE=${SECONDS_TO_PROFILE:-10}
cargo build --release --quiet
bin=target/release/phones-gateway
token=profile-$RANDOM$RANDOM
"$bin" simulate --addr 127.0.0.1:19200 --latency-ms 5 >/dev/null 2>&1 &
sim=$!
PHONES_GATEWAY__SERVER__PUBLIC_ADDR=127.0.0.1:18180 \
PHONES_GATEWAY__SERVER__ADMIN_ADDR=127.0.0.1:18181 \
PHONES_GATEWAY__ADMIN__TOKEN=$token \
PHONES_GATEWAY__LOG__FILTER=warn \
PHONES_GATEWAY__DATABASE__URL="sqlite://$(mktemp -d)/gw.db" \
PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL=http://127.0.0.1:19200 \
PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL=http://127.0.0.1:19200 \
PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL=http://127.0.0.1:19200 \
  "$bin" serve >/dev/null 2>&1 &
gw=$!
trap 'kill $sim $gw 2>/dev/null || true' EXIT
for _ in $(seq 50); do curl -sf http://127.0.0.1:18181/readyz >/dev/null && break; sleep 0.1; done
duration=$((SECONDS_TO_PROFILE + 4))s
wrk -t1 -c32 -d"$duration" -s benches/load/hot.lua http://127.0.0.1:18180 > target/profile-wrk.txt &
load=$!
sleep 2
curl -sf -H "Authorization: Bearer $token" \
  "http://127.0.0.1:18181/admin/v1/debug/pprof/profile?seconds=$SECONDS_TO_PROFILE&format=top" | head -25
wait $load
sleep 1
grep -E "Requests/sec|Latency" target/profile-wrk.txt
