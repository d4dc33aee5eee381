#!/usr/bin/env bash
# A flake hunt: run test binaries several rounds in a row and print, per test, how often it passed
# and failed, with the first lines of each failure.
# Usage: hack/flaky.sh [--rounds N] [BINARY...]
#   BINARY: a test target (e2e_roll, controller_stand_in, ...); default: every tests/e2e_*.rs.
#   --rounds N: rounds of every binary (default 3). A round runs each binary once, in order.
# Runs as hack/test.sh does (CI=true: a missing component fails; bin/ first on PATH) but installs
# nothing: run hack/install-deps.sh first. Each run's output stays in $FLAKY_LOGS (default
# /tmp/kcpshard-flaky-<date>); the table (markdown) goes to stdout, progress to stderr.
# Run it on a machine that does nothing else: two cores shared with a build fail timing assertions
# that hold on a quiet one, and that is a different hunt.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
rounds=3
binaries=()
while [ $# -gt 0 ]; do
  case $1 in
    --rounds) rounds=${2:?--rounds needs a number}; shift 2 ;;
    --rounds=*) rounds=${1#--rounds=}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "flaky: unknown option $1" >&2; exit 2 ;;
    *) [ -f "tests/$1.rs" ] || { echo "flaky: no test binary $1 (tests/$1.rs)" >&2; exit 2; }
       binaries+=("$1"); shift ;;
  esac
done
if [ ${#binaries[@]} -eq 0 ]; then
  for f in tests/e2e_*.rs; do binaries+=("$(basename "$f" .rs)"); done
fi
logs=${FLAKY_LOGS:-/tmp/kcpshard-flaky-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$logs"
export CI=true PATH="$root/bin:$PATH" KCPSHARD_BIN_DIR="$root/bin"
targets=()
for b in "${binaries[@]}"; do targets+=(--test "$b"); done
cargo test --no-run "${targets[@]}" >"$logs/build.log" 2>&1 || { cat "$logs/build.log" >&2; exit 1; }
commit=$(git rev-parse --short HEAD)
[ -n "$(git status --porcelain --untracked-files=no)" ] && commit="$commit with uncommitted changes"
echo "flaky: $rounds rounds of ${binaries[*]} on $commit; logs in $logs" >&2
for round in $(seq 1 "$rounds"); do
  for b in "${binaries[@]}"; do
    start=$SECONDS
    status=0
    cargo test --test "$b" >"$logs/$b.$round.log" 2>&1 || status=$?
    echo "flaky: round $round $b: exit $status in $((SECONDS - start))s" >&2
  done
done
# The table: each test's results over the rounds, and the first lines of each failure (its panic).
python3 - "$logs" "$rounds" "$commit" "${binaries[@]}" <<'PY'
import re, sys, pathlib, datetime
logs, rounds, commit, binaries = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4:]
print(f"{rounds} rounds, {datetime.date.today()}, {commit}\n")
print("| binary | test | passed | failed | first lines of each failure |")
print("|---|---|---|---|---|")
for b in binaries:
    passed, failed, why = {}, {}, {}
    for r in range(1, rounds + 1):
        log = logs / f"{b}.{r}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        for name, result in re.findall(r"^test (\S+) \.\.\. (ok|FAILED)$", text, re.M):
            (passed if result == "ok" else failed)[name] = (passed if result == "ok" else failed).get(name, 0) + 1
        for name, body in re.findall(r"^---- (\S+) stdout ----\n(.*?)(?=^---- |^failures:$|\Z)", text, re.M | re.S):
            lines = [l for l in body.splitlines() if "panicked at" in l or (l and not l.startswith(" "))]
            start = next((i for i, l in enumerate(lines) if "panicked at" in l), 0)
            why.setdefault(name, []).append(f"round {r}: " + " / ".join(lines[start:start + 3])[:300])
        if not re.search(r"^test result:", text, re.M):
            failed["(binary)"] = failed.get("(binary)", 0) + 1
            why.setdefault("(binary)", []).append(f"round {r}: no test result (build failure or crash; {log})")
    for name in sorted(set(passed) | set(failed)):
        cause = "<br>".join(w.replace("|", "\\|") for w in why.get(name, []))
        print(f"| {b} | {name} | {passed.get(name, 0)} | {failed.get(name, 0)} | {cause} |")
PY
