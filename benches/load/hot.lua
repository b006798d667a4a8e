-- A sale-day mix: ad popularity falls off as 1/rank (Zipf, s = 1) over 10,000
-- ads of 2,000 sellers, so a few hot ads take most requests and most answers come
-- from the caches. Deterministic: a fixed-seed generator per thread.
local ads = 10000
local weights, total = {}, 0
for rank = 1, ads do
  total = total + 1 / rank
  weights[rank] = total
end
local seed = 12345
local function random()
  seed = (seed * 1103515245 + 12345) % 2147483648
  return seed / 2147483648
end
local function pick()
  local x = random() * total
  local lo, hi = 1, ads
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if weights[mid] < x then lo = mid + 1 else hi = mid end
  end
  return lo
end
function request()
  local ad = pick()
  local user = (ad % 2000) + 1
  local category = (ad % 5 == 0) and 9 or 1
  return wrk.format("GET", "/v1/public-phone?user_id=" .. user .. "&ad_id=" .. ad .. "&category_id=" .. category)
end
