#!/usr/bin/env bash
# A shard shaped like production: fills a KinePostgres shard (a PostgreSQL kcpshard runs itself)
# with --workspaces workspaces (default 1,000, each Ready before the next batch of 50; adding stops
# after --fill-budget seconds, and the report says how many were made and how long it took), then
# rolls it under the roll bench's load: a version change (hack/versions.env: OLDER -> NEWER) and a
# restart. It is hack/bench/roll.sh with these options, so the report is the roll bench's: failed
# requests by kind, each roll's phases, the controller time, the kcp RSS after the fill.
# Usage: hack/bench/prod-shaped.sh [--workspaces N] [--fill-budget SECONDS] [--store sqlite|postgres|etcd|all]
#                                  [--rolls N] [--preflight on|off] [roll.sh options...]
#   --preflight on|off sets spec.rollout.preflight and reports the preflight of the version roll
#   (status.preflight's startedAt and completedAt) beside the roll.
# Run alone, under the real-kcp lock: `flock /tmp/kcpshard-realkcp.lock hack/bench/prod-shaped.sh`.
# Env as roll.sh: KCPSHARD and ROLL_LOAD (built binaries), KEEP=1.
set -euo pipefail
workspaces=1000
fill_budget=1800
store=postgres
rolls=2
rest=()
while [ $# -gt 0 ]; do
  case "$1" in
    --workspaces) workspaces=$2; shift 2 ;;
    --fill-budget) fill_budget=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --rolls) rolls=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) rest+=("$1"); shift ;;
  esac
done
exec "$(dirname "$0")/roll.sh" --store "$store" --rolls "$rolls" --workspaces "$workspaces" \
  --fill-budget "$fill_budget" "${rest[@]}"
