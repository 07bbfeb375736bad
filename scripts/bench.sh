#!/usr/bin/env bash
# Runs every toolgate benchmark in order and keeps the whole output with the machine's context
# (date, kernel, filesystems, load average) in target/bench/bench-<timestamp>.log.
# docs/BENCHMARKS.md says what each one measures and records the latest figures.
#
#   scripts/bench.sh            all benches
#   scripts/bench.sh gate stdio only the named ones (audit commit canon policy scan gate calls stdio pipeline
#                               replicas proxy)
#   scripts/bench.sh http        the HTTP load bench (crates/toolgate-server/benches/http_load.sh
#                               --decompose; needs wrk), only when named
#   scripts/bench.sh instructions
#                               instructions per call of gate_cost's direct rows (the handler, the
#                               gate, the gate with Cedar) under callgrind, which the load does not
#                               move; needs valgrind; only when named
#   REFERENCE_SERVER="/venv/bin/python /path/server.py" scripts/bench.sh reference
#                               the stdio driver against another server with the same tools (the
#                               reference article's Python server: see docs/BENCHMARKS.md); it is
#                               given LEDGER_DIR and POLICY_PATH instead of flags
#
# Criterion options can be passed through BENCH_ARGS, e.g. BENCH_ARGS="--warm-up-time 1".
set -euo pipefail
cd "$(dirname "$0")/.."

target="${CARGO_TARGET_DIR:-target}"
mkdir -p "$target/bench"
log="$target/bench/bench-$(date -u +%Y%m%dT%H%M%SZ).log"
read -r -a extra <<<"${BENCH_ARGS:-}"

all=(audit commit canon policy cedar scan gate calls stdio pipeline replicas proxy)
selected=("$@")
[ ${#selected[@]} -eq 0 ] && selected=("${all[@]}")

context() {
    echo "date:   $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "kernel: $(uname -srm)"
    echo "cpu:    $(nproc) x $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)"
    echo "fs:     cwd $(df -T . | awk 'NR==2 {print $2" on "$1}'), /tmp $(df -T /tmp | awk 'NR==2 {print $2}'), /dev/shm $(df -T /dev/shm 2>/dev/null | awk 'NR==2 {print $2}')"
    echo "load:   $(cut -d' ' -f1-3 /proc/loadavg)"
}

run() {
    local name=$1
    shift
    echo
    echo "=== $name: $* (load $(cut -d' ' -f1-3 /proc/loadavg))"
    "$@"
}

bench() {
    cargo bench --locked -q "$@"
}

# Instructions per call of each direct row of gate_cost: callgrind at 1,000 and 3,000 calls
# (GATE_COST_CALLS), the difference over 2,000, so the set-up is not counted.
instructions() {
    local binary
    binary=$(cargo bench --locked -q -p toolgate-rmcp --features cedar --bench gate_cost --no-run \
        --message-format=json | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
    local out="$target/bench/callgrind"
    mkdir -p "$out"
    for row in direct_handler direct_gated direct_cedar; do
        local counts=()
        for calls in 1000 3000; do
            GATE_COST_CALLS="$row:$calls" valgrind --tool=callgrind \
                --callgrind-out-file="$out/$row.$calls" "$binary" >/dev/null 2>&1
            counts+=("$(awk '/^summary:/ {print $2}' "$out/$row.$calls")")
        done
        echo "$row: $(((counts[1] - counts[0]) / 2000)) instructions per call ($out/$row.3000)"
    done
}

{
    context
    # Build everything first so compilation does not overlap the measurements.
    echo "building benches..."
    cargo bench --locked -q --workspace --no-run 2>&1 | tail -n 3
    for name in "${selected[@]}"; do
        case $name in
            audit) run audit bench -p toolgate-audit --bench append ;;
            commit) run commit bench -p toolgate-commit --bench effect ;;
            canon) run canon bench -p toolgate-canon --bench digest -- "${extra[@]}" ;;
            policy) run policy bench -p toolgate-policy --bench decide -- "${extra[@]}" ;;
            cedar) run cedar bench -p toolgate-policy --features cedar --bench cedar -- "${extra[@]}" ;;
            scan) run scan bench -p toolgate-scan --bench scan ;;
            gate) run gate bench -p toolgate-rmcp --features cedar --bench gate_cost -- "${extra[@]}" ;;
            calls) run calls bench -p toolgate-server --bench calls ;;
            stdio) run stdio bench -p toolgate-server --bench stdio ;;
            pipeline) run pipeline bench -p toolgate-server --bench pipeline ;;
            replicas) run replicas bench -p toolgate-server --bench replicas ;;
            proxy) run proxy bench -p toolgate-server --bench proxy ;;
            http) run http crates/toolgate-server/benches/http_load.sh --decompose ;;
            instructions) run instructions instructions ;;
            reference)
                if [ -z "${REFERENCE_SERVER:-}" ]; then
                    echo "=== reference: skipped (set REFERENCE_SERVER to the server's command line)"
                else
                    STDIO_BENCH_SERVER="$REFERENCE_SERVER" run reference bench -p toolgate-server --bench stdio
                fi
                ;;
            *) echo "unknown bench: $name (one of: ${all[*]} http instructions reference)" >&2; exit 2 ;;
        esac
    done
    echo
    echo "=== done (load $(cut -d' ' -f1-3 /proc/loadavg))"
} 2>&1 | tee "$log"
echo "log: $log"
