#!/usr/bin/env bash
# Interop: drive toolgate-server and the example server bookings-mcp (examples/bookings) with the
# official MCP SDK clients, over stdio; and toolgate-server over Streamable HTTP with bearer tokens
# (python_http_client.py, typescript_http_client.mjs), unless the binary given was built without
# HTTP support (the deployment build, `--no-default-features`), which is then said and skipped.
#
#   tests/interop/run.sh [SERVER_BINARY [BOOKINGS_BINARY]]
#
# Without SERVER_BINARY, builds it with `cargo build --locked -p toolgate-server`; without
# BOOKINGS_BINARY, builds bookings-mcp with `cargo build --locked -p bookings`.
# Python: a virtual environment under TARGET/interop/venv (TARGET is $CARGO_TARGET_DIR, else
# ./target), installed from requirements.txt (mcp==2.1.1 and every dependency, pinned with hashes)
# and reused while that file is unchanged. To change the pin, edit requirements.in and run
#   pip-compile --generate-hashes --strip-extras --no-emit-index-url --no-emit-find-links \
#     --output-file requirements.txt requirements.in    (pip-tools, with Python 3.11)
# TypeScript: `npm ci` in tests/interop from
# package-lock.json (@modelcontextprotocol/sdk 1.32.2, @modelcontextprotocol/server-filesystem
# 2026.8.31), skipped while node_modules matches it.
# Each client starts its own server processes with fresh temporary ledgers; see the scripts.
# Then python_proxy_client.py puts `toolgate-server proxy` in front of the MCP project's
# @modelcontextprotocol/server-filesystem (from node_modules) and drives it with the Python SDK
# client under fixtures/policy-proxy-filesystem.json (every mutating tool denied) and
# fixtures/policy-proxy-filesystem-write.json (write_file exactly-once per idempotency key); the
# proxy is in every build, the deployment build included.
# Then toolgate-kit runs its matrix against a server we did not write, the MCP project's
# filesystem server (crates/toolgate-kit/tests/filesystem_server.rs, ignored by plain
# `cargo test`); it does not depend on the server binaries given, so a second run of this
# script with another build skips it with TOOLGATE_INTEROP_KIT=0 (.ci/run does).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$root/target}"
cache_dir="$target_dir/interop"
policy="$root/fixtures/policy.json"
confirm_policy="$root/fixtures/policy-http-confirm.json"
bookings_policy="$root/examples/bookings/policy.json"
proxy_policy="$root/fixtures/policy-proxy-filesystem.json"
proxy_write_policy="$root/fixtures/policy-proxy-filesystem-write.json"

die() {
    echo "interop: $*" >&2
    exit 1
}

sha256() { sha256sum "$1" | cut -d' ' -f1; }

step_start=$SECONDS
step() {
    echo "-- $* (+$((SECONDS - step_start))s)"
}

# --- the server -------------------------------------------------------------------------------
if [[ $# -gt 2 ]]; then
    die "usage: tests/interop/run.sh [SERVER_BINARY [BOOKINGS_BINARY]]"
fi
if [[ $# -ge 1 ]]; then
    server="$1"
else
    step "building toolgate-server"
    (cd "$root" && cargo build --locked -q -p toolgate-server)
    server="$target_dir/debug/toolgate-server"
fi
if [[ $# -eq 2 ]]; then
    bookings="$2"
else
    step "building bookings-mcp (examples/bookings)"
    (cd "$root" && cargo build --locked -q -p bookings --bin bookings-mcp)
    bookings="$target_dir/debug/bookings-mcp"
fi
absolute() { echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"; }
for binary in "$server" "$bookings"; do
    [[ -x "$binary" ]] || die "server binary '$binary' does not exist or is not executable"
done
server="$(absolute "$server")"
bookings="$(absolute "$bookings")"
for file in "$policy" "$confirm_policy" "$bookings_policy" "$proxy_policy" "$proxy_write_policy"; do
    [[ -f "$file" ]] || die "missing $file"
done

# Streamable HTTP: `token list` on an empty ledger succeeds where the build has it, and names the
# missing feature where it does not; anything else is an error, not a reason to skip.
probe_dir="$(mktemp -d)"
if probe_out="$("$server" --ledger "$probe_dir/ledger" token list 2>&1)"; then
    http=1
elif [[ "$probe_out" == *"has no HTTP support"* ]]; then
    http=0
else
    rm -rf "$probe_dir"
    die "cannot tell whether $server serves HTTP: \`token list\` said: $probe_out"
fi
rm -rf "$probe_dir"
# The proxy has no feature flag: every build must have it.
proxy_help="$("$server" proxy --help 2>&1)" ||
    die "\`$server proxy --help\` failed, every build has the proxy: $proxy_help"

# --- Python: the official SDK, mcp==2.1.1 ------------------------------------------------------
python="${PYTHON:-python3}"
command -v "$python" >/dev/null || die "'$python' not found; the Python SDK client needs Python >= 3.11"
# requirements.txt was compiled for Python 3.11 (older ones need backports it does not list).
"$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$("$python" --version 2>&1) is too old: tests/interop/requirements.txt is compiled for Python 3.11"

venv="$cache_dir/venv"
requirements="$here/requirements.txt"
stamp="$venv/.toolgate-requirements.sha256"
if [[ -x "$venv/bin/python" && -f "$stamp" && "$(cat "$stamp")" == "$(sha256 "$requirements")" ]]; then
    step "reusing $venv"
else
    step "creating $venv and installing tests/interop/requirements.txt (mcp==2.1.1, hashes required)"
    rm -rf "$venv"
    mkdir -p "$cache_dir"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input \
        --require-hashes --only-binary=:all: -r "$requirements" ||
        die "pip could not install tests/interop/requirements.txt into $venv"
    sha256 "$requirements" >"$stamp"
fi

step "python SDK client"
"$venv/bin/python" "$here/python_client.py" "$server" "$policy"
step "python SDK client, bookings-mcp"
"$venv/bin/python" "$here/bookings_client.py" "$bookings" "$bookings_policy"
if [[ $http == 1 ]]; then
    step "python SDK client over HTTP"
    "$venv/bin/python" "$here/python_http_client.py" "$server" "$policy" "$confirm_policy"
else
    step "skipping the python SDK client over HTTP: this toolgate-server build has no HTTP support"
fi

# --- TypeScript: the official SDK, @modelcontextprotocol/sdk ----------------------------------
command -v node >/dev/null || die "node not found; the TypeScript SDK client needs Node >= 18"
command -v npm >/dev/null || die "npm not found; the TypeScript SDK client needs it to install the SDK"
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' ||
    die "Node $(node --version) is too old; @modelcontextprotocol/sdk needs Node >= 18"

lock="$here/package-lock.json"
npm_stamp="$here/node_modules/.toolgate-package-lock.sha256"
if [[ -f "$npm_stamp" && "$(cat "$npm_stamp")" == "$(sha256 "$lock")" ]]; then
    step "reusing tests/interop/node_modules"
else
    step "npm ci in tests/interop"
    (cd "$here" && npm ci --no-audit --no-fund --loglevel=error) || die "npm ci failed in tests/interop"
    sha256 "$lock" >"$npm_stamp"
fi

step "typescript SDK client"
node "$here/typescript_client.mjs" "$server" "$policy"
step "typescript SDK client, bookings-mcp"
node "$here/bookings_client.mjs" "$bookings" "$bookings_policy"
if [[ $http == 1 ]]; then
    step "typescript SDK client over HTTP"
    node "$here/typescript_http_client.mjs" "$server" "$policy" "$confirm_policy"
else
    step "skipping the typescript SDK client over HTTP: this toolgate-server build has no HTTP support"
fi

# --- toolgate-server proxy in front of @modelcontextprotocol/server-filesystem ---------------------
# Needs the venv above and node_modules: the Python SDK client drives the proxy, node runs the
# filesystem server as its upstream.
fs_server="$here/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
[[ -f "$fs_server" ]] || die "missing $fs_server; npm ci in tests/interop should have installed it"
step "python SDK client through toolgate-server proxy, in front of @modelcontextprotocol/server-filesystem"
"$venv/bin/python" "$here/python_proxy_client.py" "$server" "$fs_server" "$proxy_policy" "$proxy_write_policy"

# --- toolgate-kit against @modelcontextprotocol/server-filesystem --------------------------------
kit="${TOOLGATE_INTEROP_KIT:-1}"
case "$kit" in
1)
    step "toolgate-kit matrix against @modelcontextprotocol/server-filesystem (14 tools, 3 liars)"
    (cd "$root" && TOOLGATE_FS_SERVER="$fs_server" \
        cargo test --locked -q -p toolgate-kit --test filesystem_server -- --ignored) ||
        die "toolgate-kit against the filesystem server failed (the report is in the output above)"
    ;;
0) step "skipping the toolgate-kit matrix (TOOLGATE_INTEROP_KIT=0)" ;;
*) die "TOOLGATE_INTEROP_KIT must be 0 or 1, not '$kit'" ;;
esac

step "interop passed"
