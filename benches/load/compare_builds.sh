#!/usr/bin/env bash
# Compares builds of the gateway on the hit and cold paths, alternating them
# round by round (the cores are shared: compare within one run). Each argument is
# NAME=PATH-TO-BINARY, or NAME=PATH:old for a build from before
# server.max_queue_delay_ms existed. Prints each round's harness output: the hit
# path on the fixed keys and on the recorded stream, then the cold path (COLD=0:
# the hit path alone).
#   benches/load/compare_builds.sh release=target/release/phones-gateway \
#       lto=target/release-lto/phones-gateway   (ROUNDS=3 SECONDS_EACH=5)
set -euo pipefail
cd "$(dirname "$0")/../.."
ROUNDS=${ROUNDS:-3}
SECONDS_EACH=${SECONDS_EACH:-5}
COLD=${COLD:-1}
cargo build --release --quiet --bin phones-gateway --example hello --example bare_client --example openload
for round in $(seq "$ROUNDS"); do
    for build in "$@"; do
        name=${build%%=*}
        path=${build#*=}
        old=
        [[ $path == *:old ]] && { path=${path%:old}; old=1; }
        echo "== round $round: $name ($path)"
        HARNESS_GATEWAY_BIN=$path HARNESS_WITHOUT_ADMISSION=$old \
            python3 benches/load/harness.py --hits-only --rounds 1 --seconds "$SECONDS_EACH" | grep "^median"
        [[ $COLD == 0 ]] && continue
        HARNESS_GATEWAY_BIN=$path HARNESS_WITHOUT_ADMISSION=$old \
            python3 benches/load/harness.py --cold --rounds 1 --seconds "$SECONDS_EACH" | grep -E "^\| (bare|miss)"
    done
done
