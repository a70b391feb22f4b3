"""Nsight Compute (ncu) for the profile stage: the metric set, the command line, the parser of
`ncu --csv --page raw` and the compact CSV the stage writes (tools/gpu_session/profile.py).

Pure: no GPU, no ncu needed; the tests read recorded output (tests/data/ncu/). The stage asks
ncu for a short fixed set, so each profiled call replays only a few passes:

    gpu__time_duration.sum                               kernel duration (ns)
    dram__bytes.sum                                      DRAM bytes read + written
    dram__throughput.avg.pct_of_peak_sustained_elapsed   DRAM throughput, % of peak
    lts__t_sector_hit_rate.pct                           L2 hit rate
    sm__warps_active.avg.pct_of_peak_sustained_active    achieved occupancy
    launch__registers_per_thread, launch__shared_mem_per_block_static / _dynamic
    smsp__warp_issue_stalled_<reason>_per_warp_active.pct   % of active warps stalled, per reason

Grid and block come from the raw page's own "Grid Size" / "Block Size" columns (no metric).
"""
from __future__ import annotations

import csv
import io
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

DURATION = "gpu__time_duration.sum"
DRAM_BYTES = "dram__bytes.sum"
DRAM_PCT = "dram__throughput.avg.pct_of_peak_sustained_elapsed"
L2_HIT = "lts__t_sector_hit_rate.pct"
OCCUPANCY = "sm__warps_active.avg.pct_of_peak_sustained_active"
REGISTERS = "launch__registers_per_thread"
SMEM_STATIC = "launch__shared_mem_per_block_static"
SMEM_DYNAMIC = "launch__shared_mem_per_block_dynamic"
# the warp stall reasons of the Profiling Guide (Volta and later, Hopper included); "selected"
# (the warp issued) is no stall and is left out
STALL_REASONS = ("barrier", "branch_resolving", "dispatch_stall", "drain", "imc_miss",
                 "lg_throttle", "long_scoreboard", "math_pipe_throttle", "membar", "mio_throttle",
                 "misc", "no_instruction", "not_selected", "short_scoreboard", "sleeping",
                 "tex_throttle", "wait")


def stall_metric(reason: str) -> str:
    return f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct"


METRICS = (DURATION, DRAM_BYTES, DRAM_PCT, L2_HIT, OCCUPANCY, REGISTERS, SMEM_STATIC,
           SMEM_DYNAMIC) + tuple(stall_metric(r) for r in STALL_REASONS)

# the compact CSV: one row per kernel launch of a profiled call (a reader elsewhere codes
# against these names; add columns only at the end)
COLUMNS = ("M", "N", "K", "layout", "who", "name", "launch", "kernel", "status", "detail",
           "duration_us", "dram_bytes", "dram_gbs", "dram_pct_peak", "l2_hit_pct",
           "achieved_occupancy_pct", "registers", "smem_bytes", "grid", "block",
           "stall_1", "stall_2", "stall_3")
STATUSES = ("ok", "ncu_absent", "counters_refused", "timeout", "budget", "error", "no_kernel",
            "profiler_failed")
# statuses that answer for the device, not the target: after one, no further ncu process starts
DEVICE_STATUSES = ("counters_refused", "profiler_failed")
KERNEL_NAME_MAX = 400          # a CUTLASS kernel's demangled name runs to thousands of characters


def command(ncu: str | list[str], target: list[str], *, metrics=METRICS,
            log_file: str | None = None) -> list[str]:
    """ncu around `target`: only what runs between cudaProfilerStart and Stop is profiled, at the
    clocks the timing ran at (no locking), base units, demangled names, tool output to log_file."""
    head = [ncu] if isinstance(ncu, str) else list(ncu)
    return [*head, "--clock-control", "none", "--profile-from-start", "off", "--csv",
            "--page", "raw", "--print-units", "base", "--print-kernel-base", "demangled",
            "--metrics", ",".join(metrics), "--target-processes", "all",
            *(["--log-file", log_file] if log_file else []), *target]


# ---- the parser --------------------------------------------------------------------------------

@dataclass
class Launch:
    index: int                     # 0, 1, ... in launch order within the profiled call
    kernel: str
    grid: str                      # "X,Y,Z" as ncu wrote it, spaces out
    block: str
    metrics: dict = field(default_factory=dict)   # name -> float | None, in base units


@dataclass
class Parsed:
    status: str                    # ok | counters_refused | profiler_failed | no_kernel | error
    detail: str = ""               # one line
    launches: list = field(default_factory=list)
    passes: int | None = None      # ncu's "- N passes", the most of any launch
    missing_metric: str | None = None   # a requested metric this ncu does not know


_REFUSED = "ERR_NVGPUCTRPERM"
# ncu's line when the wrapped process itself failed: the target's error, not the profiler's
_TARGET_EXIT = "==ERROR== The application returned an error code"
_MISSING = re.compile(r"Failed to find metric\s+(\S+)")
_PASSES = re.compile(r"==PROF== Profiling .*?-\s*(\d+)\s+pass")
_SCALE = {"n": 1.0, "u": 1e3, "m": 1e6, "": 1e9}                  # ...second -> ns
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12}      # ...byte -> byte (ncu: SI)


def _number(text: str) -> float | None:
    """A raw-page value: thousands separators out; "n/a" and the like -> None."""
    t = text.strip().replace(",", "")
    try:
        return float(t)
    except ValueError:
        return None


def _base(value: float | None, unit: str) -> float | None:
    """Values in base units whatever --print-units did: ns for times, bytes for sizes."""
    if value is None:
        return None
    head = unit.split("/", 1)[0].strip()
    if head.endswith("second") and head[:-6] in _SCALE:
        return value * _SCALE[head[:-6]]
    if head.endswith("byte") and head[:-4] in _PREFIX:
        return value * _PREFIX[head[:-4]]
    return value


def _dims(text: str) -> str:
    return ",".join(p.strip() for p in text.strip().strip("()").split(",") if p.strip())


def _table(text: str) -> list[list[str]] | None:
    """The raw page's rows (header first), or None when ncu printed none."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID",')), None)
    if start is None:
        return None
    body = [ln for ln in lines[start:] if ln.startswith('"')]
    return list(csv.reader(io.StringIO("\n".join(body))))


def _launches(table: list[list[str]], metrics) -> list[Launch]:
    head = table[0]
    col = {name: i for i, name in enumerate(head)}
    units = next((r for r in table[1:] if r and not r[0].strip()), [""] * len(head))
    out = []
    for r in table[1:]:
        if not r or not r[0].strip() or len(r) < len(head):
            continue
        vals = {m: _base(_number(r[col[m]]), units[col[m]]) for m in metrics if m in col}
        out.append(Launch(int(_number(r[0]) or 0), r[col["Kernel Name"]].strip(),
                          _dims(r[col["Grid Size"]]) if "Grid Size" in col else "",
                          _dims(r[col["Block Size"]]) if "Block Size" in col else "", vals))
    out.sort(key=lambda ln: ln.index)
    for i, ln in enumerate(out):          # ncu numbers every profiled launch; ours start at 0
        ln.index = i
    return out


def _missing(text: str, metrics) -> str | None:
    """The requested metric an "unknown metric" error names (ncu may print it as a regex)."""
    m = _MISSING.search(text)
    if not m:
        return None
    said = re.sub(r"regex:|[\^$\\]", "", m.group(1)).split("(")[0].rstrip(".")
    return next((x for x in metrics if x == said or x.startswith(said) or said.startswith(x)), said)


def _first(text: str, prefix: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.startswith(prefix)), "")


def _profiler_error(text: str) -> str:
    """ncu's own error line, when it profiled nothing and the target did not fail on its own
    ("Failed to initialize the profiler: LibraryNotLoaded" under a sandboxed driver, "Unknown
    Error on device 0"): "" when there is none. Such a failure is the device's, not the target's."""
    for ln in text.splitlines():
        ln = ln.strip()
        if ln.startswith("==ERROR==") and not ln.startswith(_TARGET_EXIT):
            return ln
    return ""


def parse(text: str, metrics=METRICS) -> Parsed:
    """ncu's output (the --log-file and the process's own stdout/stderr, together) -> Parsed."""
    passes = [int(p) for p in _PASSES.findall(text)]
    npass = max(passes) if passes else None
    if _REFUSED in text:
        return Parsed("counters_refused", "ncu: the driver refused the performance counters "
                      "(ERR_NVGPUCTRPERM: profiling is restricted to admin users)")
    missing = _missing(text, metrics)
    if missing:
        return Parsed("error", f"ncu does not know metric {missing}", missing_metric=missing)
    table = _table(text)
    launches = _launches(table, metrics) if table else []
    if launches:
        return Parsed("ok", "", launches, npass)
    target_said = _first(text, "profile_target:")
    failed = _profiler_error(text)
    if failed and not target_said:
        return Parsed("profiler_failed", f"ncu: {failed[:280]}")
    why = target_said or _first(text, "==ERROR==") or _first(text, "==WARNING== No kernels")
    if why.startswith("==WARNING==") or not why:
        return Parsed("no_kernel", "ncu profiled no kernel between cudaProfilerStart and Stop")
    return Parsed("error", why[:300])


# ---- the compact CSV ---------------------------------------------------------------------------

def _fmt(v: float | None, digits: int) -> str:
    if v is None:
        return ""
    return str(int(round(v))) if digits == 0 else f"{v:.{digits}f}"


def stalls(metrics: dict, top: int = 3) -> list[str]:
    """The top reasons by share, "reason:pct" (reasons at 0 left out)."""
    got = [(metrics.get(stall_metric(r)), r) for r in STALL_REASONS]
    got = sorted(((v, r) for v, r in got if v), reverse=True)[:top]
    return [f"{r}:{v:.1f}" for v, r in got] + [""] * (top - len(got))


def launch_row(base: dict, ln: Launch) -> dict:
    """One compact row for one launch; `base` holds M, N, K, layout, who, name."""
    m = ln.metrics
    ns, nbytes = m.get(DURATION), m.get(DRAM_BYTES)
    smem = [m.get(SMEM_STATIC), m.get(SMEM_DYNAMIC)]
    s1, s2, s3 = stalls(m)
    row = dict(base, launch=ln.index, kernel=ln.kernel[:KERNEL_NAME_MAX], status="ok", detail="",
               duration_us=_fmt(ns / 1e3 if ns is not None else None, 3),
               dram_bytes=_fmt(nbytes, 0),
               dram_gbs=_fmt(nbytes / ns if ns and nbytes is not None else None, 1),  # B/ns = GB/s
               dram_pct_peak=_fmt(m.get(DRAM_PCT), 2), l2_hit_pct=_fmt(m.get(L2_HIT), 2),
               achieved_occupancy_pct=_fmt(m.get(OCCUPANCY), 2), registers=_fmt(m.get(REGISTERS), 0),
               smem_bytes=_fmt(sum(x for x in smem if x is not None) if any(x is not None for x in smem)
                               else None, 0),
               grid=ln.grid.replace(",", "x"), block=ln.block.replace(",", "x"),
               stall_1=s1, stall_2=s2, stall_3=s3)
    return {c: row.get(c, "") for c in COLUMNS}


def status_row(base: dict, status: str, detail: str) -> dict:
    """One row for a profile that gave no launches (refused, absent, timeout, budget, ...)."""
    if status not in STATUSES:
        raise ValueError(f"profile status {status!r} not in {STATUSES}")
    row = dict(base, status=status, detail=" ".join(detail.split())[:300])
    return {c: row.get(c, "") for c in COLUMNS}


def rows(base: dict, parsed: Parsed) -> list[dict]:
    if parsed.status == "ok":
        return [launch_row(base, ln) for ln in parsed.launches]
    return [status_row(base, parsed.status, parsed.detail)]


def write_csv(path, rows_: list[dict]) -> None:
    """The whole file, atomically: a reader (or a kill) never sees half of it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
            w.writeheader()
            w.writerows(rows_)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_csv(path) -> list[dict]:
    """The profile CSV's rows (one per kernel launch, or one per target with its status);
    ValueError naming the file and the column or line that is wrong."""
    p = Path(path)
    try:
        with p.open(newline="") as f:
            r = csv.DictReader(f)
            missing = [c for c in COLUMNS if c not in (r.fieldnames or [])]
            if missing:
                raise ValueError(f"profile {p}: missing column(s) {missing}")
            out = list(r)
    except OSError as exc:
        raise ValueError(f"profile {p}: {exc.strerror or exc}") from None
    for i, rec in enumerate(out, start=2):
        if not all((rec[k] or "").isdigit() for k in ("M", "N", "K")):
            raise ValueError(f"profile {p}:{i}: M/N/K not integers: {rec['M']},{rec['N']},{rec['K']}")
        if rec["who"] not in ("ours", "baseline"):
            raise ValueError(f"profile {p}:{i}: who {rec['who']!r} is not ours|baseline")
    return out
