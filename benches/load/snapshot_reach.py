#!/usr/bin/env python3
"""How long a full snapshot (PUT /admin/v1/calltracking/statuses) takes to be
answered, and to reach the replicas' memory: on the embedded SQLite (one
replica) and on a throwaway PostgreSQL cluster with two replicas, A answering
and B another. For each size, two snapshots in a row on a fresh database: one
into an empty set, then one over the full set that lists half of the first's
sellers and as many new ones. The watched seller is the last one the snapshot
enables that was off before (rows reach memory in seller order, so it is the
last to arrive); each replica is asked for it every 20 ms from the moment the
upload starts, over the admin API.

Prints, per run: the 2xx (seconds from the start of the upload), and per
replica when the watched seller was first seen on, and when a seller the
snapshot turns off was first seen off (a replica applies the ones it turns
on first), also relative to the 2xx (negative: before it), and whether the
answering replica had both at the 2xx.
127.0.0.1 only; starts and stops everything it needs (PostgreSQL with initdb
and pg_ctl, as `postgres` when run as root).

    benches/load/snapshot_reach.py [--bin target/release/phones-gateway]
        [--ids 1000000 10000000] [--only sqlite|postgres] [--limit 400]
        [--reach 10] [--set database.statement_timeout_ms=600000 ...]

Exits 1 unless every snapshot was answered 200, seen whole on the answering
replica at the 2xx and on every replica within --reach seconds of it (SPEC
sections 3 and 7), with the default configuration unless --set says else.

Build the binary first (`cargo build --release`); to compare two builds, run
the script once with each `--bin`, one after the other.
"""
import argparse, http.client, json, os, shutil, signal, socket, subprocess, sys, tempfile, threading, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "snapshot-reach-token"
STATUSES = "/admin/v1/calltracking/statuses"
ROOT_USER = os.geteuid() == 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def as_postgres(cmd):
    return ["runuser", "-u", "postgres", "--"] + cmd if ROOT_USER else cmd


class Postgres:
    """A throwaway cluster in a temporary directory (fsync off, as the tests')."""

    def __init__(self, base):
        self.dir = os.path.join(base, "pg")
        os.makedirs(self.dir)
        if ROOT_USER:
            subprocess.run(["chown", "-R", "postgres", self.dir], check=True)
        self.port = free_port()
        data = os.path.join(self.dir, "data")
        subprocess.run(as_postgres(["initdb", "-D", data, "-U", "postgres", "--auth=trust",
                                    "-E", "UTF8", "--no-sync"]), check=True, capture_output=True)
        options = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=100")
        subprocess.run(as_postgres(["pg_ctl", "-D", data, "-o", options, "-l",
                                    os.path.join(self.dir, "server.log"), "-w", "start"]),
                       check=True, capture_output=True)
        self.data = data
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self):
        subprocess.run(as_postgres(["pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"]),
                       capture_output=True)


class Gateway:
    def __init__(self, binary, database_url, log_path, extra_env):
        self.admin = free_port()
        env = dict(os.environ, **extra_env, **{
            "PHONES_GATEWAY__SERVER__PUBLIC_ADDR": f"127.0.0.1:{free_port()}",
            "PHONES_GATEWAY__SERVER__ADMIN_ADDR": f"127.0.0.1:{self.admin}",
            "PHONES_GATEWAY__ADMIN__TOKEN": TOKEN,
            "PHONES_GATEWAY__DATABASE__URL": database_url,
            "PHONES_GATEWAY__LOG__FILTER": "warn",
            # No upstream is asked: only the admin API is used.
            "PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL": "http://127.0.0.1:9",
            "PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL": "http://127.0.0.1:9",
            "PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL": "http://127.0.0.1:9",
        })
        env.pop("RUST_LOG", None)
        self.log_path = log_path
        log = open(log_path, "w")
        self.proc = subprocess.Popen([binary, "serve"], env=env, stdout=log, stderr=log)
        end = time.time() + 60
        while time.time() < end:
            if self.proc.poll() is not None:
                raise SystemExit(f"the gateway exited at start; see {log_path}")
            try:
                if request(self.admin, "GET", "/readyz", timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise SystemExit("the gateway did not become ready within 60 s")

    def warnings(self):
        """Warnings and errors logged, but for sqlx's slow-statement lines
        (counted: every large snapshot has a few)."""
        lines = [line.strip() for line in open(self.log_path) if "WARN" in line or "ERROR" in line]
        rest = [line for line in lines if "slow statement" not in line]
        slow = []
        for line in lines:
            if "slow statement" in line:
                try:
                    fields = json.loads(line)["fields"]
                    slow.append(f"{fields.get('summary', '?')[:40]} {fields.get('elapsed', '?')}")
                except (ValueError, KeyError):
                    slow.append(line[:80])
        return rest + ([f"sqlx's slow statements: {'; '.join(slow)}"] if slow else [])

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def request(port, method, path, body=None, timeout=10):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def status_of(port, user):
    status, text = request(port, "GET", f"{STATUSES}/{user}", timeout=5)
    return json.loads(text) if status == 200 else None


def enabled(port, user):
    got = status_of(port, user)
    return bool(got and got["enabled"])


def sellers(first, count):
    """Sellers spread over the id space, as real ones are."""
    return (i * 7 + 3 for i in range(first, first + count))


def snapshot_body(version, ids):
    return b'{"version": %d, "enabled_user_ids": [' % version + \
        ",".join(map(str, ids)).encode() + b"]}"


class Watch(threading.Thread):
    """Asks `port` for `user` every 20 ms until it has `want` (enabled, version)
    or `limit` s pass."""

    def __init__(self, port, user, want, start, limit):
        super().__init__(daemon=True)
        self.port, self.user, self.want, self.start_at, self.limit = port, user, want, start, limit
        self.seen = None

    def run(self):
        while time.monotonic() - self.start_at < self.limit:
            try:
                got = status_of(self.port, self.user)
                if got and (got["enabled"], got["version"]) == self.want:
                    self.seen = time.monotonic() - self.start_at
                    return
            except OSError:
                pass
            time.sleep(0.02)


def one_snapshot(answering, others, version, first, count, turned_off, limit):
    """A snapshot at `version` of `count` sellers from the `first`th; watches
    the last of them (off before: the snapshot turns it on) and `turned_off`
    (on before, not listed: the snapshot turns it off)."""
    ids = list(sellers(first, count))
    watched = ids[-1]
    body = snapshot_body(version, ids)
    del ids
    for port in [answering] + others:
        assert not enabled(port, watched), "the watched seller is on before the snapshot"
        assert enabled(port, turned_off), "the seller to turn off is off before the snapshot"
    start = time.monotonic()
    watches = [(Watch(port, watched, (True, version), start, limit),
                Watch(port, turned_off, (False, version), start, limit))
               for port in [answering] + others]
    for pair in watches:
        for w in pair:
            w.start()
    status, text = request(answering, "PUT", STATUSES, body=body, timeout=limit)
    answered = time.monotonic() - start
    at_answer = enabled(answering, watched) and not enabled(answering, turned_off)
    for pair in watches:
        for w in pair:
            w.join()
    return {"status": status, "answered": answered, "at_answer": at_answer,
            "seen": [(on.seen, off.seen) for on, off in watches], "body_mb": len(body) / 1e6,
            "answer": text[:200].decode(errors="replace")}


def report(kind, size, label, run):
    def when(s):
        return "not seen" if s is None else f"{s:.2f} s ({s - run['answered']:+.2f})"
    seen = []
    for name, (on, off) in zip(("A (answering)", "B (another)"), run["seen"]):
        seen.append(f"{name}: on {when(on)}, off {when(off)}")
    print(f"{kind:8} {size:>10,} ids {label:17} | {run['status']} after {run['answered']:.2f} s "
          f"({run['body_mb']:.1f} MB body) | at the 2xx on A: "
          f"{'seen' if run['at_answer'] else 'NOT SEEN'} | " + "; ".join(seen), flush=True)
    if run["status"] != 200:
        print(f"    answer: {run['answer']}", flush=True)


FAILED = []


def check(kind, size, label, run, reach):
    """SPEC sections 3 and 7: answered 2xx, seen whole on the answering
    replica at the 2xx, and on every replica within `reach` seconds of it."""
    what = f"{kind} {size:,} ids {label}"
    if run["status"] != 200:
        FAILED.append(f"{what}: answered {run['status']}")
        return
    if not run["at_answer"]:
        FAILED.append(f"{what}: not seen on the answering replica at the 2xx")
    for name, (on, off) in zip("AB", run["seen"]):
        for s in (on, off):
            if s is None or s - run["answered"] > reach:
                FAILED.append(f"{what}: replica {name} not within {reach} s of the 2xx")
                break


def measure(kind, binary, size, limit, reach, base, extra_env):
    pg = Postgres(base) if kind == "postgres" else None
    url = pg.url if pg else f"sqlite://{base}/gw.db?mode=rwc"
    gateways = []
    try:
        gateways.append(Gateway(binary, url, os.path.join(base, "a.log"), extra_env))
        if pg:
            gateways.append(Gateway(binary, url, os.path.join(base, "b.log"), extra_env))
        a, others = gateways[0].admin, [g.admin for g in gateways[1:]]
        # Into an empty set (but for seller 1, on at version 1: the first
        # snapshot turns it off), then over it: half of the first's sellers
        # and as many new ones (it turns the first one's first seller off).
        request(a, "POST", STATUSES, body=json.dumps(
            {"items": [{"user_id": 1, "enabled": True, "version": 1}]}).encode())
        for port in [a] + others:
            while not enabled(port, 1):
                time.sleep(0.05)
        first = one_snapshot(a, others, 1, 0, size, 1, limit)
        report(kind, size, "into an empty set", first)
        check(kind, size, "into an empty set", first, reach)
        if first["status"] == 200:
            second = one_snapshot(a, others, 2, size // 2, size, next(sellers(0, 1)), limit)
            report(kind, size, "over a full set", second)
            check(kind, size, "over a full set", second, reach)
        for g, name in zip(gateways, "AB"):
            for line in g.warnings():
                print(f"    {name} logged: {line[:300]}", flush=True)
    finally:
        for g in gateways:
            g.stop()
        if pg:
            pg.stop()


def load_line():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "phones-gateway"))
    parser.add_argument("--ids", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--only", choices=["sqlite", "postgres"])
    parser.add_argument("--limit", type=float, default=400,
                        help="seconds to wait for an answer and for each replica")
    parser.add_argument("--reach", type=float, default=10,
                        help="seconds after the 2xx within which every replica must see it "
                             "(SPEC section 7); the script exits 1 past it, or on an answer "
                             "other than 200")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a configuration override for every gateway, e.g. "
                             "database.statement_timeout_ms=600000")
    args = parser.parse_args()
    if not os.path.exists(args.bin):
        raise SystemExit(f"no binary at {args.bin}: cargo build --release")
    kinds = [args.only] if args.only else ["sqlite", "postgres"]
    if "postgres" in kinds and not shutil.which("initdb"):
        raise SystemExit("initdb is not on PATH")
    extra_env = {}
    for item in args.set:
        key, value = item.split("=", 1)
        extra_env["PHONES_GATEWAY__" + key.upper().replace(".", "__")] = value
    print(f"binary {args.bin}; {' '.join(args.set) or 'default configuration'}; "
          f"load average at start {load_line()}", flush=True)
    for size in args.ids:
        for kind in kinds:
            with tempfile.TemporaryDirectory(prefix="snapshot-reach-") as base:
                if ROOT_USER:
                    os.chmod(base, 0o755)
                measure(kind, args.bin, size, args.limit, args.reach, base, extra_env)
            print(f"    load average after: {load_line()}", flush=True)
    for failure in FAILED:
        print(f"FAILED: {failure}", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
