"""Prompts for the policy, from the data files in rl/data/.

Two styles:
- ``full`` (real LLMs): the task, the kernel ABI (rl/data/abi.md), the audit's rules
  (rl/data/rules.md), reference kernels (template instantiations accepted for the shape, and the
  best kernels found so far for nearby shapes), and contrastive feedback from earlier attempts
  at this shape: verdict, speedup, trimmed compile errors, ptxas registers/smem/spills and which
  baseline won.
- ``brief`` (the default small policy, SmolLM2-135M + adapter: its context and CPU time are
  short): the shape, the hardware facts of the arch, the ABI in three lines, and the template
  families of the arch with one family file as the example (rl/data/prompt_brief.txt).
- ``compact`` (the built-in ~1M-parameter test policy, 256-token context): one line naming the
  shape, arch and accumulator (rl/data/prompt_compact.txt).
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from string import Template

from .corpus import family_file, variants

DATA = Path(__file__).resolve().parent / "data"
STYLES = ("full", "brief", "compact")

# What a kernel writer needs to know about the target (SM count, L2, shared memory, the
# tensor-core instructions and TMA); per arch, one line.
HARDWARE = {
    "sm_90a": "H100 SXM: 132 SMs, 50 MB L2, 228 KB shared memory per SM (227 KB per block, opt-in), "
              "64K registers per SM, wgmma + TMA + clusters available, mma.sync and WMMA too",
    "sm_90": "H100: 132 SMs, 50 MB L2, 228 KB shared memory per SM; no wgmma (needs sm_90a), "
             "mma.sync, WMMA and cp.async",
    "sm_80": "A100: 108 SMs, 40 MB L2, 164 KB shared memory per SM; mma.sync, WMMA and cp.async, "
             "no wgmma or TMA",
}


def hardware_line(arch: str) -> str:
    return HARDWARE.get(arch, f"{arch}: no hardware facts recorded")


@lru_cache(maxsize=None)
def data_file(name: str) -> str:
    return (DATA / name).read_text()


def _shape(shape) -> tuple[int, int, int]:
    if hasattr(shape, "M"):
        return int(shape.M), int(shape.N), int(shape.K)
    m, n, k = shape
    return int(m), int(n), int(k)


def compact_prompt(shape, arch: str = "sm_90a", acc: str = "f32") -> str:
    M, N, K = _shape(shape)
    return Template(data_file("prompt_compact.txt")).substitute(M=M, N=N, K=K, arch=arch, acc=acc).strip()


def brief_prompt(shape, arch: str = "sm_90a", acc: str = "f32") -> str:
    M, N, K = _shape(shape)
    return Template(data_file("prompt_brief.txt")).substitute(
        M=M, N=N, K=K, arch=arch, acc=acc, hardware=hardware_line(arch),
        families=families_line(arch), example=family_example(arch, acc).strip()).strip()


def arch_families(arch: str) -> list:
    """The template families (cudal2.templates.FAMILIES, in its order) that target `arch`."""
    from cudal2.templates import FAMILIES
    return [f for f in FAMILIES.values() if arch in f.arches]


def families_line(arch: str) -> str:
    """`name (header)` for every family of the arch, comma-separated."""
    return ", ".join(f"{f.name} ({f.header})" for f in arch_families(arch)) or f"none for {arch}"


def family_example(arch: str, acc: str = "f32") -> str:
    """One family file: the first family of the arch that offers the accumulator, its default
    config ("" when none)."""
    from cudal2.templates import with_acc
    for fam in arch_families(arch):
        cfg = with_acc(fam.default(), acc)
        if cfg is not None and fam.valid(cfg, arch):
            return family_file(cfg)
    return ""


def template_references(shape, arch: str = "sm_90a", acc: str = "f32", *, limit: int = 2) -> list[tuple[str, str]]:
    """(title, kernel file) for each template family on `arch` whose default config (with the
    accumulator set) accepts the shape; the cost model's favourite first."""
    from cudal2.search.costmodel import CostModel
    from cudal2.templates import FAMILIES, with_acc
    M, N, K = _shape(shape)
    model = CostModel.default(arch=arch)
    refs = []
    for fam in FAMILIES.values():
        if arch not in getattr(fam, "arches", (arch,)):
            continue
        cfg = with_acc(fam.default(), acc)
        if cfg is None or not fam.valid(cfg, arch) or not fam.serves(cfg, M, N, K):
            continue
        t = model.predict_us(cfg, None, (M, N, K))
        refs.append((t, f"template family `{fam.name}` ({fam.header}), config {cfg.label()}",
                     family_file(cfg)))
    refs.sort(key=lambda r: r[0])
    return [(title, text) for _t, title, text in refs[:limit]]


def nearby_best(shape, best: dict, *, limit: int = 1) -> list[tuple[str, str]]:
    """The best kernels found so far (`best`: shape -> rl.reward.Attempt) for the nearest other
    shapes, by log-distance in (M, N, K)."""
    M, N, K = _shape(shape)

    def dist(s):
        return sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(s, (M, N, K)))
    others = sorted((s for s in best if s != (M, N, K) and best[s].source), key=dist)[:limit]
    out = []
    for s in others:
        a = best[s]
        tag = "estimated " if a.estimated else ""
        out.append((f"best so far for {s[0]}x{s[1]}x{s[2]} ({tag}speedup {a.speedup:.2f}x)", a.source))
    return out


def measured_nearby(shape, arch: str = "sm_90a", acc: str = "f32", *, limit: int = 1,
                    index=None) -> list[tuple[str, str]]:
    """The measured kernels of the shipped table (generated_kernels/index.csv, or `index`, a
    cudal2.core.store.KernelIndex) nearest to the shape, with their measured speedups: the best
    known kernels for nearby shapes. Rows without a measurement are skipped."""
    from cudal2.core.store import KernelIndex
    M, N, K = _shape(shape)
    try:
        idx = index if index is not None else KernelIndex.load()
    except Exception:          # no table here: nothing to show
        return []

    def dist(r):
        return sum(abs(math.log2(a) - math.log2(b)) for a, b in zip(r.shape, (M, N, K)))
    rows = [r for r in idx.rows if r.arch == arch and r.acc == acc and r.speedup_cublaslt_autotuned]
    out = []
    for r in sorted(rows, key=dist)[:limit]:
        try:
            src = idx.source(r)
        except Exception:
            continue
        out.append((f"measured for {r.M}x{r.N}x{r.K} ({r.family}, {r.mode}): "
                    f"{r.speedup_cublaslt_autotuned:.2f}x cuBLASLt autotuned, "
                    f"{r.speedup_torch or 0:.2f}x torch", src))
    return out


def corpus_reference(shape, arch: str = "sm_90a", acc: str = "f32") -> list[tuple[str, str]]:
    """One complete kernel file from the corpus (rl/data/corpus) that serves the shape: it
    defines the entry points itself, so a model sees a whole file, not a template include. On
    sm_90a the inline-PTX wgmma file comes first (the arch's own tensor-core instruction; its
    variants exist for sm_90a only), then the mma.sync and WMMA pipelines."""
    M, N, K = _shape(shape)
    for t in ("wgmma", "ptx_pipe", "wmma_pipe"):
        cands = [v for v in variants(t, arch) if v.acc == acc and v.layout == "RR" and v.serves(M, N, K)]
        if cands:
            v = cands[len(cands) // 2]
            return [(f"complete kernel file, {v.label()} (not measured)", v.source())]
    return []


def _trim_log(log: str, lines: int = 6) -> str:
    """The useful lines of a compile log: errors first, then warnings, never ptxas chatter."""
    rows = [r.strip() for r in (log or "").splitlines() if r.strip()]
    errs = [r for r in rows if "error" in r.lower()]
    keep = errs or [r for r in rows if "warning" in r.lower()] or rows[-lines:]
    return "\n".join(keep[:lines])


def attempt_line(a) -> str:
    """One feedback entry for an rl.reward.Attempt."""
    parts = [f"verdict {a.verdict}"]
    if a.speedup is not None:
        parts.append(f"{'estimated ' if a.estimated else ''}speedup {a.speedup:.2f}x")
    if a.reward is not None:
        parts.append(f"reward {a.reward:+.2f}")
    b = a.build or {}
    if b.get("registers") is not None:
        parts.append(f"ptxas: {b.get('registers')} regs, {b.get('shared_bytes', 0)} B smem, "
                     f"{b.get('spills', 0)} B spills")
    if a.winner_baseline:
        parts.append(f"fastest baseline {a.winner_baseline}")
    text = "- " + "; ".join(parts)
    if a.verdict == "build_error":
        text += "\n  compiler: " + _trim_log(b.get("log_tail", "")).replace("\n", "\n  compiler: ")
    elif a.detail and a.verdict not in ("ok", "not_measured"):
        text += f"\n  why: {a.detail[:200]}"
    if a.source:
        text += "\n```cuda\n" + a.source.strip()[:1500] + "\n```"
    return text


def feedback_text(attempts, *, limit: int = 3) -> str:
    """Contrastive feedback: distinct previous attempts, best first, then the latest failures."""
    seen, uniq = set(), []
    for a in attempts:
        if a.sha and a.sha in seen:
            continue
        seen.add(a.sha)
        uniq.append(a)
    if not uniq:
        return ""
    uniq.sort(key=lambda a: -(a.reward if a.reward is not None else -9))
    chosen = uniq[:max(1, limit - 1)] + [a for a in uniq[max(1, limit - 1):] if a.reward is not None
                                         and a.reward < 0][-1:]
    return Template(data_file("feedback.md")).substitute(attempts="\n".join(attempt_line(a) for a in chosen))


def full_prompt(shape, arch: str = "sm_90a", acc: str = "f32", *, baseline: str = "cublaslt_autotuned",
                references: list[tuple[str, str]] | None = None, attempts=None) -> str:
    M, N, K = _shape(shape)
    refs = references if references is not None else template_references((M, N, K), arch, acc)
    ref_text = "\n\n".join(f"{title}:\n```cuda\n{text.strip()}\n```" for title, text in refs) \
        or "(none accepted for this shape: write the kernel from the ABI)"
    return Template(data_file("prompt_full.md")).substitute(
        M=M, N=N, K=K, arch=arch, acc=acc, baseline=baseline, hardware=hardware_line(arch),
        families=families_line(arch), example=family_example(arch, acc).strip(),
        abi=data_file("abi.md").strip(),
        rules=data_file("rules.md").strip(), references=ref_text,
        feedback=feedback_text(attempts or []))


def make_prompt(style: str, shape, arch: str = "sm_90a", acc: str = "f32", *, baseline="cublaslt_autotuned",
                best: dict | None = None, attempts=None) -> str:
    if style == "compact":
        return compact_prompt(shape, arch, acc)
    if style == "brief":
        return brief_prompt(shape, arch, acc)
    if style != "full":
        raise ValueError(f"unknown prompt style {style!r}; use one of {STYLES}")
    refs = (template_references(shape, arch, acc, limit=1) + corpus_reference(shape, arch, acc)
            + (nearby_best(shape, best or {}) or measured_nearby(shape, arch, acc)))
    return full_prompt(shape, arch, acc, baseline=baseline, references=refs, attempts=attempts)
