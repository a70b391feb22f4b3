"""Our reference HGEMM kernel families: `.cuh` data files plus the configs that instantiate them.

A family is one parameterised kernel file (`mma_hgemm.cuh`, `ptx_hgemm.cuh`, `cutlass_sm90.cuh`)
whose every parameter is a `#define` with a default. A `KernelConfig` names a family and its
parameter values; `instantiate(config)` writes a self-contained `.cu` file: a banner, the
`#define` lines, then the family's `.cuh` text with its local includes inlined. The kernel code
lives only in the `.cuh` files; this module holds the parameter spaces, the static constraints
(`Family.valid`) and which shapes a config serves (`Family.accepts`). docs/templates.md has the
macro reference.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cudal2.core.abi import meta_accepts
from cudal2.core.build import BuildSpec

__all__ = ["KernelConfig", "Family", "FAMILIES", "instantiate", "template_dir", "SMEM_LIMIT",
           "default_configs"]

Value = int | str

# Largest dynamic shared memory one block may opt in to, bytes (CUDA programming guide, per CC).
SMEM_LIMIT = {"sm_80": 166912, "sm_86": 101376, "sm_89": 101376, "sm_90a": 232448}

_LOCAL_INCLUDE_RE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.M)


def template_dir() -> Path:
    """The folder holding the family `.cuh` files (also on the build's include path)."""
    return Path(__file__).resolve().parent


# ---- configs ------------------------------------------------------------------------------
@dataclass(frozen=True)
class KernelConfig:
    """One instantiation of a family: its name and (name, value) parameters, sorted by name."""
    family: str
    params: tuple[tuple[str, Value], ...] = ()

    def __post_init__(self):
        items = dict(self.params)
        if len(items) != len(self.params):
            raise ValueError(f"{self.family}: duplicate parameter names in {self.params!r}")
        for k, v in items.items():
            if not isinstance(k, str) or not re.fullmatch(r"[A-Z][A-Z0-9_]*", k):
                raise ValueError(f"{self.family}: parameter name {k!r} is not an upper-case macro name")
            if isinstance(v, bool) or not isinstance(v, (int, str)):
                raise ValueError(f"{self.family}: parameter {k}={v!r} must be an int or a str")
        object.__setattr__(self, "params", tuple(sorted(items.items())))

    @classmethod
    def make(cls, family: str, **params: Value) -> "KernelConfig":
        return cls(family, tuple(params.items()))

    def get(self, name: str, default=None) -> Value | None:
        for k, v in self.params:
            if k == name:
                return v
        return default

    def as_dict(self) -> dict[str, Value]:
        return dict(self.params)

    def with_(self, **changes: Value) -> "KernelConfig":
        d = self.as_dict()
        d.update(changes)
        return KernelConfig(self.family, tuple(d.items()))

    def label(self) -> str:
        """Short, stable, file-name-safe name: family then k=v pairs in name order."""
        return self.family + ":" + ",".join(f"{k}={v}" for k, v in self.params)


# ---- families -----------------------------------------------------------------------------
# String-valued parameters become 0/1 macros the preprocessor can test.
_ENUM_MACROS: dict[str, tuple[str, dict[str, int]]] = {
    "ACC": ("ACC_F16", {"f32": 0, "f16": 1}),
    "LAYOUT": ("LAYOUT_RC", {"RR": 0, "RC": 1}),
    "SCHEDULE": ("SCHEDULE_PINGPONG", {"cooperative": 0, "pingpong": 1}),
    "SCHEDULER": ("SCHEDULER_STREAMK", {"persistent": 0, "streamk": 1}),
}

# A runtime option a build declares (kernel ABI 2, docs/abi.md): (name, values, default).
OptionDecl = tuple[str, tuple[int, ...], int]


@dataclass(frozen=True)
class Family:
    """A kernel family: one `.cuh` file and the rules for its parameters."""
    name: str
    arches: tuple[str, ...]
    header: str                                 # file name in template_dir()
    style: str                                  # the meta "style": mma | ptx | cutlass
    flags: tuple[str, ...]                      # nvcc flags the family needs (all among BASE_FLAGS)
    description: str
    _space: dict[str, tuple[Value, ...]] = field(repr=False, default_factory=dict)
    _fixed: dict[str, tuple[Value, ...]] = field(repr=False, default_factory=dict)  # ACC, LAYOUT
    _defaults: tuple[dict[str, Value], ...] = field(repr=False, default=())
    _problems: Callable[["Family", dict, str | None], list[str]] = field(repr=False, default=None)
    _accepts: Callable[[dict, int, int, int], bool] = field(repr=False, default=None)
    any_shape: bool = True                      # the meta's any_shape (False: tile multiples only)
    # the tensor-core instruction its main loop issues: families of one instruction share a
    # throughput ceiling (mma.sync: ~110 TFLOP/s measured on an H100; wgmma: the dense peak)
    instruction: str = "mma.sync"
    # ABI 2 families: the runtime options a config's build declares, in call order; a rule
    # refusing combinations (reasons, empty = fine); one marking combinations that behave like
    # another listed one (the sweep skips them). None: an ABI 1 family, no options.
    _options: Callable[[dict], list[OptionDecl]] | None = field(repr=False, default=None)
    _option_rule: Callable[[dict, dict], list[str]] | None = field(repr=False, default=None)
    _option_redundant: Callable[[dict, dict], bool] | None = field(repr=False, default=None)

    # -- the tuner's view
    def space(self) -> dict[str, list[Value]]:
        """Tuning knobs -> candidate values. ACC and LAYOUT are requirements of the target, not
        knobs, so they are not here: set them with `config.with_(ACC=..., LAYOUT=...)`."""
        return {k: list(v) for k, v in self._space.items()}

    def choices(self) -> dict[str, list[Value]]:
        """Every parameter and its allowed values (the space plus ACC/LAYOUT)."""
        return {**self.space(), **{k: list(v) for k, v in self._fixed.items()}}

    def default(self) -> KernelConfig:
        return self.defaults()[0]

    def defaults(self) -> tuple[KernelConfig, ...]:
        """The default instantiations (the first is `default()`)."""
        return tuple(KernelConfig.make(self.name, **d) for d in self._defaults)

    def config(self, **params: Value) -> KernelConfig:
        """`default()` with some parameters changed."""
        return self.default().with_(**params)

    # -- static constraints
    def problems(self, config: KernelConfig, arch: str | None = None) -> list[str]:
        """Why `config` cannot be built (empty when it can). `arch`: check against that arch's
        limits; None: against every arch the family claims."""
        if config.family != self.name:
            return [f"config is for family {config.family!r}, not {self.name!r}"]
        if arch is not None and arch not in self.arches:
            return [f"family {self.name} does not target {arch} (it targets {', '.join(self.arches)})"]
        p = config.as_dict()
        known = self.choices()
        out = [f"unknown parameter {k}" for k in p if k not in known]
        out += [f"missing parameter {k}" for k in known if k not in p]
        if out:
            return out
        for k, v in p.items():
            if k in _ENUM_MACROS and v not in _ENUM_MACROS[k][1]:
                out.append(f"{k}={v!r} is not one of {sorted(_ENUM_MACROS[k][1])}")
            elif k not in _ENUM_MACROS and (not isinstance(v, int) or v < 1):
                out.append(f"{k}={v!r} must be a positive int")
        if out:
            return out
        return self._problems(self, p, arch)

    def valid(self, config: KernelConfig, arch: str | None = None) -> bool:
        return not self.problems(config, arch)

    def accepts(self, config: KernelConfig, M: int, N: int, K: int) -> bool:
        """Whether a (valid) config computes C[M,N] = A[M,K] @ B for this shape (dense, aligned
        operands with ld == the logical width: what dispatch hands it)."""
        if min(M, N, K) < 0 or not self.valid(config):
            return False
        return self._accepts(config.as_dict(), M, N, K)

    def serves(self, config: KernelConfig, M: int, N: int, K: int) -> bool:
        """Whether the harness and the dispatcher will let this config serve the shape: it
        accepts it, and (the ABI, docs/abi.md) a kernel that does not claim any_shape is served
        only multiples of its tile."""
        p = config.as_dict()
        return self.accepts(config, M, N, K) and meta_accepts(
            {"any_shape": self.any_shape, "tile": [p["BM"], p["BN"], p["BK"]]}, M, N, K)

    # -- runtime options (kernel ABI 2): values one build serves without a rebuild
    def option_decls(self, config: KernelConfig) -> list[OptionDecl]:
        """(name, values, default) of every runtime option the build of `config` declares in its
        meta, in the order of the options array; [] for ABI 1 families (mma, ptx)."""
        if self._options is None:
            return []
        return [(n, tuple(v), d) for n, v, d in self._options(config.as_dict())]

    def options(self, config: KernelConfig) -> dict[str, list[int]]:
        """Runtime option name -> the values its build accepts, in call order ({} for ABI 1):
        what a planner sweeps per shape without rebuilding."""
        return {n: list(v) for n, v, _ in self.option_decls(config)}

    def option_defaults(self, config: KernelConfig) -> dict[str, int]:
        """The value each option takes when the caller passes NULL."""
        return {n: d for n, _, d in self.option_decls(config)}

    def option_problems(self, config: KernelConfig, chosen: dict) -> list[str]:
        """Why the build of `config` would refuse these options (cudaErrorInvalidValue); empty
        when it takes them. Names left out take their defaults."""
        decls = self.option_decls(config)
        names = [n for n, _, _ in decls]
        out = [f"option {k} is not declared by {config.label()} (it takes {names or 'none'})"
               for k in chosen if k not in names]
        full = {**self.option_defaults(config), **{k: v for k, v in chosen.items() if k in names}}
        for n, values, _ in decls:
            if full[n] not in values:
                out.append(f"option {n}={full[n]!r} is not one of {list(values)}")
        if not out and self._option_rule is not None:
            out += self._option_rule(config.as_dict(), full)
        return out

    def option_space(self, config: KernelConfig) -> list[dict[str, int]]:
        """Every combination of the options the build accepts, fully spelt out, in a fixed order
        (defaults first), without combinations that behave like an earlier one; [{}] for an ABI
        1 family (one way to call it)."""
        decls = self.option_decls(config)
        if not decls:
            return [{}]
        import itertools
        names = [n for n, _, _ in decls]
        # each option's default first, so the first combination is the NULL-options call
        axes = [[d] + [v for v in values if v != d] for _, values, d in decls]
        out = []
        for combo in itertools.product(*axes):
            chosen = dict(zip(names, combo))
            if self._option_rule is not None and self._option_rule(config.as_dict(), chosen):
                continue
            if self._option_redundant is not None and self._option_redundant(config.as_dict(), chosen):
                continue
            out.append(chosen)
        return out

    # -- source
    def macros(self, config: KernelConfig) -> list[tuple[str, int]]:
        """The (macro, value) lines an instantiation starts with."""
        out = []
        for k, v in config.params:
            if k in _ENUM_MACROS:
                macro, values = _ENUM_MACROS[k]
                out.append((macro, values[v]))
            else:
                out.append((k, int(v)))
        return out

    def instantiate(self, config: KernelConfig) -> str:
        return instantiate(config)

    def short_source(self, config: KernelConfig) -> str:
        """The `#define` lines plus `#include "<header>"`: the same kernel as `instantiate`, for
        builds that put cudal2/templates on the include path (cudal2.core.build does)."""
        _check(self, config)
        lines = [f"#define {m} {v}" for m, v in self.macros(config)]
        return "\n".join(lines + [f'#include "{self.header}"']) + "\n"

    def build_spec(self, config: KernelConfig, arch: str | None = None):
        """A cudal2.core.build.BuildSpec for `config`."""
        # No extra flags: a family's flags are among the builder's base flags (a test holds it),
        # so its builds share the cache with anyone building the same source.
        return BuildSpec(instantiate(config), arch=arch or self.arches[-1], name=config.label())


def _check(family: Family, config: KernelConfig) -> None:
    bad = family.problems(config)
    if bad:
        raise ValueError(f"invalid {family.name} config {config.label()}: " + "; ".join(bad))


# -- mma and ptx: raw CUDA tensor-core kernels (mma_hgemm.cuh)
def _mma_smem_bytes(p: dict) -> int:
    a = p["BM"] * (p["BK"] + 8)
    b = p["BN"] * (p["BK"] + 8) if p["LAYOUT"] == "RC" else p["BK"] * (p["BN"] + 8)
    return p["STAGES"] * (a + b) * 2


def _mma_problems(family: Family, p: dict, arch: str | None) -> list[str]:
    out = []
    BM, BN, BK, WM, WN = p["BM"], p["BN"], p["BK"], p["WM"], p["WN"]
    if WM % 16 or WN % 16:
        out.append(f"warp tile {WM}x{WN} must be a multiple of 16x16")
    if BM % WM or BN % WN:
        out.append(f"warp tile {WM}x{WN} must divide the block tile {BM}x{BN}")
    if BK % 16:
        out.append(f"BK={BK} must be a multiple of 16")
    if out:
        return out
    threads = (BM // WM) * (BN // WN) * 32
    if threads > 1024:
        out.append(f"{threads} threads per block > 1024")
    for what, chunks in (("A", BM * BK // 8), ("B", BK * BN // 8)):
        if chunks % threads:
            out.append(f"{what} tile has {chunks} 16-byte chunks, not a multiple of {threads} threads")
    acc_regs = (WM // 16) * (WN // 8) * (2 if p["ACC"] == "f16" else 4)
    if acc_regs > 128:
        out.append(f"warp tile {WM}x{WN} needs {acc_regs} accumulator registers per thread (> 128: spills)")
    if p["STAGES"] < 2:
        out.append("STAGES must be >= 2")
    if p["SPLITK"] > 16:
        out.append("SPLITK must be <= 16")
    if p["SPLITK_MAX_MN"] > 1 << 26:
        out.append("SPLITK_MAX_MN must be <= 2**26 (it sizes the declared workspace)")
    smem = _mma_smem_bytes(p)
    for a in ([arch] if arch else family.arches):
        if smem > SMEM_LIMIT[a]:
            out.append(f"{smem} bytes of shared memory > {SMEM_LIMIT[a]} on {a}")
    if family.name == "ptx" and (WM, WN) != (64, 64):
        out.append("the ptx family's inner-loop PTX is written for WM = WN = 64")
    return out


def _mma_accepts(p: dict, M: int, N: int, K: int) -> bool:
    return p["SPLITK"] == 1 or M * N <= p["SPLITK_MAX_MN"]


_MMA_SPACE = {
    "BM": (64, 128, 256), "BN": (64, 128, 256), "BK": (32, 64), "WM": (32, 64), "WN": (32, 64),
    "STAGES": (2, 3, 4, 5), "SWIZZLE": (1, 4, 8, 16), "SPLITK": (1, 2, 4, 8),
    "SPLITK_MAX_MN": (2097152,),
}
_ACC_LAYOUT = {"ACC": ("f32", "f16"), "LAYOUT": ("RR", "RC")}
_MMA_DEFAULT = dict(BM=128, BN=128, BK=32, WM=64, WN=64, STAGES=3, SWIZZLE=8, SPLITK=1,
                    SPLITK_MAX_MN=2097152, ACC="f32", LAYOUT="RR")

# -- cutlass_sm90: CUTLASS 3.x TMA warp-specialised kernels (cutlass_sm90.cuh)
_CUTLASS_FLAGS = ("-std=c++17", "--expt-relaxed-constexpr", "-DNDEBUG")


def _cutlass_problems(family: Family, p: dict, arch: str | None) -> list[str]:
    """What CUTLASS 3.x (4.2) cannot build, or the space does not cover (every config this
    accepts was compiled for sm_90a with zero spills:
    tests/test_templates.py::test_cutlass_space_builds_without_spills)."""
    out = []
    BM, BN, BK = p["BM"], p["BN"], p["BK"]
    coop = p["SCHEDULE"] == "cooperative"
    if coop and BM not in (128, 256):
        out.append(f"cooperative schedule splits BM over two consumer warpgroups: BM must be 128 or 256, got {BM}")
    if not coop and BM not in (64, 128):
        out.append(f"pingpong schedule: BM must be 64 or 128, got {BM}")
    if BN % 16 or not 16 <= BN <= 256:
        out.append(f"BN={BN} must be a multiple of 16 in [16, 256] (wgmma N)")
    if BM == 256 and BN != 128:
        out.append(f"BM=256 pairs with BN=128 only (the CUTLASS profiler's 256-row tile; 256x{BN} "
                   "is not in the compiled space)")
    if BK != 64:
        out.append(f"BK={BK} must be 64 (128 bytes of fp16, one TMA swizzle atom: the compiled space)")
    cm, cn = p["CLUSTER_M"], p["CLUSTER_N"]
    if (cm, cn) not in ((1, 1), (2, 1), (1, 2)):
        out.append(f"cluster {cm}x{cn}: one of 1x1, 2x1, 1x2 (the compiled space)")
    if p["SCHEDULER"] == "streamk" and not coop:
        out.append("SCHEDULER=streamk needs the cooperative schedule (CUTLASS's ping-pong kernel "
                   "has no stream-K scheduler)")
    # accumulator registers per consumer thread (128 threads per warpgroup)
    rows = BM // 2 if coop else BM
    per_thread = rows * BN // 128 // (2 if p["ACC"] == "f16" else 1)
    if per_thread > 128:
        out.append(f"{per_thread} accumulator registers per consumer thread (> 128: spills)")
    stage = (BM + BN) * BK * 2
    if 2 * stage + 32768 > SMEM_LIMIT["sm_90a"]:
        out.append(f"two {stage}-byte stages plus the epilogue do not fit in shared memory")
    return out


def _cutlass_accepts(p: dict, M: int, N: int, K: int) -> bool:
    return N % 8 == 0 and K % 8 == 0


# Runtime options of a cutlass_sm90 build (cutlass_sm90.cuh's header has their meaning).
_CUTLASS_OPTIONS: list[OptionDecl] = [("swizzle", (1, 2, 4, 8), 1), ("raster", (0, 1, 2), 0)]
_STREAMK_OPTIONS: list[OptionDecl] = [("splits", (1, 2, 4, 8), 1), ("decomposition", (0, 1, 2, 3), 0)]


def _cutlass_options(p: dict) -> list[OptionDecl]:
    return _CUTLASS_OPTIONS + (_STREAMK_OPTIONS if p["SCHEDULER"] == "streamk" else [])


def _cutlass_option_rule(p: dict, o: dict) -> list[str]:
    # CUTLASS's stream-K can_implement: a split count needs the heuristic or split-K decomposition
    if o.get("splits", 1) > 1 and o.get("decomposition", 0) not in (0, 2):
        return [f"splits={o['splits']} needs decomposition 0 (heuristic) or 2 (split-K), "
                f"got {o['decomposition']}"]
    return []


def _cutlass_option_redundant(p: dict, o: dict) -> bool:
    """CUTLASS turns a heuristic decomposition with splits > 1 into split-K, and split-K with
    one split is data-parallel: those spellings repeat another combination."""
    splits, dec = o.get("splits", 1), o.get("decomposition", 0)
    return (dec == 0 and splits > 1) or (dec == 2 and splits == 1)


FAMILIES: dict[str, Family] = {}


def _register(f: Family) -> None:
    FAMILIES[f.name] = f


_register(Family(
    name="mma", arches=("sm_80", "sm_90a"), header="mma_hgemm.cuh", style="mma", flags=(),
    description="raw CUDA: mma.sync m16n8k16, ldmatrix, multi-stage cp.async into padded smem, "
                "grouped raster, split-K; any M, N, K",
    _space=_MMA_SPACE, _fixed=_ACC_LAYOUT,
    _defaults=(_MMA_DEFAULT, {**_MMA_DEFAULT, "ACC": "f16"}, {**_MMA_DEFAULT, "LAYOUT": "RC"}),
    _problems=_mma_problems, _accepts=_mma_accepts))

_register(Family(
    name="ptx", arches=("sm_80", "sm_90a"), header="ptx_hgemm.cuh", style="ptx", flags=(),
    description="the mma pipeline with each k16 step (ldmatrix + 32 mma.sync) as one hand-written "
                "inline-PTX block; warp tile fixed at 64x64; any M, N, K",
    _space={**_MMA_SPACE, "WM": (64,), "WN": (64,)}, _fixed=_ACC_LAYOUT,
    _defaults=(_MMA_DEFAULT,),
    _problems=_mma_problems, _accepts=_mma_accepts))

_COOP = dict(BM=128, BN=256, BK=64, CLUSTER_M=2, CLUSTER_N=1, SCHEDULE="cooperative",
             SCHEDULER="persistent", ACC="f32", LAYOUT="RR")
_PING = dict(_COOP, BM=128, BN=128, SCHEDULE="pingpong")
_STREAMK = dict(_COOP, BN=128, CLUSTER_M=1, SCHEDULER="streamk")
_TALL = dict(_COOP, BM=256, BN=128, CLUSTER_M=1, CLUSTER_N=2)
_register(Family(
    name="cutlass_sm90", arches=("sm_90a",), header="cutlass_sm90.cuh", style="cutlass",
    flags=_CUTLASS_FLAGS,
    description="CUTLASS 3.x SM90 TMA warp-specialised GEMM (cooperative or pingpong, persistent "
                "or stream-K scheduler) from the CollectiveBuilders, kernel ABI 2 (runtime "
                "swizzle, raster, splits, decomposition); any M, N % 8 == 0, K % 8 == 0, "
                "16-byte aligned operands",
    _space={"BM": (64, 128, 256), "BN": (64, 128, 192, 256), "BK": (64,),
            "CLUSTER_M": (1, 2), "CLUSTER_N": (1, 2), "SCHEDULE": ("cooperative", "pingpong"),
            "SCHEDULER": ("persistent", "streamk")},
    _fixed=_ACC_LAYOUT, _defaults=(_COOP, _PING, _STREAMK, _TALL),
    _problems=_cutlass_problems, _accepts=_cutlass_accepts, any_shape=True,
    _options=_cutlass_options, _option_rule=_cutlass_option_rule,
    _option_redundant=_cutlass_option_redundant, instruction="wgmma"))


def with_acc(config: KernelConfig, acc: str) -> KernelConfig | None:
    """`config` accumulating in `acc` ("f32" or "f16"), whichever parameter its family uses for
    it; None when the family only accumulates in f32 and f16 is asked."""
    names = config.as_dict()
    if "ACC" in names:
        return config.with_(ACC=acc)
    if "ACC_F16" in names:
        return config.with_(ACC_F16=int(acc == "f16"))
    return config if acc == "f32" else None


def default_configs(families: Iterable[str] | None = None) -> list[KernelConfig]:
    """Every default instantiation of the named families (all by default)."""
    names = list(families) if families else list(FAMILIES)
    return [c for n in names for c in FAMILIES[n].defaults()]


# ---- instantiation ------------------------------------------------------------------------
def _inline(name: str, stack: tuple[str, ...]) -> str:
    """The text of template file `name` with its local ("...") includes inlined, once each."""
    if name in stack:
        raise ValueError(f"template include cycle: {' -> '.join(stack + (name,))}")
    path = template_dir() / name
    if not path.is_file():
        raise ValueError(f"template {stack[-1] if stack else '?'} includes {name!r}, which is not a file "
                         f"in {template_dir()}")
    text = path.read_text()

    def repl(m: re.Match) -> str:
        inner = _inline(m.group(1), stack + (name,))
        return (f"// ---- begin {m.group(1)} (inlined) ----\n{inner.rstrip()}\n"
                f"// ---- end {m.group(1)} ----")
    return _LOCAL_INCLUDE_RE.sub(repl, text)


def instantiate(config: KernelConfig) -> str:
    """A self-contained .cu file for `config`: banner, #define lines, the family's .cuh inlined.
    Raises ValueError naming the problems when the config is invalid."""
    if config.family not in FAMILIES:
        raise ValueError(f"unknown family {config.family!r}; known: {sorted(FAMILIES)}")
    fam = FAMILIES[config.family]
    _check(fam, config)
    banner = [
        f"// cudal2 kernel, family {fam.name} (style {fam.style}), instantiated from "
        f"cudal2/templates/{fam.header}",
        f"// config: {config.label()}",
        f"// targets: {', '.join(fam.arches)}" + (f"; nvcc flags: {' '.join(fam.flags)}" if fam.flags else ""),
        "// Generated by cudal2.templates.instantiate(); edit the template, not this file.",
    ]
    defines = [f"#define {m} {v}" for m, v in fam.macros(config)]
    body = _inline(fam.header, ())
    return "\n".join(banner + defines) + "\n\n" + body.rstrip() + "\n"


# -- wgmma: our own Hopper kernel, raw CUDA + inline PTX (wgmma_hgemm.cuh, docs/wgmma.md)
# TMA loads into a STAGES-deep mbarrier pipeline, one producer warpgroup and CONSUMERS consumer
# warpgroups issuing wgmma.mma_async, clusters of CLUSTER_M CTAs along M sharing B by TMA
# multicast, a persistent grid whose tile order (raster, swizzle) and size (sm_count) are ABI 2
# runtime options, and a stmatrix + TMA-store ("tma") or register ("direct") epilogue.
_ENUM_MACROS.setdefault("EPILOGUE", ("EPILOGUE_TMA", {"direct": 0, "tma": 1}))

# The runtime options every wgmma kernel declares in its meta (call order, values, default):
# what the tuner sweeps per shape without rebuilding.
WGMMA_OPTIONS: tuple[tuple[str, tuple[int, ...], int], ...] = (
    ("raster", (0, 1, 2, 3), 0),                              # 0 heuristic, 1 along M, 2 along N, 3 Hilbert
    ("swizzle", (1, 2, 4, 8, 16), 8),                         # group size of rasters 1 and 2
    ("sm_count", (0, 64, 96, 114, 120, 128, 130, 132), 0),    # persistent grid size (0 = every SM)
)


def wgmma_option_space() -> dict[str, list[int]]:
    """Runtime option -> values of the wgmma family (the same list every build's meta declares)."""
    return {name: list(values) for name, values, _ in WGMMA_OPTIONS}


def _wgmma_smem_bytes(p: dict) -> int:
    """Dynamic shared memory of a wgmma config, as wgmma_hgemm.cuh computes kSmemBytes."""
    fixed = p["STAGES"] * (p["BM"] + p["BN"]) * p["BK"] * 2 + 3 * p["STAGES"] * 8 + 1024
    if p["EPILOGUE"] != "tma":
        return fixed
    # C staging for all consumers: the whole BM x BN tile if it fits, else 128 columns, else 64
    chunks = p["BN"] // 64
    for c in (chunks, 2, 1):
        if c <= chunks and fixed + p["BM"] * 128 * c <= SMEM_LIMIT["sm_90a"]:
            return fixed + p["BM"] * 128 * c
    return fixed + p["BM"] * 128


def _wgmma_problems(family: Family, p: dict, arch: str | None) -> list[str]:
    out = []
    BM, BN, BK, C = p["BM"], p["BN"], p["BK"], p["CONSUMERS"]
    if p["ACC"] != "f32":
        out.append("the wgmma family implements fp32 accumulation only (ACC=f32)")
    if C not in (1, 2, 3):
        out.append(f"CONSUMERS={C} must be 1, 2 or 3")
    elif BM % (64 * C) or BM // (64 * C) not in (1, 2):
        out.append(f"BM={BM} must be 64 or 128 rows per consumer warpgroup (CONSUMERS={C})")
    if BN not in (64, 128, 192, 256):
        out.append(f"BN={BN} must be 64, 128, 192 or 256 (wgmma N, whole 64-column swizzle chunks)")
    if BK not in (64, 128):
        out.append(f"BK={BK} must be 64 or 128 (whole 128-byte swizzle atoms)")
    if p["CLUSTER_M"] not in (1, 2):
        out.append(f"CLUSTER_M={p['CLUSTER_M']} must be 1 or 2")
    if p["STAGES"] < 2:
        out.append("STAGES must be >= 2")
    if out:
        return out
    acc = (BM // C // 64) * BN // 2
    limit = 96 if C == 3 else 128
    if acc > limit:
        out.append(f"{acc} accumulator registers per consumer thread (> {limit}: spills)")
    smem = _wgmma_smem_bytes(p)
    if smem > SMEM_LIMIT["sm_90a"]:
        out.append(f"{smem} bytes of shared memory > {SMEM_LIMIT['sm_90a']} on sm_90a")
    return out


def _wgmma_accepts(p: dict, M: int, N: int, K: int) -> bool:
    # TMA strides are multiples of 16 bytes: lda = K, ldb = N (RR) or K (RC), ldc = N when the
    # epilogue is a TMA store. The meta's "divisible" says the same.
    n_div8 = p["LAYOUT"] == "RR" or p["EPILOGUE"] == "tma"
    return K % 8 == 0 and (N % 8 == 0 or not n_div8)


_WGMMA_BIG = dict(BM=128, BN=256, BK=64, STAGES=4, CONSUMERS=2, CLUSTER_M=2, EPILOGUE="tma",
                  ACC="f32", LAYOUT="RR")
_WGMMA_128 = dict(_WGMMA_BIG, BN=128, STAGES=6)
# The simplest path (one consumer warpgroup, no cluster, register epilogue): the fallback.
_WGMMA_SIMPLE = dict(_WGMMA_BIG, BN=128, CONSUMERS=1, CLUSTER_M=1, EPILOGUE="direct")
_register(Family(
    name="wgmma", arches=("sm_90a",), header="wgmma_hgemm.cuh", style="wgmma", flags=(),
    description="raw CUDA + inline PTX Hopper kernel: TMA (multicast in 2-CTA clusters) into an "
                "mbarrier pipeline, producer + consumer warpgroups with setmaxnreg, "
                "wgmma.mma_async f32, persistent grid with runtime tile order (ABI 2), TMA-store "
                "epilogue; N % 8 == 0 (RR or TMA store) and K % 8 == 0",
    _space={"BM": (64, 128, 192, 256), "BN": (64, 128, 192, 256), "BK": (64, 128),
            "STAGES": (2, 3, 4, 5, 6, 7, 8), "CONSUMERS": (1, 2, 3), "CLUSTER_M": (1, 2),
            "EPILOGUE": ("direct", "tma")},
    _fixed={"ACC": ("f32",), "LAYOUT": ("RR", "RC")},
    _defaults=(_WGMMA_BIG, {**_WGMMA_BIG, "LAYOUT": "RC"}, _WGMMA_128, _WGMMA_SIMPLE,
               {**_WGMMA_SIMPLE, "LAYOUT": "RC"}),
    _problems=_wgmma_problems, _accepts=_wgmma_accepts,
    _options=lambda p: list(WGMMA_OPTIONS),
    # swizzle is the group size of rasters 1 and 2 only: with 0 (heuristic) or 3 (Hilbert)
    # every swizzle value runs the same order
    _option_redundant=lambda p, o: o["raster"] in (0, 3) and o["swizzle"] != 8,
    instruction="wgmma"))

from cudal2.templates.skinny import skinny_family  # noqa: E402  (M <= 64: skinny_hgemm.cuh)
_register(skinny_family(Family, _mma_problems))
