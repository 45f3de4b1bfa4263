-- wrk script for perf/proxy_compare.sh: POST one fixed body, and print one machine-readable
-- line when the run ends.
--
-- Environment:
--   BODY_FILE  the request body (sent as is, Content-Type: application/json)
--   THINK_MS   if > 0, each connection waits this long after a response before its next
--              request (wrk's delay() hook; millisecond resolution). Used for the paced,
--              below-saturation latency runs; 0 or unset = closed loop at full speed.

local f = assert(io.open(assert(os.getenv("BODY_FILE"), "BODY_FILE not set"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"

local think_ms = tonumber(os.getenv("THINK_MS") or "0")
if think_ms > 0 then
  function delay()
    return think_ms
  end
end

-- errors.status counts responses with status >= 400 (wrk's definition); the socket errors are
-- connect/read/write failures and timeouts.
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%.1f p99_us=%.1f status_errors=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
