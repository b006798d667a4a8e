#!/usr/bin/env python3
"""The reveal log's cost on the hit path, build against build: each round runs
every build with the log off and then on (every request a reveal with a viewer
id, viewer.lua), each run on a database of its own, the gateway pinned to core 0
and wrk to core 1 as in harness.py. Prints each run, then per build the median
of its on/off ratios (each round's "on" against the same round's "off") and
every round's ratio, so the spread is in view. The cores are shared: compare
builds within one run.

    benches/load/compare_reveals.py [--rounds 5] [--seconds 8] [--ports 19300] NAME=PATH [NAME=PATH ...]

--ports moves the simulator, gateway and admin ports (base, +1, +2) off the
harness's, so this runs beside a harness run on the same machine.

Builds other than target/release are made by the caller (e.g. a copy of
target/release/phones-gateway taken before a change). REVEALS_DATABASE_URL
writes the log to PostgreSQL instead of the embedded SQLite.
"""
import argparse, os, statistics, sys, tempfile, urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as h  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=8)
    parser.add_argument("--ports", type=int, default=h.SIM)
    parser.add_argument("builds", nargs="+", help="NAME=PATH to a phones-gateway binary")
    args = parser.parse_args()
    builds = [b.split("=", 1) for b in args.builds]
    h.SIM, gw_port, admin = args.ports, args.ports + 1, args.ports + 2
    hot = f"http://127.0.0.1:{gw_port}/v1/public-phone?user_id=41&ad_id=1001&category_id=1"
    url = os.environ.get("REVEALS_DATABASE_URL")
    sim = h.simulator(latency_ms=5)
    cpu = {(name, on): [] for name, _ in builds for on in ("off", "on")}
    with tempfile.TemporaryDirectory() as db:
        for r in range(args.rounds):
            for name, path in builds:
                for on in ("off", "on"):
                    h.BIN = path
                    env = {"PHONES_GATEWAY__REVEALS__ENABLED": "true" if on == "on" else "false"}
                    if url:
                        env["PHONES_GATEWAY__DATABASE__URL"] = url
                    gw = h.gateway(os.path.join(db, f"{r}-{name}-{on}"), extra_env=env, port=gw_port, admin=admin)
                    urllib.request.urlopen(hot).read()
                    m = h.measured(gw, lambda: h.wrk(hot, args.seconds, script=h.VIEWER_SCRIPT))
                    dropped = h.metric(admin, "phones_gateway_reveals_dropped_total")
                    gw.stop()
                    cpu[(name, on)].append(m["cpu_us_per_req"])
                    print(f"round {r} {name} log {on}: {m['cpu_us_per_req']:.2f} us/req, "
                          f"{m['rps']:.0f} req/s, reveals dropped {dropped:.0f}", flush=True)
    sim.stop()
    for name, _ in builds:
        ratios = [a / b for a, b in zip(cpu[(name, "on")], cpu[(name, "off")])]
        print(f"{name}: the log on costs {statistics.median(ratios):.3f}x (median of {len(ratios)}; "
              f"rounds {', '.join(f'{x:.3f}' for x in ratios)}); CPU per request, median: "
              f"off {statistics.median(cpu[(name, 'off')]):.2f} us, on {statistics.median(cpu[(name, 'on')]):.2f} us")


if __name__ == "__main__":
    main()
