"""The device kind a verdict call names, and what either lent Hopper would autotune inside it.

The call names its kind: `run` without one starts whatever is free (an H100 first), while the
plan, the committed rows it is compared with and the cuBLASLt choices the packs carry
(`campaign prepare --lt-choices-from reports`) are the H200's. A carried choice answers only on
its GPU model and cuBLASLt version (harness/baselines.py autotune_key); a row without one is
autotuned inside the call, in its shape's finals.

    python tools/gpu_session/kind.py PACK [PACK...]   # the kind line, then the coverage per model
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from cudal2.harness.baselines import autotune_key, legacy_autotune_key  # noqa: E402
from cudal2.runs.campaign import load_manifest  # noqa: E402

# the device tool's kinds and the GPU model each one lends (torch.cuda.get_device_name)
KINDS = {"nvidia-h200": "NVIDIA H200", "nvidia-h100-x1": "NVIDIA H100 80GB HBM3"}
PLAN_KIND = "nvidia-h200"
# The H200's RC call of 2026-11-26 carried no choice: every one of its 26 decode rows autotuned
# in its finals, and the whole RC stage took 134 s (reports/NVIDIA_H200/README.md).
AUTOTUNED_EXAMPLE = "as all 26 RC rows did in the H200's call of 2026-11-26 (its RC stage: 134 s in all)"


def _versions(choices: dict) -> list[int]:
    """The cuBLASLt versions the carried choices were made with ("...|cublasLt 130100|...")."""
    return sorted({int(k.split("|")[1].split()[-1]) for k in choices if "|cublasLt " in k})


def coverage(manifests: list[dict]) -> dict[str, tuple[int, int, list[int]]]:
    """Per kind: (rows whose choice the packs carry for its GPU model, rows, cuBLASLt versions
    checked). A row is a pack's (shape, acc, layout)."""
    rows = {(tuple(s), m["acc"], m["layout"]) for m in manifests for s in m["shapes"]}
    choices = {k: v for m in manifests for k, v in (m.get("lt_choices") or {}).items()}
    versions = _versions(choices)
    out = {}
    for kind, gpu in KINDS.items():
        def carried(row) -> bool:
            (M, N, K), acc, layout = row
            return any(key in choices for v in versions
                       for key in (autotune_key(gpu, v, M, N, K, acc, layout),
                                   legacy_autotune_key(gpu, v, M, N, K, acc, layout)))
        out[kind] = (sum(map(carried, rows)), len(rows), versions)
    return out


def lines(manifests: list[dict]) -> list[str]:
    cov = coverage(manifests)
    out = [f"  kind:      \"{PLAN_KIND}\"   (the plan's GPU; refused: name \"nvidia-h100-x1\", "
           "never no kind)"]
    for kind, (have, n, versions) in cov.items():
        lt = "/".join(map(str, versions)) or "none"
        left = n - have
        tail = (f"; {left} autotuned inside the call, {AUTOTUNED_EXAMPLE}" if left else "")
        out.append(f"  {kind:<15} cuBLASLt choices carried for {have} of {n} rows (cuBLASLt {lt}){tail}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("packs", nargs="+", type=Path)
    args = ap.parse_args(argv)
    try:
        manifests = [load_manifest(p) for p in args.packs if (p / "manifest.json").is_file()]
    except ValueError as exc:
        print(f"kind.py: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines(manifests)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
