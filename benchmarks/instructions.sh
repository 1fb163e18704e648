#!/bin/sh
# Instructions per turn or per delegation, counted by callgrind (deterministic, unlike time).
# ``delegation`` is delegation.py's spawn:memory route (a bench tool calls start()), ``tool``
# its spawn:tool route (the parent calls the real ``subagent`` tool).
#   benchmarks/instructions.sh TREE turn|delegation|tool|resume|followup|agent|sdkagent
# Runs the measurement twice (small and large count, the cyclic GC off) and prints the
# difference divided by the difference in count, so set-up and imports cancel out. ``resume``
# counts per stored event a cold-resume follow-up (benchmarks/resume.py) up to acceptance, in
# a fresh process on a JSONL store of 1,000 and of 10,000 events written beforehand, with the
# cyclic GC on (its passes over the loaded log are part of the cost). ``followup`` counts the
# parent process of benchmarks/acp_continuable.py per warm follow-up to a continuable ACP child
# (dsh-acp-agent, not counted: callgrind follows no child process), every thread of the
# parent, the cyclic GC on. ``agent`` and ``sdkagent`` count per prompt the process of
# dsh-acp-agent (echo model, memory store) or of acp.py's SDK-only echo agent, driven by
# benchmarks/acp_agent.py's plain client (not counted), as the console script runs it.
set -eu
tree=$(cd "$1" && pwd); what=$2
python=${PYTHON:-python3}
src=$(ls -d "$tree"/packages/*/src "$tree"/packages/subagent/*/src | tr '\n' ':')
case $what in
  turn) small=200; large=1200; call="import turn; asyncio.run(turn.measure(N, 50, False))" ;;
  delegation) small=50; large=350
    call="import delegation, tempfile, pathlib; asyncio.run(delegation._measure('spawn', 'memory', N, 1, pathlib.Path(tempfile.mkdtemp())))" ;;
  tool) small=50; large=350
    call="import delegation, tempfile, pathlib; asyncio.run(delegation._measure('spawn', 'tool', N, 1, pathlib.Path(tempfile.mkdtemp())))" ;;
  resume) small=1000; large=10000 ;;
  followup) small=10; large=40 ;;
  agent|sdkagent) small=100; large=1100 ;;
  *) echo "usage: $0 TREE turn|delegation|tool|resume|followup|agent|sdkagent" >&2; exit 2 ;;
esac
count() {
  out=$(mktemp)
  if [ "$what" = resume ]; then
    store=$(mktemp -d)
    id=$(cd "$tree/benchmarks" && PYTHONPATH=$src "$python" resume.py --make "$1" --root "$store")
    (cd "$tree/benchmarks" && PYTHONPATH=$src valgrind --tool=callgrind --callgrind-out-file="$out" \
      "$python" resume.py --child "$id" --root "$store" --exit >/dev/null 2>&1)
    rm -rf "$store"
    callgrind_annotate "$out" | grep -m1 "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,
    rm -f "$out"
    return
  fi
  if [ "$what" = agent ] || [ "$what" = sdkagent ]; then
    kind=dsh; [ "$what" = sdkagent ] && kind=sdk
    (cd "$tree" && PYTHONHASHSEED=0 PYTHONPATH=$src "$python" benchmarks/acp_agent.py --agent "$kind" \
      --prompts "$1" --warm 20 --wrap "valgrind --tool=callgrind --callgrind-out-file=$out" \
      >/dev/null 2>&1)
    callgrind_annotate "$out" | grep -m1 "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,
    rm -f "$out"
    return
  fi
  if [ "$what" = followup ]; then
    (cd "$tree" && PYTHONPATH=$src valgrind --tool=callgrind --callgrind-out-file="$out" \
      "$python" benchmarks/acp_continuable.py --count "$1" >/dev/null 2>&1)
    callgrind_annotate "$out" | grep -m1 "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,
    rm -f "$out"
    return
  fi
  (cd "$tree/benchmarks" && PYTHONPATH=$src valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$python" -c "import gc, asyncio; gc.disable(); N = $1; $call" >/dev/null 2>&1)
  callgrind_annotate "$out" | grep -m1 "PROGRAM TOTALS" | awk '{print $1}' | tr -d ,
  rm -f "$out"
}
a=$(count "$small"); b=$(count "$large")
echo "$what: $(( (b - a) / (large - small) )) instructions each ($tree)"
