#!/usr/bin/env bash
# Upgrades over a full reveal log (docs/operations.md, "Upgrading"): the time
# of each migration that reads or rewrites the reveal log, and the time from
# the start of a replica on the previous release's schema to /readyz 200, on
# SQLite and PostgreSQL, at REVEALS reveals (default 1,000,000; 20,000,000 is
# the log's design size: about 4 GB of SQLite file, as much again for
# PostgreSQL, and an hour). PostgreSQL comes from tests/it/support/pg.rs
# (initdb on PATH). Figures: docs/operations.md, "Upgrading".
#
#   benches/load/upgrade.sh                  # 1,000,000, release build
#   REVEALS=20000000 benches/load/upgrade.sh
#   PROFILE=debug benches/load/upgrade.sh    # no release build (slower SQLite)
set -euo pipefail
cd "$(dirname "$0")/../.."
REVEALS=${REVEALS:-1000000}
PROFILE=${PROFILE:-release}
flag=()
[[ $PROFILE == release ]] && flag=(--release)
export UPGRADE_REVEALS=$REVEALS REQUIRE_POSTGRES=1
# One at a time: each times its own database.
cargo test "${flag[@]}" --test it upgrade:: -- --include-ignored --nocapture --test-threads 1 2>&1 |
    grep -E '^(sqlite|postgres) 0|reveals at|ready .* after|read back|^test |test result'
