"""The warm-start corpus: complete, self-contained kernel files, each paired with a prompt.

Every template file defines the ABI's entry points itself (`cudal2_hgemm`, `cudal2_meta`;
docs/abi.md); none includes one of our template headers (family files, below, do). The kernel sources are data files
(rl/data/corpus/*.cu) with `${NAME}` placeholders; this module fills them with a variant's
parameters, written out as `constexpr` code (tile constants, pipeline depth, tile order,
split-K), and renders the meta from the same values, so the meta tells the truth about the code.

Styles and templates:

| template | style | what it is | layouts / acc |
| --- | --- | --- | --- |
| `wmma.cu` | raw CUDA C++ | WMMA fragments loaded straight from global memory (short) | RR / f32, f16 |
| `ptx.cu` | inline PTX | `mma.sync.m16n8k16` via asm, fragments from global memory (short) | RR, RC / f32 |
| `wmma_pipe.cu` | raw CUDA C++ | WMMA + cp.async smem pipeline, grouped tile order, split-K | RR / f32, f16 |
| `ptx_pipe.cu` | inline PTX | cp.async + ldmatrix + mma.sync pipeline, grouped tile order | RR / f32 |
| `wgmma.cu` | inline PTX | cp.async into 128B-swizzled smem + `wgmma.mma_async` m64n64k16, one tile per CTA, any M (sm_90a; not measured: no GPU) | RR, RC / f32 |
| `cutlass.cu` | CUTLASS 3 | SM90 collective builders (TMA + wgmma, warp-specialised) | RR, RC / f32, f16 |

Family files (template kind `family:<name>`, one per cudal2.templates family of the arch): the
`#define` lines of one config and `#include "<family header>"` (`family_file`), the same binary as
`cudal2.templates.instantiate(config)`; their variants are the family's `enumerate_space` over the
accumulators and layouts it offers. `parse_corpus_file` reads a kernel file back to its variant
(`parse_family_file` a family file to its config).

The two short templates (~50 lines, ~1.2-1.5k tokens with the SmolLM2 tokenizer) are what the
default small policy is trained to write (`SMALL_TEMPLATES`): a whole kernel must be generated
on a CPU in reasonable time. The pipelined, wgmma and CUTLASS templates are references for bigger
models (full prompts) and the rest of the corpus.

`python -m cudal2_rl.corpus list|render|audit` prints, renders or builds+audits variants.
"""
from __future__ import annotations

import argparse
import json
import random
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from itertools import product
from pathlib import Path
from string import Template

from cudal2.core.abi import meta_accepts, meta_problems
from cudal2.core.identity import canonical

CORPUS_DIR = Path(__file__).resolve().parent / "data" / "corpus"
TEMPLATES = ("wmma", "ptx", "wmma_pipe", "ptx_pipe", "wgmma", "cutlass")
SMALL_TEMPLATES = ("wmma", "ptx")
# templates whose parameters are literal constexpr values (parse_corpus_file reads them back);
# the CUTLASS file's are type arguments, and no policy has written one
CONSTEXPR_TEMPLATES = ("wmma", "ptx", "wmma_pipe", "ptx_pipe", "wgmma")
FAMILY_PREFIX = "family:"          # template kind of a family file: family:<cudal2.templates family>
SPLITK_MAX_MN = 1 << 22            # the largest M*N a split-K variant's fixed workspace covers
MAX_SMEM = 227 * 1024              # opt-in dynamic shared memory per block on sm_90


@dataclass(frozen=True)
class Variant:
    template: str                  # file stem in rl/data/corpus/
    params: tuple                  # ((name, value), ...) in the template's order
    acc: str = "f32"
    layout: str = "RR"
    arch: str = "sm_90a"

    @property
    def p(self) -> dict:
        return dict(self.params)

    def label(self) -> str:
        return f"{self.template}[{','.join(f'{k}={v}' for k, v in self.params)},{self.acc},{self.layout}]"

    @property
    def family(self) -> str | None:
        """The template family of a `family:<name>` variant (a family file); None otherwise."""
        return self.template[len(FAMILY_PREFIX):] if self.template.startswith(FAMILY_PREFIX) else None

    def config(self):
        """The cudal2.templates.KernelConfig of a family variant."""
        from cudal2.templates import KernelConfig
        if self.family is None:
            raise ValueError(f"{self.label()}: not a family variant")
        return KernelConfig(self.family, self.params)

    def meta(self) -> dict:
        if self.family is not None:
            raise ValueError(f"{self.label()}: a family file's meta comes from its build, not the corpus")
        return _META[self.template](self)

    def serves(self, M: int, N: int, K: int) -> bool:
        if self.family is not None:
            from cudal2.templates import FAMILIES
            return FAMILIES[self.family].serves(self.config(), M, N, K, checked=True)
        return meta_accepts(self.meta(), M, N, K)

    def source(self) -> str:
        return render(self)


@lru_cache(maxsize=None)
def template_text(name: str) -> str:
    path = CORPUS_DIR / f"{name}.cu"
    if not path.is_file():
        raise FileNotFoundError(f"corpus template {name!r}: no file {path}")
    return path.read_text()


def _meta_wmma(v: Variant) -> dict:
    p = v.p
    return {"style": "mma", "family": "wmma", "arch": v.arch, "acc": v.acc, "layout": "RR",
            "tile": [p["WM"] * p["WARPS_M"], p["WN"] * p["WARPS_N"], 16], "any_shape": False,
            "workspace_bytes": 0, "threads": 32 * p["WARPS_M"] * p["WARPS_N"], "group_m": p["GROUP_M"]}


def _meta_ptx(v: Variant) -> dict:
    p = v.p
    return {"style": "ptx", "family": "ptx_mma", "arch": v.arch, "acc": "f32", "layout": v.layout,
            "tile": [p["WM"] * p["WARPS_M"], p["WN"] * p["WARPS_N"], 16], "any_shape": False,
            "workspace_bytes": 0, "threads": 32 * p["WARPS_M"] * p["WARPS_N"], "group_m": p["GROUP_M"]}


def _pipe_smem(p: dict) -> int:
    return p["STAGES"] * (p["BM"] * (p["BK"] + 8) + p["BK"] * (p["BN"] + 8)) * 2


def _meta_wmma_pipe(v: Variant) -> dict:
    p = v.p
    m = {"style": "mma", "family": "wmma_pipe", "arch": v.arch, "acc": v.acc, "layout": "RR",
         "tile": [p["BM"], p["BN"], p["BK"]], "any_shape": False,
         "workspace_bytes": p["SPLITS"] * SPLITK_MAX_MN * 4 if p["SPLITS"] > 1 else 0,
         "stages": p["STAGES"], "threads": 32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]),
         "smem_bytes": _pipe_smem(p), "group_m": p["GROUP_M"], "splits": p["SPLITS"]}
    if p["SPLITS"] > 1:
        m["divisible"] = [1, 1, p["BK"] * p["SPLITS"]]
        m["splitk_max_mn"] = SPLITK_MAX_MN
    return m


def _meta_ptx_pipe(v: Variant) -> dict:
    p = v.p
    return {"style": "ptx", "family": "ptx_pipe", "arch": v.arch, "acc": "f32", "layout": "RR",
            "tile": [p["BM"], p["BN"], p["BK"]], "any_shape": False, "workspace_bytes": 0,
            "stages": p["STAGES"], "threads": 32 * (p["BM"] // p["WM"]) * (p["BN"] // p["WN"]),
            "smem_bytes": _pipe_smem(p), "group_m": p["GROUP_M"]}


def _wgmma_smem(p: dict) -> int:
    return p["STAGES"] * (p["BM"] + p["BN"]) * 64 * 2 + 1024     # + the 1 KiB alignment slack


def _meta_wgmma(v: Variant) -> dict:
    p = v.p
    return {"style": "ptx", "family": "wgmma_ptx", "arch": v.arch, "acc": "f32", "layout": v.layout,
            "tile": [p["BM"], p["BN"], 64], "any_shape": True, "divisible": [1, 8, 8],
            "workspace_bytes": 0, "threads": 128 * (p["BM"] // 64), "stages": p["STAGES"],
            "smem_bytes": _wgmma_smem(p), "instruction": "wgmma"}


def _meta_cutlass(v: Variant) -> dict:
    p = v.p
    return {"style": "cutlass", "family": "cutlass_sm90_builder", "arch": v.arch, "acc": v.acc,
            "layout": v.layout, "tile": [p["BM"], p["BN"], p["BK"]], "any_shape": True,
            "divisible": [1, 8, 8], "workspace_bytes": 0,
            "cluster": [p["CLUSTER_M"], p["CLUSTER_N"], 1],
            "schedule": "pingpong" if p["PINGPONG"] else "cooperative",
            "raster": p["RASTER"], "swizzle": p["SWIZZLE"]}


_META = {"wmma": _meta_wmma, "ptx": _meta_ptx, "wmma_pipe": _meta_wmma_pipe,
         "ptx_pipe": _meta_ptx_pipe, "wgmma": _meta_wgmma, "cutlass": _meta_cutlass}


def meta_literal(meta: dict) -> str:
    """The meta as the body of a C string literal (quotes escaped)."""
    return json.dumps(meta, separators=(", ", ": ")).replace('"', '\\"')


# Templates whose cudal2_meta prints the meta from the file's constants (snprintf with the
# arguments BM, BN, threads, GROUP_M): a policy that changes the constants keeps a true meta.
# The policy learned to copy meta literals from one variant beside another's constants, which
# the audit's meta-versus-binary rules reject.
PRINTED_META = ("wmma", "ptx")
_PRINTED = (("tile", 0), ("tile", 1), ("threads", None), ("group_m", None))


def meta_format(meta: dict) -> str:
    """The meta as a printf format (a C string literal's body) whose %d take, in order, the
    tile's rows and columns, the threads and GROUP_M."""
    m = json.loads(json.dumps(meta))
    for i, (key, idx) in enumerate(_PRINTED):
        if idx is None:
            m[key] = f"@{i}@"
        else:
            m[key][idx] = f"@{i}@"
    text = json.dumps(m, separators=(", ", ": ")).replace("%", "%%")
    at = [text.index(f'"@{i}@"') for i in range(len(_PRINTED))]
    assert at == sorted(at), "the meta's keys must come in the order of snprintf's arguments"
    for i in range(len(_PRINTED)):
        text = text.replace(f'"@{i}@"', "%d")
    return text.replace('"', '\\"')


def render(v: Variant) -> str:
    """The kernel file for a variant: a complete file, or for a family kind its family file."""
    if v.family is not None:
        return family_file(v.config())
    p = v.p
    values = {k: str(val) for k, val in p.items()}
    values["META"] = (meta_format if v.template in PRINTED_META else meta_literal)(v.meta())
    values["ACC_T"] = "half" if v.acc == "f16" else "float"
    if v.template in ("ptx", "wgmma"):
        values["RC"] = "true" if v.layout == "RC" else "false"
    if v.template == "wmma_pipe":
        values["MAX_MN"] = str(SPLITK_MAX_MN)
    if v.template == "cutlass":
        values["ACC_T"] = "cutlass::half_t" if v.acc == "f16" else "float"
        values["LAYOUT_B"] = "ColumnMajor" if v.layout == "RC" else "RowMajor"
        values["STRIDE_B"] = ("make_stride(int64_t(ldb), _1{}, int64_t(0))" if v.layout == "RC"
                              else "make_stride(_1{}, int64_t(ldb), int64_t(0))")
        values["SCHEDULE"] = ("KernelTmaWarpSpecializedPingpong" if p["PINGPONG"]
                              else "KernelTmaWarpSpecializedCooperative")
        values["EPI_SCHEDULE"] = ("TmaWarpSpecialized" if p["PINGPONG"]
                                  else "TmaWarpSpecializedCooperative")
    return Template(template_text(v.template)).substitute(values)


# -- the variant spaces -------------------------------------------------------------------
def _variants_wmma(arch):
    # one warp (WARPS_M = WARPS_N = 1) included: the default policy writes such files
    # (reports/cpu/2026-11-25-smollm2-printed-meta), so they belong to the space it acts in
    for wm, wn, wa, wb, g, acc in product((32, 64), (32, 64), (1, 2, 4), (1, 2, 4), (1, 8), ("f32", "f16")):
        if wa * wb <= 8:
            yield Variant("wmma", (("WM", wm), ("WN", wn), ("WARPS_M", wa), ("WARPS_N", wb),
                                   ("GROUP_M", g)), acc, "RR", arch)


def _variants_ptx(arch):
    for wm, wn, wa, wb, g, lay in product((16, 32, 64), (16, 32, 64), (1, 2, 4), (1, 2, 4), (1, 8), ("RR", "RC")):
        if 2 <= wa * wb <= 8 and wm * wn <= 64 * 32:        # accumulators: <= 64 floats a thread
            yield Variant("ptx", (("WM", wm), ("WN", wn), ("WARPS_M", wa), ("WARPS_N", wb),
                                  ("GROUP_M", g)), "f32", lay, arch)


def _pipe_ok(p: dict) -> bool:
    warps = (p["BM"] // p["WM"]) * (p["BN"] // p["WN"])
    return (p["BM"] % p["WM"] == 0 and p["BN"] % p["WN"] == 0 and 2 <= warps <= 16
            and _pipe_smem(p) <= MAX_SMEM and _pipe_smem(p) >= warps * 1024)


def _variants_wmma_pipe(arch):
    for bm, bn, bk, wm, wn, st, g, sp, acc in product((64, 128), (64, 128), (32, 64), (32, 64), (32, 64),
                                                      (2, 3, 4), (1, 8), (1, 2, 4), ("f32", "f16")):
        if acc == "f16" and sp > 1:
            continue
        params = (("BM", bm), ("BN", bn), ("BK", bk), ("WM", wm), ("WN", wn), ("STAGES", st),
                  ("GROUP_M", g), ("SPLITS", sp))
        if _pipe_ok(dict(params)):
            yield Variant("wmma_pipe", params, acc, "RR", arch)


def _variants_ptx_pipe(arch):
    for bm, bn, bk, wm, wn, st, g in product((64, 128), (64, 128), (32, 64), (32, 64), (32, 64),
                                             (2, 3, 4), (1, 8)):
        params = (("BM", bm), ("BN", bn), ("BK", bk), ("WM", wm), ("WN", wn), ("STAGES", st),
                  ("GROUP_M", g))
        if _pipe_ok(dict(params)):
            yield Variant("ptx_pipe", params, "f32", "RR", arch)


def _variants_wgmma(arch):
    if arch != "sm_90a":                     # wgmma is an sm_90a instruction
        return
    for bm, bn, st, lay in product((64, 128), (64, 128, 256), (2, 3, 4), ("RR", "RC")):
        params = (("BM", bm), ("BN", bn), ("STAGES", st))
        if _wgmma_smem(dict(params)) <= MAX_SMEM:
            yield Variant("wgmma", params, "f32", lay, arch)


def _variants_cutlass(arch):
    for pp, bm, bn, (cm, cn), ras, sw, lay, acc in product(
            (0, 1), (64, 128, 256), (64, 128, 256), ((1, 1), (2, 1), (1, 2)), (1, 2), (1, 4),
            ("RR", "RC"), ("f32", "f16")):
        if (pp and bm == 256) or (not pp and bm == 64) or bm * bn > 128 * 256:
            continue
        yield Variant("cutlass", (("BM", bm), ("BN", bn), ("BK", 64), ("CLUSTER_M", cm), ("CLUSTER_N", cn),
                                  ("PINGPONG", pp), ("RASTER", ras), ("SWIZZLE", sw)), acc, lay, arch)


_SPACES = {"wmma": _variants_wmma, "ptx": _variants_ptx, "wmma_pipe": _variants_wmma_pipe,
           "ptx_pipe": _variants_ptx_pipe, "wgmma": _variants_wgmma, "cutlass": _variants_cutlass}


def family_kinds(arch: str = "sm_90a") -> tuple[str, ...]:
    """`family:<name>` for every template family that targets `arch` (cudal2.templates.FAMILIES)."""
    from cudal2.templates import FAMILIES
    return tuple(FAMILY_PREFIX + n for n, f in FAMILIES.items() if arch in f.arches)


@lru_cache(maxsize=None)
def _family_variants(name: str, arch: str) -> tuple[Variant, ...]:
    """Every config of family `name` for `arch`, over the accumulators and layouts it offers."""
    from cudal2.templates import FAMILIES, enumerate_space
    fam = FAMILIES[name]
    out = []
    for acc in fam.choices().get("ACC", ["f32"]):
        for layout in fam.choices().get("LAYOUT", ["RR"]):
            out += [Variant(FAMILY_PREFIX + name, c.params, acc, layout, arch)
                    for c in enumerate_space(fam, arch=arch, acc=acc, layout=layout)]
    return tuple(out)


def variants(template: str, arch: str = "sm_90a") -> list[Variant]:
    """The variants of a corpus template or of a family kind (`family:<name>`) for `arch`."""
    if template.startswith(FAMILY_PREFIX):
        if template not in family_kinds(arch):
            raise ValueError(f"unknown family kind {template!r} for {arch}; known: {', '.join(family_kinds(arch))}")
        return list(_family_variants(template[len(FAMILY_PREFIX):], arch))
    if template not in _SPACES:
        raise ValueError(f"unknown corpus template {template!r}; known: {', '.join(TEMPLATES)}")
    out = list(_SPACES[template](arch))
    for v in out:
        problems = meta_problems(v.meta(), arch)
        if problems:
            raise AssertionError(f"{v.label()}: meta breaks the ABI: {problems}")
    return out


# -- family files: what cudal2.templates.instantiate builds, as #define lines + one #include ----
_DEFINE_RE = re.compile(r"^#define ([A-Z][A-Z0-9_]*) (-?[0-9]+)$")
_INCLUDE_RE = re.compile(r'^#include "([a-z0-9_]+\.cuh)"$')


def family_file(config) -> str:
    """The short file for a family config: exactly the `#define` lines instantiate(config) emits,
    then `#include "<header>"` (the build puts cudal2/templates on the include path): the same
    binary as the instantiation, in a few lines a policy can write."""
    from cudal2.templates import FAMILIES
    if config.family not in FAMILIES:
        raise ValueError(f"unknown family {config.family!r}; known: {sorted(FAMILIES)}")
    return FAMILIES[config.family].short_source(config)


def _define_values(text: str) -> tuple[dict, str] | None:
    """({macro: value}, header) of a file that is only #define lines and one final #include."""
    lines = canonical(text).split("\n")
    inc = _INCLUDE_RE.match(lines[-1]) if lines else None
    defs = [_DEFINE_RE.match(line) for line in lines[:-1]]
    if inc is None or not all(defs):
        return None
    return {m.group(1): int(m.group(2)) for m in defs}, inc.group(1)


def _config_from_macros(fam, macros: dict):
    """The family's config whose macros are `macros`, or None (a value its enums lack)."""
    from cudal2.templates import _ENUM_MACROS, KernelConfig
    params = {}
    for name in fam.choices():
        macro, values = _ENUM_MACROS.get(name, (name, None))
        if macro not in macros:
            return None
        v = macros[macro]
        if values is not None:
            v = next((k for k, val in values.items() if val == v), None)
            if v is None:
                return None
        params[name] = v
    try:
        return KernelConfig(fam.name, tuple(params.items()))
    except ValueError:
        return None


def parse_family_file(text: str):
    """The KernelConfig a family file sets (comments and spacing ignored), or None when the text
    is not exactly one valid config's #define lines and its family's #include."""
    from cudal2.templates import FAMILIES
    parsed = _define_values(text)
    if parsed is None:
        return None
    macros, header = parsed
    for fam in FAMILIES.values():
        if fam.header != header:
            continue
        cfg = _config_from_macros(fam, macros)
        if cfg is not None and any(fam.valid(cfg, a) for a in fam.arches) \
                and canonical(family_file(cfg)) == canonical(text):
            return cfg
    return None


# -- corpus files back to their variants ---------------------------------------------------
_CONST_LINE_RE = re.compile(r"^constexpr (?:int|bool|size_t) ([^;]*);$")
_CONST_ITEM_RE = re.compile(r"^([A-Za-z_]\w*) = (-?[0-9]+|true|false)$")


def _constants(text: str) -> tuple[dict, list[str]]:
    """(the literal constexpr values, the canonical lines other than their declarations)."""
    values, rest = {}, []
    for line in canonical(text).split("\n"):
        m = _CONST_LINE_RE.match(line)
        items = [_CONST_ITEM_RE.match(x.strip()) for x in m.group(1).split(",")] if m else []
        if m and items and all(items):
            values.update((i.group(1), i.group(2)) for i in items)
        else:
            rest.append(line)
    return values, rest


def _unused(name: str, lines: list[str]) -> bool:
    return not any(re.search(rf"\b{name}\b", line) for line in lines)


@lru_cache(maxsize=None)
def _space_set(template: str, arch: str) -> frozenset:
    return frozenset(variants(template, arch))


def parse_corpus_file(text: str, arch: str = "sm_90a") -> Variant | None:
    """The corpus variant a kernel file is (its literal constexpr parameters read back, the rest
    compared as canonical text: comments, spacing and unused extra constants ignored;
    CONSTEXPR_TEMPLATES only), or a family variant for a family file; None when it is neither or
    lies outside the space."""
    cfg = parse_family_file(text)
    if cfg is not None:
        v = Variant(FAMILY_PREFIX + cfg.family, cfg.params, str(cfg.get("ACC", "f32")),
                    str(cfg.get("LAYOUT", "RR")), arch)
        return v if FAMILY_PREFIX + cfg.family in family_kinds(arch) and v in _space_set(v.template, arch) else None
    values, rest = _constants(text)
    for t in CONSTEXPR_TEMPLATES:
        for v in _candidates(t, values, arch):
            want, want_rest = _constants(render(v))
            extra = set(values) - set(want)
            if (want_rest == rest and all(values.get(k) == x for k, x in want.items())
                    and all(_unused(k, rest) for k in extra)):
                return v if v in _space_set(t, arch) else None
    return None


def _candidates(template: str, values: dict, arch: str):
    """The variants of `template` with these parameter values, one per accumulator and layout."""
    space = variants(template, arch)
    names = [k for k, _ in space[0].params] if space else []
    if not names or not all(k in values and values[k].lstrip("-").isdigit() for k in names):
        return
    params = tuple((k, int(values[k])) for k in names)
    for acc, layout in product(("f32", "f16"), ("RR", "RC")):
        yield Variant(template, params, acc, layout, arch)


def pairs(shapes, prompt, *, templates=SMALL_TEMPLATES, per_shape: int = 2, accs=("f32",),
          arch: str = "sm_90a", seed: int = 0) -> list[tuple[str, str, tuple, Variant]]:
    """(prompt, kernel file, shape, variant): per shape and accumulator, `per_shape` variants
    drawn (seeded) among those that serve the shape, alternating templates; `prompt(shape, arch,
    acc)` writes the prompt (e.g. cudal2_rl.prompts.brief_prompt)."""
    rng = random.Random(seed)
    pools = {t: variants(t, arch) for t in templates}
    out = []
    for shape in shapes:
        for acc in accs:
            for i in range(per_shape):
                t = templates[(i + rng.randrange(len(templates))) % len(templates)]
                cands = [v for v in pools[t] if v.acc == acc and v.serves(*shape)] or \
                        [v for tt in templates for v in pools[tt] if v.acc == acc and v.serves(*shape)]
                if not cands:
                    continue
                v = rng.choice(cands)
                out.append((prompt(shape, arch, acc), v.source(), tuple(shape), v))
    return out


def sample_variants(n: int, *, templates=TEMPLATES, seed: int = 0, arch: str = "sm_90a") -> list[Variant]:
    """n variants, spread over the templates (seeded)."""
    rng = random.Random(seed)
    pools = {t: variants(t, arch) for t in templates}
    return [rng.choice(pools[templates[i % len(templates)]]) for i in range(n)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m cudal2_rl.corpus", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="count the variants of each template")
    r = sub.add_parser("render", help="write N sampled variants as .cu files into a folder")
    r.add_argument("out")
    r.add_argument("-n", type=int, default=10)
    r.add_argument("--templates", default=",".join(TEMPLATES))
    r.add_argument("--seed", type=int, default=0)
    a = sub.add_parser("audit", help="build and audit N sampled variants (nvcc, no GPU)")
    a.add_argument("-n", type=int, default=8)
    a.add_argument("--templates", default=",".join(SMALL_TEMPLATES))
    a.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for t in TEMPLATES:
            print(f"{t}: {len(variants(t))} variants ({CORPUS_DIR / (t + '.cu')})")
        for k in family_kinds():
            print(f"{k}: {len(variants(k))} family files")
        return 0
    vs = sample_variants(args.n, templates=tuple(args.templates.split(",")), seed=args.seed)
    if args.cmd == "render":
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        for i, v in enumerate(vs):
            (out / f"{i:03d}_{v.template}.cu").write_text(v.source())
            print(f"{out / f'{i:03d}_{v.template}.cu'}: {v.label()}")
        return 0
    from cudal2.harness.audit import audit_source
    bad = 0
    for v in vs:
        res = audit_source(v.source(), v.arch, name=v.label())
        bad += not res.ok
        print(res.line())
    print(f"{len(vs) - bad}/{len(vs)} variants built and passed the audit")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
