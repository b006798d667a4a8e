-- Every request from one of 1,000 viewers (X-Viewer-Id), as a backend in front
-- would send them: each answer is a reveal with a viewer id.
local n = 0
request = function()
  n = n + 1
  return wrk.format("GET", nil, { ["X-Viewer-Id"] = "viewer-" .. (n % 1000) })
end
