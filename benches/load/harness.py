#!/usr/bin/env python3
"""The load harness: builds release, starts the simulator, the gateway and a bare
axum hello-world (examples/hello.rs), drives them with wrk (closed model, maximum
throughput) and oha (open model, constant rate, latency-corrected so coordinated
omission cannot hide the tail), and writes BENCHMARKS.md with a latency plot per
scenario (PNG, under benches/load/plots/).

Servers run pinned to core 0 with one tokio worker; the load tools and the
simulator to core 1, so CPU per request is the server's alone. Everything binds
127.0.0.1 and stops by itself.

The gateway runs its default configuration, as it ships: the reveal log on, on
the embedded SQLite (a file in the run's temporary directory), and on the hit
path every request a reveal with a viewer id (viewer.lua). The one deviation is
cold admission, off in the closed-model runs (see `gateway`). The hit path with
the reveal log off is measured beside it, in the same rounds, as a second row;
the log's cost on PostgreSQL on a throwaway cluster (or REVEALS_DATABASE_URL).

The hit path runs on two sets of keys in the same rounds, against the same
hello-world: fixed keys (one ad, every request the same hit) and the recorded
stream of stream.py (a sale day's Zipf mix over 2,000,000 ads, 404s among them),
warmed by one pass and then looped (see `stream_hits`). BENCHMARKS.md's sections
between the fleet's markers and the profile findings' are kept as they are
when it is rewritten (KEPT_SECTIONS); `--hit-path` rewrites the hit-path section
alone.

    benches/load/harness.py [--seconds 10] [--soak 240] [--quick]
    benches/load/harness.py --hit-path [--rounds 5]   (the hit-path section alone)
    benches/load/harness.py --cold | --refresh-ahead | --cold-replica   (one scenario, printed)
    benches/load/harness.py --reveals-cost [--postgres]   (the log's cost alone, printed)
    benches/load/harness.py --reveals-soak 20   (the process's memory as the reveal log ages, printed;
                                                 the gateway with the image's environment too)

With GO_SEED_BIN set to a build of the Go design this project replaces
(../shared/go-seed: `go build -o target/go-seed .` there), the hit and cold
paths measure it too, in the same rounds, on ports of its own; nothing else
needs it. CARGO_TARGET_DIR, when set, is where the release build is looked for;
HARNESS_PORT_OFFSET, when set, is added to every port (a run beside another's).

Beside wrk and oha, two load tools of the project's own (examples/): bare_client,
the cold path's limit (the gateway's upstream call with nothing around it), and
openload, an open-model generator with a Zipf key mix that reports per second
and for the most popular keys; the soak drives it in its soak shape (see
`soak_run`: oha stalls in runs that long).
"""
import argparse, glob, json, os, re, resource, shutil, signal, socket, subprocess, sys, tempfile, time, urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOAD = os.path.join(ROOT, "benches", "load")
# Where cargo puts the release build (CARGO_TARGET_DIR, as cargo reads it).
RELEASE = os.path.join(ROOT, os.environ.get("CARGO_TARGET_DIR") or "target", "release")
# HARNESS_GATEWAY_BIN: another build of the gateway (a profile or allocator
# candidate); the simulator and the load tools stay the release build's.
BIN = os.environ.get("HARNESS_GATEWAY_BIN") or os.path.join(RELEASE, "phones-gateway")
SIM_BIN = os.path.join(RELEASE, "phones-gateway")
HELLO = os.path.join(RELEASE, "examples", "hello")
BARE = os.path.join(RELEASE, "examples", "bare_client")
OPENLOAD = os.path.join(RELEASE, "examples", "openload")
# GO_SEED_BIN: the Go design this project replaces (../shared/go-seed, built by
# the caller; nothing here needs it). When set, it is measured in the same
# rounds as the gateway on the hit and cold paths, on ports of its own.
GO_SEED = os.environ.get("GO_SEED_BIN")
# HARNESS_PORT_OFFSET: added to every port below, so that a run can go on beside
# another checkout's (both then share the cores: their CPU figures are not
# comparable, a memory figure sampled once the log has caught up is).
PORT_OFFSET = int(os.environ.get("HARNESS_PORT_OFFSET") or 0)
GO_PORT, GO_ADMIN = 19501 + PORT_OFFSET, 19502 + PORT_OFFSET
SIM, GW, ADMIN, HELLO_PORT = (p + PORT_OFFSET for p in (19300, 19301, 19302, 19400))
# A second gateway, the reveal log off, beside the default one in the hit-path rounds.
GW_OFF, ADMIN_OFF = 19311 + PORT_OFFSET, 19312 + PORT_OFFSET
# Every hit-path request a reveal with a viewer id, as a backend in front sends them.
VIEWER_SCRIPT = "viewer.lua"
VIEWER_HEADER = "X-Viewer-Id: viewer-1"
REVEALS_OFF = {"PHONES_GATEWAY__REVEALS__ENABLED": "false"}
# The recorded stream (stream.py at its defaults, or HARNESS_STREAM), the hit
# path's realistic keys beside the fixed ones: warmed by one pass of replay.lua,
# then looped by stream_hits.lua.
STREAM_SCRIPT = "stream_hits.lua"
# Sections of BENCHMARKS.md a full run keeps as they are (another tool or a
# person writes them), and the hit-path section `--hit-path` rewrites alone.
KEPT_SECTIONS = (("<!-- fleet:begin -->", "<!-- fleet:end -->"),
                 ("<!-- hitpath-profile:begin -->", "<!-- hitpath-profile:end -->"),
                 ("<!-- snapshot-reach:begin -->", "<!-- snapshot-reach:end -->"),
                 ("<!-- callgrind-gate:begin -->", "<!-- callgrind-gate:end -->"))
HIT_PATH_SECTION = ("<!-- hitpath:begin -->", "<!-- hitpath:end -->")
TOKEN = "harness-token"
TICK = os.sysconf("SC_CLK_TCK")


def run(cmd, **kw):
    return subprocess.run(cmd, check=True, capture_output=True, text=True, **kw).stdout


def stat_cpu_seconds(stat_path):
    """User plus system CPU seconds of a /proc stat file (a process's or a thread's)."""
    fields = open(stat_path).read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def cpu_seconds(pid):
    return stat_cpu_seconds(f"/proc/{pid}/stat")


def thread_cpu_seconds(pid):
    """CPU seconds by thread name: the tokio workers, SQLite's connection threads."""
    by_name = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            name = open(f"{task}/comm").read().strip()
            seconds = stat_cpu_seconds(f"{task}/stat")
        except OSError:
            continue
        by_name[name] = by_name.get(name, 0) + seconds
    return by_name


def rss_mib(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def wait_http(url, seconds=20, proc=None):
    """Until `url` answers; gives up at once when `proc` (the server) exited."""
    end = time.time() + seconds
    while time.time() < end:
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"exited before {url} answered")
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except Exception:
            time.sleep(0.1)
    raise SystemExit(f"not up: {url}")


class Server:
    def __init__(self, cmd, env=None, core="0", ready=None):
        full_env = dict(os.environ, **(env or {}))
        self.proc = subprocess.Popen(["taskset", "-c", core] + cmd, env=full_env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if ready:
            wait_http(ready)

    @property
    def pid(self):
        return self.proc.pid

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def simulator(**flags):
    cmd = [SIM_BIN, "simulate", "--addr", f"127.0.0.1:{SIM}"]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    return Server(cmd, core="1")


def gateway(db_dir, anonymous_url=None, extra_env=None, port=GW, admin=ADMIN):
    """The gateway in its default configuration (the reveal log on, SQLite in
    `db_dir`), but for cold admission and what `extra_env` sets."""
    upstream = f"http://127.0.0.1:{SIM}"
    os.makedirs(db_dir, exist_ok=True)
    env = {
        "PHONES_GATEWAY__SERVER__PUBLIC_ADDR": f"127.0.0.1:{port}",
        "PHONES_GATEWAY__SERVER__ADMIN_ADDR": f"127.0.0.1:{admin}",
        "PHONES_GATEWAY__ADMIN__TOKEN": TOKEN,
        "PHONES_GATEWAY__LOG__FILTER": "error",
        "PHONES_GATEWAY__RUNTIME__WORKER_THREADS": "1",
        "PHONES_GATEWAY__DATABASE__URL": f"sqlite://{db_dir}/gw.db",
        "PHONES_GATEWAY__UPSTREAMS__REAL_PHONE__BASE_URL": upstream,
        "PHONES_GATEWAY__UPSTREAMS__ANONYMOUS__BASE_URL": anonymous_url or upstream,
        "PHONES_GATEWAY__UPSTREAMS__CALLTRACKING__BASE_URL": upstream,
        # Cold admission off: the closed-model runs saturate the core on purpose
        # to find a maximum, and cheap 503s would inflate it. The cold-replica
        # scenario turns it on and off explicitly.
        "PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS": "0",
    }
    if os.environ.get("HARNESS_WITHOUT_ADMISSION"):
        # A build from before the key existed (a "before" figure).
        del env["PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS"]
    env.update(extra_env or {})
    gw = Server([BIN, "serve"], env=env, ready=f"http://127.0.0.1:{admin}/readyz")
    # Call tracking on for sellers that are multiples of 4 (as the simulator's feed).
    items = [{"user_id": 4 * k, "enabled": True, "version": 1} for k in range(1, 10001)]
    request = urllib.request.Request(f"http://127.0.0.1:{admin}/admin/v1/calltracking/statuses",
                                     data=json.dumps({"items": items}).encode(), method="POST",
                                     headers={"Authorization": f"Bearer {TOKEN}",
                                              "Content-Type": "application/json"})
    urllib.request.urlopen(request).read()
    return gw


def go_seed(db_dir):
    """The Go design (GO_SEED_BIN) in its bench configuration, pointed at the
    simulator, pinned to core 0 like the gateway (its runtime then runs one
    thread); ready once it has drained the simulator's status feed, which turns
    call tracking on for the same sellers the gateway's webhook does."""
    os.makedirs(db_dir, exist_ok=True)
    upstream = f"http://127.0.0.1:{SIM}"
    config = os.path.join(db_dir, "go-seed.toml")
    with open(config, "w") as f:
        f.write(f"""[server]
public_addr = "127.0.0.1:{GO_PORT}"
admin_addr = "127.0.0.1:{GO_ADMIN}"
[admin]
token = "{TOKEN}"
[upstreams.real_phone]
base_url = "{upstream}"
timeout_ms = 300
max_idle_conns_per_host = 512
[upstreams.anonymous]
base_url = "{upstream}"
timeout_ms = 300
on_error = "fail_closed"
max_idle_conns_per_host = 512
[upstreams.calltracking]
base_url = "{upstream}"
timeout_ms = 300
on_error = "fall_through"
max_idle_conns_per_host = 512
[upstreams.calltracking.status_feed]
enabled = true
interval_ms = 1000
[selection]
order = ["anonymous", "calltracking", "real"]
anonymous_categories = [9, 24]
[cache]
impl = "ccache"
[cache.real_phone]
capacity = 5000000
ttl_s = 900
negative_ttl_s = 60
[cache.calltracking]
capacity = 500000
ttl_s = 900
negative_ttl_s = 60
[cache.anonymous]
capacity = 1000000
ttl_s = 300
negative_ttl_s = 60
""")
    return Server([GO_SEED, "serve", "--config", config], ready=f"http://127.0.0.1:{GO_ADMIN}/readyz")


def parse_wrk(text):
    def ms(value):
        number, unit = re.match(r"([\d.]+)(\w+)", value).groups()
        return float(number) * {"us": 0.001, "ms": 1, "s": 1000, "m": 60000}[unit]
    out = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))}
    out["requests"] = int(re.search(r"(\d+) requests in", text).group(1))
    for p in ("50", "75", "90", "99"):
        m = re.search(rf"^\s+{p}%\s+(\S+)", text, re.M)
        out[f"p{p}"] = ms(m.group(1)) if m else None
    out["max"] = ms(re.search(r"Latency\s+\S+\s+\S+\s+(\S+)", text).group(1))
    non2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", text)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", text)
    out["non2xx"] = int(non2xx.group(1)) if non2xx else 0
    out["errors"] = sum(int(g) for g in errors.groups()) if errors else 0
    return out


def wrk(url, seconds, connections=64, script=None, args=()):
    cmd = ["taskset", "-c", "1", "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    if script:
        cmd += ["-s", os.path.join(LOAD, script)]
    cmd += [url]
    if args:
        cmd += ["--"] + list(args)
    return parse_wrk(run(cmd))


def oha(url, seconds, rate, connections=64, header=VIEWER_HEADER):
    out = run(["taskset", "-c", "1", "oha", "-z", f"{seconds}s", "-q", str(rate), "-c", str(connections),
               "--latency-correction", "--no-tui", "--output-format", "json", "-H", header, url])
    data = json.loads(out)
    pct = data["latencyPercentiles"]
    codes = data.get("statusCodeDistribution", {})
    return {
        "rps": data["summary"]["requestsPerSec"],
        "requests": sum(codes.values()),
        "p50": pct["p50"] * 1000, "p90": pct["p90"] * 1000, "p99": pct["p99"] * 1000,
        "p99.9": pct["p99.9"] * 1000, "max": data["summary"]["slowest"] * 1000,
        "errors": sum(data.get("errorDistribution", {}).values()),
        "error_kinds": data.get("errorDistribution", {}),
        "non2xx": sum(v for k, v in codes.items() if not k.startswith("2")),
    }


def measured(server, load):
    """Runs `load()` and adds the server's CPU per request and RSS."""
    before = cpu_seconds(server.pid)
    result = load()
    used = cpu_seconds(server.pid) - before
    result["cpu_us_per_req"] = used / max(result["requests"], 1) * 1e6
    result["rss_mib"] = rss_mib(server.pid)
    return result


def plot(name, rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for label, r in rows:
        keys = [k for k in ("p50", "p75", "p90", "p99", "p99.9", "max") if r.get(k) is not None]
        ax.plot(keys, [r[k] for k in keys], marker="o", label=label)
    ax.set_yscale("log")
    ax.set_ylabel("latency (ms)")
    ax.set_title(name)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class Postgres:
    """A throwaway PostgreSQL (initdb in a temporary directory, a free port, as
    the `postgres` user when root, as tests/it/support/pg.rs does), pinned to
    core 1 with the load tools: its work is not the gateway's. None of it is
    left behind by `stop`."""

    def __init__(self):
        bins = [os.path.dirname(shutil.which("initdb") or "")] + sorted(
            glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)
        self.bin = next((b for b in bins if b and os.path.exists(os.path.join(b, "pg_ctl"))), None)
        if self.bin is None:
            raise FileNotFoundError("initdb and pg_ctl (PostgreSQL's server binaries)")
        self.dir = tempfile.mkdtemp(prefix="harness-pg-")
        self.as_pg = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_pg:
            shutil.chown(self.dir, "postgres")
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        data = os.path.join(self.dir, "data")
        run(self.as_pg + [os.path.join(self.bin, "initdb"), "-D", data, "-U", "postgres", "--auth=trust",
                          "-E", "UTF8", "--no-sync"])
        run(self.as_pg + ["taskset", "-c", "1", os.path.join(self.bin, "pg_ctl"), "-D", data, "-w",
                          "-l", os.path.join(self.dir, "log"), "-o",
                          f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start"])
        self.data = data
        self.url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def stop(self):
        subprocess.run(self.as_pg + [os.path.join(self.bin, "pg_ctl"), "-D", self.data, "-m", "fast", "stop"],
                       capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def reveals_cost(db, hot_url, seconds, rounds, database_url=None):
    """The hit path's CPU per request with the reveal log off and on (every
    request a reveal with a viewer id, flushed each second), in alternating
    pairs, each run on a database of its own; the median pair's ratio is the
    figure. `database_url` (PostgreSQL) writes the log there, its work in its
    own processes; by default the embedded SQLite file, whose inserts run inside
    the gateway's process and so count in its CPU. Returns the median ratio and
    one line per round."""
    sim = simulator(latency_ms=5)
    pairs = []
    for r in range(rounds):
        pair = []
        for enabled in ("false", "true"):
            env = {"PHONES_GATEWAY__REVEALS__ENABLED": enabled}
            if database_url:
                env["PHONES_GATEWAY__DATABASE__URL"] = database_url
            gw = gateway(os.path.join(db, f"cost-{r}-{enabled}"), extra_env=env)
            urllib.request.urlopen(hot_url).read()
            pair.append(measured(gw, lambda: wrk(hot_url, seconds, script=VIEWER_SCRIPT)))
            gw.stop()
        pairs.append(pair)
    sim.stop()
    ratio = lambda pair: pair[1]["cpu_us_per_req"] / pair[0]["cpu_us_per_req"]
    lines = [f"- round: reveal log on/off CPU per request {ratio((off, on)):.3f}x "
             f"({on['cpu_us_per_req']:.2f} vs {off['cpu_us_per_req']:.2f} us; "
             f"{on['rps']:.0f} vs {off['rps']:.0f} req/s)" for off, on in pairs]
    return sorted(ratio(p) for p in pairs)[len(pairs) // 2], lines


def recorded_stream():
    """The recorded stream's file and its summary (stream.py at its defaults:
    300,000 requests, Zipf 1.1 over 2,000,000 ads of 200,000 sellers, a sale
    day's hot seller, 404s), or HARNESS_STREAM's file; (None, None) without
    stream.py."""
    if os.environ.get("HARNESS_STREAM"):
        return os.environ["HARNESS_STREAM"], None
    script = os.path.join(LOAD, "stream.py")
    if not os.path.exists(script):
        print("warning: benches/load/stream.py is missing: no hit path on the recorded stream", file=sys.stderr)
        return None, None
    with tempfile.NamedTemporaryFile(suffix=".json") as summary:
        path = run([sys.executable, script, "--summary", summary.name], cwd=ROOT).strip()
        return path, json.load(open(summary.name))


# The cache lookups that waited on an upstream (a miss, one joining a miss
# under way, one served stale when its fetch failed), and the hits that started
# a refresh ahead of expiry (counted as hits too): what a measured pass on the
# recorded stream must not hold if it is to be the hit path alone (the warm pass
# before it took the first sight of every key).
NOT_HITS = ("miss", "coalesced", "stale_served")


def memory_of(pid):
    """The process's resident memory in MiB: VmRSS and its parts (RssAnon,
    RssFile, RssShmem from /proc/PID/status), and the anonymous part split by
    mapping (/proc/PID/smaps): `mimalloc` is the mappings of 128 MiB or more
    (mimalloc reserves its arenas that large; glibc's arenas are 64 MiB at
    most), `heap` glibc's main heap (brk), `anon` every other anonymous
    mapping (glibc's thread arenas, where SQLite's connection threads
    allocate, and thread stacks). A heuristic by size, not a ledger. `thp`:
    the part of it in transparent huge pages (AnonHugePages: the gateway
    turns them off for itself, so 0 unless a build without that runs)."""
    out = {}
    for line in open(f"/proc/{pid}/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) / 1024
    parts = {"mimalloc": 0.0, "heap": 0.0, "anon": 0.0}
    size, kind = 0, None
    for line in open(f"/proc/{pid}/smaps"):
        fields = line.split()
        if "-" in fields[0] and len(fields) >= 5 and not fields[0].endswith(":"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            size = end - start
            path = fields[5] if len(fields) > 5 else ""
            kind = ("heap" if path == "[heap]" else
                    None if path else "mimalloc" if size >= 128 << 20 else "anon")
        elif fields[0] == "Rss:" and kind:
            parts[kind] += int(fields[1]) / 1024
        elif fields[0] == "AnonHugePages:":
            parts["thp"] = parts.get("thp", 0.0) + int(fields[1]) / 1024
    out.update(parts)
    return out


def image_env():
    """The variables the image sets for the process (the Dockerfile's `ENV`
    lines: mimalloc's purge delay), but for those the caller's environment
    sets: the soak measures the gateway as the image runs it."""
    env = {}
    for line in open(os.path.join(ROOT, "Dockerfile")):
        m = re.match(r"ENV\s+(\w+)=(\S+)\s*$", line)
        if m and m.group(1) not in os.environ:
            env[m.group(1)] = m.group(2)
    return env


def reveals_soak(db, millions, chunk_seconds, hours):
    """The gateway's memory as its reveal log ages: the default configuration
    (the reveal log on SQLite), the recorded stream looped (stream_hits.lua,
    every request a reveal with a viewer id) after one warm pass (replay.lua,
    its reveals without a viewer), wrk runs of `chunk_seconds` one after the
    other (1.2 s apart, a flush interval: the log writes what the run left)
    until `millions` million reveals are written (or `hours` passed). At each
    million written, once the log has caught up (nothing left unwritten, or a
    minute passed): RSS and its parts (`memory_of`), the server's CPU per
    request over that million, the log's file (database and WAL) per reveal,
    and how many reveals were waiting in memory before it caught up (wrk
    saturates the gateway's one core, where the log's writer, at background
    priority, gets a seventh of it, so reveals wait while a run lasts).
    The gateway runs with the image's environment (`image_env`).
    Returns the rows and the run's lines."""
    stream, _ = recorded_stream()
    if not stream:
        raise SystemExit("--reveals-soak needs the recorded stream (benches/load/stream.py)")
    sim = simulator(latency_ms=5)
    gw = gateway(os.path.join(db, "reveals-soak"), extra_env=image_env())
    base = f"http://127.0.0.1:{GW}"
    wrk(base, 600, 64, "replay.lua", (stream, "1"))
    files = [os.path.join(db, "reveals-soak", f"gw.db{x}") for x in ("", "-wal")]
    written = lambda: metric(ADMIN, "phones_gateway_reveals_written_total")
    rows = []

    def sample(requests, cpu):
        n = written()
        on_disk = sum(os.path.getsize(f) for f in files if os.path.exists(f))
        row = {"reveals": n, "requests": requests, "cpu_s": cpu, "disk_bytes": on_disk,
               "t": round(time.time() - start), "load": os.getloadavg()[0],
               "buffered": metric(ADMIN, "phones_gateway_reveals_buffered"),
               "dropped": metric(ADMIN, "phones_gateway_reveals_dropped_total"), **memory_of(gw.pid)}
        rows.append(row)
        return row

    def line(row, prev):
        per_req = ((row["cpu_s"] - prev["cpu_s"]) / max(row["requests"] - prev["requests"], 1) * 1e6
                   if prev else 0.0)
        return (f"{row['reveals'] / 1e6:5.1f}M reveals, t {row['t']:5d} s: RSS {row['VmRSS']:6.1f} MiB "
                f"(anon {row['RssAnon']:.1f}: mimalloc {row['mimalloc']:.1f}, glibc heap {row['heap']:.1f}, "
                f"other anon {row['anon']:.1f}; file {row['RssFile']:.1f}; shmem {row['RssShmem']:.1f}; "
                f"huge pages {row.get('thp', 0.0):.1f}); "
                f"{per_req:.1f} us/request over the segment; log file {row['disk_bytes'] / max(row['reveals'], 1):.0f} "
                f"B/reveal; {row.get('backlog', 0):.0f} reveals were waiting, {row['buffered']:.0f} at the sample, "
                f"{row['dropped']:.0f} dropped; load {row['load']:.1f}")

    start = time.time()
    requests, cpu0 = 0, cpu_seconds(gw.pid)
    lines = [line(sample(0, 0.0), None)]
    print(lines[-1], flush=True)
    marks = [rows[0]]
    next_mark = (int(rows[0]["reveals"] // 1e6) + 1) * 1e6
    while written() < millions * 1e6 and time.time() - start < hours * 3600:
        r = wrk(base, chunk_seconds, script=STREAM_SCRIPT, args=(stream,))
        requests += r["requests"]
        time.sleep(1.2)  # past the flush of what the run recorded
        if written() >= next_mark:
            # Sampled once the log has caught up: the reveals waiting for a
            # writer behind the saturated core are the load's, not the log's
            # age (how many waited is in the row).
            backlog = metric(ADMIN, "phones_gateway_reveals_buffered")
            caught_up = time.time() + 60
            while metric(ADMIN, "phones_gateway_reveals_buffered") > 0 and time.time() < caught_up:
                time.sleep(0.2)
            time.sleep(1)
            row = sample(requests, cpu_seconds(gw.pid) - cpu0)
            row["backlog"] = backlog
            lines.append(line(row, marks[-1]))
            print(lines[-1], flush=True)
            marks.append(row)
            next_mark = (int(row["reveals"] // 1e6) + 1) * 1e6
    gw.stop(); sim.stop()
    return marks[1:], lines


def cache_lookups(admin_port):
    """phones_gateway_cache_lookups_total by result, summed over the caches."""
    return {result: metric(admin_port, "phones_gateway_cache_lookups_total", f'result="{result}"')
            for result in ("hit", "refresh") + NOT_HITS}


def stream_hits(server, port, admin_port, stream, seconds):
    """The hit path on the recorded stream: one pass of replay.lua over the
    file, unmeasured, so every key is in the caches (a cached 404 included)
    and fresh; then stream_hits.lua loops the file for `seconds`, measured
    like the fixed-key runs. The lookups that were not hits during the
    measured run (expiry, refresh ahead) are counted in the result."""
    base = f"http://127.0.0.1:{port}"
    wrk(base, 600, 64, "replay.lua", (stream, "1"))
    before = cache_lookups(admin_port)
    result = measured(server, lambda: wrk(base, seconds, script=STREAM_SCRIPT, args=(stream,)))
    after = cache_lookups(admin_port)
    result["lookups"] = {k: after[k] - before[k] for k in after}
    return result


def hit_path_section(closed, streamed, summary, seconds, rounds):
    """BENCHMARKS.md's hit-path section (between HIT_PATH_SECTION's markers):
    the fixed keys and the recorded stream side by side, each with its CPU per
    request over hello-world's of the same round, log on and off."""
    median = lambda xs: sorted(xs)[len(xs) // 2]
    ratio = lambda t, i: t[i]["cpu_us_per_req"] / t[0]["cpu_us_per_req"]
    lines = [HIT_PATH_SECTION[0], "## The hit path: fixed keys and the recorded stream", "",
             f"Each round measures hello-world, then the gateway as shipped (the reveal log on, SQLite) and the same "
             f"build with the reveal log off, {seconds} s each, wrk at 64 connections, every request with an "
             f"X-Viewer-Id (one of 1,000 viewers). Fixed keys: one ad, every request the same hit (viewer.lua). "
             f"The recorded stream: one pass of replay.lua over the file (unmeasured: it fills the caches, the first "
             f"sight of each key being a miss, not the hit path), then stream_hits.lua loops the file, measured; "
             f"hello-world is measured again right before the stream's pair. Ratios are each run's CPU per request "
             f"over its round's hello-world; the median of {rounds} rounds, and the lowest and highest round.", ""]
    if summary:
        lines += [f"The stream (`benches/load/stream.py`, seed {summary['seed']}): {summary['requests']:,} requests, "
                  f"Zipf {summary['s']} over {summary['ads']:,} ads of {summary['sellers']:,} sellers; "
                  f"{summary['distinct_ads']:,} distinct ads of {summary['distinct_sellers']:,} sellers; the sale "
                  f"day's seller takes {100 * summary['hot_seller_share']:.1f}% of the requests; "
                  f"{100 * summary['predicted_404_share']:.1f}% are 404s (a cached \"no number\").", ""]
    lines += ["| keys | reveal log | server CPU us/req (median) | over hello-world (median) | rounds, lowest to highest | req/s (median) |",
              "|---|---|---|---|---|---|"]
    rows = [("fixed (one ad)", "on", closed, 1), ("fixed (one ad)", "off", closed, 2)]
    if streamed:
        rows += [("recorded stream", "on", streamed, 1), ("recorded stream", "off", streamed, 2)]
    for keys, log, triples, i in rows:
        ratios = [ratio(t, i) for t in triples]
        lines.append(f"| {keys} | {log} | {median([t[i]['cpu_us_per_req'] for t in triples]):.2f} | "
                     f"{median(ratios):.2f}x | {min(ratios):.2f} to {max(ratios):.2f} | "
                     f"{median([t[i]['rps'] for t in triples]):.0f} |")
    hellos = [t[0]["cpu_us_per_req"] for t in closed] + [t[0]["cpu_us_per_req"] for t in streamed]
    lines += ["", f"hello-world: {median(hellos):.2f} us per request (median of its {len(hellos)} runs, "
              f"{min(hellos):.2f} to {max(hellos):.2f})."]
    if streamed:
        lines += ["", "The recorded stream, each round (over its hello-world; non-2xx are the stream's 404s; of the "
                  "caches' lookups during the measured run, those that waited on an upstream, and the hits that "
                  "started a refresh ahead of expiry):", ""]
        waited = lambda r: f"{sum(r['lookups'][k] for k in NOT_HITS):.0f}"
        looked = lambda r: f"{r['lookups']['hit'] + sum(r['lookups'][k] for k in NOT_HITS):.0f}"
        for h, a, o in streamed:
            lines.append(f"- round: log on {a['cpu_us_per_req'] / h['cpu_us_per_req']:.2f}x ({a['cpu_us_per_req']:.2f} vs "
                         f"{h['cpu_us_per_req']:.2f} us, {a['rps']:.0f} req/s, non-2xx {a['non2xx'] / max(a['requests'], 1):.1%}; "
                         f"of {looked(a)} lookups {waited(a)} waited, {a['lookups']['refresh']:.0f} refreshed); log off "
                         f"{o['cpu_us_per_req'] / h['cpu_us_per_req']:.2f}x ({o['cpu_us_per_req']:.2f} us, "
                         f"{o['rps']:.0f} req/s; of {looked(o)} lookups {waited(o)} waited, {o['lookups']['refresh']:.0f} refreshed)")
    lines += ["", f"Made by `benches/load/harness.py --hit-path --rounds {rounds} --seconds {seconds}` "
              "(or a full run), which rewrites this section alone.", HIT_PATH_SECTION[1]]
    return lines


def section(text, markers):
    """The lines of `text` from the `markers`' begin to their end, both kept;
    None without them."""
    begin, end = text.find(markers[0]), text.find(markers[1])
    if begin < 0 or end < begin:
        return None
    return text[begin:end + len(markers[1])]


def write_section(markers, lines):
    """Replaces the section of BENCHMARKS.md between `markers` with `lines`
    (appends it when the file has none), leaving everything else as it is:
    the hit-path section here, the fleet's section in fleet.py."""
    path = os.path.join(ROOT, "BENCHMARKS.md")
    text = open(path).read() if os.path.exists(path) else "# Benchmarks\n"
    new = "\n".join(lines)
    old = section(text, markers)
    text = text.replace(old, new) if old else text.rstrip("\n") + "\n\n" + new + "\n"
    open(path, "w").write(text)


def child_cpu_seconds():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bare_client(seconds, stack="hyper"):
    """The cold path's limit: examples/bare_client on core 0, CPU per call."""
    before = child_cpu_seconds()
    out = json.loads(run(["taskset", "-c", "0", BARE, f"http://127.0.0.1:{SIM}", "32", str(seconds), stack]))
    calls = out["calls"] + out["failed"]
    return {"calls": calls, "failed": out["failed"], "rps": calls / seconds,
            "cpu_us_per_call": (child_cpu_seconds() - before) / max(calls, 1) * 1e6}


def cold_path(db, seconds, rounds):
    """Server CPU per request when every request misses (simulator at 0 ms, each
    request a new seller), beside the bare client's CPU per call, alternating;
    the median of each is the figure. Real only: one upstream call; anonymous
    category: the anonymous and real calls."""
    sim = simulator(latency_ms=0)
    runs = {"bare hyper client, per call": [], "bare reqwest client, per call": [],
            "miss, real only (1 call)": [], "miss, anonymous category (2 calls)": []}
    if GO_SEED:
        runs["the Go design: miss, real only (1 call)"] = []
        runs["the Go design: miss, anonymous category (2 calls)"] = []
    servers = [("", lambda r: gateway(os.path.join(db, f"cold-{r}")), GW)]
    if GO_SEED:
        servers.append(("the Go design: ", lambda r: go_seed(os.path.join(db, f"cold-go-{r}")), GO_PORT))
    for r in range(rounds):
        runs["bare hyper client, per call"].append(bare_client(seconds)["cpu_us_per_call"])
        runs["bare reqwest client, per call"].append(bare_client(seconds, "reqwest")["cpu_us_per_call"])
        # The gateway and the Go design back to back, each on keys of its own.
        for n, (prefix, start, port) in enumerate(servers):
            server = start(r)
            base = f"http://127.0.0.1:{port}"
            offset = r * 10_000_000 + n * 100_000_000
            real = measured(server, lambda: wrk(base, seconds, 32, "cold.lua", ("1", "1", str(offset))))
            anon = measured(server, lambda: wrk(base, seconds, 32, "cold.lua", ("9", "1", str(offset + 5_000_000))))
            server.stop()
            runs[f"{prefix}miss, real only (1 call)"].append(real["cpu_us_per_req"])
            runs[f"{prefix}miss, anonymous category (2 calls)"].append(anon["cpu_us_per_req"])
            if real["non2xx"] or anon["non2xx"]:
                print(f"warning: non-2xx answers on the cold path ({prefix or 'gateway'}): "
                      f"{real['non2xx']}, {anon['non2xx']}", file=sys.stderr)
    sim.stop()
    median = lambda xs: sorted(xs)[len(xs) // 2]
    figures = {k: median(v) for k, v in runs.items()}
    lines = ["| server CPU per request or call (us) | median | every round |", "|---|---|---|"]
    lines += [f"| {k} | {figures[k]:.2f} | {', '.join(f'{x:.2f}' for x in v)} |" for k, v in runs.items()]
    second_call = figures["miss, anonymous category (2 calls)"] - figures["miss, real only (1 call)"]
    lines += ["", f"The second upstream call of a request costs {second_call:.2f} us "
              f"(anonymous category minus real only); the bare client's call {figures['bare hyper client, per call']:.2f} us."]
    if GO_SEED:
        # Per round, the Go design's CPU over the gateway's: the rounds are pairs.
        for kind in ("miss, real only (1 call)", "miss, anonymous category (2 calls)"):
            ratios = [g / m for g, m in zip(runs[f"the Go design: {kind}"], runs[kind])]
            figures[f"go ratio: {kind}"] = median(ratios)
            lines.append(f"The Go design spends {median(ratios):.2f}x the gateway's CPU on a {kind} "
                         f"(median of the rounds' ratios; rounds {', '.join(f'{x:.2f}' for x in ratios)}).")
    return figures, second_call, lines


def openload(rate, seconds, connections=64, ads=10000, sellers=2000, top=1000, slow_ms=50, warmup_s=0):
    out = run(["taskset", "-c", "1", OPENLOAD, f"http://127.0.0.1:{GW}", str(rate), str(seconds),
               str(connections), str(ads), str(sellers), str(top), str(slow_ms), str(warmup_s)])
    return json.loads(out)


def cache_env(ttl_s, negative_ttl_s, refresh_ahead_s):
    env = {}
    for cache in ("REAL_PHONE", "ANONYMOUS", "CALLTRACKING"):
        env[f"PHONES_GATEWAY__CACHE__{cache}__TTL_S"] = str(ttl_s)
        env[f"PHONES_GATEWAY__CACHE__{cache}__NEGATIVE_TTL_S"] = str(negative_ttl_s)
        env[f"PHONES_GATEWAY__CACHE__{cache}__REFRESH_AHEAD_S"] = str(refresh_ahead_s)
    return env


def refresh_ahead(db, rate, seconds):
    """Zipf at `rate` over `seconds` with a TTL of 10 s (at least three TTLs;
    30 s for a cached 404, whose window is at most a tenth of it), the simulator
    at 200 ms so a request that waited on an upstream stands clear of any hit's
    latency; the top 1,000 ads after a 12 s warm-up: how many took 200 ms or
    more. Beside it the same run with refresh ahead off, and an all-hit run
    (TTLs of an hour: nothing expires) whose p99.9 is the bar."""
    sim = simulator(latency_ms=200)
    runs = {}
    for name, env in (("all hits (TTL 1 h)", cache_env(3600, 3600, 0)),
                      ("TTL 10 s, refresh ahead 3 s", cache_env(10, 30, 3)),
                      ("TTL 10 s, refresh ahead off", cache_env(10, 30, 0))):
        gw = gateway(db, extra_env=env)
        # Many connections, as a fleet of clients holds: with few, the tail's
        # misses (200 ms each) would hold them all and queue the top keys'
        # requests in the client, which no cache can help.
        runs[name] = openload(rate, seconds, 1024, 10000, 2000, 1000, 200, 12)
        runs[name]["refreshes"] = metric(ADMIN, 'phones_gateway_cache_lookups_total', 'result="refresh"')
        runs[name]["misses"] = metric(ADMIN, 'phones_gateway_cache_lookups_total', 'result="miss"')
        gw.stop()
    sim.stop()
    lines = ["| run | top 1,000 ads: requests | of them 200 ms or more (misses) | top p99 ms | top p99.9 ms | all p99.9 ms | background refreshes | cache misses (all keys, warm-up included) |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in runs.items():
        t, a = r["top"], r["after_warmup"]
        lines.append(f"| {name} | {t['answered']} | {t['slow']} | {t['p99_ms']:.2f} | {t['p999_ms']:.2f} | "
                     f"{a['p999_ms']:.2f} | {r['refreshes']:.0f} | {r['misses']:.0f} |")
    return runs, lines


def metric(admin_port, name, label=""):
    """The sum of a counter's series (those with `label`) on the admin listener."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/metrics").read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and label in line and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def cold_replica(db, rate, seconds, connections):
    """A fresh replica thrown into `rate` (half the hit path's maximum) with the
    Zipf mix of hot.lua (10,000 ads of 2,000 sellers), the simulator at 5 ms: per
    second, answered, shed and the answered p99; with cold admission (the
    default) and without (server.max_queue_delay_ms = 0)."""
    sim = simulator(latency_ms=5)
    runs = {}
    for name, delay in (("cold admission on (default)", "50"), ("cold admission off", "0")):
        gw = gateway(db, extra_env={"PHONES_GATEWAY__SERVER__MAX_QUEUE_DELAY_MS": delay})
        runs[name] = openload(rate, seconds, connections, 10000, 2000, 1000, 255, 0)
        runs[name]["shed_metric"] = metric(ADMIN, "phones_gateway_shed_total", 'reason="cold"')
        gw.stop()
    sim.stop()
    lines = []
    for name, r in runs.items():
        rows = r["per_second"]
        worst = max(rows, key=lambda row: row["p99_ms"])
        full = next((row["t"] for row in rows if all(x["shed"] == 0 and x["answered"] >= 0.999 * x["sent"]
                                                      for x in rows if x["t"] >= row["t"])), None)
        lines.append(f"- {name}: statuses {json.dumps(r['statuses'])}; worst second's p99 {worst['p99_ms']:.1f} ms "
                     f"(t = {worst['t']} s); answered p99 over the run {r['after_warmup']['p99_ms']:.1f} ms; "
                     f"every request answered from t = {full} s on" if full is not None else
                     f"- {name}: statuses {json.dumps(r['statuses'])}; worst second's p99 {worst['p99_ms']:.1f} ms "
                     f"(t = {worst['t']} s); still shedding at the end")
    return runs, lines


def plot_per_second(runs, path, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for name, r in runs.items():
        rows = r["per_second"]
        t = [row["t"] for row in rows]
        axes[0].plot(t, [row["answered"] for row in rows], marker=".", label=name)
        axes[1].plot(t, [row["shed"] for row in rows], marker=".", label=name)
        axes[2].plot(t, [max(row["p99_ms"], 0.01) for row in rows], marker=".", label=name)
    axes[0].set_ylabel("answered / s")
    axes[1].set_ylabel("shed (503) / s")
    axes[2].set_ylabel("answered p99 (ms)")
    axes[2].set_yscale("log")
    axes[2].set_xlabel("second of the run")
    axes[0].set_title(title)
    for ax in axes:
        ax.grid(True, alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def soak_run(db_dir, rate, seconds, extra_env, quick):
    """One soak (see main) on a fresh simulator and gateway: RSS samples, oha's
    JSON, and the reveal log's counters at the end."""
    sim = simulator(latency_ms=5)
    gw = gateway(db_dir, anonymous_url="http://127.0.0.1:9", extra_env=extra_env)
    base = f"http://127.0.0.1:{GW}"
    # Every key fetched once before the soak (fill.lua walks them, one wrk
    # thread so each key comes once a cycle): the soak then measures the filled
    # gateway at its rate, not the queue the fill's upstream calls build behind
    # an open-model load, which would be its whole tail.
    fill = wrk(base, 12 if not quick else 6, 256, "fill.lua")
    if fill["requests"] < 90_000:
        print(f"warning: the soak's fill walked {fill['requests']} of 90,000 keys", file=sys.stderr)
    # The fill's own reveals (a million or so at wrk's maximum) written before
    # the soak starts: otherwise the soak's first seconds measure the log
    # catching up with the fill, not the log at the soak's rate.
    drained = time.time() + 120
    while time.time() < drained and metric(ADMIN, "phones_gateway_reveals_buffered") > 0:
        time.sleep(0.5)
    backlog = metric(ADMIN, "phones_gateway_reveals_buffered")
    if backlog > 0:
        print(f"warning: {backlog:.0f} of the fill's reveals still unwritten as the soak starts", file=sys.stderr)
    # examples/openload.rs in its soak shape (ADS = fill.lua's 90,000 keys drawn
    # uniformly, SELLERS unused, each request with VIEWER_HEADER's viewer), not oha: over 240 s at this
    # rate oha stalled for up to 0.7 s at a time against the bare hello-world
    # too (p99 63 ms, max 677 ms; openload on the same: p99 3.3 ms, max 23 ms),
    # so its p99 measured oha. 64 connections, latency from when each was due.
    soak = subprocess.Popen(["taskset", "-c", "1", OPENLOAD, base, str(rate), str(seconds), "64",
                             "90000", "9000", "1000", "200", "0", "soak"],
                            stdout=subprocess.PIPE, text=True)
    samples = []
    start = time.time()
    threads_before = thread_cpu_seconds(gw.pid)
    while soak.poll() is None:
        samples.append((round(time.time() - start), rss_mib(gw.pid)))
        time.sleep(10 if not quick else 3)
    out = json.loads(soak.stdout.read())
    threads = {k: v - threads_before.get(k, 0) for k, v in thread_cpu_seconds(gw.pid).items()}
    # Past the last flush: what was recorded is written or still buffered.
    time.sleep(1.5)
    counters = {k: metric(ADMIN, f"phones_gateway_reveals_{k}_total") for k in ("recorded", "written", "dropped")}
    gw.stop(); sim.stop()
    statuses = out["statuses"]
    answered = out["after_warmup"]
    data = {
        "rps": answered["answered"] / seconds,
        "statuses": {k: v for k, v in statuses.items() if k != "0"},
        # Requests with no answer (status 0) and those never answered at all.
        "errors": statuses.get("0", 0) + out["missing"],
        "p50": answered["p50_ms"], "p99": answered["p99_ms"], "p99.9": answered["p999_ms"],
        "max": answered["max_ms"],
        "worst_second_p99": max((r["p99_ms"] for r in out["per_second"]), default=0.0),
    }
    return {"samples": samples, "data": data, "reveals": counters, "threads": threads}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--soak", type=int, default=240)
    parser.add_argument("--quick", action="store_true", help="3 s per run, 30 s soak")
    parser.add_argument("--rounds", type=int, default=5,
                        help="hello-world/gateway pairs for the hit-path comparisons; the median is reported")
    parser.add_argument("--reveals-cost", action="store_true",
                        help="only the hit path with the reveal log off and on, alternating, printed "
                             "(SQLite; REVEALS_DATABASE_URL or --postgres: PostgreSQL)")
    parser.add_argument("--postgres", action="store_true",
                        help="with --reveals-cost: on a throwaway PostgreSQL")
    parser.add_argument("--hits-only", action="store_true",
                        help="only hello-world and the hit path at maximum (fixed keys and the recorded "
                             "stream), printed; BENCHMARKS.md untouched")
    parser.add_argument("--hit-path", action="store_true",
                        help="as --hits-only, and BENCHMARKS.md's hit-path section rewritten (nothing else)")
    parser.add_argument("--no-stream", action="store_true",
                        help="the hit path on the fixed keys alone")
    parser.add_argument("--cold", action="store_true",
                        help="only the cold path's CPU against the bare client, printed")
    parser.add_argument("--refresh-ahead", action="store_true",
                        help="only the refresh-ahead Zipf runs, printed")
    parser.add_argument("--cold-replica", action="store_true",
                        help="only the cold replica's first seconds, printed and plotted")
    parser.add_argument("--soak-only", action="store_true",
                        help="only the soak, log on then off, at --rate for --soak seconds, printed")
    parser.add_argument("--reveals-soak", type=float, metavar="MILLIONS",
                        help="only the memory as the reveal log ages: the recorded stream looped until "
                             "MILLIONS million reveals are written, RSS and its parts at each million, printed")
    parser.add_argument("--rate", type=int, default=64000,
                        help="the open-model rate of --refresh-ahead and --cold-replica alone "
                             "(a full run uses half the measured hit-path maximum)")
    parser.add_argument("--connections", type=int, default=1024,
                        help="the cold replica's client connections")
    args = parser.parse_args()
    args.hits_only = args.hits_only or args.hit_path
    if args.quick:
        args.seconds, args.soak = 3, 30
    alone = (args.reveals_cost or args.cold or args.refresh_ahead or args.cold_replica or args.soak_only
             or args.reveals_soak)
    for tool in ("wrk", "taskset") if alone else ("wrk", "oha", "taskset"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing (apt-get install -y wrk; cargo install oha --locked)")
    run(["cargo", "build", "--release", "--quiet", "--bin", "phones-gateway", "--example", "hello",
         "--example", "bare_client", "--example", "openload"], cwd=ROOT)
    plots = os.path.join(LOAD, "plots")
    os.makedirs(plots, exist_ok=True)
    s = args.seconds
    results = {}
    base = f"http://127.0.0.1:{GW}"
    hot_url = f"{base}/v1/public-phone?user_id=41&ad_id=1001&category_id=1"
    with tempfile.TemporaryDirectory() as db:
        # The machine's HTTP limit, measured in alternation with the gateway: the
        # cores are shared with other machines, so each pair is one comparison
        # and the median pair is reported (every pair's ratios are listed).
        if args.reveals_cost:
            pg = Postgres() if args.postgres else None
            url = pg.url if pg else os.environ.get("REVEALS_DATABASE_URL")
            try:
                median, lines = reveals_cost(db, hot_url, s, args.rounds, url)
            finally:
                if pg:
                    pg.stop()
            print("\n".join(lines))
            print(f"median: the reveal log on costs {median:.3f}x the CPU of the log off "
                  f"({'PostgreSQL' if url else 'SQLite'})")
            return
        if args.cold:
            print("\n".join(cold_path(db, s, args.rounds)[2]))
            return
        if args.reveals_soak:
            marks, lines = reveals_soak(db, args.reveals_soak, s, 3)
            after = [m["VmRSS"] for m in marks if m["reveals"] >= 5e6]
            if len(after) > 1:
                print(f"RSS from the fifth million on: {min(after):.1f} to {max(after):.1f} MiB, "
                      f"max/min {max(after) / min(after):.3f}")
            at = lambda m: next((r for r in marks if r["reveals"] >= m * 1e6), None)
            print("RSS MiB at " + ", ".join(f"{m}M {at(m)['VmRSS']:.1f}" for m in (1, 5, 10, 15, 20)
                                              if m <= args.reveals_soak and at(m)))
            return
        if args.refresh_ahead:
            print("\n".join(refresh_ahead(db, args.rate, max(s, 40))[1]))
            return
        if args.cold_replica:
            runs, lines = cold_replica(db, args.rate, 30, args.connections)
            plot_per_second(runs, os.path.join(plots, "4-cold-replica.png"), f"a fresh replica at {args.rate}/s")
            print("\n".join(lines))
            for name, r in runs.items():
                print(name)
                for row in r["per_second"]:
                    print("   ", json.dumps(row))
            return
        if args.soak_only:
            for name, env in (("log on", {}), ("log off", REVEALS_OFF)):
                r = soak_run(os.path.join(db, f"soak-{name}"), args.rate, args.soak, env, args.quick)
                p = r["data"]
                print(f"{name}: p50 {p['p50']:.2f} ms, p99 {p['p99']:.2f} ms, "
                      f"p99.9 {p['p99.9']:.2f} ms, max {p['max']:.1f} ms; RSS {[round(m) for _, m in r['samples']]}; {r['reveals']}; "
                      f"CPU s by thread {({k: round(v, 1) for k, v in r['threads'].items() if v})}")
            return
        hello_url = f"http://127.0.0.1:{HELLO_PORT}/"
        hello = Server([HELLO, f"127.0.0.1:{HELLO_PORT}", "1"], ready=hello_url)
        sim = simulator(latency_ms=5)
        gw = gateway(os.path.join(db, "default"))
        # The same build with the reveal log off, on ports of its own: measured
        # in the same rounds, so its row and the log's cost are pairs too.
        gw_off = gateway(os.path.join(db, "log-off"), extra_env=REVEALS_OFF, port=GW_OFF, admin=ADMIN_OFF)
        off_url = hot_url.replace(f":{GW}/", f":{GW_OFF}/")
        urllib.request.urlopen(hot_url).read()
        urllib.request.urlopen(off_url).read()
        go = go_seed(os.path.join(db, "go-seed")) if GO_SEED else None
        go_url = hot_url.replace(f":{GW}/", f":{GO_PORT}/")
        if go:
            urllib.request.urlopen(go_url).read()
        stream, stream_summary = (None, None) if args.no_stream else recorded_stream()
        closed, go_hits, streamed = [], [], []
        for _ in range(args.rounds):
            closed.append((measured(hello, lambda: wrk(hello_url, s, script=VIEWER_SCRIPT)),
                           measured(gw, lambda: wrk(hot_url, s, script=VIEWER_SCRIPT)),
                           measured(gw_off, lambda: wrk(off_url, s, script=VIEWER_SCRIPT))))
            if go:
                go_hits.append(measured(go, lambda: wrk(go_url, s, script=VIEWER_SCRIPT)))
            if stream:
                # The recorded stream in the same round, against a hello-world
                # measured right before it (each pass warmed just before its run).
                streamed.append((measured(hello, lambda: wrk(hello_url, s, script=VIEWER_SCRIPT)),
                                 stream_hits(gw, GW, ADMIN, stream, s),
                                 stream_hits(gw_off, GW_OFF, ADMIN_OFF, stream, s)))
        hit_path_lines = hit_path_section(closed, streamed, stream_summary, s, args.rounds)
        gw_off.stop()
        if go:
            go.stop()
        # The Go design's CPU per hit over the gateway's (log on) and hello-world's,
        # each round against the same round's: the rounds are the comparisons.
        go_vs = lambda i: sorted(g["cpu_us_per_req"] / t[i]["cpu_us_per_req"] for g, t in zip(go_hits, closed))[len(go_hits) // 2] if go_hits else None
        go_over_gw, go_over_off, go_over_hello = go_vs(1), go_vs(2), go_vs(0)
        if go_hits:
            results["(a) all hits, the Go design: max (wrk)"] = sorted(go_hits, key=lambda m: m["cpu_us_per_req"])[len(go_hits) // 2]
        cpu_ratio = lambda pair: pair[1]["cpu_us_per_req"] / pair[0]["cpu_us_per_req"]
        stream_ratio = lambda i: sorted(t[i]["cpu_us_per_req"] / t[0]["cpu_us_per_req"] for t in streamed)[len(streamed) // 2]
        log_ratio = lambda t: t[1]["cpu_us_per_req"] / t[2]["cpu_us_per_req"]
        log_cost_sqlite = sorted(log_ratio(t) for t in closed)[len(closed) // 2]
        by_log_off = sorted(closed, key=lambda t: t[2]["cpu_us_per_req"] / t[0]["cpu_us_per_req"])
        closed.sort(key=cpu_ratio)
        results["hello: max (wrk)"], results["(a) all hits: max (wrk)"], _ = closed[len(closed) // 2]
        hello_of_off, _, results["(a) all hits, reveal log off: max (wrk)"] = by_log_off[len(closed) // 2]
        if streamed:
            for i, name in ((1, "(a) the recorded stream, all hits: max (wrk)"),
                            (2, "(a) the recorded stream, all hits, reveal log off: max (wrk)")):
                results[name] = sorted(streamed, key=lambda t: t[i]["cpu_us_per_req"] / t[0]["cpu_us_per_req"])[len(streamed) // 2][i]
        # With the log off the run is the same as before the default changed.
        rounds = ["Hit path against hello-world, each round one triple (closed model, wrk, every request "
                  "with an X-Viewer-Id: with the reveal log on, each a reveal):", ""]
        rounds += [f"- round: throughput {a['rps'] / h['rps']:.2f} ({a['rps']:.0f} vs {h['rps']:.0f} req/s), "
                   f"CPU per request {cpu_ratio((h, a)):.2f}x ({a['cpu_us_per_req']:.2f} vs {h['cpu_us_per_req']:.2f} us); "
                   f"reveal log off {o['cpu_us_per_req'] / h['cpu_us_per_req']:.2f}x ({o['cpu_us_per_req']:.2f} us), "
                   f"so the log costs {log_ratio((h, a, o)):.3f}x"
                   for h, a, o in closed]
        if go_hits:
            rounds += ["", "The Go design on the same hit, in the same rounds:", ""]
            rounds += [f"- round: {g['cpu_us_per_req']:.2f} us of CPU per request, {g['rps']:.0f} req/s: "
                       f"{g['cpu_us_per_req'] / a['cpu_us_per_req']:.2f}x the gateway's (log on), "
                       f"{g['cpu_us_per_req'] / o['cpu_us_per_req']:.2f}x with the log off, "
                       f"{g['cpu_us_per_req'] / h['cpu_us_per_req']:.2f}x hello-world's"
                       for g, (h, a, o) in zip(go_hits, closed)]
        if args.hits_only:
            gw.stop(); sim.stop(); hello.stop()
            print("\n".join(rounds))
            print("\n".join(hit_path_lines))
            if args.hit_path:
                write_section(HIT_PATH_SECTION, hit_path_lines)
            h, a = results["hello: max (wrk)"], results["(a) all hits: max (wrk)"]
            print(f"median: throughput ratio {a['rps'] / h['rps']:.2f}, CPU ratio {cpu_ratio((h, a)):.2f}x; "
                  f"the reveal log costs {log_cost_sqlite:.3f}x")
            if streamed:
                print(f"median on the recorded stream: CPU ratio {stream_ratio(1):.2f}x, "
                      f"reveal log off {stream_ratio(2):.2f}x")
            if go_hits:
                print(f"the Go design spends {go_over_gw:.2f}x the gateway's CPU per hit "
                      f"({go_over_off:.2f}x with the log off; {go_over_hello:.2f}x hello-world's)")
            return
        half = int(results["(a) all hits: max (wrk)"]["rps"] / 2)
        opened = []
        for _ in range(args.rounds):
            opened.append((measured(hello, lambda: oha(hello_url, s, half)), measured(gw, lambda: oha(hot_url, s, half))))
        tail_ratio = lambda key: sorted(a[key] / h[key] for h, a in opened)[len(opened) // 2]
        p99_ratio, p999_ratio = tail_ratio("p99"), tail_ratio("p99.9")
        opened.sort(key=lambda pair: pair[1]["p99"] / pair[0]["p99"])
        results[f"hello: {half}/s (oha)"], results[f"(a) all hits: {half}/s (oha)"] = opened[len(opened) // 2]
        rounds += ["", f"Open model at {half}/s (oha, latency-corrected), each round one pair:", ""]
        rounds += [f"- round: p99 {a['p99'] / h['p99']:.2f}x ({a['p99']:.2f} vs {h['p99']:.2f} ms), "
                   f"p99.9 {a['p99.9'] / h['p99.9']:.2f}x ({a['p99.9']:.2f} vs {h['p99.9']:.2f} ms)"
                   for h, a in opened]
        hello.stop()
        results["(b) Zipf mix: max (wrk)"] = measured(gw, lambda: wrk(base, s, script="hot.lua"))
        gw.stop(); sim.stop()

        sim = simulator(latency_ms=50)
        gw = gateway(db)
        # The upstream's own latency, the cold-path bar's reference (tokio timers
        # round up, and the simulator shares core 1 with wrk).
        results["(c) the simulator alone, 50 ms: (wrk)"] = measured(
            sim, lambda: wrk(f"http://127.0.0.1:{SIM}/v1/users/41/phone?ad_id=1", s, 32))
        results["(c) cold, real only, 50 ms: (wrk)"] = measured(gw, lambda: wrk(base, s, 32, "cold.lua", ("1", "1")))
        results["(c) cold, full chain, 50 ms each: (wrk)"] = measured(gw, lambda: wrk(base, s, 32, "cold.lua", ("9", "0")))
        gw.stop(); sim.stop()

        sim = simulator(latency_ms=5, anonymous_latency_ms=300)
        gw = gateway(db)
        results["(d) anonymous at its 300 ms timeout, Zipf (wrk)"] = measured(gw, lambda: wrk(base, s, script="hot.lua"))
        gw.stop(); sim.stop()

        sim = simulator(latency_ms=5)
        gw = gateway(db, anonymous_url="http://127.0.0.1:9")
        results["(e) anonymous down, Zipf (wrk)"] = measured(gw, lambda: wrk(base, s, script="hot.lua"))

        gw.stop(); sim.stop()
        cold_figures, second_call, cold_lines = cold_path(db, s, 3)
        ra_runs, ra_lines = refresh_ahead(db, half, max(4 * s, 45))
        cr_runs, cr_lines = cold_replica(db, half, 30, args.connections)
        plot_per_second(cr_runs, os.path.join(plots, "4-cold-replica.png"), f"a fresh replica at {half}/s")
        # The reveal log's cost on PostgreSQL: a throwaway cluster on core 1
        # (or REVEALS_DATABASE_URL), its work in its own processes.
        pg = None
        try:
            pg_url = os.environ.get("REVEALS_DATABASE_URL") or (pg := Postgres()).url
            log_cost_pg, pg_lines = reveals_cost(db, hot_url, s, args.rounds, pg_url)
        except (FileNotFoundError, subprocess.CalledProcessError) as error:
            log_cost_pg, pg_lines = None, [f"- not measured: {error}"]
        finally:
            if pg:
                pg.stop()

        # Soak: half the hit path's maximum over 90,000 (seller, ad) keys drawn at
        # random (every cache fills, then holds), every request with an
        # X-Viewer-Id, so every number answered is a reveal; RSS sampled every
        # 10 s. At the default configuration, then with the reveal log off for
        # its tail.
        rate = half
        soaks = {name: soak_run(os.path.join(db, f"soak-{name}"), rate, args.soak, env, args.quick)
                 for name, env in (("log on", {}), ("log off", REVEALS_OFF))}
        samples, soak_data = soaks["log on"]["samples"], soaks["log on"]["data"]

    spike = subprocess.run(["cargo", "bench", "--quiet", "--bench", "spike"], cwd=ROOT, capture_output=True, text=True).stdout

    # Report.
    machine = run(["uname", "-srm"]).strip()
    cpu = re.search(r"model name\s*:\s*(.*)", open("/proc/cpuinfo").read()).group(1)
    lines = ["# Benchmarks", "",
             f"Machine: {machine}, {cpu}, {os.cpu_count()} cores shared with the load tool. "
             f"Servers pinned to core 0 (one tokio worker), wrk/oha and the simulator to core 1. "
             f"{s} s per run. Produced by `benches/load/harness.py`; compare ratios within one run.", "",
             "The gateway runs its default configuration: the reveal log on, on the embedded SQLite, and every "
             "hit-path request carries an X-Viewer-Id, so each is a reveal with a viewer id. Rows marked "
             "\"reveal log off\" are the same build with `reveals.enabled = false`, measured in the same rounds. "
             "Cold admission is off (`server.max_queue_delay_ms = 0`) but in the cold-replica runs.", "",
             "| scenario | req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | non-2xx | errors | server CPU us/req | RSS MiB |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        cell = lambda k: "" if r.get(k) is None else f"{r[k]:.2f}"
        lines.append(f"| {name} | {r['rps']:.0f} | {cell('p50')} | {cell('p90')} | {cell('p99')} | {cell('p99.9')} | "
                     f"{cell('max')} | {r['non2xx']} | {r['errors']} | {r['cpu_us_per_req']:.2f} | {r['rss_mib']:.1f} |")
    hello_max, hits_max = results["hello: max (wrk)"], results["(a) all hits: max (wrk)"]
    hello_half = results[f"hello: {half}/s (oha)"]
    hits_half = results[f"(a) all hits: {half}/s (oha)"]
    rss = [m for t, m in samples if t >= min(60, args.soak // 5)]
    hello_off = hello_of_off
    hits_off = results["(a) all hits, reveal log off: max (wrk)"]
    soak_on = soaks["log on"]
    soak_p99 = {k: v["data"]["p99"] for k, v in soaks.items()}
    upstream = results["(c) the simulator alone, 50 ms: (wrk)"]["p50"]
    soak_errors = soak_data["errors"]
    lines += ["", "## Targets", "",
              "| target | bar | measured |", "|---|---|---|",
              f"| hit-path throughput vs hello-world (median pair of {args.rounds}) | >= 0.85 | {hits_max['rps'] / hello_max['rps']:.2f} |",
              f"| hit-path CPU per request vs hello-world (default: the reveal log on, SQLite) | <= 1.15x | {hits_max['cpu_us_per_req'] / hello_max['cpu_us_per_req']:.2f}x ({hits_max['cpu_us_per_req']:.2f} vs {hello_max['cpu_us_per_req']:.2f} us) |",
              f"| hit-path CPU per request vs hello-world, the reveal log off | <= 1.15x | {hits_off['cpu_us_per_req'] / hello_off['cpu_us_per_req']:.2f}x ({hits_off['cpu_us_per_req']:.2f} vs {hello_off['cpu_us_per_req']:.2f} us) |",
              *([f"| hit-path CPU per request vs hello-world on the recorded stream, as shipped (median of {args.rounds} rounds) | <= 1.3x | {stream_ratio(1):.2f}x |",
                 f"| the same, the reveal log off | | {stream_ratio(2):.2f}x |"] if streamed else
                ["| hit path on the recorded stream | | not measured (no stream.py) |"]),
              f"| the reveal log's cost on SQLite: hit-path CPU, log on vs off (median of {args.rounds} rounds) | <= 1.15x | {log_cost_sqlite:.3f}x |",
              f"| the reveal log's cost on PostgreSQL: the same, alternating pairs (median of {args.rounds}) | <= 1.05x | " + (f"{log_cost_pg:.3f}x |" if log_cost_pg else "not measured |"),
              f"| open model at {half}/s: p99 vs hello-world (median of {args.rounds} pairs) | <= 1.5x | {p99_ratio:.2f}x |",
              f"| open model at {half}/s: p99.9 vs hello-world (median of {args.rounds} pairs) | <= 1.5x | {p999_ratio:.2f}x |",
              f"| cold p50, real only: upstream p50 + 1 ms (the simulator alone: {upstream:.2f} ms) | <= {upstream + 1:.2f} ms | {results['(c) cold, real only, 50 ms: (wrk)']['p50']:.2f} ms |",
              f"| cold p50, full chain, real then calltracking: two upstream p50s + 1 ms | <= {2 * upstream + 1:.2f} ms | {results['(c) cold, full chain, 50 ms each: (wrk)']['p50']:.2f} ms |",
              f"| soak {args.soak} s at {rate}/s: requests without an answer | 0 | {soak_errors} |",
              f"| soak RSS after warm-up, max/min | <= 1.05 | {max(rss) / min(rss):.3f} ({min(rss):.1f} to {max(rss):.1f} MiB) |" if rss else "| soak RSS | | no samples |",
              f"| soak: reveals dropped by the log | 0 | {soak_on['reveals']['dropped']:.0f} (recorded {soak_on['reveals']['recorded']:.0f}, written {soak_on['reveals']['written']:.0f}) |",
              f"| soak p99 vs the same soak with the reveal log off | <= 1.5x | {soak_p99['log on'] / soak_p99['log off']:.2f}x ({soak_p99['log on']:.2f} vs {soak_p99['log off']:.2f} ms) |",
              f"| cold path, miss with one upstream call (real only): server CPU | <= 25 us | {cold_figures['miss, real only (1 call)']:.2f} us |",
              f"| cold path, miss with two upstream calls (anonymous category): server CPU | <= 40 us | {cold_figures['miss, anonymous category (2 calls)']:.2f} us |",
              f"| cold path, CPU per upstream call (the second call of a request) | <= 15 us | {second_call:.2f} us (the bare client: {cold_figures['bare hyper client, per call']:.2f} us) |",
              *([f"| hit path: the Go design's CPU per request over the gateway's (median of {args.rounds} rounds) | | {go_over_gw:.2f}x (log off: {go_over_off:.2f}x; Go over hello-world: {go_over_hello:.2f}x) |",
                 f"| cold path, miss with one upstream call: the Go design's server CPU over the gateway's | >= 3.0x | {cold_figures['go ratio: miss, real only (1 call)']:.2f}x ({cold_figures['the Go design: miss, real only (1 call)']:.2f} vs {cold_figures['miss, real only (1 call)']:.2f} us) |",
                 f"| cold path, miss with two upstream calls: the Go design's server CPU over the gateway's | >= 3.0x | {cold_figures['go ratio: miss, anonymous category (2 calls)']:.2f}x ({cold_figures['the Go design: miss, anonymous category (2 calls)']:.2f} vs {cold_figures['miss, anonymous category (2 calls)']:.2f} us) |"]
                if go_hits else ["| against the Go design | | not measured (GO_SEED_BIN unset) |"]),
              f"| refresh ahead: top 1,000 ads, requests of 200 ms or more after warm-up | 0 | {ra_runs['TTL 10 s, refresh ahead 3 s']['top']['slow']} of {ra_runs['TTL 10 s, refresh ahead 3 s']['top']['answered']} (refresh ahead off: {ra_runs['TTL 10 s, refresh ahead off']['top']['slow']}) |",
              f"| refresh ahead: top 1,000 ads' p99.9 across expiry vs all hits | ~1x | {ra_runs['TTL 10 s, refresh ahead 3 s']['top']['p999_ms']:.2f} vs {ra_runs['all hits (TTL 1 h)']['top']['p999_ms']:.2f} ms |",
              "", *rounds, "", *hit_path_lines, "",
              "The reveal log on PostgreSQL, hit path with the log on and off (every request a reveal with a viewer id), each round one pair:", "",
              *pg_lines, "",
              "## Cold path (`harness.py --cold`)", "",
              "Every request a new seller, the simulator at 0 ms on core 1; server CPU per request. "
              "The bare client (examples/bare_client.rs) makes the gateway's real-number call with nothing around it, "
              "on one pinned worker: the limit of this machine and library stack.", "", *cold_lines, "",
              "## Refresh ahead (`harness.py --refresh-ahead`)", "",
              f"Zipf over 10,000 ads at {half}/s for {max(4 * s, 45)} s, TTL 10 s (30 s for a 404), refresh ahead 3 s, the simulator at 200 ms; "
              "figures after a 12 s warm-up, latency from when each request was due (examples/openload.rs).", "",
              *ra_lines, "",
              "## A cold replica (`harness.py --cold-replica`)", "",
              f"A fresh replica at {half}/s (half the hit-path maximum), the Zipf mix (10,000 ads of 2,000 sellers), "
              f"{args.connections} client connections, the simulator at 5 ms; 30 s.", "", *cr_lines, "",
              "## Spike (open model, `cargo bench --bench spike`)", "", "```", spike.strip(), "```", "",
              "## Plots", ""]
    groups = {
        "hello vs all hits (open model)": [(f"hello {half}/s", hello_half), (f"all hits {half}/s", hits_half)],
        "closed model maxima": [(k, v) for k, v in results.items() if "max (wrk)" in k],
        "cold path": [(k, v) for k, v in results.items() if k.startswith("(c)")],
        "faults": [(k, v) for k, v in results.items() if k.startswith(("(d)", "(e)"))],
    }
    for i, (title, rows) in enumerate(groups.items()):
        path = os.path.join(plots, f"{i}-{re.sub(r'[^a-z]+', '-', title.lower()).strip('-')}.png")
        plot(title, rows, path)
        lines.append(f"![{title}]({os.path.relpath(path, ROOT)})")
    lines.append(f"![a cold replica](benches/load/plots/4-cold-replica.png)")
    kinds = [f"{name}: {json.dumps(r['error_kinds'])}" for name, r in results.items() if r.get("error_kinds")]
    if kinds:
        lines += ["", "Load-tool errors by kind: " + "; ".join(kinds) + "."]
    for name, soak in soaks.items():
        d = soak["data"]
        lines += ["", f"Soak, reveal {name}: {d['rps']:.0f} req/s answered, status codes "
                  f"{json.dumps(d['statuses'])}, latency from when each request was due (examples/openload.rs, "
                  f"after a fill of the 90,000 keys by wrk, fill.lua) p50 {d['p50']:.2f} ms, "
                  f"p99 {d['p99']:.2f} ms, p99.9 {d['p99.9']:.2f} ms, max {d['max']:.0f} ms, the worst second's p99 "
                  f"{d['worst_second_p99']:.2f} ms; reveals "
                  f"{json.dumps({k: round(v) for k, v in soak['reveals'].items()})}."]
        lines += ["", f"Soak RSS samples, reveal {name} (s, MiB): "
                  + ", ".join(f"{t}:{m:.1f}" for t, m in soak["samples"]), ""]
    # What others write stays: the fleet's section, the profile's findings.
    old = open(os.path.join(ROOT, "BENCHMARKS.md")).read() if os.path.exists(os.path.join(ROOT, "BENCHMARKS.md")) else ""
    for markers in KEPT_SECTIONS:
        kept = section(old, markers)
        if kept:
            lines += ["", kept, ""]
    open(os.path.join(ROOT, "BENCHMARKS.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
