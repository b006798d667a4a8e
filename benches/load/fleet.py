#!/usr/bin/env python3
"""The fleet on a real balancer: N replicas of the release build behind Debian's
HAProxy 2.6, one recorded stream (stream.py) replayed once in order through it
(wrk and replay.lua, 64 connections), and what each way of balancing costs:
upstream calls per request, the share of requests answered from cache, p50 and
p99, and the busiest replica's requests over the mean. docs/locality.md explains
the recipes and the figures.

Each replica runs as the harness runs one: its own SQLite file (the embedded
default), one tokio worker, the reveal log on, cold admission off; the upstream
simulator answers at 0 ms. Every run starts fresh replicas (empty caches). HAProxy
runs in the foreground from a config written to the run's temporary directory,
as the invoking user, on 127.0.0.1 only, and stops with the run (installed with
apt-get when missing and run as root, as scripts/test does for PgBouncer).

    benches/load/fleet.py [--replicas 1,4,20] [--modes rr,user,user-bounded]
        [--stream PATH] [--kill MODES] [--markdown PATH] [--json PATH] [--benchmarks]
    benches/load/fleet.py --render RUN.json[,RUN.json...] [--benchmarks]

Modes (the HAProxy backend each run uses; docs/locality.md has the configs):
  rr            balance roundrobin
  user          balance url_param user_id, hash-type consistent
  user-bounded  the same with hash-balance-factor (--factor, 125)
  ad            balance url_param ad_id, hash-type consistent
  ad-bounded    the same with hash-balance-factor
  user-hot      user, and a key whose request rate over the last --window
                seconds exceeds --hot-pct percent of the mean replica's goes to
                a round-robin backend instead (a stick table per key and one for
                the total, compared in HAProxy itself); --hot-factor adds a
                hash-balance-factor to the hashed backend
  ad-hot        the same by ad_id
--weight W gives every server weight W (default 100; HAProxy puts W x 16
points of a server on the consistent-hash ring; more points, a more even ring).
--hot-pct defaults to 10, --window to 10 s, --factor to 125.

--kill MODES: after the runs, one more run per mode named, at the largest
--replicas, in which one replica is killed (SIGKILL) when half the stream is
answered: how many keys moved, how many extra upstream calls that cost beside
the same run without the kill (when --modes ran it), and when the misses of
the moved keys came. --benchmarks writes the tables into BENCHMARKS.md between
its fleet markers; --render does so from saved --json files without running.

Counts (calls per request, busiest over mean, keys moved) do not depend on the
machine; latencies do (wrk's, through HAProxy, everything on one machine).
The share answered from cache is the replicas' own count: a request is answered
from cache when none of the cache lookups it made missed; it is derived from
where HAProxy's log says each request went, the caches' keys (seller and ad)
and the order of the requests, and printed
beside the measured upstream calls that the same derivation predicts, so a
reader can see the two agree.
"""
import argparse, json, os, re, shutil, signal, subprocess, sys, tempfile, threading, time, urllib.request
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (the load harness's helpers: wait_http, parse_wrk, write_section)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOAD = os.path.join(ROOT, "benches", "load")
RELEASE = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target", "release")
BIN = os.environ.get("FLEET_GATEWAY_BIN") or os.path.join(RELEASE, "phones-gateway")
BASE = int(os.environ.get("FLEET_BASE_PORT", "21000"))
SIM, HAPROXY = BASE, BASE + 1
TOKEN = "fleet-token"
CONNECTIONS = 64
MADE = ("ok", "not_found", "timeout", "error")  # outcomes of calls actually made


def replica_ports(i):
    return BASE + 10 + 2 * i, BASE + 11 + 2 * i


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def haproxy_bin():
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not os.path.exists(path):
        if os.geteuid() != 0:
            sys.exit("fleet: haproxy not found (apt-get install -y haproxy)")
        print("== installing HAProxy (apt-get install -y haproxy)", file=sys.stderr)
        subprocess.run(["apt-get", "install", "-y", "haproxy"], check=True,
                       stdout=subprocess.DEVNULL)
    return path


def backend(name, balance, servers, args, factor=None):
    lines = [f"backend {name}", f"    balance {balance}"]
    if balance.startswith("url_param"):
        lines.append(f"    hash-type consistent {args.hash_fn}".rstrip())
        if factor:
            lines.append(f"    hash-balance-factor {factor}")
    for i, (public, admin) in servers:
        lines.append(f"    server r{i} 127.0.0.1:{public} weight {args.weight} "
                     f"check port {admin} inter 250ms fall 1 rise 2")
    return "\n".join(lines)


def haproxy_config(mode, n, args, log_path):
    servers = [(i, replica_ports(i)) for i in range(1, n + 1)]
    head = f"""global
    log stdout format raw local0
    maxconn 4096
    nbthread 1
defaults
    mode http
    log global
    log-format "%Ts.%ms %s %ST %HU %b %[var(txn.key)] %[var(txn.all)]"
    option httpchk GET /readyz
    option redispatch 1
    retries 3
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    http-reuse always
frontend fe
    bind 127.0.0.1:{HAPROXY}
"""
    if mode == "rr":
        return head + "    default_backend be\n" + backend("be", "roundrobin", servers, args)
    if mode in ("user", "user-bounded"):
        factor = args.factor if mode == "user-bounded" else None
        return head + "    default_backend be\n" + backend("be", "url_param user_id", servers, args, factor)
    if mode in ("ad", "ad-bounded"):
        factor = args.factor if mode == "ad-bounded" else None
        return head + "    default_backend be\n" + backend("be", "url_param ad_id", servers, args, factor)
    if mode in ("user-hot", "ad-hot"):
        param = "user_id" if mode == "user-hot" else "ad_id"
        # key's rate x replicas x 100 > all keys' rate x hot-pct: the key takes more
        # than hot-pct percent of the mean replica's share; then round-robin.
        w = args.window
        return head + f"""    http-request track-sc0 url_param({param}) table st_keys
    http-request track-sc1 str(all) table st_total
    http-request set-var(txn.replicas) nbsrv(be)
    http-request set-var(txn.all) sc1_http_req_rate(st_total),mul({args.hot_pct})
    http-request set-var(txn.key) sc0_http_req_rate(st_keys),mul(100),mul(txn.replicas)
    http-request set-var(txn.over) var(txn.key),sub(txn.all)
    use_backend be_spread if {{ var(txn.over) -m int gt 0 }}
    default_backend be
backend st_keys
    stick-table type string len 24 size 1m expire {2 * w}s store http_req_rate({w}s)
backend st_total
    stick-table type string len 4 size 1 expire {2 * w}s store http_req_rate({w}s)
""" + backend("be", f"url_param {param}", servers, args, args.hot_factor) + "\n" + \
            backend("be_spread", "roundrobin", servers, args)
    raise SystemExit(f"fleet: unknown mode {mode}")


def scrape(admin_port):
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics", timeout=5).read().decode()
    out = {"requests": 0, "calls": 0, "lookups": Counter()}
    for line in text.splitlines():
        if line.startswith("phones_gateway_upstream_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            if any(f'outcome="{o}"' in labels for o in MADE):
                out["calls"] += float(value)
        elif line.startswith("phones_gateway_http_request_duration_seconds_count{") \
                and 'route="/v1/public-phone"' in line:
            out["requests"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("phones_gateway_cache_lookups_total{"):
            labels, value = line.rsplit(" ", 1)
            cache = re.search(r'cache="([^"]+)"', labels).group(1)
            result = re.search(r'result="([^"]+)"', labels).group(1)
            out["lookups"][(cache, result)] += float(value)
    return out


class Fleet:
    """The simulator, N replicas and HAProxy, in one temporary directory."""

    def __init__(self, n, mode, args, tmp):
        self.n, self.tmp, self.procs, self.replicas, self.log = n, tmp, [], {}, None
        os.makedirs(tmp, exist_ok=True)
        try:
            self.start(n, mode, args, tmp)
        except BaseException:
            self.down()
            raise

    def start(self, n, mode, args, tmp):
        self.sim = self.spawn([BIN, "simulate", "--addr", f"127.0.0.1:{SIM}", "--latency-ms", "0"],
                              "simulator")
        for i in range(1, n + 1):
            public, admin = replica_ports(i)
            env = {
                "PHONES_GATEWAY__SERVER__PUBLIC_ADDR": f"127.0.0.1:{public}",
                "PHONES_GATEWAY__SERVER__ADMIN_ADDR": f"127.0.0.1:{admin}",
                "PHONES_GATEWAY__ADMIN__TOKEN": TOKEN,
                "PHONES_GATEWAY__LOG__FILTER": "error",
                "PHONES_GATEWAY__RUNTIME__WORKER_THREADS": "1",
                "PHONES_GATEWAY__DATABASE__URL": f"sqlite://{tmp}/replica-{i}.db",
                "PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL": f"http://127.0.0.1:{SIM}",
                "PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL": f"http://127.0.0.1:{SIM}",
                "PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL": f"http://127.0.0.1:{SIM}",
                "PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS": "0",
            }
            self.replicas[i] = (self.spawn([BIN, "serve"], f"replica-{i}", env), admin)
        for i, (proc, admin) in self.replicas.items():
            harness.wait_http(f"http://127.0.0.1:{admin}/readyz", 60, proc)
        self.log_path = os.path.join(tmp, "haproxy.log")
        cfg = os.path.join(tmp, "haproxy.cfg")
        with open(cfg, "w") as f:
            f.write(haproxy_config(mode, n, args, self.log_path) + "\n")
        subprocess.run([haproxy_bin(), "-c", "-q", "-f", cfg], check=True)
        self.log = open(self.log_path, "w")
        self.haproxy = subprocess.Popen([haproxy_bin(), "-db", "-f", cfg], stdout=self.log,
                                        stderr=open(os.path.join(tmp, "haproxy.err"), "w"))
        self.procs.append(self.haproxy)
        time.sleep(1)  # the first health checks
        if self.haproxy.poll() is not None:
            raise SystemExit("fleet: haproxy exited: " + open(os.path.join(tmp, "haproxy.err")).read())

    def spawn(self, cmd, name, env=None):
        proc = subprocess.Popen(cmd, env=dict(os.environ, **(env or {})),
                                stdout=subprocess.DEVNULL,
                                stderr=open(os.path.join(self.tmp, f"{name}.err"), "w"))
        self.procs.append(proc)
        return proc

    def down(self):
        for proc in reversed(self.procs):
            stop(proc)
        if self.log:
            self.log.close()


def wrk_figures(text):
    """wrk's figures (harness.parse_wrk) under the names the run files keep."""
    w = harness.parse_wrk(text)
    return {"p50_ms": w["p50"], "p99_ms": w["p99"], "wrk_requests": w["requests"],
            "rps": w["rps"], "non_2xx": w["non2xx"]}


def read_log(path):
    """(accept time, server, status, user_id, ad_id, category) per request, in accept order."""
    rows = []
    pat = re.compile(r"^(\d+)\.(\d+) (\S+) (\d+) /v1/public-phone\?user_id=(\d+)&ad_id=(\d+)&category_id=(\d+)")
    for line in open(path):
        m = pat.match(line)
        if m:
            rows.append((int(m.group(1)) + int(m.group(2)) / 1000, m.group(3), int(m.group(4)),
                         int(m.group(5)), int(m.group(6)), int(m.group(7))))
    rows.sort(key=lambda r: r[0])
    return rows


def cache_model(rows):
    """Per request: did every cache key it needs already sit on its replica?
    Keys (docs/caching.md): the real number by (seller, ad) for every request,
    the anonymous one by (seller, ad) for category 9. Returns (answered from
    cache, predicted calls)."""
    seen, from_cache, calls = set(), 0, 0
    for _, server, _, user, ad, category in rows:
        keys = [(server, "r", user, ad)]
        if category == 9:
            keys.append((server, "a", user, ad))
        new = [k for k in keys if k not in seen]
        seen.update(new)
        calls += len(new)
        from_cache += not new
    return from_cache, calls


def run_one(mode, n, args, kill=False):
    tmp = tempfile.mkdtemp(prefix=f"fleet-{mode}-{n}-")
    total = sum(1 for _ in open(args.stream))
    print(f"== {mode}, {n} replica(s){', one killed mid-run' if kill else ''}", file=sys.stderr)
    fleet = Fleet(n, mode, args, tmp)
    timeline, killed = [], {}
    stop_scraping = threading.Event()
    last = {}

    def scraper():
        while not stop_scraping.is_set():
            t = time.time()
            for i, (proc, admin) in fleet.replicas.items():
                if proc.poll() is None:
                    try:
                        last[i] = scrape(admin)
                    except Exception:
                        pass
            req = sum(v["requests"] for v in last.values())
            calls = sum(v["calls"] for v in last.values())
            timeline.append((t, req, calls))
            if kill and not killed and req >= total / 2:
                victim = max(1, n // 2)
                fleet.replicas[victim][0].kill()
                killed.update(victim=victim, at=time.time(), requests=req, calls=calls)
                print(f"   killed replica {victim} at {int(req)} requests", file=sys.stderr)
            stop_scraping.wait(0.25)

    thread = threading.Thread(target=scraper, daemon=True)
    try:
        start = time.time()
        thread.start()
        wrk = subprocess.run(["wrk", "-t", "1", "-c", str(CONNECTIONS), "-d", "3600s", "--latency",
                              "--timeout", "30s", "-s", os.path.join(LOAD, "replay.lua"),
                              f"http://127.0.0.1:{HAPROXY}", "--", args.stream, "1"],
                             capture_output=True, text=True, timeout=1800)
        elapsed = time.time() - start
        stop_scraping.set()
        thread.join()
        final = {}
        for i, (proc, admin) in fleet.replicas.items():
            final[i] = scrape(admin) if proc.poll() is None else last.get(i)
    finally:
        stop_scraping.set()
        fleet.down()
    result = wrk_figures(wrk.stdout)
    rows = read_log(fleet.log_path)
    per_server = Counter(r[1] for r in rows)
    requests = sum(v["requests"] for v in final.values())
    calls = sum(v["calls"] for v in final.values())
    lookups = Counter()
    for v in final.values():
        lookups.update(v["lookups"])
    hits = sum(c for (_, r), c in lookups.items() if r == "hit")
    from_cache, predicted = cache_model(rows)
    counts = [per_server.get(f"r{i}", 0) for i in range(1, n + 1)]
    mean = sum(counts) / n
    result.update(mode=mode, replicas=n, stream_requests=total, elapsed_s=round(elapsed, 1),
                  logged=len(rows), replica_requests=int(requests), upstream_calls=int(calls),
                  calls_per_request=calls / total, lookup_hit_ratio=hits / max(1, sum(lookups.values())),
                  from_cache=from_cache / max(1, len(rows)), predicted_calls=predicted,
                  busiest_over_mean=max(counts) / mean if mean else None,
                  statuses=dict(Counter(r[2] for r in rows)))
    result["timeline"] = [(round(t - start, 2), int(r), int(c)) for t, r, c in timeline]
    if kill:
        result["kill"] = kill_figures(rows, killed, timeline, mode)
    if not os.environ.get("FLEET_KEEP"):
        shutil.rmtree(tmp, ignore_errors=True)
    print("   " + json.dumps({k: v for k, v in result.items() if k not in ("kill", "timeline")}),
          file=sys.stderr)
    return result


def kill_figures(rows, killed, timeline, mode):
    """Keys (the hash key: the seller, or the ad in the ad modes) seen before and
    after the kill, and how many of them are answered by another replica after."""
    if not killed:
        return None
    at = killed["at"]
    before, after = defaultdict(Counter), defaultdict(Counter)
    for t, server, _, user, ad, _ in rows:
        (before if t < at else after)[ad if mode.startswith("ad") else user][server] += 1
    both = [k for k in before if k in after]
    moved = sum(1 for k in both if before[k].most_common(1)[0][0] != after[k].most_common(1)[0][0])
    victim = f"r{killed['victim']}"
    owned = sum(1 for k in both if before[k].most_common(1)[0][0] == victim)
    # The misses the kill caused: a request after it, for a cache key held
    # before it on a replica other than the one now answering, the first time
    # that key reaches this one (each moved key's relearning, nothing else).
    held, moved_misses, index = defaultdict(set), [], 0
    for t, server, _, user, ad, _ in rows:
        key = (user, ad)
        if t >= at:
            index += 1
            if server not in held[key] and held[key] - {server}:
                moved_misses.append((t - at, index))
        held[key].add(server)
    n = len(moved_misses)
    ninety = moved_misses[max(0, int(0.9 * n) - 1)] if n else (None, None)
    return {"victim": killed["victim"], "killed_at_requests": int(killed["requests"]),
            "moved_misses": n, "moved_misses_90pct_s": round(ninety[0], 1) if n else None,
            "moved_misses_90pct_requests": ninety[1],
            "moved_misses_first_10s": sum(1 for dt, _ in moved_misses if dt < 10),
            "keys_before_and_after": len(both), "keys_moved": moved,
            "keys_the_victim_held": owned,
            "timeline": [(round(t - at, 2), int(r), int(c)) for t, r, c in timeline]}


def settle(kill_run, base_run):
    """Extra upstream calls of the kill run over the same run without it, and how
    many requests (and seconds) after the kill 90% of them were made, by the
    scraped counters (every 0.25 s) compared at equal requests answered."""
    tl = kill_run["kill"]["timeline"]
    base_tl = [(r, c) for _, r, c in base_run.get("timeline") or []]
    if not base_tl:
        return None

    def base_calls_at(req):
        prev = (0, 0)
        for r, c in base_tl:
            if r >= req:
                if r == prev[0]:
                    return c
                return prev[1] + (c - prev[1]) * (req - prev[0]) / (r - prev[0])
            prev = (r, c)
        return base_tl[-1][1]

    k0 = kill_run["kill"]["killed_at_requests"]
    excess0 = next(c for dt, r, c in tl if dt >= 0) - base_calls_at(next(r for dt, r, c in tl if dt >= 0))
    series = [(dt, r, c - base_calls_at(r) - excess0) for dt, r, c in tl if dt >= 0]
    total_extra = series[-1][2] if series else 0
    when = next(((dt, r - k0) for dt, r, e in series if e >= 0.9 * total_extra), (None, None))
    return {"extra_calls": int(total_extra), "settled_90pct_after_s": when[0],
            "settled_90pct_after_requests": when[1]}


def markdown(results, kills, args, command):
    one = {r["mode"]: r for r in results if r["replicas"] == 1}
    base = next(iter(one.values()))["calls_per_request"] if one else None
    lines = [f"Command: `{command}` (stream: `{args.stream_cmd}`).", "",
             "| balancing | replicas | upstream calls per request | over one replica | answered from cache | p50 | p99 | busiest replica over the mean | 503s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        over = f"{r['calls_per_request'] / base:.2f}x" if base else ""
        lines.append(f"| {r['mode'] if r['replicas'] > 1 else 'any'} | {r['replicas']} | {r['calls_per_request']:.3f} | {over} | "
                     f"{100 * r['from_cache']:.1f}% | {r['p50_ms']:.2f} ms | {r['p99_ms']:.2f} ms | "
                     f"{r['busiest_over_mean']:.2f} | {r['statuses'].get('503', 0)} |")
    if kills:
        lines += ["", "| balancing | replicas | keys seen before and after the kill | moved | held by the killed replica | extra upstream calls, the run against the same without the kill: measured (derived from the log) | misses of moved keys after the kill (from the log) |",
                  "|---|---|---|---|---|---|---|"]
        for k in kills:
            f, s = k["kill"], k.get("settle") or {}
            base_run = next(r for r in results if r["mode"] == k["mode"] and r["replicas"] == k["replicas"])
            lines.append(f"| {k['mode']} | {k['replicas']} | {f['keys_before_and_after']} | "
                         f"{f['keys_moved']} ({100 * f['keys_moved'] / max(1, f['keys_before_and_after']):.1f}%) | "
                         f"{f['keys_the_victim_held']} | {k['upstream_calls'] - base_run['upstream_calls']:+d} "
                         f"({k['predicted_calls'] - base_run['predicted_calls']:+d}) | "
                         + (f"{f['moved_misses']}: 90% within {f['moved_misses_90pct_requests']} requests "
                            f"({f['moved_misses_90pct_s']} s), {f['moved_misses_first_10s']} in the first 10 s |"
                            if "moved_misses" in f else
                            f"{s.get('settled_90pct_after_requests')} requests ({s.get('settled_90pct_after_s')} s) |"))
    return "\n".join(lines) + "\n"


def write_benchmarks(md):
    """Replaces what BENCHMARKS.md holds between the fleet markers (appended at
    the end when it has none); the rest of the file is harness.py's."""
    begin, end = harness.KEPT_SECTIONS[0]
    harness.write_section(harness.KEPT_SECTIONS[0], [
        f"{begin}\n## The fleet behind a balancer: cache locality\n\n"
        f"Written by `benches/load/fleet.py --benchmarks` (docs/locality.md explains the "
        f"recipes). {time.strftime('%Y-%m-%d', time.gmtime())}, release build, 2 shared cores: "
        f"counts do not depend on the machine, latencies do. A 503 is an answer without "
        f"a number (e.g. a breaker opened by upstream timeouts on the loaded machine); "
        f"docs/locality.md reads the run of record.\n\n{md}{end}"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="1,4,20")
    p.add_argument("--modes", default="rr,user,user-bounded")
    p.add_argument("--stream")
    p.add_argument("--factor", type=int, default=125)
    p.add_argument("--weight", type=int, default=100)
    p.add_argument("--hash-fn", default="")
    p.add_argument("--hot-pct", type=int, default=10)
    p.add_argument("--hot-factor", type=int, default=0)
    p.add_argument("--window", type=int, default=10)
    p.add_argument("--kill", default="", help="modes to run once more with a replica killed")
    p.add_argument("--json")
    p.add_argument("--markdown")
    p.add_argument("--benchmarks", action="store_true",
                   help="write the tables into BENCHMARKS.md between its fleet markers")
    p.add_argument("--render", help="only print (and with --benchmarks write) the tables of --json "
                   "files (comma-separated)")
    args = p.parse_args()
    if args.render:
        # Several runs' files (e.g. the matrix and a kill run): their rows together.
        files = [json.load(open(path)) for path in args.render.split(",")]
        results = [r for saved in files for r in saved["results"]]
        kills = [k for saved in files for k in saved["kills"]]
        command = "` and `".join(saved["command"] for saved in files)
        command += f"`, rendered by `benches/load/fleet.py --render {args.render}"
        md = markdown(results, kills, argparse.Namespace(**files[0]["args"]), command)
        print(md)
        if args.benchmarks:
            write_benchmarks(md)
        return
    if not os.path.exists(BIN):
        sys.exit(f"fleet: no release build at {BIN} (cargo build --release)")
    if not shutil.which("wrk"):
        sys.exit("fleet: wrk not found (apt-get install -y wrk)")
    args.stream_cmd = "benches/load/stream.py"
    if not args.stream:
        args.stream = subprocess.run([sys.executable, os.path.join(LOAD, "stream.py")],
                                     check=True, capture_output=True, text=True).stdout.strip()
    sizes = [int(x) for x in args.replicas.split(",")]
    modes = [m for m in args.modes.split(",") if m]
    results = []
    for n in sizes:
        for mode in (modes if n > 1 else modes[:1]):
            results.append(run_one(mode, n, args))
    kills = []
    for mode in filter(None, args.kill.split(",")):
        kills.append(run_one(mode, max(sizes), args, kill=True))
    command = "benches/load/fleet.py " + " ".join(sys.argv[1:])
    for k in kills:
        base_run = next((r for r in results if r["mode"] == k["mode"] and r["replicas"] == k["replicas"]), None)
        k["settle"] = settle(k, base_run) if base_run else None
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "kills": kills, "command": command,
                       "args": {"stream_cmd": args.stream_cmd}}, f, indent=1)
    if not results:
        return
    md = markdown(results, kills, args, command)
    print(md)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(md)
    if args.benchmarks:
        write_benchmarks(md)


if __name__ == "__main__":
    main()
