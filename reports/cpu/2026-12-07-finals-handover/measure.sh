#!/usr/bin/env bash
# measure.sh REPO OUT: one fake-device campaign run (CUDAL2_FAKE_DEVICE=1.0) of the pack $PACK
# (default /tmp/h66/pack, made by the README's prepare command) with the code at REPO, and the
# finals line of its account. Run it for the commit before and after on the same machine.
set -e
. "${VENV:-/work/venv}/bin/activate"
cd "$1"; rm -rf "$2"; mkdir -p "$2"
uptime > "$2/load.txt"
CUDAL2_FAKE_DEVICE=1.0 python -m cudal2 campaign run ${PACK:-/tmp/h66/pack} --finals-per-shape 1 --out "$2/rep" \
  --kernels-out "$2/gk" --db "$2/results.db" --live "$2/live" --no-progress > "$2/log.txt" 2>&1
uptime >> "$2/load.txt"
python - "$2" <<'PY'
import json, sys
s = json.load(open(sys.argv[1] + "/live/summary.json"))
f = s["throughput"]["final all"]; ph = s["call"]["phases"]
ho = ph.get("finals hand-over", 0.0)
fw = s.get("finals_workers") or {}
sess = fw.get("sessions")
print(f"finals {f['n']} in {f['seconds']:.1f} s: {f['per_gpu_minute']:.1f} per minute; hand-over {ho:.1f} s "
      f"({ho / f['n']:.3f} s a final" + (f", {ho / sess:.3f} s a session of {sess}" if sess else "") + f"); workers {fw}")
PY
