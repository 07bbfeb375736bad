// A loopback reverse proxy that adds `Authorization: Bearer <token>` to every request, for the MCP
// conformance suite (tests/conformance/run.sh): its runner has no option to send a bearer token,
// and toolgate-server answers 401 to any request without one.
//
//   TOOLGATE_PROXY_TOKEN=tgt_... node bearer_proxy.mjs http://127.0.0.1:PORT
//
// Listens on 127.0.0.1 on a free port and prints one line on stdout once bound:
//   bearer_proxy: listening on http://127.0.0.1:PORT (-> UPSTREAM)
// Every request is forwarded to UPSTREAM with its method, path, query and headers as received
// (Host, Origin and the MCP headers included, so the server judges what the client sent), the
// client's Authorization replaced by ours, and both bodies streamed as they come: status, status
// text and response headers are passed back unchanged, and an SSE response is flushed event by
// event. Only hop-by-hop headers (RFC 9110 section 7.6.1) are not forwarded; Node frames each side
// itself. The token comes from the environment, never from the command line (visible to `ps`).
// With TOOLGATE_PROXY_LOG=FILE, every exchange is appended to FILE as it passes (request line,
// headers and body, then status, headers and body, each line prefixed with the exchange's
// number), without the token. Node's standard library only. Stops on SIGTERM or SIGINT.
import fs from "node:fs";
import http from "node:http";

const usage = "usage: TOOLGATE_PROXY_TOKEN=TOKEN node bearer_proxy.mjs UPSTREAM_URL";
if (process.argv.length !== 3) {
  console.error(usage);
  process.exit(2);
}
const upstream = new URL(process.argv[2]);
const token = process.env.TOOLGATE_PROXY_TOKEN;
if (upstream.protocol !== "http:" || !token) {
  console.error(usage);
  process.exit(2);
}

const logFile = process.env.TOOLGATE_PROXY_LOG;
const logStream = logFile ? fs.createWriteStream(logFile, { flags: "a" }) : null;
let exchanges = 0;
function log(n, arrow, text) {
  if (!logStream) return;
  for (const line of String(text).split("\n")) logStream.write(`#${n} ${arrow} ${line}\n`);
}
function logHeaders(n, arrow, raw) {
  for (let i = 0; i < raw.length; i += 2) {
    const value = raw[i].toLowerCase() === "authorization" ? "(not logged)" : raw[i + 1];
    log(n, arrow, `${raw[i]}: ${value}`);
  }
}

const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
]);

// Headers as [name, value, name, value, ...], order, case and repeats kept, minus hop-by-hop
// ones, those the Connection header names, and (requests only) `drop`.
function forwardable(raw, drop) {
  const named = new Set();
  for (let i = 0; i < raw.length; i += 2) {
    if (raw[i].toLowerCase() === "connection") {
      for (const name of raw[i + 1].split(",")) named.add(name.trim().toLowerCase());
    }
  }
  const out = [];
  for (let i = 0; i < raw.length; i += 2) {
    const name = raw[i].toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name) || name === drop) continue;
    out.push(raw[i], raw[i + 1]);
  }
  return out;
}

const proxy = http.createServer((req, res) => {
  const n = ++exchanges;
  log(n, ">", `${req.method} ${req.url} HTTP/${req.httpVersion}`);
  logHeaders(n, ">", req.rawHeaders);
  if (logStream) req.on("data", (chunk) => log(n, ">", chunk.toString("utf8")));
  const headers = forwardable(req.rawHeaders, "authorization");
  headers.push("Authorization", `Bearer ${token}`);
  const out = http.request({
    host: upstream.hostname,
    port: upstream.port,
    method: req.method,
    path: req.url,
    headers,
    // One upstream connection per request: no reused keep-alive socket that the server may
    // have closed in between.
    agent: false,
  });
  out.on("response", (answer) => {
    log(n, "<", `${answer.statusCode} ${answer.statusMessage}`);
    logHeaders(n, "<", answer.rawHeaders);
    if (logStream) answer.on("data", (chunk) => log(n, "<", chunk.toString("utf8")));
    answer.on("end", () => log(n, "<", "(end)"));
    res.writeHead(answer.statusCode, answer.statusMessage, forwardable(answer.rawHeaders));
    // Send the headers now: an SSE stream may stay silent for a while after them.
    res.flushHeaders();
    answer.pipe(res);
    // The server cut the response short: cut ours too, so the client sees it.
    answer.on("error", () => res.destroy());
    answer.on("close", () => {
      if (!answer.complete) res.destroy();
    });
  });
  out.on("error", (err) => {
    log(n, "!", `upstream error: ${err.message}`);
    if (!res.headersSent) {
      res.writeHead(502, { "content-type": "text/plain" });
      res.end(`bearer_proxy: upstream error: ${err.message}\n`);
    } else {
      res.destroy();
    }
  });
  // The client went away (a closed SSE stream, a timeout): close the upstream request too.
  res.on("close", () => out.destroy());
  req.on("error", () => out.destroy());
  req.pipe(out);
});
// Long-lived SSE streams: no idle timeout on the client side.
proxy.requestTimeout = 0;
proxy.timeout = 0;

proxy.listen(0, "127.0.0.1", () => {
  const { port } = proxy.address();
  console.log(`bearer_proxy: listening on http://127.0.0.1:${port} (-> ${upstream.origin})`);
});

for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    proxy.close();
    proxy.closeAllConnections();
    process.exit(0);
  });
}
