#!/usr/bin/env bash
# CPU machine: prepare a GPU call, into ignored folders of the repo root.
#
#   tools/gpu_session/prepare.sh          the verdict call (README.md here): prints the command, the
#                                         folders to carry and the time limit
#     .gpu_cache/       CUDAL2_CACHE: the kernels of the GPU test groups due (families.py due), the
#                       canary's, the baselines; sent.txt (the commit and tree hash sent);
#                       gpu_tests.json (each due group's GPU tests: run.sh's shares)
#     .gpu_campaign/    `cudal2 campaign prepare` of the RR priority shapes (priority.py: the new
#                       families' targets, then the unmeasured stratified shapes by expected gain),
#                       carrying the committed DBs' cuBLASLt choices
#     .gpu_campaign_rc/ the same for the RC decode rows
#     .whl/             nvidia-cutlass, only when the CUTLASS tests are due (their headers)
#   tools/gpu_session/prepare.sh --queue PATH      the same, and the RL queue's stage:
#     .gpu_queue/       `cudal2 campaign prepare --sources-queue PATH`: the queued sources (the RL
#                       reward's misses, rl/table.py's Queue), each at its queued shapes, built and
#                       audited here, within what the carry leaves (QUEUE_PACK_MIB, default 8: the
#                       least counted, then the oldest, left out first). No --queue, no stage: the
#                       queues RL runs left (runs/*/queue.jsonl) are listed, never picked silently.
#   tools/gpu_session/prepare.sh --confirm PATH --no-campaign --no-prefill --no-wheels
#     .gpu_confirm/     `cudal2 campaign prepare --sources-confirm PATH`: an experiment's confirm.jsonl
#                       (every arm's held-out winner per shape), each screened at its shape and all
#                       sent to that shape's one finals session; run it with
#                       GPU_SESSION_PACK=.gpu_confirm run.sh campaign (README.md here)
#   tools/gpu_session/prepare.sh --second [--shapes CSV] [--no-wheels] [--no-campaign] [--no-prefill]
#       [--families "mma ptx"] [--limit-per-shape N] [--queue PATH]
#                                         a second call's folders: every GPU test's kernels, the
#                                         hostile corpus, a pack of CSV (default the stratified
#                                         100), .whl (nvidia-cutlass)
# Either way: build entries travel gzipped (*.carry.gz; run.sh restores them), and the carry (the
# tree that travels + these folders) must stay under 56 MiB (the call's limit is 64; each GPU run
# adds some): over it, prepare lists what is largest and fails.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$REPO SHAPES=shapes/stratified_100.csv ARCH=sm_90a
WHEELS=1 CAMPAIGN=1 PREFILL=1 FAMILIES="" LIMIT_PER_SHAPE="" QUEUE="" CONFIRM=""
VERDICT=1
while [ $# -gt 0 ]; do
  case $1 in --queue|--root) ;; *) VERDICT=0;; esac     # alone, they keep the verdict call
  case $1 in
    --second) shift;;
    --queue) QUEUE=$(realpath "$2"); shift 2;;
    --confirm) CONFIRM=$(realpath "$2"); shift 2;;
    --shapes) SHAPES=$2; shift 2;;
    --arch) ARCH=$2; shift 2;;
    --root) ROOT=$2; shift 2;;
    --no-wheels) WHEELS=0; shift;;
    --no-campaign) CAMPAIGN=0; shift;;
    --no-prefill) PREFILL=0; shift;;
    --families) FAMILIES=$2; shift 2;;
    --limit-per-shape) LIMIT_PER_SHAPE=$2; shift 2;;
    -h|--help) sed -n '2,32p' "$0"; exit 0;;
    *) echo "prepare.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
LIMIT=$((56 << 20))
PY=${PYTHON:-python3}
# Where every build happens, the test prefill's and the packs': kept between prepares (a kernel is
# compiled once, whoever asks first); .gpu_cache gets copies of the prefill's entries.
BUILD_CACHE=${PREPARE_BUILD_CACHE:-$HOME/.cache/cudal2}
# The one wheel a call may need: the CUTLASS headers of the CUTLASS tests, pinned to the version here.
# (No policy, trl or training travels: with the reward table, RL's GPU work is the queue's stage.)
PINS=("nvidia-cutlass==$($PY -c 'from importlib.metadata import version; print(version("nvidia-cutlass"))' 2>/dev/null || echo 4.2.0.0)")

cd "$REPO"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the scripts import cudal2 from this checkout, installed or not
mkdir -p "$ROOT"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
for d in /.gpu_cache/ /.gpu_campaign/ /.gpu_campaign_rc/ /.gpu_queue/ /.gpu_confirm/ /.whl/; do
  grep -qxF "$d" "$exclude" 2>/dev/null || echo "$d" >> "$exclude"
done
export CUDAL2_CACHE=$ROOT/.gpu_cache
# an earlier prepare left the build entries gzipped for the journey (below): usable again first
[ -d "$CUDAL2_CACHE/builds" ] && find "$CUDAL2_CACHE/builds" -type f -name '*.carry.gz' -exec gunzip -f -S .carry.gz {} +
echo "== prepare: root $ROOT, arch $ARCH, shapes $SHAPES, nvcc $(nvcc --version 2>/dev/null | grep -o 'V[0-9.]*' || echo '?')"

T_PREP=$(date +%s) T_LAP=$(date +%s)
lap() { local now; now=$(date +%s); echo "== $1: $((now - T_LAP)) s"; T_LAP=$now; }   # the phases' times
if [ $VERDICT = 1 ]; then
  due=$($PY tools/gpu_session/families.py due | tr '\n' ' ')
  only="canary,baselines"
  for g in $due; do only="$only,$(basename "$($PY tools/gpu_session/families.py test "$g")" .py)"; done
  echo "== verdict call: GPU test groups due: ${due:-none}"
  rm -rf "$CUDAL2_CACHE"      # copies only: the builds stay in $BUILD_CACHE
  $PY tools/gpu_session/prefill.py --arch "$ARCH" --only "$only" --seed "$BUILD_CACHE"
  lap "prefill (the due tests' kernels)"
  # each due group's GPU tests still to run: run.sh shares the tests' time by them
  if [ -n "$due" ]; then
    mkdir -p "$CUDAL2_CACHE"
    # shellcheck disable=SC2086
    if $PY tools/gpu_session/families.py count $due > "$CUDAL2_CACHE/gpu_tests.json"; then
      echo "== GPU tests per group: $(cat "$CUDAL2_CACHE/gpu_tests.json")"
    else
      rm -f "$CUDAL2_CACHE/gpu_tests.json"; echo "== no gpu_tests.json: run.sh shares the tests' time equally"
    fi
  fi
  prio=$(mktemp -d)
  $PY tools/gpu_session/priority.py "$prio"
  lap "priority lists"
  # pack:shapes:MiB; the RC pack's decode rows carry >= 200 screenings each (~200 builds)
  for p in .gpu_campaign:priority_rr.csv:16 .gpu_campaign_rc:priority_rc.csv:24; do
    dir=${p%%:*} rest=${p#*:}
    echo "== campaign pack $ROOT/$dir"
    rm -rf "${ROOT:?}/$dir"
    CUDAL2_CACHE="$BUILD_CACHE" \
      $PY -m cudal2 campaign prepare --shapes "$prio/${rest%%:*}" --arch "$ARCH" --out "$ROOT/$dir" \
        --lt-choices-from reports --max-pack-mib "${MAX_PACK_MIB:-${rest#*:}}" --run-order file
    lap "campaign pack $dir (its planning and builds: the lines above)"
  done
  rm -rf "$prio" "$ROOT/.whl"
  WHEELS=0
  case " $due " in *" templates "*) WHEELS=1;; esac     # the CUTLASS tests need its headers
  CAMPAIGN=0 PREFILL=0
fi
if [ $PREFILL = 1 ]; then
  echo "== build cache $CUDAL2_CACHE (GPU tests' kernels, hostile corpus, baselines)"
  $PY tools/gpu_session/prefill.py --arch "$ARCH" --seed "$BUILD_CACHE"
fi
if [ $CAMPAIGN = 1 ]; then
  echo "== campaign pack $ROOT/.gpu_campaign"
  rm -rf "$ROOT/.gpu_campaign"
  # the pack copies its builds: build them in the user's cache, not the carried one
  CUDAL2_CACHE="$BUILD_CACHE" \
    $PY -m cudal2 campaign prepare --shapes "$SHAPES" --arch "$ARCH" --out "$ROOT/.gpu_campaign" \
      ${LIMIT_PER_SHAPE:+--limit-per-shape $LIMIT_PER_SHAPE} ${FAMILIES:+--families $FAMILIES} \
      --max-pack-mib "${MAX_PACK_MIB:-64}"   # what one lent-GPU call may carry
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
  lap "gzip of $CUDAL2_CACHE"
fi

# What the call runs, and the commit it was prepared at (run.sh trusts it when the tree hash matches)
mkdir -p "$CUDAL2_CACHE"
printf '%s\n%s\n' "$(git rev-parse HEAD)$(git diff --quiet HEAD -- 2>/dev/null || echo -dirty)" \
  "$(bash tools/gpu_session/tree_hash.sh .)" > "$CUDAL2_CACHE/sent.txt"

# Size of what a `run` call sends: the tree git sends + the carried folders (carry_size.sh)
FOLDERS=(.gpu_cache .gpu_campaign .gpu_campaign_rc .gpu_queue .gpu_confirm .whl)
carried() { bash tools/gpu_session/carry_size.sh "$ROOT"; }

# The RL queue's stage: its pack last, in what the rest of the carry leaves (a stale one never travels)
rm -rf "${ROOT:?}/.gpu_queue"
if [ -n "$QUEUE" ]; then
  mib=$(awk "BEGIN{q=${QUEUE_PACK_MIB:-8}; r=($LIMIT - $(carried))/1048576; printf \"%.1f\", (r < q ? r : q)}")
  if awk "BEGIN{exit !($mib < 1)}"; then
    echo "== RL queue $QUEUE: no stage, the carry leaves $mib MiB (a queue pack needs its baselines: 1 MiB or more)"
  else
    echo "== RL queue pack $ROOT/.gpu_queue from $QUEUE (at most $mib MiB)"
    CUDAL2_CACHE="$BUILD_CACHE" \
      $PY -m cudal2 campaign prepare --sources-queue "$QUEUE" --arch "$ARCH" --out "$ROOT/.gpu_queue" \
        --lt-choices-from reports --max-pack-mib "$mib" --no-progress
  fi
else
  queues=""
  [ -d runs ] && queues=$(find runs -maxdepth 3 -name queue.jsonl | sort)
  if [ -n "$queues" ]; then
    echo "== RL queues RL runs left (none is screened unless named: prepare.sh --queue PATH):"
    sed 's/^/   /' <<< "$queues"
  fi
fi

# An experiment's confirmation: its pack in what the rest of the carry leaves (a stale one never travels)
rm -rf "${ROOT:?}/.gpu_confirm"
if [ -n "$CONFIRM" ]; then
  mib=$(awk "BEGIN{printf \"%.1f\", ($LIMIT - $(carried))/1048576}")
  echo "== confirm pack $ROOT/.gpu_confirm from $CONFIRM (at most $mib MiB)"
  CUDAL2_CACHE="$BUILD_CACHE" \
    $PY -m cudal2 campaign prepare --sources-confirm "$CONFIRM" --arch "$ARCH" --out "$ROOT/.gpu_confirm" \
      --lt-choices-from reports --max-pack-mib "$mib" --no-progress
fi

total=$(carried) carry=()
while read -r part n; do
  [ "$part" = tree ] && part="working tree" || carry+=("\"$part\"")
  printf '%-18s %8.1f MiB\n' "$part" "$(awk "BEGIN{print $n/1048576}")"
done < <(bash tools/gpu_session/carry_size.sh "$ROOT" --parts)
printf '%-18s %8.1f MiB (limit 56)\n' "total" "$(awk "BEGIN{print $total/1048576}")"
if [ "$total" -gt "$LIMIT" ]; then
  echo "prepare.sh: $total bytes > 56 MiB: carry less. Largest:" >&2
  { git ls-files -z --cached --others --exclude-standard | xargs -0 -r du -b 2>/dev/null
    for d in "${FOLDERS[@]}"; do
      [ -d "$ROOT/$d" ] && du -b --max-depth=1 "$ROOT/$d" 2>/dev/null; done; } | sort -rn | head -15 >&2
  exit 1
fi
carry_json="[$(IFS=,; echo "${carry[*]}" | sed 's/,/, /g')]"
if [ $VERDICT = 1 ]; then
  echo "prepared in $(( $(date +%s) - T_PREP )) s. The call:"
  echo "  command:   bash tools/gpu_session/run.sh verdict"
  echo "  carry:     $carry_json"
  echo "  timeout_s: 600   (run.sh's deadline is 570 s; GPU_SESSION_DEADLINE_S to change it)"
  # the kind, named (no kind starts an H100), and what each Hopper would autotune in the call
  $PY tools/gpu_session/kind.py "$ROOT/.gpu_campaign_rc" "$ROOT/.gpu_campaign"
else
  echo "carry: $carry_json   (tools/gpu_session/README.md has the run commands)"
fi
