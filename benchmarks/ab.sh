#!/bin/sh
# Compare two checkouts by alternating their runs of one benchmark script.
#   benchmarks/ab.sh BASE_TREE HEAD_TREE ROUNDS SCRIPT [ARGS...]
#   e.g. git worktree add ../base <rev> && benchmarks/ab.sh ../base . 6 benchmarks/turn.py
# Each tree runs its own copy of SCRIPT with its own packages/*/src first on PYTHONPATH, under
# the same interpreter ($PYTHON, default python3). Alternating spreads a drifting machine's
# speed over both sides; compare the medians, not single runs.
set -eu
base=$(cd "$1" && pwd); head=$(cd "$2" && pwd); rounds=$3; shift 3
python=${PYTHON:-python3}
src() { ls -d "$1"/packages/*/src "$1"/packages/subagent/*/src | tr '\n' ':'; }
i=1
while [ "$i" -le "$rounds" ]; do
  for side in base head; do
    if [ "$side" = base ]; then tree=$base; else tree=$head; fi
    echo "--- $side $i"
    (cd "$tree" && PYTHONPATH=$(src "$tree") "$python" "$@")
  done
  i=$((i + 1))
done
