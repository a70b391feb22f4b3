#!/usr/bin/env python3
"""A fake `ncu` for CPU rehearsals of the profile stage (tools/gpu_session/profile.py --ncu).

It takes the command line the stage gives the real one (cudal2/harness/ncu.py `command`),
refusing an option it does not know as ncu would, runs the wrapped target for real (on the fake
device, CUDAL2_FAKE_DEVICE: the target loads its library and writes what it would launch to
$CUDAL2_FAKE_NCU_LAUNCHES), and prints what ncu prints: ==PROF== lines, then the `--csv --page
raw` table (a quoted header, a units row, one row per launch; values with thousands separators),
into --log-file if given, else stdout. The real parser reads it.

CUDAL2_FAKE_NCU selects a mode:
    ok (default)   profile the launches, synthetic metric values
    refuse         ERR_NVGPUCTRPERM: the counters refused, no kernel profiled
    initfail       the profiler fails to start (as under gVisor on an H200), the target never runs
    unknown=NAME   ncu does not know metric NAME ("Failed to find metric"), when it is asked
    hang           never returns (a stuck replay)
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time

VALUED = {"--clock-control", "--profile-from-start", "--page", "--print-units",
          "--print-kernel-base", "--metrics", "--target-processes", "--log-file",
          "--cache-control", "--replay-mode"}
FLAGS = {"--csv"}
FIXED = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
         "Block Size", "Grid Size", "Device", "CC"]
PASSES = 7
INIT_FAILED = "==ERROR== Failed to initialize the profiler: LibraryNotLoaded"
REFUSED = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU "
           "Performance Counters on the target device 0. For instructions on enabling permissions "
           "and to get more information see https://developer.nvidia.com/ERR_NVGPUCTRPERM")


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    opts, i = {}, 0
    while i < len(argv) and argv[i].startswith("--"):
        a = argv[i]
        if a in FLAGS:
            opts[a] = True
            i += 1
        elif a in VALUED and i + 1 < len(argv):
            opts[a] = argv[i + 1]
            i += 2
        else:
            sys.exit(f"==ERROR== unrecognised option '{a}'. Use --help for further details.")
    if i == len(argv):
        sys.exit("==ERROR== No application was specified.")
    return opts, argv[i:]


def _q(v) -> str:
    return '"' + str(v).replace('"', '""') + '"'


def _grouped(v: float) -> str:
    """ncu's value spelling: thousands separators, decimals only where they matter."""
    return f"{v:,.0f}" if float(v).is_integer() or abs(v) >= 1e4 else f"{v:,.2f}"


def _unit(m: str) -> str:
    if m.startswith("gpu__time_duration"):
        return "nsecond"
    if m == "dram__bytes.sum":
        return "byte"
    if m.startswith("launch__shared_mem"):
        return "byte/block"
    if m.startswith("launch__registers"):
        return "register/thread"
    return "%" if m.endswith(".pct") or "pct_of_peak" in m else ""


def _value(m: str, ln: dict, seed: str) -> float:
    """Deterministic synthetic values, in range for each metric."""
    r = int(hashlib.sha256((seed + m).encode()).hexdigest()[:8], 16) / 2**32
    if m.startswith("gpu__time_duration"):
        return round(ln["duration_ns"])
    if m == "dram__bytes.sum":
        return round(ln["duration_ns"] * (400 + 2400 * r))       # 0.4 .. 2.8 TB/s
    if m.startswith("launch__registers"):
        return ln.get("registers", 32 + 8 * int(r * 28))
    if m == "launch__shared_mem_per_block_static":
        return ln.get("smem_static", 0)
    if m == "launch__shared_mem_per_block_dynamic":
        return ln.get("smem_dynamic", 1024 * int(r * 200))
    if "stalled" in m:
        return round(60 * r * r, 2)
    return round(5 + 90 * r, 2)


def table(launches: list[dict], metrics: list[str], pid: int) -> list[str]:
    head = FIXED + metrics
    lines = [",".join(map(_q, head)), ",".join(_q("") for _ in FIXED) + ","
             + ",".join(_q(_unit(m)) for m in metrics)]
    for i, ln in enumerate(launches):
        fixed = [i, pid, "python3", "127.0.0.1", ln["kernel"], 1, 7,
                 "(" + ln["block"].replace(",", ", ") + ")", "(" + ln["grid"].replace(",", ", ") + ")",
                 0, "9.0"]
        vals = [_grouped(_value(m, ln, ln["kernel"] + str(i))) for m in metrics]
        lines.append(",".join(map(_q, fixed + vals)))
    return lines


def run_target(target: list[str]) -> tuple[int, list[dict]]:
    fd, path = tempfile.mkstemp(prefix="fake_ncu.", suffix=".json")
    os.close(fd)
    try:
        env = dict(os.environ, CUDAL2_FAKE_NCU_LAUNCHES=path)
        rc = subprocess.run(target, env=env).returncode
        text = open(path).read()
        return rc, (json.loads(text) if text.strip() else [])
    finally:
        os.unlink(path)


def main(argv: list[str]) -> int:
    opts, target = parse(argv)
    metrics = [m for m in opts.get("--metrics", "").split(",") if m]
    mode = os.environ.get("CUDAL2_FAKE_NCU", "ok")
    out: list[str] = []
    log = opts.get("--log-file")
    pid = os.getpid() + 1

    def emit():
        text = "".join(s + "\n" for s in out)
        if log:
            with open(log, "a") as f:
                f.write(text)
        else:
            sys.stdout.write(text)
            sys.stdout.flush()

    if mode.startswith("unknown=") and mode[8:] in metrics:
        out.append(f"==ERROR== Failed to find metric regex:^{mode[8:].replace('.', chr(92) + '.')}$")
        emit()
        return 1
    if mode == "initfail":
        out.append(INIT_FAILED)
        emit()
        return 1
    out.append(f"==PROF== Connected to process {pid} ({sys.executable})")
    if mode == "hang":
        emit()
        while True:
            time.sleep(3600)
    rc, launches = run_target(target)
    if mode == "refuse":
        out += [REFUSED, f"==PROF== Disconnected from process {pid}", "==WARNING== No kernels were profiled."]
        emit()
        return 1
    for i, ln in enumerate(launches):
        out.append(f'==PROF== Profiling "{ln["kernel"][:30]}" - {i}: 0%....50%....100% - {PASSES} passes')
    out.append(f"==PROF== Disconnected from process {pid}")
    if rc:
        out.append(f"==ERROR== The application returned an error code ({rc}).")
    if not launches:
        out.append("==WARNING== No kernels were profiled.")
    else:
        out += table(launches, metrics, pid)
    emit()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
