"""A throwaway kernel table for the overhead stage: the mma family's default (any-shape) kernel,
RR and RC, marked to serve the given shapes, so `python -m cudal2.runs.overhead` times the kernel
path before any measured winner exists (the shipped table has none yet).

This table states no measured speedup: its rows carry the smallest value the index accepts for a
tuned row and a report field that says so; run.sh deletes it after the stage, and the overhead
JSON's `served_by` says which path was timed. The same fixture as tests/test_matmul.py's gpu_store.

    python tools/gpu_session/overhead_table.py DIR M,N,K [M,N,K ...]
"""
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

NOTE = "gpu_session overhead fixture: not measured, host-cost benchmark only"


def main(argv) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    import torch

    from cudal2.core.store import KernelIndex
    from cudal2.core.vocab import AUDIT_VERSION
    from cudal2.templates import FAMILIES, instantiate
    root = Path(argv[0])
    try:
        shapes = [tuple(int(x) for x in s.split(",")) for s in argv[1:]]
    except ValueError:
        print(f"overhead_table.py: shapes are M,N,K, got {argv[1:]}", file=sys.stderr)
        return 2
    idx = KernelIndex(root)
    # the rows name this GPU, so the kernel path serves them outright: a row of another GPU
    # model (or naming none) would race torch first and could time torch's path instead
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    for layout in ("RR", "RC"):
        src = instantiate(FAMILIES["mma"].default().with_(LAYOUT=layout))
        for M, N, K in shapes:
            # audit: the family's default passes this cudal2's audit (tests/test_callguard.py
            # drives its launcher under the call guard); a row without it would not serve
            idx.add(src, arch="sm_90a", acc="f32", layout=layout, M=M, N=N, K=K, family="mma",
                    tuned=True, mode="offline", report=NOTE, speedups={"torch": 1.0001},
                    audit=AUDIT_VERSION, gpu=gpu)
    idx.write()
    print(f"wrote {root / 'index.csv'}: mma default kernel on {len(shapes)} shape(s), RR and RC ({NOTE})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
