-- wrk script of benches/http_load.sh: one MCP tools/call per POST in the stateless 2026-07-28
-- flow (MCP-Protocol-Version, Mcp-Method, Mcp-Name headers; _meta with the protocol version and
-- the client's capabilities), as crates/toolgate-server/tests/http.rs sends them.
--
--   wrk ... -s http_load.lua URL -- MODE TOKEN TAG
--
-- MODE: read    read_ledger, the same body every time
--       new     write_note with a new request_id every request: TAG-<thread>-<counter>
--       replay  write_note cycling over 64 request_ids per thread (TAG-<thread>-r<n>): once
--               they are written (the driver's warm-up), every call is a replay. A thread has
--               at most 32 connections, so one request_id is never in flight twice (a second
--               call of a key in flight waits for the first in the gate: not a replay).
-- TOKEN: the bearer token (sent to every server; the ungated ones ignore it)
--
-- Every response is checked: HTTP 200, a JSON-RPC result without isError, and for write_note
-- the status the mode expects ("committed" for new, "replay" for replay). Anything else counts as
-- bad, and the first one is shown. done() prints one line for the driver:
--   RESULT requests=N seconds=S rps=R p50_us=.. p90_us=.. p99_us=.. max_us=.. connect=.. read=..
--          write=.. status=.. timeout=.. bad=.. committed=.. replay=..

local threads = {}
local next_id = 1

function setup(thread)
   thread:set("tid", next_id)
   next_id = next_id + 1
   table.insert(threads, thread)
end

local meta = '"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28",'
   .. '"io.modelcontextprotocol/clientCapabilities":{}}'

function init(args)
   mode = args[1] or "read"
   local token = args[2] or "none"
   tag = args[3] or "load"
   n = 0
   bad = 0
   committed = 0
   replayed = 0
   sample = ""
   local tool = "write_note"
   if mode == "read" then tool = "read_ledger" end
   headers = {
      ["Content-Type"] = "application/json",
      ["Accept"] = "application/json, text/event-stream",
      ["Authorization"] = "Bearer " .. token,
      ["MCP-Protocol-Version"] = "2026-07-28",
      ["Mcp-Method"] = "tools/call",
      ["Mcp-Name"] = tool,
   }
   if mode == "read" then
      local body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":'
         .. '{"name":"read_ledger","arguments":{},' .. meta .. '}}'
      fixed = wrk.format("POST", "/mcp", headers, body)
   end
end

function request()
   if fixed then
      return fixed
   end
   n = n + 1
   local rid
   if mode == "new" then
      rid = string.format("%s-%d-%d", tag, tid, n)
   else
      rid = string.format("%s-%d-r%d", tag, tid, n % 64)
   end
   local body = string.format(
      '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"write_note",'
         .. '"arguments":{"request_id":"%s","text":"load test note"},%s}}',
      n, rid, meta)
   return wrk.format("POST", "/mcp", headers, body)
end

function response(status, hdrs, body)
   local ok = status == 200 and body:find('"result"', 1, true) ~= nil
      and body:find('"isError":true', 1, true) == nil
   if ok and mode ~= "read" then
      if body:find('"status":"committed"', 1, true) then
         committed = committed + 1
         ok = mode == "new"
      elseif body:find('"status":"replay"', 1, true) then
         replayed = replayed + 1
         ok = mode == "replay"
      else
         ok = false
      end
   end
   if not ok then
      bad = bad + 1
      if sample == "" then
         sample = status .. " " .. string.sub(body, 1, 300)
      end
   end
end

function done(summary, latency, requests)
   local total_bad, total_committed, total_replay, first = 0, 0, 0, ""
   for _, thread in ipairs(threads) do
      total_bad = total_bad + thread:get("bad")
      total_committed = total_committed + thread:get("committed")
      total_replay = total_replay + thread:get("replayed")
      local s = thread:get("sample")
      if first == "" and s ~= nil then
         first = s
      end
   end
   local seconds = summary.duration / 1e6
   local e = summary.errors
   io.write(string.format(
      "RESULT requests=%d seconds=%.2f rps=%.1f p50_us=%d p90_us=%d p99_us=%d max_us=%d "
         .. "connect=%d read=%d write=%d status=%d timeout=%d bad=%d committed=%d replay=%d\n",
      summary.requests, seconds, summary.requests / seconds,
      latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
      e.connect, e.read, e.write, e.status, e.timeout, total_bad, total_committed, total_replay))
   if first ~= "" then
      io.write("FIRST_BAD " .. string.gsub(first, "\n", " ") .. "\n")
   end
end
