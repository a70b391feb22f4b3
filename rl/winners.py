"""Warm-start data from the results DB: each shape's measured winners (SFT on measured bests).

The corpus (rl.corpus) teaches the policy to write kernels; this teaches it which kernel wins
where. For each shape the DB has measured (status ok, final stage, not estimated, on one GPU
model), the target completion is the fastest kernel's source; the prompt is the shape's brief
prompt followed, as CUDA-L1 does, by earlier kernels for the shape with their measured times
(the runners-up, slower than the target), so the policy learns to improve on what it is shown.
Estimated rows never enter: an estimate is no measurement. `python -m cudal2_rl.warmstart --db`
trains on these pairs instead of the corpus.
"""
from __future__ import annotations

from dataclasses import dataclass

from .prompts import brief_prompt

DEFAULT_BASELINE = "cublaslt_autotuned"
MAX_EARLIER_CHARS = 6000          # an earlier kernel longer than this is cut (prompt length)


@dataclass(frozen=True)
class Winner:
    shape: tuple[int, int, int]
    sha: str
    speedup: float               # measured, vs the baseline, in the mode
    time_us: float | None        # the kernel's measured median time
    source: str
    gpu: str


def measured_winners(db, *, arch: str = "sm_90a", acc: str = "f32", baseline: str = DEFAULT_BASELINE,
                     mode: str = "offline", gpu: str | None = None) -> dict[tuple, list[Winner]]:
    """{shape: [Winner, ...] fastest first, one per distinct kernel} from the DB's measured final
    rows (a kernel measured more than once counts by its newest row, as the cache serves it).
    `gpu`: only rows measured on that GPU model; None: the DB must hold one GPU model's rows
    (ValueError naming them otherwise: speedups from two GPUs do not rank together)."""
    rows = [e for e in db.rows(arch=arch, status="ok", estimated=False, stage="final")
            if (not acc or e.acc == acc)]
    gpus = sorted({(e.env or {}).get("gpu", "") for e in rows} - {""})
    if gpu is None and len(gpus) > 1:
        raise ValueError(f"the DB holds measurements from {len(gpus)} GPU models ({', '.join(gpus)}): "
                         "name one")
    newest: dict[tuple, object] = {}
    for e in rows:                               # oldest first: the newest row per kernel wins
        if gpu is not None and (e.env or {}).get("gpu", "") != gpu:
            continue
        newest[((e.shape.M, e.shape.N, e.shape.K), e.source_sha)] = e
    out: dict[tuple, list[Winner]] = {}
    for (shape, sha), e in newest.items():
        s = ((e.speedups or {}).get(mode) or {}).get(baseline)
        src = db.source(sha)
        if not s or not src:
            continue
        t = (((e.timings or {}).get(mode) or {}).get("candidate") or {}).get("median_us")
        out.setdefault(shape, []).append(Winner(shape, sha, float(s), t, src, (e.env or {}).get("gpu", "")))
    for ws in out.values():
        ws.sort(key=lambda w: (-w.speedup, w.sha))
    return out


def earlier_text(w: Winner, baseline: str = DEFAULT_BASELINE) -> str:
    src = w.source if len(w.source) <= MAX_EARLIER_CHARS else w.source[:MAX_EARLIER_CHARS] + "\n// ... (cut)"
    t = f"{w.time_us:.1f} us, " if w.time_us else ""
    return (f"An earlier kernel for this shape measured {t}{w.speedup:.2f}x {baseline} on {w.gpu or 'a GPU'}:\n"
            f"```cuda\n{src.strip()}\n```")


def winner_prompt(shape, earlier: list[Winner], arch: str = "sm_90a", acc: str = "f32",
                  baseline: str = DEFAULT_BASELINE) -> str:
    """The brief prompt of `shape`, then the earlier kernels with their measured times."""
    text = brief_prompt(shape, arch, acc)
    if earlier:
        text += "\n\n" + "\n\n".join(earlier_text(w, baseline) for w in earlier) + \
            "\n\nWrite a faster kernel for this shape."
    return text


def db_pairs(db, *, arch: str = "sm_90a", acc: str = "f32", baseline: str = DEFAULT_BASELINE,
             mode: str = "offline", gpu: str | None = None, earlier: int = 1,
             min_speedup: float = 0.0) -> list[tuple[str, str, tuple, Winner]]:
    """(prompt, completion, shape, winner) per shape: the completion is the shape's fastest
    measured kernel (if at least `min_speedup`), the prompt carries up to `earlier` slower ones."""
    out = []
    for shape, ws in sorted(measured_winners(db, arch=arch, acc=acc, baseline=baseline, mode=mode,
                                             gpu=gpu).items()):
        best = ws[0]
        if best.speedup < min_speedup:
            continue
        prompt = winner_prompt(shape, ws[1:1 + earlier][::-1], arch, acc, baseline)
        out.append((prompt, best.source, shape, best))
    return out
