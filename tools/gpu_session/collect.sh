#!/usr/bin/env bash
# CPU machine, after a GPU `run`: unpack the returned files (the folder the device tool's
# files_at names, i.e. what run.sh wrote into $OUT) into reports/<gpu>/<date>-<stage>/, each with
# the run's provenance, and remake the reports from the returned DBs here:
#   verdict  -> reports/<gpu>/<date>-verdict/: provenance, session.log, tests/ (junit per group,
#               family_inputs.json), campaign/ (reports, export decisions, the call's account),
#               the RL queue's run (campaign/queue/), results.db.gz (both runs' rows), summary.json,
#               profile.csv (the profile stage's, when it ran);
#               `cudal2 export` of its winners into generated_kernels/ (sources from the carried
#               packs .gpu_campaign, .gpu_campaign_rc and .gpu_queue)
#   campaign -> `cudal2 export` of its winners into generated_kernels/ (the run wrote its reports)
#               (sources from the carried pack .gpu_campaign; --no-export to skip)
#   hostile  -> `cudal2 report` (verdicts are in its DB and report)
#
#   tools/gpu_session/collect.sh FILES_DIR [--reports reports] [--kernels generated_kernels] [--no-export]
#                                  [--tag TAG]   (folders <date>-<stage>-TAG, e.g. TAG=s3-call2)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,17p' "$0"; exit 2; }
SRC=$(cd "$1" && pwd); shift
REPORTS=$REPO/reports KERNELS=$REPO/generated_kernels EXPORT=1 TAG=
while [ $# -gt 0 ]; do
  case $1 in
    --reports) REPORTS=$2; shift 2;;
    --kernels) KERNELS=$2; shift 2;;
    --no-export) EXPORT=0; shift;;
    --tag) TAG=-$2; shift 2;;
    *) echo "collect.sh: unknown argument $1" >&2; exit 2;;
  esac
done
PY=${PYTHON:-python3}
PACK=${GPU_SESSION_PACK:-.gpu_campaign}
cd "$REPO"
[ -f "$SRC/provenance.txt" ] || { echo "collect.sh: $SRC/provenance.txt missing: not a run.sh output folder" >&2; exit 2; }
# reports/<gpu>/: the GPU's name as nvidia-smi gives it, spaces -> '_' (as campaign/bench name it)
gpu=$(awk -F', ' '/^name, driver_version/{getline; print $1; exit}' "$SRC/provenance.txt")
[ -n "$gpu" ] || gpu=no-gpu
gpu=${gpu// /_}; gpu=${gpu//\//_}
date=$(sed -n 's/^date_utc: \([0-9-]*\)T.*/\1/p' "$SRC/provenance.txt")
date=${date:-$(date -u +%F)}
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
shopt -s nullglob
done_any=0

provenance() {  # provenance DEST: the run's provenance, and whether the code that ran is this tree's
  cp "$SRC/provenance.txt" "$1/provenance.txt"
  [ -f "$SRC/session.log" ] && cp "$SRC/session.log" "$1/session.log"
  local ran here
  ran=$(sed -n 's/^tree_hash: //p' "$SRC/provenance.txt")
  here=$(bash tools/gpu_session/tree_hash.sh .)
  { echo "collect.sh $SRC (local HEAD $(git rev-parse HEAD), $(date -u +%FT%TZ))"
    echo "tree_hash ran ${ran:-unrecorded}, local $here: $([ "$ran" = "$here" ] && echo same code || echo 'DIFFERENT code: find the commit whose tree_hash.sh matches')"
  } > "$1/collected.txt"
}

export_from() {  # export_from DB RUN_DIR PACK...: the export rule over the DB, sources from the packs
  local db=$1 run=$2 srcs=$tmp/sources; shift 2
  mkdir -p "$srcs"
  for pk in "$@"; do
    [ -f "$pk/manifest.json" ] || continue
    $PY - "$pk" "$srcs" <<'EOF'
import json, sys
from pathlib import Path
from cudal2.runs.campaign import read_source
pack, out = sys.argv[1:]
for c in json.load(open(f"{pack}/manifest.json"))["candidates"]:
    Path(f"{out}/{c['sha']}.cu").write_text(read_source(Path(pack) / c["dir"]))
EOF
  done
  $PY -m cudal2 export --db "$db" --report "${run#"$REPO"/}" --sources "$srcs" --out "$KERNELS" || true
}

shrink() {  # shrink DEST: every results DB, and row dumps and logs over 64 KiB, gzipped (reports/README.md)
  # (every tracked byte travels with each later GPU call; summaries, JSON and profile.csv stay readable)
  find "$1" -type f -name '*.db' -exec gzip -9n {} +
  find "$1" -type f \( -name 'evaluations.csv' -o -name '*.jsonl' -o -name '*.log' -o -name '*.xml' \) \
    -size +64k -exec gzip -9n {} +
}

if grep -q '^stages: verdict' "$SRC/provenance.txt"; then
  dest=$REPORTS/$gpu/$date-verdict$TAG
  [ -e "$dest" ] && dest=$dest-$(date -u +%H%M%S)
  mkdir -p "$dest"
  provenance "$dest"
  # the call's DB comes back gzipped (results.db.gz: a DB over 16 MiB would not come back at all)
  for f in results.db.gz summary.json profile.csv; do [ -f "$SRC/$f" ] && cp "$SRC/$f" "$dest/"; done
  for t in tests campaign; do [ -f "$SRC/$t.tar.gz" ] && tar xzf "$SRC/$t.tar.gz" -C "$dest"; done
  run=$(dirname "$(find "$dest/campaign" -name summary.json -path '*-campaign/*' ! -path '*/campaign/queue/*' 2>/dev/null | head -1)")
  if [ $EXPORT = 1 ] && [ -f "$dest/results.db.gz" ]; then
    export_from "$dest/results.db.gz" "${run:-$dest}" "$PACK" "${PACK}_rc" "${GPU_SESSION_QUEUE:-.gpu_queue}"
    rm -rf "$dest/campaign/generated_kernels"    # the same export, redone into the repo's table
  fi
  shrink "$dest"
  # the call gzipped its DB fast (level 1, after every shape); what is committed travels with every
  # later call: recompressed at -9
  if [ -f "$dest/results.db.gz" ]; then
    gunzip -c "$dest/results.db.gz" | gzip -9n > "$tmp/results.db.gz" && mv "$tmp/results.db.gz" "$dest/results.db.gz"
  fi
  echo "== verdict -> $dest"
  echo "collected into $REPORTS/$gpu/; review, then commit reports/ (and generated_kernels/ if exported)"
  exit 0
fi

for tgz in "$SRC"/*.tar.gz; do
  stage=$(basename "$tgz" .tar.gz)
  dest=$REPORTS/$gpu/$date-$stage$TAG
  [ -e "$dest" ] && dest=$dest-$(date -u +%H%M%S)
  tar xzf "$tgz" -C "$tmp"
  mkdir -p "$dest"
  cp -r "$tmp/$stage/." "$dest/"
  provenance "$dest"
  echo "== $stage -> $dest (rc $(cat "$dest/rc" 2>/dev/null || echo ?))"
  done_any=1
  case $stage in
    campaign)
      for db in "$dest"/reports/*/*-campaign/results.db; do
        [ $EXPORT = 1 ] && export_from "$db" "$(dirname "$db")" "$PACK"
      done
      # the GPU side's own export is the same rows from the same DB: with the export redone into
      # the repo's table above, a second copy of the sources under reports/ is only a duplicate
      if [ $EXPORT = 1 ]; then rm -rf "$dest/generated_kernels"; fi
      ;;
    hostile)
      [ -f "$dest/results.db" ] && { $PY -m cudal2 report --db "$dest/results.db" --out "$dest/report-db" || true; }
      ;;
  esac
  shrink "$dest"     # every tracked byte travels with each later GPU call
done
[ $done_any = 1 ] || { echo "collect.sh: no <stage>.tar.gz in $SRC" >&2; exit 1; }
echo "collected into $REPORTS/$gpu/; review, then commit reports/ (and generated_kernels/ if exported)"
