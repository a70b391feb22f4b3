#!/usr/bin/env bash
# GPU machine (device tool `run`), from the repo root: the project's GPU work in stages, within
# one call's deadline.
#
#   tools/gpu_session/run.sh [--allow-no-gpu] STAGE...
#
# verdict   THE call of a GPU window (prepare.sh with no arguments prepares it; README.md here):
#           a canary (one GPU worker with the call guard screens a trivial kernel; on failure the
#           call goes on with the guard off and says why), the GPU tests of every test group whose
#           inputs changed since a committed run passed them (families.py due; one junit file per
#           group; a family with a failing test is kept out of the timing), then the RL queue's
#           stage when .gpu_queue is carried (`cudal2 campaign run` of the queue pack, kernel time
#           only, in its own slice: QUEUE_PCT percent of the call, default 5, or BUDGET_QUEUE
#           seconds), then `cudal2 campaign run` on the carried packs (the device's ceilings, then
#           the shapes in the packs' order; export by the export rule, reports, the by-phase
#           account of the whole call) until the profile stage's reserve (BUDGET_PROFILE, 90 s),
#           then the profile stage (profile.py: ncu over each shape's best finalist and fastest
#           baseline, worst first); the queue and the campaign write into one results DB. Writes
#           into $OUT as it goes, so a call killed at any point leaves usable files:
#           provenance.txt, session.log, tests.tar.gz (after each group), results.db.gz +
#           summary.json (after each shape), profile.csv (after each target), campaign.tar.gz
#           (at the end): 7 files.
# Stages for a second call (each packed into $OUT/<stage>.tar.gz at its end):
#   tests     python -m pytest -m gpu (junit XML + log); TESTS_ARGS: pytest arguments (default: tests)
#   overhead  python -m cudal2.runs.overhead on the kernel path (JSON + table)
#   hostile   cudal2 bench over tests/data/hostile: the GPU half of the hostile corpus
#   timer     benchmarks/timer_check.py: what each timer reads for torch.matmul
#   trace     benchmarks/serving_trace.py: shapes/llm_trace.csv replayed as CUDA graphs
#   campaign  cudal2 campaign run .gpu_campaign alone
# No stage trains or samples a policy here: with the reward table, RL's GPU work is the queue's
# screening (the verdict call's stage); the policy and its training stay on the CPU machine.
# Carried paths it uses when present: .gpu_cache (CUDAL2_CACHE and CUDAL2_TEST_CACHE), .gpu_campaign(_rc), .gpu_queue, .whl.
# Env: GPU_SESSION_DEADLINE_S (the whole call, default 570), BUDGET_<STAGE> (seconds, never past
# the deadline), BUDGET_TESTS (verdict: 150, each due group, largest first, its share of what is
# left by its GPU tests (.gpu_cache/gpu_tests.json); a group stopped at its share is "partial"),
# CAMPAIGN_MIN_S (verdict: the tests leave the queue, the campaign and the profile at least this,
# 120, plus the queue's slice and BUDGET_PROFILE), QUEUE_PCT, BUDGET_QUEUE, CAMPAIGN_ARGS
# (appended to `campaign run`), TIMER_ARGS, TRACE_ARGS, TRACE_ENV, GPU_SESSION_PACK (default
# .gpu_campaign), GPU_SESSION_QUEUE (default .gpu_queue), GPU_SESSION_CACHE (default .gpu_cache).
# --allow-no-gpu: run on a machine without a GPU (the plumbing; with CUDAL2_FAKE_DEVICE set the
# fake device answers: rehearse.sh).
set -uo pipefail
T0=$(date +%s)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
DEADLINE=$((T0 + ${GPU_SESSION_DEADLINE_S:-570}))
PY=${PYTHON:-python3}
PACK=${GPU_SESSION_PACK:-.gpu_campaign}
QUEUE=${GPU_SESSION_QUEUE:-.gpu_queue}
NO_GPU=""
STAGES=()
for a in "$@"; do
  case $a in
    --allow-no-gpu) NO_GPU=1;;
    verdict|tests|overhead|hostile|timer|trace|campaign) STAGES+=("$a");;
    -h|--help) sed -n '2,41p' "$0"; exit 0;;
    *) echo "run.sh: unknown stage or option '$a' (see --help)" >&2; exit 2;;
  esac
done
[ ${#STAGES[@]} -gt 0 ] || { echo "run.sh: name at least one stage (see --help)" >&2; exit 2; }
OUT=${OUT:?run.sh writes into \$OUT (set by the device tool; set it yourself elsewhere)}
WORK=${GPU_SESSION_WORK:-$(mktemp -d /tmp/gpu_session.XXXXXX)}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
# the RL package installs as cudal2_rl (pyproject maps it to rl/); nothing is installed here
mkdir -p "$WORK/pkgs" && ln -sfn "$REPO/rl" "$WORK/pkgs/cudal2_rl"
export PYTHONPATH=$PYTHONPATH:$WORK/pkgs
CARRIED_CACHE=${GPU_SESSION_CACHE:-$REPO/.gpu_cache}
# the tests build into CUDAL2_TEST_CACHE, never CUDAL2_CACHE (tests/conftest.py): the carried
# cache is both here, so the GPU tests find their prefilled kernels
[ -d "$CARRIED_CACHE" ] && export CUDAL2_CACHE=$CARRIED_CACHE CUDAL2_TEST_CACHE=$CARRIED_CACHE
# prepare.sh gzips the carried build entries to fit the carry limit: restore them first
[ -d "$CARRIED_CACHE/builds" ] && find "$CARRIED_CACHE/builds" -type f -name '*.carry.gz' -exec gunzip -f -S .carry.gz {} +

# Wheels the image lacks (nvidia-cutlass): into /tmp/site, after the repo.
if compgen -G ".whl/*.whl" > /dev/null; then
  SITE=${GPU_SESSION_SITE:-/tmp/site}
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; then
    export PYTHONPATH=$PYTHONPATH:$SITE
  else
    echo "run.sh: installing .whl/*.whl failed; the CUTLASS tests will miss their headers" >&2
  fi
fi

# ---- provenance -------------------------------------------------------------------------
# the commit: what prepare.sh recorded for the tree it sent (the machine's .git may be stale),
# trusted only when the tree hash here matches
tree=$(bash tools/gpu_session/tree_hash.sh . 2>/dev/null || echo unknown)
if [ -f "$CARRIED_CACHE/sent.txt" ] && [ "$(sed -n 2p "$CARRIED_CACHE/sent.txt")" = "$tree" ]; then
  commit=$(sed -n 1p "$CARRIED_CACHE/sent.txt"); commit_from="prepare.sh, tree hash matches"
elif [ -f "$CARRIED_CACHE/sent.txt" ]; then
  commit="$(sed -n 1p "$CARRIED_CACHE/sent.txt")+changes"; commit_from="prepare.sh's commit; the tree here differs from the one it hashed"
else
  commit=$(git rev-parse HEAD 2>/dev/null || echo unknown); commit_from="this machine's .git (may be stale: no sent.txt)"
fi
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $0 $*"
  echo "stages: ${STAGES[*]}"
  echo "git_commit: $commit ($commit_from)"
  echo "tree_hash: $tree"
  echo "hostname: $(hostname)  kernel: $(uname -r)  cpus: $(nproc)"
  echo "python: $($PY -c 'import sys; print(sys.version.split()[0], sys.executable)')"
  echo "torch: $($PY -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available() and torch.cuda.get_device_name(0))' 2>&1 | tail -1)"
  for m in transformers trl datasets accelerate peft cutlass_library; do
    echo "$m: $($PY -c "import importlib.metadata as md, sys; n={'cutlass_library':'nvidia-cutlass'}.get('$m','$m'); print(md.version(n))" 2>/dev/null || echo absent)"
  done
  echo "nvcc: $(command -v nvcc) $(nvcc --version 2>/dev/null | grep -o 'V[0-9][0-9.]*' || echo absent)"
  echo "CUDAL2_CACHE: ${CUDAL2_CACHE:-default}  PYTHONPATH: $PYTHONPATH"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu,compute_mode,persistence_mode --format=csv
    nvidia-smi -q -d CLOCK,PERFORMANCE,POWER | grep -v '^\s*$' | head -80
  else
    echo "nvidia-smi: absent"
  fi
} > "$OUT/provenance.txt" 2>&1
cat "$OUT/provenance.txt"

gpu_ok=$($PY -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
[ -n "${CUDAL2_FAKE_DEVICE:-}" ] && echo "run.sh: CUDAL2_FAKE_DEVICE=$CUDAL2_FAKE_DEVICE: GPU workers answer as the fake device (a rehearsal: nothing is measured)"
if [ "$gpu_ok" != 1 ] && [ -z "$NO_GPU" ]; then
  echo "run.sh: no CUDA GPU visible; pass --allow-no-gpu to run the plumbing only" >&2
  exit 3
fi

# ---- stages -------------------------------------------------------------------------------
budget() {  # budget NAME DEFAULT -> seconds for this stage, never past the call's deadline
  local want=$2 left=$((DEADLINE - $(date +%s) - 20))
  [ "$left" -lt 0 ] && left=0
  [ "$left" -lt "$want" ] && want=$left
  echo "$want"
}

pack() {  # pack STAGE: $WORK/STAGE -> $OUT/STAGE.tar.gz (<= 16 MiB, else the big files go)
  local s=$1 d=$WORK/$1
  cp "$OUT/provenance.txt" "$d/provenance.txt"
  tar czf "$OUT/$s.tar.gz" -C "$WORK" --exclude='checkpoints' --exclude='*.lock' "$s"
  local size; size=$(stat -c %s "$OUT/$s.tar.gz")
  if [ "$size" -gt $((15 << 20)) ]; then
    echo "pack $s: $size bytes > 15 MiB; leaving out files over 2 MiB (listed in left_out.txt)"
    find "$d" -type f -size +2M -printf '%P %s\n' > "$d/left_out.txt"
    tar czf "$OUT/$s.tar.gz" -C "$WORK" --exclude='checkpoints' --exclude='*.lock' \
      $(sed 's/ .*//' "$d/left_out.txt" | sed "s|^|--exclude=$s/|") "$s"
  fi
  echo "== $s: rc $(cat "$d/rc") -> $OUT/$s.tar.gz ($(stat -c %s "$OUT/$s.tar.gz") bytes)"
}

stage() {  # stage NAME SECONDS CMD...: run with a timeout, log + rc into $WORK/NAME
  local s=$1 secs=$2; shift 2
  mkdir -p "$WORK/$s"
  if [ "$secs" -lt 30 ]; then
    echo "== $s: skipped, only $secs s left in this call" | tee "$WORK/$s/log.txt"
    echo skipped > "$WORK/$s/rc"; pack "$s"; return
  fi
  echo "== $s ($secs s): $*" | tee "$WORK/$s/command.txt"
  local t=$(date +%s)
  timeout -k 20 -s INT "$secs" "$@" 2>&1 | tee "$WORK/$s/log.txt"
  local rc=${PIPESTATUS[0]}
  echo "$rc" > "$WORK/$s/rc"
  echo "$(( $(date +%s) - t )) s" > "$WORK/$s/seconds"
  [ "$rc" = 124 ] && echo "== $s: stopped at its $secs s budget" | tee -a "$WORK/$s/log.txt"
}

# ---- the verdict call ----------------------------------------------------------------------
account() {  # account NAME SECONDS: one phase of the call, before the campaign
  echo "$1 $2" >> "$WORK/phases.txt"
  $PY -c '
import json, sys
phases = {}
for line in open(sys.argv[1]):
    name, secs = line.rsplit(" ", 1)
    phases[name] = phases.get(name, 0.0) + float(secs)
print(json.dumps({"start": float(sys.argv[2]), "phases": phases}))' "$WORK/phases.txt" "$T0" > "$WORK/call.json"
}

snapshot() {  # snapshot DIR NAME: $WORK/DIR -> $OUT/NAME.tar.gz, replaced whole (a kill keeps the last)
  tar czf "$OUT/$2.tar.gz.tmp" -C "$WORK" "$1" && mv "$OUT/$2.tar.gz.tmp" "$OUT/$2.tar.gz"
}

queue_stage() {  # queue_stage SECONDS DB EXCL: the RL queue's pack screened (and its bests in finals) into DB
  local t=$(date +%s) n
  n=$($PY -c 'import json,sys; m=json.load(open(sys.argv[1])); print(len(m["candidates"]), "sources,", m["screenings"], "(source, shape) screenings")' "$QUEUE/manifest.json" 2>/dev/null)
  echo "== RL queue ($1 s): $n"
  # kernel time only (the reward table's draws); each shape's best in finals, as the campaign does
  # shellcheck disable=SC2086
  timeout -k 10 -s INT $(( $1 + 15 )) $PY -m cudal2 campaign run "$QUEUE" --budget-s "$1" --modes offline \
    --finals-per-shape 1 --db "$2" --out "$WORK/campaign/queue" --kernels-out "$WORK/campaign/generated_kernels" \
    --live "$OUT" --no-progress ${3:+--exclude-families $3} ${NO_GPU:+--allow-no-gpu}
  echo "== RL queue: rc $?"
  account "RL queue" $(( $(date +%s) - t ))
}

profile_stage() {  # profile_stage SECONDS PACK...: ncu over each shape's best finalist and fastest baseline
  local t=$(date +%s) db=$WORK/campaign/results.db secs=$1 pk args=()
  shift
  for pk in "$@"; do args+=(--pack "$pk"); done
  # a rehearsal's ncu is the fake one: the real parser reads what it prints
  [ -n "${CUDAL2_FAKE_DEVICE:-}" ] && args+=(--ncu "tools/gpu_session/fake_ncu.py")
  echo "== profile ($secs s)"
  timeout -k 10 -s INT $(( secs + 15 )) $PY tools/gpu_session/profile.py --db "$db" "${args[@]}" \
    --out "$OUT/profile.csv" --budget-s "$secs"
  echo "== profile: rc $?"
  [ -f "$OUT/summary.json" ] && $PY -m cudal2.runs.account extend "$OUT/summary.json" profile \
    $(( $(date +%s) - t )) --start "$T0"
}

plan() {  # plan QUEUE_S PROFILE_S: the call's time plan, printed before it starts
  echo "== plan of the $(( DEADLINE - T0 )) s call: canary <= 90 s; GPU tests <= ${BUDGET_TESTS:-150} s," \
    "each due group, largest first, its share of what is left by its GPU tests; RL queue $1 s;" \
    "campaign (the ceilings, then the packs' shapes in priority order) until the profile's" \
    "reserve; profile $2 s; 10 s to pack"
}

verdict() {
  local t tdir=$WORK/tests g test left share excl arch budget tests_end pk packs qs=0 keep ps
  account "call start (wheels, provenance)" $(( $(date +%s) - T0 ))
  # the RL queue's slice of the call (kept out of the tests' time like the campaign's minimum)
  [ -f "$QUEUE/manifest.json" ] && qs=${BUDGET_QUEUE:-$(( (DEADLINE - T0) * ${QUEUE_PCT:-5} / 100 ))}
  # the profile stage's reserve: after the campaign, before the deadline
  ps=${BUDGET_PROFILE:-90}
  keep=$(( ${CAMPAIGN_MIN_S:-120} + qs + ps ))
  plan "$qs" "$ps"
  arch=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["arch"])' "$PACK/manifest.json" 2>/dev/null || echo sm_90a)
  t=$(date +%s)
  if timeout -k 5 90 $PY tools/gpu_session/canary.py --arch "$arch" 2>&1 | tee "$WORK/canary.txt" | grep -q '^canary: \(ok\|not_measured\)'; then
    echo "== canary: passed with the call guard"
  else
    echo "== canary: FAILED with the call guard ($(tail -1 "$WORK/canary.txt")): the call goes on with CUDAL2_CALL_GUARD=0"
    export CUDAL2_CALL_GUARD=0
  fi
  account canary $(( $(date +%s) - t ))
  t=$(date +%s); tests_end=$(( t + ${BUDGET_TESTS:-150} )); mkdir -p "$tdir"
  # largest first, each group its part of the tests' time by its GPU tests among the groups left
  # (prepare.sh's count; equal parts without it)
  local counts=$CARRIED_CACHE/gpu_tests.json fam=tools/gpu_session/families.py rc dsel id
  local groups=($($PY $fam order --counts "$counts" $($PY $fam due))) n=0
  for g in "${groups[@]}"; do
    test=$($PY $fam test "$g")
    # at least 15 s each (a fast group's rest goes to the later ones), so one slow group cannot
    # starve the others
    left=$(( tests_end - $(date +%s) ))
    share=$($PY $fam share --counts "$counts" "$left" "${groups[@]:n}"); n=$((n + 1))
    [ "$share" -lt "$left" ] && left=$share
    # the queue and the campaign keep at least their slice and CAMPAIGN_MIN_S of the call
    [ $(( DEADLINE - $(date +%s) - keep )) -lt "$left" ] && left=$(( DEADLINE - $(date +%s) - keep ))
    if [ "$left" -lt 15 ]; then echo "== tests $g: skipped, $left s left for tests" | tee -a "$tdir/skipped.txt"; continue; fi
    # what partial runs of these inputs already passed is not run again (families.py done)
    $PY $fam done "$g" > "$tdir/$g.deselected"
    dsel=()
    while read -r id; do [ -n "$id" ] && dsel+=(--deselect "$id"); done < "$tdir/$g.deselected"
    echo "== tests $g ($test, at most $left s${dsel[*]:+, $(( ${#dsel[@]} / 2 )) passed earlier: deselected})"
    # the ids selected (.collected) tell a run stopped at its share from a complete one; no xdist:
    # the image may lack it, and its controller collects nothing
    CUDAL2_COLLECTED_FILE=$tdir/$g.collected timeout -k 10 -s INT "$left" env -u CUDAL2_FAKE_DEVICE \
      $PY -m pytest -m gpu -q -p no:cacheprovider -p no:xdist -o junit_family=xunit2 \
      --junitxml="$tdir/$g.xml" "${dsel[@]}" "$test" > "$tdir/$g.log" 2>&1
    rc=$?
    echo "   rc $rc$([ "$rc" = 124 ] && echo " (stopped at its $left s share)"): $($PY $fam record "$tdir" --group "$g"); $(tail -1 "$tdir/$g.log")"
    snapshot tests tests
  done
  account tests $(( $(date +%s) - t ))
  excl=$($PY tools/gpu_session/families.py excluded "$tdir")
  [ -n "$excl" ] && echo "== kept out of timing (a GPU test failed): $excl"
  mkdir -p "$WORK/campaign"
  # one results DB for the call: the queue's rows beside the campaign's ($OUT/results.db.gz)
  [ "$qs" -gt 0 ] && queue_stage "$(budget queue "$qs")" "$WORK/campaign/results.db" "$excl"
  # one run over the decode (RC) pack, then the RR pack, until the deadline
  packs=()
  for pk in "${PACK}_rc" "$PACK"; do [ -f "$pk/manifest.json" ] && packs+=("$pk"); done
  if [ ${#packs[@]} = 0 ]; then
    echo "== campaign: no pack at $PACK or ${PACK}_rc (prepare.sh makes them)"
    [ "$qs" -gt 0 ] || return
  else
    # the campaign keeps its own reserve for export and reports; the profile its own; 10 s more
    # for the tarball and exit
    budget=$(( DEADLINE - $(date +%s) - 10 - ps ))
    # shellcheck disable=SC2086
    timeout -k 10 -s INT $(( budget + 15 )) $PY -m cudal2 campaign run "${packs[@]}" --budget-s "$budget" \
      --finals-per-shape 1 --out "$WORK/campaign" --kernels-out "$WORK/campaign/generated_kernels" \
      --db "$WORK/campaign/results.db" --live "$OUT" --call-account "$WORK/call.json" ${excl:+--exclude-families $excl} \
      ${NO_GPU:+--allow-no-gpu} ${CAMPAIGN_ARGS:-}
    echo "== campaign: rc $?"
    # the queue's pack too: a queued source may be a shape's best finalist
    [ -f "$QUEUE/manifest.json" ] && packs+=("$QUEUE")
    [ -f "$WORK/campaign/results.db" ] && profile_stage "$(budget profile "$ps")" "${packs[@]}"
  fi
  cp "$WORK/canary.txt" "$WORK/call.json" "$WORK/campaign/" 2>/dev/null
  tar czf "$OUT/campaign.tar.gz" -C "$WORK" --exclude='results.db*' --exclude='ptx' campaign
}

for s in "${STAGES[@]}"; do
  d=$WORK/$s
  if [ "$s" = verdict ]; then verdict; continue; fi
  case $s in
    tests)
      # shellcheck disable=SC2086
      # CUDAL2_TEST_PACK: tests/test_templates.py checks every CUTLASS build of the carried pack
      CUDAL2_TEST_PACK=$PACK stage tests "$(budget tests "${BUDGET_TESTS:-300}")" \
        $PY -m pytest -m gpu -q -p no:cacheprovider -p no:xdist --junitxml="$d/junit.xml" -o junit_family=xunit2 ${TESTS_ARGS:-} tests
      ;;
    overhead)
      # The shipped table has no tuned kernel yet, so time the kernel path with a table that
      # serves the mma family's default kernel on the timed shapes (made by overhead_table.py;
      # a host-cost measurement, not a speed claim: the table says so).
      mkdir -p "$d"
      if [ "$gpu_ok" = 1 ]; then ovh=(--device cuda --shape 64 64 64 --shape 256 256 256 --shape 128 4096 4096)
      else ovh=(--device cpu); fi
      stage overhead "$(budget overhead "${BUDGET_OVERHEAD:-90}")" bash -c "
        $PY tools/gpu_session/overhead_table.py '$d/kernels' 64,64,64 256,256,256 128,4096,4096 &&
        CUDAL2_KERNELS='$d/kernels' CUDAL2_USER_KERNELS='$d/kernels' $PY -m cudal2.runs.overhead ${ovh[*]} --json '$d/overhead_kernel_path.json' &&
        $PY -m cudal2.runs.overhead --device all --json '$d/overhead_shipped_table.json'"
      rm -rf "$d/kernels"   # the fixture table states no measured speedup: it stays here
      ;;
    hostile)
      stage hostile "$(budget hostile "${BUDGET_HOSTILE:-150}")" \
        $PY -m cudal2 bench --kernels tests/data/hostile --shapes 256,256,256 --mode offline \
          --baselines torch --timeout 30 --db "$d/results.db" --out "$d/report" --name hostile
      ;;
    timer)
      # shellcheck disable=SC2086
      stage timer "$(budget timer "${BUDGET_TIMER:-90}")" \
        $PY benchmarks/timer_check.py --json "$d/timer_check.json" ${TIMER_ARGS:-}
      ;;
    trace)
      # shellcheck disable=SC2086
      stage trace "$(budget trace "${BUDGET_TRACE:-90}")" \
        env ${TRACE_ENV:-} $PY benchmarks/serving_trace.py --json "$d/serving_trace.json" ${TRACE_ARGS:-}
      ;;
    campaign)
      if [ ! -f "$PACK/manifest.json" ]; then
        mkdir -p "$d"; echo "no .gpu_campaign/manifest.json: carry the pack (prepare.sh)" | tee "$d/log.txt"
        echo missing > "$d/rc"; pack "$s"; continue
      fi
      secs=$(budget campaign "${BUDGET_CAMPAIGN:-500}")
      stage campaign "$secs" $PY -m cudal2 campaign run "$PACK" --budget-s $((secs - 30)) \
        --out "$d/reports" --kernels-out "$d/generated_kernels" ${NO_GPU:+--allow-no-gpu} ${CAMPAIGN_ARGS:-}
      ;;
  esac
  pack "$s"
done
echo "run.sh done in $(( $(date +%s) - T0 )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
# the device tool returns no file over 16 MiB and at most 8: say so here, not by their absence
big=$(find "$OUT" -type f -size +16M -printf '%P (%s bytes) ')
n=$(find "$OUT" -type f | wc -l)
if [ -n "$big" ]; then echo "run.sh: WARNING: over the 16 MiB a returned file may be, these will not come back: $big"; fi
if [ "$n" -gt 8 ]; then echo "run.sh: WARNING: $n files in \$OUT; only 8 come back"; fi
