-- Every request a new seller and ad: nothing is cached, every source is asked.
-- Arguments: category, then the remainder of user_id mod 4 (0: call tracking on
-- after cold.sh's webhook; 1: off). Category 9 sells anonymous numbers. A third
-- argument offsets the sellers, so runs against one gateway never share a key.
local counter = 0
local thread_id = 0
function setup(thread)
  thread:set("thread_id", thread_id)
  thread_id = thread_id + 1
end
function init(args)
  category = args[1] or "9"
  remainder = tonumber(args[2] or "0")
  offset = tonumber(args[3] or "0")
end
function request()
  counter = counter + 1
  local k = offset + thread_id * 1000000 + counter
  return wrk.format("GET", "/v1/public-phone?user_id=" .. (k * 4 + remainder) .. "&ad_id=" .. k .. "&category_id=" .. category)
end
