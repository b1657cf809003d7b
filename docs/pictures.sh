#!/usr/bin/env bash
# Makes the guide's pictures and sample outputs (docs/src/images/) from a real recording:
# examples/downstream (a user's project on memtrack-criterion) copied into a scratch git
# repository, its `tokenize` then changed to copy each token once more, and `memtrack bench
# --base HEAD` run on the change as a user runs it. Needs root (the eBPF tracker); takes a few
# minutes (two builds of the suite in memory mode). Run it after a change of the outputs'
# shape, and commit what it writes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=$root/docs/src/images
work=$root/target/pictures
mkdir -p "$out"

cargo build -q --release --locked -p memtrack-cli --bin memtrack
memtrack=$root/target/release/memtrack

# The project: downstream's files, its memtrack-criterion dependency made absolute; a commit.
# The scratch copy keeps its target directory between runs (the builds are the slow part).
proj=$work/project
mkdir -p "$proj"
find "$proj" -mindepth 1 -maxdepth 1 ! -name target -exec rm -rf {} +
(cd examples/downstream && cp -r --parents Cargo.toml Cargo.lock src benches .cargo "$proj/")
sed -i "s|\"../../memtrack-criterion\"|\"$root/memtrack-criterion\"|" "$proj/Cargo.toml"
printf '/target\n' >"$proj/.gitignore"
git() { command git -C "$proj" -c user.name=docs -c user.email=docs@localhost "$@"; }
git init -q -b main
git add .
git commit -qm base

# The change a pull request would make: tokenize copies each token's String once more.
sed -i 's/words().map(str::to_lowercase)/words().map(|t| t.to_lowercase().as_str().to_owned())/' "$proj/src/lib.rs"
grep -q 'as_str().to_owned()' "$proj/src/lib.rs"

# `memtrack bench` exits 1 on the regression it is made to find; anything else is a failure.
status=0
(cd "$proj" && "$memtrack" bench --base main --format markdown --out "$work/bench") \
    >"$out/compare.md" 2>"$work/bench.log" || status=$?
[ "$status" = 1 ] || { cat "$work/bench.log"; echo "memtrack bench exited $status, not 1"; exit 1; }
grep -q 'regressed' "$out/compare.md"

head=$work/bench/head/tokenize.memtrack
base=$work/bench/base/tokenize.memtrack
"$memtrack" flamegraph "$head" -o "$out/flamegraph.svg"
"$memtrack" flamegraph --diff "$base" "$head" -o "$out/flamegraph-diff.svg"
"$memtrack" plot "$head" -o "$out/heap.svg"
echo "wrote: $(cd "$out" && ls compare.md flamegraph.svg flamegraph-diff.svg heap.svg | tr '\n' ' ')"
