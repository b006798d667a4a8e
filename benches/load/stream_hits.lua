-- The hit path on a recorded stream (stream.py: one request path a line): sends
-- the file's lines in order and starts over at its end, for as long as wrk
-- runs, every request with an X-Viewer-Id as viewer.lua sends it (one of 1,000
-- viewers), so each answer is a reveal with a viewer id. No response() hook,
-- as viewer.lua has none: the load tool's own cost per request stays that of
-- the fixed-key runs beside it.
--
--   wrk -t1 -c64 -d10s -s benches/load/stream_hits.lua URL -- STREAM_FILE
--
-- Run it after one pass of replay.lua over the same file: that pass fills the
-- caches (first sight of a key is a miss, not the hit path), this one measures.
local lines, n = {}, 0

function init(args)
  local file = args[1] or error("stream_hits.lua: the stream file is the first argument")
  for line in io.lines(file) do
    if #line > 0 then
      lines[#lines + 1] = line
    end
  end
end

function request()
  n = n + 1
  return wrk.format("GET", lines[(n - 1) % #lines + 1], { ["X-Viewer-Id"] = "viewer-" .. (n % 1000) })
end
