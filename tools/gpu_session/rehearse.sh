#!/usr/bin/env bash
# CPU machine: rehearse the verdict call end to end before a GPU sees it. Prepares (or takes a
# given pack), runs `run.sh --allow-no-gpu verdict` with the fake device (CUDAL2_FAKE_DEVICE: GPU
# workers answer with synthetic times, sleeping what a GPU took times SCALE) under the deadline
# scaled the same way, and checks what would come back: at most 8 files, each under 16 MiB, no
# deeper than two folders, the deadline kept, a complete summary with its by-phase account. Then
# runs the call again and kills it (SIGKILL, the whole process group) at a random point, and checks
# that what it left is usable: results.db opens, summary.json parses, tests.tar.gz lists.
#
#   tools/gpu_session/rehearse.sh [--pack DIR] [--queue FILE] [--scale 0.2] [--no-kill] [--work DIR]
# --pack DIR: use this campaign pack (as .gpu_campaign) instead of running prepare.sh
# --queue FILE: an RL queue (rl/table.py's Queue) as the call's queue stage (prepare.sh --queue);
#   the complete call must land rows for its sources in results.db
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PACK="" QFILE="" SCALE=0.2 KILL=1 WORK=""
while [ $# -gt 0 ]; do
  case $1 in
    --pack) PACK=$(cd "$2" && pwd); shift 2;;
    --queue) QFILE=$(realpath "$2"); shift 2;;
    --scale) SCALE=$2; shift 2;;
    --no-kill) KILL=0; shift;;
    --work) WORK=$2; shift 2;;
    -h|--help) sed -n '2,14p' "$0"; exit 0;;
    *) echo "rehearse.sh: unknown argument $1 (see --help)" >&2; exit 2;;
  esac
done
PY=${PYTHON:-python3}
WORK=${WORK:-$(mktemp -d /tmp/rehearse.XXXXXX)}
mkdir -p "$WORK"
cd "$REPO"
t0=$(date +%s)
QPACK=$WORK/no-queue
if [ -z "$PACK" ]; then
  bash tools/gpu_session/prepare.sh ${QFILE:+--queue "$QFILE"} 2>&1 | tee "$WORK/prepare.log"
  PACK=$REPO/.gpu_campaign
  [ -n "$QFILE" ] && QPACK=$REPO/.gpu_queue
elif [ -n "$QFILE" ]; then      # the queue's pack alone, beside the given pack
  bash tools/gpu_session/prepare.sh --second --root "$WORK/qroot" --no-prefill --no-campaign --no-wheels \
    --queue "$QFILE" 2>&1 | tee "$WORK/prepare.log"
  QPACK=$WORK/qroot/.gpu_queue
fi
[ -z "$QFILE" ] || [ -f "$QPACK/manifest.json" ] || { echo "rehearse: no queue pack at $QPACK (prepare.log)" >&2; exit 1; }
echo "== rehearse: prepare/pack ready in $(( $(date +%s) - t0 )) s; pack $PACK"
# The call runs on a copy of the carried cache: run.sh unpacks the gzipped build entries where they
# lie, and a rehearsal must leave the carry as the call will find it (a grown carry is refused)
carry_before=$(bash tools/gpu_session/carry_size.sh)
CARRIED=${GPU_SESSION_CACHE:-$REPO/.gpu_cache} CACHE_COPY=$WORK/carried-cache
rm -rf "$CACHE_COPY"
if [ -d "$CARRIED" ]; then cp -a "$CARRIED" "$CACHE_COPY"; else mkdir -p "$CACHE_COPY"; fi
# The deadline scaled as the fake device's time, but never below what Python, worker starts,
# pytest collection and the campaign's up-front audit cost on a CPU (they do not scale: the audit
# of the 2026-11-29 packs' 319 builds took 52 s on 2 cores, 7 s on the H200 machine's 16). Those
# floors were set on an idle 2-core machine; on a loaded one they stretch by its slowdown, measured
# here (SLOW: this machine's time for a Python start with torch against the idle machine's).
slow=$($PY tools/gpu_session/slowdown.py)
floor() { $PY -c "print(max(int($1 * $slow), int($2 * $SCALE)))"; }   # floor SECONDS SCALED_SECONDS
deadline=$(floor 150 570)
tests=$(floor 30 150)
echo "== rehearse: this machine runs CPU work ${slow}x slower than the idle machine the floors were set on"
# the queue's slice likewise: a campaign run's start on a CPU takes ~8 s whatever the scale
export CUDAL2_FAKE_DEVICE=$SCALE GPU_SESSION_DEADLINE_S=$deadline BUDGET_TESTS=$tests GPU_SESSION_PACK=$PACK \
  GPU_SESSION_CACHE=$CACHE_COPY \
  CAMPAIGN_MIN_S=$(floor 40 120) GPU_SESSION_QUEUE=$QPACK \
  BUDGET_PROFILE=$(floor 20 90) \
  BUDGET_QUEUE=$($PY -c "print(max(int(20 * $slow), int(570 * ${QUEUE_PCT:-5} / 100 * $SCALE)))")

call() {  # call OUT: one verdict call, as the device tool runs it (its own process group); CALL_PID
  mkdir -p "$1"
  OUT=$1 GPU_SESSION_WORK=$1.work setsid bash tools/gpu_session/run.sh --allow-no-gpu verdict > "$1.stdout" 2>&1 &
  CALL_PID=$!
}

check_files() {  # check_files OUT: the device tool's limits on what comes back
  $PY - "$1" <<'PYEOF'
import sys
from pathlib import Path
out = Path(sys.argv[1])
files = [p for p in out.rglob("*") if p.is_file()]
bad = [f"{p} ({p.stat().st_size} bytes)" for p in files if p.stat().st_size > 16 << 20]
bad += [f"{p}: deeper than two folders" for p in files if len(p.relative_to(out).parts) > 3]
if len(files) > 8:
    bad.append(f"{len(files)} files > 8")
for p in sorted(files):
    print(f"  {p.relative_to(out)}  {p.stat().st_size} bytes")
sys.exit(f"rehearse: {'; '.join(bad)}" if bad else 0)
PYEOF
}

check_usable() {  # check_usable OUT COMPLETE: results.db opens, summary parses, tests.tar.gz lists
  $PY - "$1" "$2" "$QPACK" "$PACK" <<'PYEOF'
import json, sys, tarfile
from pathlib import Path
from cudal2.harness.db import ResultsDB
out, complete, qpack, pack = Path(sys.argv[1]), sys.argv[2] == "1", Path(sys.argv[3]), Path(sys.argv[4])
LIMIT = 16 << 20                 # the most a returned file may be
if (out / "results.db").exists():
    sys.exit("rehearse: results.db came back ungzipped (the call's DB travels as results.db.gz)")
if (out / "results.db.gz").exists():
    with ResultsDB(out / "results.db.gz", readonly=True) as db:
        rows = db.rows()
    print(f"  results.db.gz: {len(rows)} rows")
    if complete and rows:        # a full call: every pack's screenings and one finals row per shape
        packs = [json.loads((p / "manifest.json").read_text())
                 for p in (Path(f"{pack}_rc"), pack, qpack) if (p / "manifest.json").is_file()]
        want = sum(m["screenings"] + 3 * len(m["shapes"]) for m in packs)   # <= 3 finalists a shape
        size = (out / "results.db.gz").stat().st_size
        projected = size * max(1.0, want / len(rows))
        print(f"  results.db.gz projected for a full call: {projected / 2**20:.1f} MiB "
              f"({size} bytes for {len(rows)} rows, {want} rows planned; limit 16 MiB)")
        assert projected <= LIMIT, f"a full call's results.db.gz would be {projected:.0f} bytes > 16 MiB"
    if (qpack / "manifest.json").exists():     # the queue's stage: its sources' rows in the call's DB
        queued = {c["sha"] for c in json.loads((qpack / "manifest.json").read_text())["candidates"]}
        mine = [ev for ev in rows if ev.source_sha in queued]
        print(f"  results.db: {len(mine)} rows of the {len(queued)} queued sources "
              f"({sum(ev.stage == 'screen' for ev in mine)} screenings, {sum(ev.stage == 'final' for ev in mine)} finals)")
        assert mine or not complete, "the queue's stage landed no rows in results.db"
for s in sorted(out.glob("summary*.json")):
    d = json.loads(s.read_text())
    print(f"  {s.name}: {d['shapes_done']} of {d['shapes_planned']} shapes, complete {d['complete']}, "
          f"call {d['call']['wall_s']} s, {d['call']['unattributed_fraction']:.1%} unattributed; "
          f"ceilings {d.get('ceilings', {}).get('status')}")
    if complete:
        assert d["complete"], f"{s} is not complete"
        assert sum(d["call"]["phases"].values()) <= d["call"]["wall_s"] * 1.01
        assert d.get("ceilings", {}).get("status") == "ok", f"{s}: ceilings {d.get('ceilings')}"
if (out / "profile.csv").exists():           # the real reader over what the (fake) ncu stage wrote
    from collections import Counter
    from cudal2.harness import ncu
    prof = ncu.read_csv(out / "profile.csv")
    print(f"  profile.csv: {len(prof)} rows, {dict(Counter(r['status'] for r in prof))}")
    assert not complete or any(r["status"] == "ok" for r in prof), "the profile stage profiled nothing"
elif complete:
    sys.exit("rehearse: the complete call left no profile.csv")
if (out / "tests.tar.gz").exists():
    names = tarfile.open(out / "tests.tar.gz").getnames()
    print(f"  tests.tar.gz: {len(names)} entries, junit: {[n for n in names if n.endswith('.xml')]}")
if complete:
    assert list(out.glob("summary*.json")) and (out / "campaign.tar.gz").exists(), "no summary or campaign.tar.gz"
PYEOF
}

echo "== rehearse: the verdict call with the fake device (scale $SCALE, deadline $deadline s)"
t=$(date +%s)
call "$WORK/out"
wait "$CALL_PID" || true
wall=$(( $(date +%s) - t ))
tail -25 "$WORK/out.stdout"
echo "== rehearse: the call took $wall s of its $deadline s deadline; what comes back:"
check_files "$WORK/out"
check_usable "$WORK/out" 1
[ "$wall" -le $(( deadline + 15 )) ] || { echo "rehearse: the call overran its deadline ($wall > $deadline + 15 s)" >&2; exit 1; }

if [ $KILL = 1 ]; then
  at=$($PY -c "import random; print(random.randint(5, $deadline - 5))")
  echo "== rehearse: the call again, killed at $at s"
  call "$WORK/killed"
  sleep "$at"
  kill -KILL -- "-$CALL_PID" 2>/dev/null || true
  wait "$CALL_PID" 2>/dev/null || true
  check_files "$WORK/killed"
  check_usable "$WORK/killed" 0
fi
carry_after=$(bash tools/gpu_session/carry_size.sh)
if [ "$carry_after" != "$carry_before" ]; then
  echo "rehearse: the carry was $carry_before bytes before the rehearsal and is $carry_after after it:" >&2
  bash tools/gpu_session/carry_size.sh --parts >&2
  exit 1
fi
echo "== rehearse: passed in $(( $(date +%s) - t0 )) s (work in $WORK); the carry is as it was ($(( carry_after >> 20 )) MiB)"
