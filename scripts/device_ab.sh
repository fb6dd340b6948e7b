#!/usr/bin/env bash
# Run THERE (the GPU machine), in one device call: interleaved A/B rounds of the bench. Every setting
# runs once per round, in turn (a slow spell of the machine falls on all of them alike); each run's
# reports go to $OUT/runs/<name>-<round>/ and are packed into $OUT/runs.tgz after it (the device tool
# returns 8 files a call); no run starts past the deadline; at the end, the summary table
# (python -m tritonbundle.bench.compare: median and range per setting, read/tokenize per row, CPU per
# request, the host's speed). Results docs/benchmarks.md, "H200: the plain-text tokenizer", used it.
#
# usage: bash scripts/device_ab.sh [--install] [--rounds N] [--first N] [--model bert-base|minilm]
#            [--deadline S] [--budget S] [--reference ceiling|peer ...] NAME=TUNED_JSON[+VAR=VALUE...] ...
#   --install   install what the call carries first (scripts/device_bench.sh install)
#   --rounds    the last round's number (default 3); --first: the first round's number (a later call
#               goes on: --first 4 --rounds 6 runs rounds 4-6; --first past --rounds is refused)
#   --deadline  seconds from the start after which no run starts (default 480: a call's 600 s less one
#               run killed at 115 s)
#   --budget    each run's --budget-s (default 75; a run is killed 40 s past it): more for settings
#               whose instances take longer to start (more CUDA graphs: the 18 batch buckets start in
#               52-55 s, and at 95 the budget cut all three ladders of an A/B: give 120, with --deadline 420)
#   --reference a system measured once per round after the settings, into runs/<system>-<round>
#               (ceiling: the model alone, --budget-s 60; peer: LitServe, --budget-s 55, carry
#               .device/peer and --install once): the summary puts each setting's median over the reference's, and round
#               by round (the bundle/ceiling and bundle/peer targets ask for the same host, >= 3 runs)
#   NAME=FILE   a setting: its --tuned file; +VAR=VALUE sets an environment variable for its runs only,
#               +--flag=VALUE passes a flag of the bench (e.g. +--load-procs=4; values without '+');
#               +taskset=CPUS runs the whole run (server, MPS, stubs, load generators, the host probe) on
#               those CPUs only (taskset -c CPUS, e.g. +taskset=0-5): does a knee move with the cores?
# e.g. (carry .device/server, .device/stubs; ~440 s with the install):
#   bash scripts/device_ab.sh --install --rounds 3 \
#       plain=docs/tuning/h200-handpicked/bert-base-fused8-t4-b64.json \
#       rust=docs/tuning/h200-handpicked/bert-base-fused8-t4-b64.json+TRITONBUNDLE_TOKENIZER_NORMALIZER=rust
#   (the load generators' sender: wire=FILE client=FILE+TRITONBUNDLE_LOAD_SENDER=client
#    http=FILE+TRITONBUNDLE_LOAD_SENDER=http;
#    their processes: procs4=FILE+--load-procs=4 procs11=FILE+--load-procs=11)
# Every run: TRITONBUNDLE_GPU_SHARING=mps unless set, texts in, p99 <= 50 ms, --budget-s 75 unless --budget
# (62-70 s a run); a reference's: --budget-s 60 (ceiling) or 55 (peer).
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s)
OUT=${OUT:-$PWD/reports/ab}
install=0 rounds=3 first=1 model=bert-base deadline=480 budget=75 settings=() references=()
while [ $# -gt 0 ]; do
  case $1 in
    --install) install=1 ;;
    --rounds) rounds=$2; shift ;;
    --first) first=$2; shift ;;
    --model) model=$2; shift ;;
    --deadline) deadline=$2; shift ;;
    --budget) budget=$2; shift ;;
    --reference) case $2 in ceiling|peer) references+=("$2") ;;
      *) echo "device_ab: --reference ceiling or peer, not $2" >&2; exit 2 ;; esac; shift ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *=*) settings+=("$1") ;;
    *) echo "device_ab: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#settings[@]} -gt 0 ] || { echo "device_ab: name at least one setting NAME=TUNED_JSON" >&2; exit 2; }
for spec in "${settings[@]}"; do case ${spec%%=*} in ceiling|peer)
  echo "device_ab: '${spec%%=*}' names a reference system's runs (--reference): give the setting another name" >&2; exit 2 ;; esac; done
parse_setting() {  # SPEC: its name, its --tuned file and its items (what follows each '+') in name, file, items
  local rest=${1#*=}
  name=${1%%=*} file=${rest%%+*} items=()
  [ "$rest" != "$file" ] && IFS=+ read -r -a items <<< "${rest#*+}"
  return 0
}
for spec in "${settings[@]}"; do  # every item of every setting, before any run spends device time
  parse_setting "$spec"
  for e in ${items[@]+"${items[@]}"}; do case $e in
    taskset=*) taskset -c "${e#taskset=}" true > /dev/null 2>&1 || {
      echo "device_ab: $name: taskset cannot run on CPUs '${e#taskset=}' here (e.g. taskset=0-5)" >&2; exit 2; } ;;
    --*=*|*=*) ;;
    *) echo "device_ab: $name: '$e' is neither VAR=VALUE, --flag=VALUE nor taskset=CPUS" >&2; exit 2 ;;
  esac; done
done
[ "$first" -le "$rounds" ] || { echo "device_ab: --first $first is past --rounds $rounds (the last round's number): no round would run; for rounds $first-$((first + rounds - 1)) give --rounds $((first + rounds - 1))" >&2; exit 2; }
case $model in
  bert-base) rates="--start-rate 6000 --max-rate 25600" ;;
  minilm) rates="--start-rate 8000 --max-rate 81000" ;;  # above the H100/H200 ceilings (76,224-79,639)
  *) echo "device_ab: --model bert-base or minilm, not $model" >&2; exit 2 ;;
esac
mkdir -p "$OUT/runs"
best() {  # REPORT SYSTEM: the system's status and its best rate, from the run's bench.json
  python3 -c "
import json, sys
m = json.load(open(sys.argv[1]))['models']
b = next(iter(m.values()))['systems'][sys.argv[2]]
print(b['status'], b.get('best_rps'), 'req/s' + (' at the SLO' if sys.argv[2] != 'ceiling' else ''))" "$1" "$2" 2>&1 | tail -1
}
if [ "$install" = 1 ]; then
  bash scripts/device_bench.sh install > "$OUT/install.log" 2>&1; tail -3 "$OUT/install.log"
fi
export TRITONBUNDLE_GPU_SHARING=${TRITONBUNDLE_GPU_SHARING:-mps}
for i in $(seq "$first" "$rounds"); do
  for spec in "${settings[@]}"; do
    parse_setting "$spec"
    env_vars=() flags=() pin=()
    for e in ${items[@]+"${items[@]}"}; do case $e in --*=*) flags+=("$e") ;; taskset=*) pin=(taskset -c "${e#taskset=}") ;;
      *=*) env_vars+=("$e") ;;
      esac; done  # each item was checked above
    now=$(date +%s)
    if [ $((now - T0)) -gt "$deadline" ]; then echo "$name-$i: not started (deadline ${deadline} s)"; continue; fi
    ${pin[@]+"${pin[@]}"} env ${env_vars[@]+"${env_vars[@]}"} OUT="$OUT/runs/$name-$i" timeout $((budget + 40)) bash scripts/device_bench.sh run \
      --models "$model" --systems bundle --budget-s "$budget" --rate-factor 1.5 --refine 3 --input text $rates \
      --tuned "$file" ${flags[@]+"${flags[@]}"} \
      > /dev/null 2>&1
    rc=$?
    echo "$name-$i: exit $rc, $(($(date +%s) - now)) s, $(best "$OUT/runs/$name-$i/bench.json" bundle)"
    (cd "$OUT" && tar czf runs.tgz runs install.log 2>/dev/null)
  done
  for system in ${references[@]+"${references[@]}"}; do
    now=$(date +%s)
    if [ $((now - T0)) -gt "$deadline" ]; then echo "$system-$i: not started (deadline ${deadline} s)"; continue; fi
    seconds=60; [ "$system" = peer ] && seconds=55
    OUT="$OUT/runs/$system-$i" timeout $((seconds + 40)) bash scripts/device_bench.sh run \
      --models "$model" --systems "$system" --budget-s "$seconds" --input text > /dev/null 2>&1
    rc=$?
    echo "$system-$i: exit $rc, $(($(date +%s) - now)) s, $(best "$OUT/runs/$system-$i/bench.json" "$system")"
    (cd "$OUT" && tar czf runs.tgz runs install.log 2>/dev/null)
  done
done
python3 -m tritonbundle.bench.compare "$OUT" | tee "$OUT/summary.md"
