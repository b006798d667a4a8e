#!/usr/bin/env python3
"""How many calls at once each seller needs of each upstream, on the recorded
stream (stream.py): a seller's calls in flight to an upstream are its distinct
cold keys whose calls overlap (calls for one key coalesce, and a key answered
stays cached), so this counts, per seller and upstream, the most first-seen keys
within any window of `rate x latency` consecutive requests. Keys: real phone
(seller, ad); anonymous (seller, ad), only for ads in category 9; call tracking
(seller, phone), one real phone per seller. Prints the hottest sellers' needs.

    benches/load/seller_need.py STREAM [--rate 20000] [--latency-ms 300]
"""
import argparse, collections, urllib.parse

p = argparse.ArgumentParser()
p.add_argument("stream")
p.add_argument("--rate", type=float, default=20000)
p.add_argument("--latency-ms", type=float, default=300)
a = p.parse_args()
window = max(1, int(a.rate * a.latency_ms / 1000))
seen = {"real_phone": set(), "anonymous": set(), "calltracking": set()}
starts = {k: collections.defaultdict(list) for k in seen}
requests = collections.Counter()
with open(a.stream) as f:
    for i, line in enumerate(f):
        q = dict(urllib.parse.parse_qsl(line.strip().split("?", 1)[1]))
        user, ad, cat = int(q["user_id"]), int(q["ad_id"]), int(q["category_id"])
        requests[user] += 1
        keys = {"real_phone": (user, ad), "calltracking": (user, 0)}
        if cat == 9:
            keys["anonymous"] = (user, ad)
        for up, key in keys.items():
            if key not in seen[up]:
                seen[up].add(key)
                starts[up][user].append(i)


def most_in_window(idx):
    best, lo = 0, 0
    for hi, x in enumerate(idx):
        while x - idx[lo] >= window:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


print(f"window: {window} requests ({a.rate:.0f} req/s x {a.latency_ms:.0f} ms)")
for up in seen:
    need = {u: most_in_window(v) for u, v in starts[up].items()}
    top = sorted(need.items(), key=lambda kv: -kv[1])[:3]
    hot = max(requests, key=requests.get)
    print(f"{up}: most any seller needs {top[0][1]} (top: {top}); "
          f"the hottest seller {hot} ({requests[hot]} requests) needs {need.get(hot, 0)}")
