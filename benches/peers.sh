#!/usr/bin/env bash
# The recorders bench's workloads (benches/recorders.rs: `churn`, `mixed`) under other
# whole-program heap profilers, measured as that bench measures: each tool a fresh process at N
# and at 0 iterations, so start-up cancels, rounds interleaved, medians; ns of wall clock and of
# CPU (user + system, every thread) per allocation over the untracked process. `memtrack record`
# runs beside them, and counts the allocations the other rows divide by.
#   bash benches/peers.sh [N] [ROUNDS]        (root, for `memtrack record`; defaults 1000000 3)
# Needs heaptrack and valgrind (apt-get install heaptrack valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-1000000}
rounds=${2:-3}

cargo build -q --release --locked -p memtrack-cli --bin memtrack
exe=$(cargo bench -q --locked --bench recorders --no-run --message-format=json | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("executable") and m["target"]["name"] == "recorders":
        print(m["executable"])')
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

python3 - "$exe" "$PWD/target/release/memtrack" "$tmp" "$n" "$rounds" <<'EOF'
import json, os, resource, statistics, subprocess, sys, time
exe, memtrack, tmp, n, rounds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])

def child(w, k):
    return [exe, "--child", "untracked", w, str(k)]

TOOLS = {
    "untracked": lambda w, k: child(w, k),
    "memtrack record": lambda w, k: [memtrack, "record", "--no-syscalls", "-o", f"{tmp}/{w}-{k}.memtrack", "--"] + child(w, k),
    "heaptrack": lambda w, k: ["heaptrack", "-o", f"{tmp}/heaptrack-{w}-{k}"] + child(w, k),
    "Valgrind DHAT": lambda w, k: ["valgrind", "--tool=dhat", f"--dhat-out-file={tmp}/dhat-{w}-{k}.json"] + child(w, k),
}

def run(cmd):
    """Wall and CPU nanoseconds of one run of `cmd` (and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter_ns()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter_ns() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1e9
    return wall, cpu

def allocations(w, k):
    out = subprocess.run([memtrack, "show", "--json", f"{tmp}/{w}-{k}.memtrack"], check=True, capture_output=True)
    v = json.loads(out.stdout)
    assert v["lost_events"] == 0, "memtrack record lost events"
    return v["allocations"]

print(f"peers: N = {n} iterations, {rounds} rounds interleaved (order alternating), medians; "
      f"ns per allocation over the untracked process (wall / CPU)")
for w in ["churn", "mixed"]:
    times = {t: {0: [], n: []} for t in TOOLS}
    for r in range(rounds):
        order = list(TOOLS) if r % 2 == 0 else list(reversed(TOOLS))
        for tool in order:
            for k in (n, 0):
                times[tool][k].append(run(TOOLS[tool](w, k)))
    counted = allocations(w, n) - allocations(w, 0)
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    marginal = {t: [(med(v[n], i) - med(v[0], i)) / counted for i in (0, 1)] for t, v in times.items()}
    base = marginal["untracked"]
    print(f"{w} ({counted} allocations): untracked {base[0]:.1f} / {base[1]:.1f} ns per allocation")
    for tool in TOOLS:
        if tool != "untracked":
            m = marginal[tool]
            print(f"  {tool:<16} +{m[0] - base[0]:,.0f} / +{m[1] - base[1]:,.0f}")
EOF
