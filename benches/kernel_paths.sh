#!/usr/bin/env bash
# What the eBPF tracker's older paths cost, side by side on this kernel (root): each path is
# taken with MEMTRACK_KERNEL_WITHOUT, as on a kernel that lacks the feature.
#
#   per allocation: `memtrack record -- follow time N 16` (tests/fixtures/follow.c: N
#                   malloc(16)+free pairs, timed by the program itself), ns per pair, and the
#                   same program unrecorded (the floor);
#   start-up:       wall time of `memtrack record -- follow alloc 1 16` (probe the kernel,
#                   load and verify, attach every probe site of the program and libc, detach).
#
# Configurations interleaved, their order reversed every other round; medians and ranges.
#
#   sudo bash benches/kernel_paths.sh [N] [ROUNDS]     # default 300000 7
#   MEMTRACK=target/release/memtrack sudo bash benches/kernel_paths.sh
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-300000}
rounds=${2:-7}
memtrack=${MEMTRACK:-target/release/memtrack}
[ -x "$memtrack" ] || memtrack=target/debug/memtrack
[ -x "$memtrack" ] || { echo "build the CLI first: cargo build --release -p memtrack-cli" >&2; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cc -O1 tests/fixtures/follow.c -o "$work/follow" -ldl

# name | MEMTRACK_KERNEL_WITHOUT
configs=(
    "uprobe.multi, task storage|"
    "one link per site|uprobe-multi"
    "tid-keyed state|thread-pidfd"
    "one link per site, tid-keyed state|uprobe-multi,thread-pidfd"
    "every fallback|fallbacks"
)
echo "memtrack: $memtrack; Linux $(uname -r); N = $n; $rounds rounds"
for r in $(seq "$rounds"); do
    order=("${!configs[@]}")
    if [ $((r % 2)) = 0 ]; then
        order=($(printf '%s\n' "${order[@]}" | tac))
    fi
    echo "floor $("$work/follow" time "$n" 16)" >> "$work/pair"
    for i in "${order[@]}"; do
        without=${configs[$i]#*|}
        ns=$(MEMTRACK_KERNEL_WITHOUT=$without "$memtrack" record -o "$work/x.memtrack" -- \
            "$work/follow" time "$n" 16 2> "$work/err") || { cat "$work/err"; exit 1; }
        grep -q "; 0 events lost" "$work/err" || { echo "events lost:"; cat "$work/err"; exit 1; }
        echo "$i $ns" >> "$work/pair"
        s=$(date +%s%N)
        MEMTRACK_KERNEL_WITHOUT=$without "$memtrack" record -o "$work/y.memtrack" -- \
            "$work/follow" alloc 1 16 2> /dev/null
        echo "$i $(( ($(date +%s%N) - s) / 1000000 ))" >> "$work/start"
    done
done
python3 - "$work/pair" "$work/start" "${configs[@]}" <<'EOF'
import statistics, sys
pair, start, configs = sys.argv[1], sys.argv[2], [c.split("|")[0] for c in sys.argv[3:]]
def load(path):
    out = {}
    for line in open(path):
        k, v = line.split()
        out.setdefault(k, []).append(float(v))
    return out
p, s = load(pair), load(start)
floor = statistics.median(p["floor"])
print(f"{'path':40} {'ns/pair (median, min-max)':>28} {'over floor':>11} {'start-up ms (median, min-max)':>32}")
print(f"{'no recording (floor)':40} {floor:>14.0f} ({min(p['floor']):.0f}-{max(p['floor']):.0f})")
for i, name in enumerate(configs):
    v, t = p[str(i)], s[str(i)]
    m = statistics.median(v)
    print(f"{name:40} {m:>14.0f} ({min(v):.0f}-{max(v):.0f}) {m - floor:>11.0f} "
          f"{statistics.median(t):>16.0f} ({min(t):.0f}-{max(t):.0f})")
EOF
