#!/usr/bin/env bash
# CPU machine, after a GPU `run`: unpack the returned files (the folder the device tool's
# files_at names, i.e. what run.sh wrote into $OUT) into reports/<gpu>/<date>-<stage>/, each with
# the run's provenance, and remake the reports from the returned DBs here:
#   campaign -> `cudal2 export` of its winners into generated_kernels/ (the run wrote its reports)
#               (sources from the carried pack .gpu_campaign; --no-export to skip)
#   hostile  -> `cudal2 report` (verdicts are in its DB and report)
#   rl       -> `cudal2 report` on the run's DB
#
#   tools/gpu_session/collect.sh FILES_DIR [--reports reports] [--kernels generated_kernels] [--no-export]
#                                  [--tag TAG]   (folders <date>-<stage>-TAG, e.g. TAG=s3-call2)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 1 ] || { sed -n '2,12p' "$0"; exit 2; }
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
for tgz in "$SRC"/*.tar.gz; do
  stage=$(basename "$tgz" .tar.gz)
  dest=$REPORTS/$gpu/$date-$stage$TAG
  [ -e "$dest" ] && dest=$dest-$(date -u +%H%M%S)
  tar xzf "$tgz" -C "$tmp"
  mkdir -p "$dest"
  cp -r "$tmp/$stage/." "$dest/"
  cp "$SRC/provenance.txt" "$dest/provenance.txt"
  [ -f "$SRC/session.log" ] && cp "$SRC/session.log" "$dest/session.log"
  ran=$(sed -n 's/^tree_hash: //p' "$SRC/provenance.txt")
  here=$(bash tools/gpu_session/tree_hash.sh .)
  { echo "collect.sh $SRC (local HEAD $(git rev-parse HEAD), $(date -u +%FT%TZ))"
    echo "tree_hash ran ${ran:-unrecorded}, local $here: $([ "$ran" = "$here" ] && echo same code || echo 'DIFFERENT code: find the commit whose tree_hash.sh matches')"
  } > "$dest/collected.txt"
  echo "== $stage -> $dest (rc $(cat "$dest/rc" 2>/dev/null || echo ?))"
  done_any=1
  case $stage in
    campaign)
      for db in "$dest"/reports/*/*-campaign/results.db; do
        run=$(dirname "$db")     # campaign run wrote a report per timings key next to its DB
        if [ $EXPORT = 1 ] && [ -f "$PACK/manifest.json" ]; then
          srcs=$tmp/sources; mkdir -p "$srcs"
          $PY - "$PACK" "$srcs" <<'EOF'
import json, shutil, sys
pack, out = sys.argv[1:]
for c in json.load(open(f"{pack}/manifest.json"))["candidates"]:
    shutil.copy(f"{pack}/{c['dir']}/kernel.cu", f"{out}/{c['sha']}.cu")
EOF
          $PY -m cudal2 export --db "$db" --report "${run#"$REPO"/}" --sources "$srcs" --out "$KERNELS" || true
        fi
      done
      # the GPU side's own export is the same rows from the same DB: with the export redone into
      # the repo's table above, a second copy of the sources under reports/ is only a duplicate
      if [ $EXPORT = 1 ]; then rm -rf "$dest/generated_kernels"; fi
      # every tracked byte travels with each later GPU call (64 MiB in all): a large DB is kept
      # gzipped (`gunzip -k results.db.gz` to query it); evaluations.csv beside it holds the rows
      for db in "$dest"/reports/*/*-campaign/results.db; do
        [ "$(stat -c %s "$db")" -gt 4000000 ] && gzip -9 "$db"
      done
      ;;
    hostile)
      [ -f "$dest/results.db" ] && { $PY -m cudal2 report --db "$dest/results.db" --out "$dest/report-db" || true; }
      ;;
    rl)
      [ -f "$dest/run/results.db" ] && { $PY -m cudal2 report --db "$dest/run/results.db" --out "$dest/report-db" || true; }
      ;;
  esac
done
[ $done_any = 1 ] || { echo "collect.sh: no <stage>.tar.gz in $SRC" >&2; exit 1; }
echo "collected into $REPORTS/$gpu/; review, then commit reports/ (and generated_kernels/ if exported)"
