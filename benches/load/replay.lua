-- Replays a recorded stream (stream.py: one request path a line) once, in order,
-- then stops: wrk exits by itself when every request has been answered.
--
--   wrk -t T -c C -d 3600s -s benches/load/replay.lua URL -- STREAM_FILE T
--
-- T must be given twice (wrk does not tell a script its thread count). Thread k
-- of T sends lines k+1, k+1+T, k+1+2T, ... over its connections, so the file's
-- order holds up to the requests in flight. -d is only an upper bound. A thread
-- whose lines are all answered stops; its connections idle meanwhile (delay),
-- so no request outside the file is sent. The last thread to finish sends wrk
-- SIGINT, which ends wrk's wait and prints its report (latency over the file's
-- requests alone). Each thread leaves a marker file next to os.tmpname()'s.
local next_id = 0
local run = nil
function setup(thread)
  run = run or os.tmpname()
  thread:set("id", next_id)
  thread:set("run", run)
  next_id = next_id + 1
end

local lines, reserved, sent, answered, threads, id, marker_base = {}, 0, 0, 0, 1, 0, nil

function init(args)
  local file = args[1] or error("replay.lua: the stream file is the first argument")
  threads = tonumber(args[2] or "1")
  id = wrk.thread:get("id")
  marker_base = wrk.thread:get("run")
  local n = 0
  for line in io.lines(file) do
    if n % threads == id and #line > 0 then
      lines[#lines + 1] = line
    end
    n = n + 1
  end
end

-- wrk asks delay() before each request() of a connection, and other
-- connections may ask between the two: a line is reserved here, so no line is
-- sent twice. Every line reserved: idle until the thread stops.
function delay()
  if reserved >= #lines then
    return 3600000
  end
  reserved = reserved + 1
  return 0
end

function request()
  sent = sent + 1
  return wrk.format("GET", lines[math.min(sent, #lines)])
end

local function finished()
  local mine = io.open(marker_base .. ".done" .. id, "w")
  mine:close()
  for k = 0, threads - 1 do
    local f = io.open(marker_base .. ".done" .. k, "r")
    if not f then
      return
    end
    f:close()
  end
  -- Every thread is done: the last one ends wrk's wait. From the background, a
  -- moment later: wrk ignores SIGINT while os.execute runs, and by then every
  -- thread has left, so the signal reaches the main thread (sh's parent is wrk).
  os.execute("(sleep 0.2; kill -INT $PPID) >/dev/null 2>&1 &")
  for k = 0, threads - 1 do
    os.remove(marker_base .. ".done" .. k)
  end
  os.remove(marker_base)
end

function response(status, headers, body)
  answered = answered + 1
  if answered == #lines then
    finished()
    wrk.thread:stop()
  end
end
