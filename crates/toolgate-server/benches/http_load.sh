#!/usr/bin/env bash
# HTTP load benchmark of `toolgate-server serve --http` (issue 20; docs/BENCHMARKS.md, "HTTP load").
#
# Drives the gated server (serve --http, bearer token) and its ungated peer (the same notes
# served by rmcp's StreamableHttpService with no gate and no authentication:
# examples/http_peer.rs) on loopback with wrk (Debian package `wrk`) and benches/http_load.lua:
# one stateless 2026-07-28 tools/call per POST. Each scenario (read_ledger, new write_note,
# write_note replay; 1 and 64 connections) runs in rounds; in each round every server runs once,
# in an order that alternates between rounds, so load changes hit them alike. Ratios are taken
# within a round and the table gives their median (and range) over rounds.
#
#   crates/toolgate-server/benches/http_load.sh [options]
#     --duration S     seconds of each measured run (default 10)
#     --warmup S       seconds of the warm-up run of each server before each scenario (default 3)
#     --rounds N       rounds per scenario (default 3)
#     --decompose      also measure `http_peer --mode gated-noauth`: the gate and its stores
#                      without authentication, to split the gap between the two
#     --scenarios LIST comma-separated, from read,write,replay (default all three)
#     --conns LIST     comma-separated connection counts (default 1,64)
#     --soak S         instead of the matrix: one S-second run of read_ledger at 64 connections
#                      against the gated server, its RSS sampled every 10 s
#     --syscalls       instead of the matrix: each scenario once per server under `strace -f -c`
#                      (attached to every thread of the running server), and the system calls
#                      per request. strace slows the servers down: counts only, no timing.
#     --no-build       use the binaries already built in $CARGO_TARGET_DIR/release
#
# The table gives, per scenario and server, the medians over rounds of p50, p99 (wrk's latency
# percentiles, microseconds), requests per second and the server's CPU time per request (user +
# system of all its threads, /proc/PID/stat), the errors of all rounds (connect, read, write,
# timeout, HTTP status >= 400, and responses that are not the expected result), the largest RSS
# after a round, and the ratios of p50 to the peers'.
#
# Builds (release, --locked) toolgate-server and the example http_peer into
# ${CARGO_TARGET_DIR:-target}. Ledgers go to a fresh directory under ${TMPDIR:-/tmp}, removed at
# the end. Only loopback is used; every run is bounded in time.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
target=${CARGO_TARGET_DIR:-$root/target}
policy=$root/fixtures/policy.json
lua=$here/http_load.lua

duration=10
warmup=3
rounds=3
soak=0
syscalls=0
build=1
servers=(gated ungated)
scenarios=read,write,replay
conns_list=1,64

while [ $# -gt 0 ]; do
    case $1 in
        --duration) duration=$2; shift 2 ;;
        --warmup) warmup=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --soak) soak=$2; shift 2 ;;
        --decompose) servers=(gated ungated gated-noauth); shift ;;
        --scenarios) scenarios=$2; shift 2 ;;
        --conns) conns_list=$2; shift 2 ;;
        --syscalls) syscalls=1; shift ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,38p' "$0"; exit 0 ;;
        *) echo "unknown option: $1 (see --help)" >&2; exit 2 ;;
    esac
done

if ! command -v wrk >/dev/null 2>&1; then
    echo "wrk is needed: apt-get install -y wrk" >&2
    exit 2
fi

if [ "$build" = 1 ]; then
    echo "building (release)..."
    (cd "$root" && cargo build --release --locked -q -p toolgate-server --bin toolgate-server --example http_peer)
fi
server_bin=$target/release/toolgate-server
peer_bin=$target/release/examples/http_peer
for bin in "$server_bin" "$peer_bin"; do
    [ -x "$bin" ] || { echo "missing $bin (build it, or drop --no-build)" >&2; exit 2; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/http-load.XXXXXX")
declare -A pid url
started=()
cleanup() {
    for p in "${started[@]}"; do
        kill -TERM "$p" 2>/dev/null || true
    done
    for p in "${started[@]}"; do
        wait "$p" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

unset RUST_LOG

# Waits for the "serving Streamable HTTP at URL" line of a server's stderr; prints the URL.
wait_url() {
    local log=$1 p=$2 found=""
    for _ in $(seq 1 600); do
        found=$(grep -o 'http://127\.0\.0\.1:[0-9]*/mcp' "$log" 2>/dev/null | head -n 1 || true)
        [ -n "$found" ] && { echo "$found"; return 0; }
        kill -0 "$p" 2>/dev/null || { echo "the server exited:" >&2; cat "$log" >&2; return 1; }
        sleep 0.1
    done
    echo "the server did not say where it listens:" >&2
    cat "$log" >&2
    return 1
}

token=""
start_server() {
    local name=$1 ledger=$work/$1
    case $name in
        gated)
            token=$("$server_bin" --policy "$policy" --ledger "$ledger" token create --principal bench)
            "$server_bin" --policy "$policy" --ledger "$ledger" serve --http 127.0.0.1:0 \
                2>"$work/$name.log" &
            ;;
        ungated|gated-noauth)
            "$peer_bin" --mode "$name" --policy "$policy" --ledger "$ledger" --addr 127.0.0.1:0 \
                2>"$work/$name.log" &
            ;;
    esac
    pid[$name]=$!
    started+=("${pid[$name]}")
    url[$name]=$(wait_url "$work/$name.log" "${pid[$name]}")
}

ticks=$(getconf CLK_TCK)
cpu_ticks() { # pid: user + system time of every thread so far, in clock ticks
    awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0
}

status_kib() { # pid field
    awk -v f="$2:" '$1 == f {print $2}' "/proc/$1/status" 2>/dev/null || echo 0
}

field() { # name line
    local value
    value=$(tr ' ' '\n' <<<"$2" | sed -n "s/^$1=//p")
    echo "${value:-0}"
}

median() { # values on stdin, one a line
    sort -g | awk '{v[NR] = $1} END {if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

range() { # values on stdin
    sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%s-%s", lo, hi}'
}

# run_wrk SERVER CONNS SECONDS MODE TAG: prints wrk's RESULT line (and FIRST_BAD, if any).
run_wrk() {
    local server=$1 conns=$2 seconds=$3 mode=$4 tag=$5 threads=2 out
    [ "$conns" -lt 2 ] && threads=1
    out=$work/wrk.out
    wrk -t "$threads" -c "$conns" -d "${seconds}s" --timeout 10s -s "$lua" "${url[$server]}" \
        -- "$mode" "$token" "$tag" >"$out" 2>&1 || { cat "$out" >&2; return 1; }
    grep -E '^(RESULT|FIRST_BAD)' "$out" || { cat "$out" >&2; return 1; }
}

context() {
    echo "date:    $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "commit:  $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "kernel:  $(uname -srm)"
    echo "cpu:     $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    echo "fs:      ledgers in $work ($(df -T "$work" | awk 'NR==2 {print $2" on "$1}'))"
    echo "wrk:     $(wrk -v 2>&1 | head -n 1)"
    echo "load:    $(cut -d' ' -f1-3 /proc/loadavg)"
}

context

if [ "$soak" != 0 ]; then
    start_server gated
    p=${pid[gated]}
    echo "soak: read_ledger, 64 connections, ${soak} s, gated server pid $p ($(status_kib "$p" VmRSS) KiB RSS idle)"
    run_wrk gated 64 "$warmup" read warm >/dev/null
    samples=$work/rss.tsv
    wrk -t 2 -c 64 -d "${soak}s" --timeout 10s -s "$lua" "${url[gated]}" -- read "$token" soak \
        >"$work/soak.out" 2>&1 &
    wrk_pid=$!
    started+=("$wrk_pid")
    t0=$(date +%s)
    printf 'seconds\tVmRSS_KiB\tRssAnon_KiB\taudit_bytes\n' >"$samples"
    while kill -0 "$wrk_pid" 2>/dev/null; do
        now=$(( $(date +%s) - t0 ))
        printf '%s\t%s\t%s\t%s\n' "$now" "$(status_kib "$p" VmRSS)" "$(status_kib "$p" RssAnon)" \
            "$(stat -c %s "$work/gated/audit.jsonl" 2>/dev/null || echo 0)" >>"$samples"
        for _ in $(seq 1 100); do
            kill -0 "$wrk_pid" 2>/dev/null || break
            sleep 0.1
        done
    done
    wait "$wrk_pid" || true
    result=$(grep -E '^(RESULT|FIRST_BAD)' "$work/soak.out" || true)
    [ -n "$result" ] || { cat "$work/soak.out" >&2; exit 1; }
    echo "$result"
    echo "RSS samples (every 10 s):"
    column -t "$samples" 2>/dev/null || cat "$samples"
    rss=$(tail -n +2 "$samples" | cut -f2)
    first=$(head -n 1 <<<"$rss")
    last=$(tail -n 1 <<<"$rss")
    max=$(sort -n <<<"$rss" | tail -n 1)
    after60=$(tail -n +2 "$samples" | awk -F'\t' '$1 >= 60 {print $2; exit}')
    line=$(grep '^RESULT' <<<"$result")
    errors=$(( $(field connect "$line") + $(field read "$line") + $(field write "$line") + $(field status "$line") + $(field timeout "$line") + $(field bad "$line") ))
    echo
    echo "soak summary: $(field requests "$line") calls, $(field rps "$line") calls/s, p50 $(field p50_us "$line") us, p99 $(field p99_us "$line") us, errors $errors"
    echo "RSS (KiB): first $first, at 60 s ${after60:-n/a}, last $last, max $max, VmHWM $(status_kib "$p" VmHWM)"
    echo "audit log: $(stat -c %s "$work/gated/audit.jsonl") bytes at the end"
    exit 0
fi

for s in "${servers[@]}"; do
    start_server "$s"
    echo "started $s at ${url[$s]} (pid ${pid[$s]}, $(status_kib "${pid[$s]}" VmRSS) KiB RSS)"
done

mode_of() {
    case $1 in
        read) echo read ;;
        write) echo new ;;
        replay) echo replay ;;
        *) echo "unknown scenario $1" >&2; return 2 ;;
    esac
}

IFS=, read -r -a scenario_names <<<"$scenarios"
IFS=, read -r -a conn_counts <<<"$conns_list"

if [ "$syscalls" = 1 ]; then
    command -v strace >/dev/null 2>&1 || { echo "strace is needed: apt-get install -y strace" >&2; exit 2; }
    for scenario in "${scenario_names[@]}"; do
        mode=$(mode_of "$scenario")
        for conns in "${conn_counts[@]}"; do
            for s in "${servers[@]}"; do
                tag=$s-$scenario-c$conns
                [ "$mode" = new ] && tag=$s-s$conns
                seconds=$warmup
                [ "$mode" = replay ] && [ "$seconds" -lt 5 ] && seconds=5
                warm_tag=$tag-warm
                [ "$mode" = replay ] && warm_tag=$tag
                run_wrk "$s" "$conns" "$seconds" "$mode" "$warm_tag" >/dev/null
                attach=()
                for task in /proc/"${pid[$s]}"/task/*; do
                    attach+=(-p "${task##*/}")
                done
                trace=$work/strace-$s.txt
                strace -f -c -o "$trace" "${attach[@]}" 2>/dev/null &
                strace_pid=$!
                started+=("$strace_pid")
                sleep 1
                result=$(run_wrk "$s" "$conns" "$duration" "$mode" "$tag")
                kill -INT "$strace_pid"
                wait "$strace_pid" || true
                line=$(grep '^RESULT' <<<"$result")
                n=$(field requests "$line")
                echo
                echo "== $scenario, $conns connection(s), $s under strace: $n requests, errors $(( $(field status "$line") + $(field bad "$line") + $(field timeout "$line") ))"
                awk -v n="$n" '$1 ~ /^[0-9.]+$/ && $NF != "total" {printf "%s %.3f\n", $NF, $4 / n}' "$trace" \
                    | sort -k2 -g -r | awk '$2 >= 0.01 {printf "  %-18s %8.3f per request\n", $1, $2}'
            done
        done
    done
    exit 0
fi

runs=$work/runs.tsv
: >"$runs"
n_servers=${#servers[@]}
# Read first: read_ledger lists every note, so it runs while the notes directories are empty.
for scenario in "${scenario_names[@]}"; do
    mode=$(mode_of "$scenario")
    for conns in "${conn_counts[@]}"; do
        echo
        echo "== $scenario, $conns connection(s): warm-up ${warmup} s per server (load $(cut -d' ' -f1-3 /proc/loadavg))"
        for s in "${servers[@]}"; do
            tag=$s-$scenario-c$conns
            [ "$mode" = new ] && tag=$s-w$conns-warm
            # The replay warm-up writes the 64 request_ids per wrk thread: give it time to.
            seconds=$warmup
            [ "$mode" = replay ] && [ "$seconds" -lt 5 ] && seconds=5
            run_wrk "$s" "$conns" "$seconds" "$mode" "$tag" >/dev/null
        done
        for round in $(seq 1 "$rounds"); do
            for i in $(seq 0 $((n_servers - 1))); do
                # Rotate the order each round: gated first in odd rounds, last in even ones.
                if [ $((round % 2)) = 1 ]; then
                    s=${servers[$i]}
                else
                    s=${servers[$((n_servers - 1 - i))]}
                fi
                tag=$s-$scenario-c$conns
                [ "$mode" = new ] && tag=$s-w$conns-r$round
                cpu0=$(cpu_ticks "${pid[$s]}")
                result=$(run_wrk "$s" "$conns" "$duration" "$mode" "$tag")
                cpu1=$(cpu_ticks "${pid[$s]}")
                line=$(grep '^RESULT' <<<"$result")
                cpu=$(awk -v d=$((cpu1 - cpu0)) -v t="$ticks" -v n="$(field requests "$line")" 'BEGIN {if (n > 0) printf "%.0f", d / t * 1e6 / n; else print 0}')
                errors=$(( $(field connect "$line") + $(field read "$line") + $(field write "$line") + $(field status "$line") + $(field timeout "$line") + $(field bad "$line") ))
                rss=$(status_kib "${pid[$s]}" VmRSS)
                printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$scenario" "$conns" "$s" "$round" \
                    "$(field p50_us "$line")" "$(field p99_us "$line")" "$(field rps "$line")" \
                    "$errors" "$rss" "$cpu" >>"$runs"
                printf '  round %s %-13s p50 %7s us  p99 %7s us  %8s req/s  errors %s  server CPU %5s us/req  RSS %s KiB\n' \
                    "$round" "$s" "$(field p50_us "$line")" "$(field p99_us "$line")" \
                    "$(field rps "$line")" "$errors" "$cpu" "$rss"
                grep '^FIRST_BAD' <<<"$result" | sed 's/^/    /' || true
            done
        done
    done
done

# The peers each server's p50 is divided by (those that ran).
peers_of() {
    local candidates=()
    case $1 in
        gated) candidates=(ungated gated-noauth) ;;
        gated-noauth) candidates=(ungated) ;;
    esac
    for c in "${candidates[@]}"; do
        [[ " ${servers[*]} " == *" $c "* ]] && echo "$c"
    done
    return 0
}

echo
echo "== summary: median over $rounds rounds of ${duration} s (ratio: per-round p50 / the peer's p50 in the same round; median, range)"
printf '%-8s %5s  %-13s %9s %9s %9s %7s %10s %8s  %s\n' scenario conns server p50_us p99_us req/s errors cpu_us/req RSS_KiB "p50 ratio"
for scenario in "${scenario_names[@]}"; do
    for conns in "${conn_counts[@]}"; do
        for s in "${servers[@]}"; do
            sel() { awk -F'\t' -v a="$scenario" -v b="$conns" -v c="$1" -v col="$2" '$1 == a && $2 == b && $3 == c {print $col}' "$runs"; }
            p50=$(sel "$s" 5 | median)
            p99=$(sel "$s" 6 | median)
            rps=$(sel "$s" 7 | median)
            errors=$(sel "$s" 8 | awk '{t += $1} END {print t + 0}')
            rss=$(sel "$s" 9 | sort -n | tail -n 1)
            cpu=$(sel "$s" 10 | median)
            ratio=""
            for peer in $(peers_of "$s"); do
                ratios=$(for round in $(seq 1 "$rounds"); do
                    mine=$(awk -F'\t' -v a="$scenario" -v b="$conns" -v c="$s" -v r="$round" '$1 == a && $2 == b && $3 == c && $4 == r {print $5}' "$runs")
                    theirs=$(awk -F'\t' -v a="$scenario" -v b="$conns" -v c="$peer" -v r="$round" '$1 == a && $2 == b && $3 == c && $4 == r {print $5}' "$runs")
                    awk -v m="$mine" -v t="$theirs" 'BEGIN {if (t > 0) printf "%.2f\n", m / t}'
                done)
                ratio="$ratio$(median <<<"$ratios")x ($(range <<<"$ratios")) vs $peer; "
            done
            printf '%-8s %5s  %-13s %9s %9s %9s %7s %10s %8s  %s\n' "$scenario" "$conns" "$s" "$p50" "$p99" "$rps" "$errors" "$cpu" "$rss" "$ratio"
        done
    done
done
echo
echo "gated server: VmHWM $(status_kib "${pid[gated]}" VmHWM) KiB, audit log $(stat -c %s "$work/gated/audit.jsonl") bytes (load $(cut -d' ' -f1-3 /proc/loadavg))"
