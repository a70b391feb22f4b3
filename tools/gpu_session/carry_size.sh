#!/usr/bin/env bash
# The bytes a device `run` call sends: the files git would send from the repo (tracked, and
# untracked but not ignored; a tracked file deleted in the working tree is not sent) plus every
# carried folder under ROOT (default the repo root). prepare.sh sizes the carry with it and
# rehearse.sh checks that a rehearsal leaves it as it found it.
#   tools/gpu_session/carry_size.sh [ROOT]            total bytes
#   tools/gpu_session/carry_size.sh [ROOT] --parts    "part bytes" lines: the tree, then each folder
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
ROOT=$REPO PARTS=0
for a in "$@"; do case $a in --parts) PARTS=1;; *) ROOT=$a;; esac; done
FOLDERS=(.gpu_cache .gpu_campaign .gpu_campaign_rc .gpu_queue .gpu_confirm .whl)
# du reads the names from stdin (one du, whatever the file count); missing files are skipped
tree=$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard \
  | du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1 || true)
total=${tree:-0}
[ $PARTS = 1 ] && echo "tree $total"
for d in "${FOLDERS[@]}"; do
  [ -d "$ROOT/$d" ] || continue
  n=$(du -sb "$ROOT/$d" | cut -f1); total=$((total + n))
  [ $PARTS = 1 ] && echo "$d $n"
done
[ $PARTS = 1 ] || echo "$total"
