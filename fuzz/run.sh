#!/usr/bin/env bash
# Builds every fuzz target (cargo-fuzz, nightly, AddressSanitizer). With a number of seconds,
# seeds the corpora from fixtures/ (seed.sh) and runs each target that long, one after the other;
# further arguments select targets. Crashes are written to fuzz/artifacts/<target>/.
#
#   fuzz/run.sh                 # build only
#   fuzz/run.sh 180             # every target for 3 minutes
#   fuzz/run.sh 60 canon policy # two targets for a minute each
#
# FUZZ_TOOLCHAIN overrides the toolchain (default nightly).
set -euo pipefail
cd "$(dirname "$0")"
toolchain=${FUZZ_TOOLCHAIN:-nightly}

if ! command -v cargo-fuzz >/dev/null 2>&1; then
    cargo install --locked cargo-fuzz
fi

cargo +"$toolchain" fuzz build
[ $# -eq 0 ] && exit 0

seconds=$1
shift
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo +"$toolchain" fuzz list)
fi
./seed.sh
failed=()
for target in "${targets[@]}"; do
    echo "== $target for ${seconds}s"
    if ! cargo +"$toolchain" fuzz run "$target" -- -max_total_time="$seconds" -print_final_stats=1; then
        failed+=("$target")
    fi
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "crashes in: ${failed[*]} (inputs in fuzz/artifacts/)" >&2
    exit 1
fi
