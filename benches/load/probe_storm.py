#!/usr/bin/env python3
"""Probes and a token holder while token-less clients reconnect to the admin
port as fast as they are closed (docs/operations.md, "Probes under a reconnect
storm").

Starts the gateway (GATEWAY_BIN, else target/release, else target/debug) on
127.0.0.1 with an SQLite file in a temporary directory, then for --seconds:
- --clients storm clients (one process, asyncio): each connects to the admin
  port, sends a GET of an admin path without a token, reads the 401 to its
  close, and connects again at once;
- a prober (another process): every 100 ms a GET /healthz, then /readyz, on a
  new connection to --probe-on (admin, or probe: the listener of
  server.probe_addr), each bounded at 5 s;
- a token holder (a third process): webhook POSTs with the token one after
  another, each on a new connection with a 5 s connect timeout and a 10 s
  answer timeout.
Prints the probes' p50, p99 and max and how many failed, and the token holder's
requests answered 200 and failed. Everything binds 127.0.0.1 and stops by
itself (the gateway is killed at the end).

    benches/load/probe_storm.py [--clients 600] [--seconds 30] [--probe-on admin|probe]
"""
import argparse, asyncio, multiprocessing, os, socket, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOKEN = "probe-storm-token-0123456789abcdef"
PUBLIC, ADMIN, PROBE = 18280, 18281, 18282


def binary():
    if os.environ.get("GATEWAY_BIN"):
        return os.environ["GATEWAY_BIN"]
    for profile in ("release", "debug"):
        path = os.path.join(ROOT, "target", profile, "phones-gateway")
        if os.path.exists(path):
            return path
    sys.exit("no phones-gateway build: cargo build --release first")


def get(port, path, headers="", body=None, connect_timeout=5.0, timeout=5.0):
    """One request on a new connection; the status, or None on a failure."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=connect_timeout) as s:
            s.settimeout(timeout)
            method = "POST" if body is not None else "GET"
            head = f"{method} {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{headers}"
            if body is not None:
                head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n"
            s.sendall((head + "\r\n").encode() + (body or b""))
            got = b""
            while b"\r\n" not in got:
                chunk = s.recv(4096)
                if not chunk:
                    return None
                got += chunk
            return int(got[9:12])
    except OSError:
        return None


async def storm_client(stop):
    head = b"GET /admin/v1/calltracking/statuses/1 HTTP/1.1\r\nhost: x\r\n\r\n"
    while time.time() < stop:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", ADMIN), 5)
            writer.write(head)
            while await asyncio.wait_for(reader.read(4096), 5):
                pass
            writer.close()
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.01)


def storm(clients, stop):
    async def run():
        await asyncio.gather(*(storm_client(stop) for _ in range(clients)))
    asyncio.run(run())


def prober(port, stop, out):
    latencies, failed = [], 0
    while time.time() < stop:
        for path in ("/healthz", "/readyz"):
            start = time.perf_counter()
            status = get(port, path)
            if status == 200:
                latencies.append(time.perf_counter() - start)
            else:
                failed += 1
        time.sleep(0.1)
    out.put(("probe", latencies, failed))


def token_holder(stop, out):
    body = b'{"items":[{"user_id":7,"enabled":true,"version":1}]}'
    version, ok, failed = 1, 0, 0
    while time.time() < stop:
        version += 1
        item = body.replace(b'"version":1', f'"version":{version}'.encode())
        status = get(ADMIN, "/admin/v1/calltracking/statuses",
                     headers=f"authorization: Bearer {TOKEN}\r\n", body=item, timeout=10)
        if status == 200:
            ok += 1
        else:
            failed += 1
    out.put(("token", ok, failed))


def quantile(values, q):
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--clients", type=int, default=600)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--probe-on", choices=("admin", "probe"), default="probe")
    args = parser.parse_args()
    dir = tempfile.mkdtemp()
    env = dict(os.environ,
               PHONES_GATEWAY__SERVER__PUBLIC_ADDR=f"127.0.0.1:{PUBLIC}",
               PHONES_GATEWAY__SERVER__ADMIN_ADDR=f"127.0.0.1:{ADMIN}",
               PHONES_GATEWAY__ADMIN__TOKEN=TOKEN,
               PHONES_GATEWAY__DATABASE__URL=f"sqlite://{dir}/gw.db",
               PHONES_GATEWAY__LOG__FILTER="warn")
    if args.probe_on == "probe":
        env["PHONES_GATEWAY__SERVER__PROBE_ADDR"] = f"127.0.0.1:{PROBE}"
    gateway = subprocess.Popen([binary(), "serve"], env=env, stdout=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while get(ADMIN, "/readyz", timeout=1) != 200:
            if time.time() > deadline or gateway.poll() is not None:
                sys.exit("the gateway did not become ready")
            time.sleep(0.1)
        stop = time.time() + args.seconds
        out = multiprocessing.Queue()
        port = PROBE if args.probe_on == "probe" else ADMIN
        workers = [multiprocessing.Process(target=storm, args=(args.clients, stop))] if args.clients else []
        workers += [multiprocessing.Process(target=prober, args=(port, stop, out)),
                    multiprocessing.Process(target=token_holder, args=(stop, out))]
        for w in workers:
            w.start()
        results = dict((r[0], r[1:]) for r in (out.get(timeout=args.seconds + 60) for _ in range(2)))
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
        latencies, failed = results["probe"]
        ok, token_failed = results["token"]
        ms = lambda s: f"{s * 1000:.1f} ms"
        print(f"clients={args.clients} probes on {args.probe_on} ({args.seconds:.0f} s): "
              f"probes {len(latencies)} answered, {failed} failed; p50 {ms(quantile(latencies, 0.5))}, "
              f"p99 {ms(quantile(latencies, 0.99))}, max {ms(max(latencies, default=float('nan')))}; "
              f"token holder {ok} answered 200, {token_failed} failed")
    finally:
        gateway.kill()
        gateway.wait()


if __name__ == "__main__":
    main()
