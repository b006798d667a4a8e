#!/usr/bin/env python3
"""What N replicas cost PostgreSQL, directly or through PgBouncer in transaction
mode: PostgreSQL's client connections and transactions per second at idle and
under webhook load, and how long a change accepted by one replica takes to show
on all of them. Starts the cluster with scripts/cluster (release build), measures,
stops it. 127.0.0.1 only; stops by itself.

    benches/load/db_budget.py N [--pgbouncer] [--seconds 10]
"""
import argparse, json, os, subprocess, sys, time, urllib.error, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STATE = os.path.join(ROOT, ".cluster-budget")


def sh(*cmd, env=None):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT,
                          env=dict(os.environ, **(env or {}))).stdout


def pg_env():
    env = {}
    for line in open(os.path.join(STATE, "pg.env")):
        key, value = line.strip().split("=", 1)
        env[key] = value.strip("'")
    return env


def psql(url, query):
    return sh("psql", url, "-Atc", query).strip()


def connections(url):
    # PostgreSQL's client backends, this psql excluded.
    return int(psql(url, "SELECT count(*) FROM pg_stat_activity "
                         "WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"))


def xacts(url):
    return int(psql(url, "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = 'postgres'"))


def admin(i):
    return open(os.path.join(STATE, f"replica-{i}.admin")).read().strip()


def send(url, token, method, body=None):
    request = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Authorization": f"Bearer {token}",
                                              "Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(request, timeout=10).read() or "null")
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        raise


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("n", type=int)
    parser.add_argument("--pgbouncer", action="store_true")
    parser.add_argument("--seconds", type=int, default=10)
    args = parser.parse_args()
    sh("cargo", "build", "--release", "--quiet", "--bin", "phones-gateway")
    env = {"CLUSTER_DIR": STATE, "PHONES_GATEWAY_BIN": os.path.join(ROOT, "target/release/phones-gateway")}
    up = ["scripts/cluster", "up", str(args.n), "--base-port", os.environ.get("BASE_PORT", "21080")] + (["--pgbouncer"] if args.pgbouncer else [])
    sh(*up, env=env)
    try:
        pg = pg_env()["PG_URL"]
        token = open(os.path.join(STATE, "token")).read().strip()
        mode = "through PgBouncer (transaction mode)" if args.pgbouncer else "directly"
        time.sleep(3)  # past start-up loads
        s = args.seconds
        c0, x0 = connections(pg), xacts(pg)
        time.sleep(s)
        c1, x1 = connections(pg), xacts(pg)
        idle_rate = (x1 - x0) / s
        # Webhook load: 10-item deliveries, round-robin over the replicas, as
        # fast as one client sends them.
        start, sent, x0 = time.time(), 0, xacts(pg)
        peak = 0
        while time.time() - start < s:
            i = sent % args.n + 1
            items = [{"user_id": 100000 + sent * 10 + k, "enabled": True, "version": 1} for k in range(10)]
            send(f"{admin(i)}/admin/v1/calltracking/statuses", token, "POST", {"items": items})
            sent += 1
            if sent % 200 == 0:
                peak = max(peak, connections(pg))
        elapsed = time.time() - start
        load_rate = (xacts(pg) - x0) / elapsed
        peak = max(peak, connections(pg))
        # Convergence: one change on replica 1, until every replica shows it.
        times = []
        for round_ in range(5):
            user = 900000 + round_
            t0 = time.time()
            send(f"{admin(1)}/admin/v1/calltracking/statuses", token, "POST",
                 {"items": [{"user_id": user, "enabled": True, "version": 1}]})
            pending = set(range(1, args.n + 1))
            while pending:
                for i in list(pending):
                    status = send(f"{admin(i)}/admin/v1/calltracking/statuses/{user}", token, "GET")
                    if status and status.get("enabled"):
                        pending.discard(i)
                if time.time() - t0 > 10:
                    raise SystemExit(f"not converged in 10 s: {sorted(pending)}")
            times.append(time.time() - t0)
        times.sort()
        print(f"{args.n} replicas {mode}:")
        print(f"  idle: {c1} PostgreSQL client connections ({c1 / args.n:.2f} per replica), "
              f"{idle_rate:.1f} transactions/s ({idle_rate / args.n:.2f} per replica)")
        print(f"  webhook load ({sent / elapsed:.0f} deliveries/s of 10 items): up to {peak} connections, "
              f"{load_rate:.0f} transactions/s")
        print(f"  a change on replica 1 seen by all {args.n}: median {times[2] * 1000:.0f} ms, "
              f"max {times[-1] * 1000:.0f} ms (5 changes; includes polling {args.n} replicas one by one)")
    finally:
        sh("scripts/cluster", "down", env=env)


if __name__ == "__main__":
    main()
