#!/usr/bin/env bash
# Makes the guide's pictures from real recordings, into docs/src/images/ (not checked in by
# this script):
#   flamegraph.svg  `memtrack flamegraph` of examples/basic.rs's own recording of build_index
#                   (a Rust program: the allocator's frames hidden, as by default)
#   heap.svg        `memtrack plot` of the `tokenize` benchmark of examples/downstream (a
#                   criterion suite on memtrack-criterion), recorded by `memtrack bench`
# Needs root, or CAP_BPF + CAP_PERFMON: the basic example records with the eBPF tracker. The
# first run builds the downstream suite (a few minutes). Run from a clone: bash docs/pictures.sh
set -euo pipefail
cd "$(dirname "$0")/.."

cargo build -q --release --locked -p memtrack-cli --bin memtrack
memtrack="$PWD/target/release/memtrack"
images=docs/src/images
mkdir -p "$images"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run LOG CMD…: runs CMD, its output to LOG, shown if it fails.
run() {
    local log=$1
    shift
    "$@" >"$log" 2>&1 || { cat "$log"; exit 1; }
}

echo "recording examples/basic.rs"
MEMTRACK_DIR="$work" run "$work/basic.log" cargo run -q --release --locked --example basic
"$memtrack" flamegraph "$work/build_index.memtrack" -o "$images/flamegraph.svg"

echo "recording examples/downstream's benchmarks with memtrack bench"
(cd examples/downstream && run "$work/bench.log" "$memtrack" bench --out "$work/bench" -- --locked)
"$memtrack" plot "$work/bench/tokenize.memtrack" -o "$images/heap.svg"

ls -l "$images"/flamegraph.svg "$images"/heap.svg
