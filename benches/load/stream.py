#!/usr/bin/env python3
"""Records one request stream, deterministically: a file of request paths, one a
line, that `replay.lua` makes wrk send once each, in order, then stop. One
recorded stream is what the fleet runs (fleet.py) and the hit-path runs
(harness.py) replay, so every figure taken on it is taken on the same requests.

The shape is a sale day's: ad popularity falls off as a Zipf law (the ad of rank
r is asked for in proportion to 1/r^s) over `--ads` ads of `--sellers` sellers,
and one seller, the sale's, owns the `--hot-ads` most popular ads. At the
defaults (s = 1.1 over 2,000,000 ads) the first rank alone takes about 12% of the
requests, so the sale's seller does. `--hot-share` sets that seller's share
instead (its ads then keep a Zipf law among themselves, every other ad its
weight relative to the rest).

Every request is `GET /v1/public-phone?user_id=U&ad_id=A&category_id=C`, as the
other load scripts send it. The ids are chosen so the upstream simulator
(src/sim/mod.rs) answers as real traffic sees it:
- the rank-to-ad map is a fixed permutation, so popular ads are spread over
  the id space rather than being ads 1, 2, 3;
- an ad's seller is a hash of the ad id (each seller has about ads/sellers
  ads); the simulator has no real number for sellers whose id is a multiple of
  50, so about 2% of sellers answer 404 (their ads' requests are the stream's
  404s, unless the ad's anonymous number answers first);
- an ad whose id is a multiple of 5 is in category 9 (anonymous numbers by
  default), the rest in category 1; the simulator connects an anonymous number
  when (user_id + ad_id) is a multiple of 3;
- sellers 4, 8, 12, ... up to 48,000 are the simulator's call-tracking sellers
  (when the gateway follows its status feed).
The sale's seller is 77,777: it has a real number and no call tracking.

Same arguments, same file: the generator is Python's seeded Mersenne Twister,
stable across Python versions. A summary (distinct keys, the sale's share, the
predicted 404 share, the top ads' shares) goes to stderr, or as JSON to
`--summary PATH`.

    benches/load/stream.py [--out PATH] [--requests 300000] [--s 1.1]
        [--ads 2000000] [--sellers 200000] [--hot-ads 1] [--hot-share F]
        [--seed 38] [--summary PATH]

The default output is target/stream/zipf-<requests>-s<s>-seed<seed>.txt; the
path written is printed on stdout (nothing else is).
"""
import argparse, bisect, itertools, json, os, random, sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOT_SELLER = 77_777
# A prime that divides no ad count used here: rank -> ad id is a permutation.
STRIDE = 1_000_003
MASK = (1 << 64) - 1


def mix(x):
    """splitmix64, as the simulator's `mix`."""
    x = (x + 0x9E3779B97F4A7C15) & MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def ad_of_rank(rank, ads):
    return ((rank - 1) * STRIDE) % ads + 1


def seller_of(ad_id, rank, args):
    if rank <= args.hot_ads:
        return HOT_SELLER
    seller = mix(ad_id) % args.sellers + 1
    # Only the sale's ads are the sale seller's.
    return seller + 1 if seller == HOT_SELLER else seller


def category_of(ad_id):
    return 9 if ad_id % 5 == 0 else 1


def predicted_status(user_id, ad_id, category):
    """What the simulator behind a gateway at its defaults answers (no feed)."""
    if category == 9 and (user_id + ad_id) % 3 == 0:
        return 200
    return 404 if user_id % 50 == 0 else 200


def weights(args):
    w = [r ** -args.s for r in range(1, args.ads + 1)]
    if args.hot_share is not None:
        hot, rest = sum(w[: args.hot_ads]), sum(w[args.hot_ads:])
        scale = args.hot_share / (1 - args.hot_share) * rest / hot
        for i in range(args.hot_ads):
            w[i] *= scale
    return w


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out")
    p.add_argument("--requests", type=int, default=300_000)
    p.add_argument("--s", type=float, default=1.1)
    p.add_argument("--ads", type=int, default=2_000_000)
    p.add_argument("--sellers", type=int, default=200_000)
    p.add_argument("--hot-ads", type=int, default=1)
    p.add_argument("--hot-share", type=float)
    p.add_argument("--seed", type=int, default=38)
    p.add_argument("--summary")
    args = p.parse_args()
    if args.ads % STRIDE == 0 or not 1 <= args.hot_ads <= args.ads or args.sellers < HOT_SELLER + 1:
        sys.exit("stream: --ads must not be a multiple of 1,000,003, 1 <= --hot-ads <= --ads, --sellers > 77,777")
    if args.hot_share is not None and not 0 < args.hot_share < 1:
        sys.exit("stream: --hot-share is a fraction, 0 < F < 1")
    out = args.out or os.path.join(
        ROOT, "target", "stream", f"zipf-{args.requests}-s{args.s}-seed{args.seed}.txt")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)

    cumulative = list(itertools.accumulate(weights(args)))
    total = cumulative[-1]
    rng = random.Random(args.seed)
    ranks = [min(bisect.bisect_left(cumulative, rng.random() * total), args.ads - 1) + 1
             for _ in range(args.requests)]

    by_rank, sellers, not_found, hot = {}, set(), 0, 0
    with open(out + ".tmp", "w") as f:
        for rank in ranks:
            ad = ad_of_rank(rank, args.ads)
            user = seller_of(ad, rank, args)
            category = category_of(ad)
            f.write(f"/v1/public-phone?user_id={user}&ad_id={ad}&category_id={category}\n")
            by_rank[rank] = by_rank.get(rank, 0) + 1
            sellers.add(user)
            not_found += predicted_status(user, ad, category) == 404
            hot += user == HOT_SELLER
    os.replace(out + ".tmp", out)

    n = args.requests
    top = sorted(by_rank.items(), key=lambda kv: -kv[1])[:5]
    summary = {
        "path": out,
        "requests": n, "s": args.s, "ads": args.ads, "sellers": args.sellers,
        "hot_ads": args.hot_ads, "hot_share_asked": args.hot_share, "seed": args.seed,
        "distinct_ads": len(by_rank), "distinct_sellers": len(sellers),
        "hot_seller": HOT_SELLER, "hot_seller_share": round(hot / n, 4),
        "predicted_404_share": round(not_found / n, 4),
        "top_ads": [{"ad_id": ad_of_rank(r, args.ads), "share": round(c / n, 4)} for r, c in top],
    }
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump(summary, f, indent=1)
    print(json.dumps(summary), file=sys.stderr)
    print(out)


if __name__ == "__main__":
    main()
