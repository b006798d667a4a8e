-- Walks every key of the soak once, then again (hits): user_id 1000..9999,
-- ad_id 10..19, category 1, the key space of harness.py's soak, so the soak
-- that follows measures a filled cache, not the fill's queue.
local counter = 0
function request()
  local k = counter
  counter = counter + 1
  k = k % 90000
  return wrk.format("GET", "/v1/public-phone?user_id=" .. (1000 + math.floor(k / 10)) .. "&ad_id=" .. (10 + k % 10) .. "&category_id=1")
end
