"""The first-call race: a shape without its own tuned kernel is served by a nearest one only if
that kernel beats torch's cuBLAS path on the caller's own operands, timed the harness's way
(kernel time, cudal2.timing) and decided by the export rule's margin: the lower end of the
interval of torch time / kernel time must clear 1 + WIN_MARGIN. Ties and noise go to torch.
Verdicts are kept in memory and on disk ($CUDAL2_CACHE/dispatch/)."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Callable

import torch

from cudal2.core import knobs
from cudal2.core.vocab import WIN_MARGIN
from cudal2.runtime.loader import KernelLoadError
from cudal2.timing import kerneltime as KT

log = logging.getLogger("cudal2.runtime")

# A short session: the race runs inside a user's first call of the shape.
RACE_CONFIG = KT.KernelTimeConfig(sample_us=200.0, warmup_ms=1.0, min_rounds=5, max_rounds=15,
                                  budget_s=0.25, target=0.01, operands="hot")
_verdicts: dict[str, dict] = {}


def race(contenders: dict[str, Callable[[torch.Tensor], None]], a, b, M: int, N: int, *,
         backend=None, config: KT.KernelTimeConfig = RACE_CONFIG) -> dict:
    """Time every contender (fn(c) writes C = a @ b on the current stream; "torch" is the
    reference) by kernel time, interleaved. A kernel whose output disagrees with torch's, or
    that fails to launch, is disqualified. Returns {"speedups": {name: {median, lo, hi, n}}
    (torch time / name's time), "time_us": {name: median}, "wrong": {name: error}, "session"}."""
    ref = torch.matmul(a, b).float()
    scale = ref.abs().max().item() + 1.0
    c = torch.empty((M, N), dtype=torch.float16, device=a.device)
    wrong = {}
    for name, run in list(contenders.items()):
        if name == "torch":
            continue
        c.fill_(float("nan"))
        try:
            run(c)
            err = (c.float() - ref).abs().max().item()
        except KernelLoadError as exc:  # launch error: disqualified like a wrong answer
            err = float("nan")
            log.warning("cudal2: %s", exc)
        if not err <= 1e-2 * scale:  # NaN fails too
            wrong[name] = err
            del contenders[name]
    names = list(contenders)
    out = {"speedups": {}, "time_us": {}, "wrong": wrong, "session": {}}
    if len(names) < 2:
        return out
    kt = KT.time_kernels({n: (lambda i, run=contenders[n]: run(c)) for n in names}, config,
                         backend or KT.CudaKernelBackend(), n_sets=1,
                         pairs=[("torch", n) for n in names if n != "torch"])
    out["time_us"] = {n: kt.time(n).median for n in names}
    out["speedups"] = {n: kt.ratio("torch", n).to_dict() for n in names if n != "torch"}
    out["session"] = kt.session_dict()
    return out


def choose_winner(result: dict, margin: float = WIN_MARGIN) -> str:
    """The contender whose speedup interval has the highest lower end, if that end clears
    1 + margin; else "torch"."""
    sp = result.get("speedups") or {}
    if not sp:
        return "torch"
    best = max(sp, key=lambda n: (sp[n]["lo"], n))
    return best if sp[best]["lo"] >= 1.0 + margin else "torch"


def verdict_path(key: dict) -> Path:
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    slug = "".join(ch if ch.isalnum() else "_" for ch in key["gpu"])[:60]
    return knobs.cache_dir() / "dispatch" / slug / f"{digest[:40]}.json"


def read_verdict(key: dict) -> dict | None:
    digest = json.dumps(key, sort_keys=True)
    hit = _verdicts.get(digest)
    if hit is not None:
        return hit
    try:
        data = json.loads(verdict_path(key).read_text())
        if data.get("key") != key or not isinstance(data.get("winner"), str):
            return None
    except (OSError, ValueError):
        return None
    _verdicts[digest] = data
    return data


def write_verdict(key: dict, data: dict) -> None:
    _verdicts[json.dumps(key, sort_keys=True)] = data
    p = verdict_path(key)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=".verdict.", suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, p)
    except OSError as exc:  # a read-only cache only costs a re-race next process
        log.warning("cudal2: cannot write race verdict %s: %s", p, exc)


def forget() -> None:
    """Forget the in-memory verdicts (the on-disk ones stay)."""
    _verdicts.clear()
