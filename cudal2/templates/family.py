"""What a kernel family is: `KernelConfig` (one instantiation), `Family` (a `.cuh` file and the
rules for its parameters), the registry `FAMILIES` and `instantiate`. The families themselves live
in modules beside their `.cuh` files (mma.py, cutlass_sm90.py, wgmma.py, ...), which register
themselves here when `cudal2.templates` imports them; import names from `cudal2.templates`.
"""
from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from cudal2.core.abi import meta_accepts
from cudal2.core.build import BuildSpec


Value = int | str

MAX_ENUMERATE = 200_000   # above this a family's product space is sampled, not listed (enumerate_space)

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

    def name(self) -> str:
        """The canonical name of a registered family's config, file-name safe and one per config,
        e.g. `wgmma_sm90a_f32_rr_128x256x64_s4_c2x1_g2_tma`: what its generated file is named."""
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; known: {sorted(FAMILIES)}")
        return FAMILIES[self.family].config_name(self)


# ---- families -----------------------------------------------------------------------------
# String-valued parameters become 0/1 macros the preprocessor can test.
_ENUM_MACROS: dict[str, tuple[str, dict[str, int]]] = {
    "ACC": ("ACC_F16", {"f32": 0, "f16": 1}),
    "LAYOUT": ("LAYOUT_RC", {"RR": 0, "RC": 1}),
    "SCHEDULE": ("SCHEDULE_PINGPONG", {"cooperative": 0, "pingpong": 1}),
    "SCHEDULER": ("SCHEDULER_STREAMK", {"persistent": 0, "streamk": 1}),
    "A_LOAD": ("A_REGS", {"ring": 0, "regs": 1}),
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
    # the options the planner sweeps on a decode row, where they are more than _options's
    _decode_options: Callable[[dict], list[OptionDecl]] | None = field(repr=False, default=None)
    # the family-specific part of a config's canonical name (after family_arch_acc_layout_)
    _name: Callable[[dict], str] | None = field(repr=False, default=None)

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
        # a requirement the family does not offer (skinny_n with row-major B)
        return self._problems(self, p, arch) + [
            f"{k}={p[k]!r}: family {self.name} offers {k} {', '.join(map(str, v))} only"
            for k, v in self._fixed.items() if p[k] not in v]

    def valid(self, config: KernelConfig, arch: str | None = None) -> bool:
        return not self.problems(config, arch)

    def accepts(self, config: KernelConfig, M: int, N: int, K: int, *, checked: bool = False) -> bool:
        """Whether a (valid) config computes C[M,N] = A[M,K] @ B for this shape (dense, aligned
        operands with ld == the logical width: what dispatch hands it). checked=True: the
        caller has validated the config already (a planner over an enumerated space). Valid
        means for some arch the family claims (a deep ring may fit sm_90a only)."""
        if min(M, N, K) < 0 or not (checked or any(self.valid(config, a) for a in self.arches)):
            return False
        return self._accepts(config.as_dict(), M, N, K)

    def serves(self, config: KernelConfig, M: int, N: int, K: int, *, checked: bool = False) -> bool:
        """Whether the harness and the dispatcher will let this config serve the shape: it
        accepts it, and (the ABI, docs/abi.md) a kernel that does not claim any_shape is served
        only multiples of its tile."""
        p = config.as_dict()
        # a family without a BM x BN x BK tile (gemv) claims any_shape: its tile is not read
        tile = [p.get("BM", 1), p.get("BN", 1), p.get("BK", 1)]
        return self.accepts(config, M, N, K, checked=checked) and meta_accepts(
            {"any_shape": self.any_shape, "tile": tile}, M, N, K)

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

    def option_space(self, config: KernelConfig, decode: bool = False) -> list[dict[str, int]]:
        """Every combination of the options the build accepts, fully spelt out, in a fixed order
        (defaults first), without combinations that behave like an earlier one; [{}] for an ABI
        1 family (one way to call it). decode: the wider sweep of a decode row, where the family
        has one."""
        decls = self.option_decls(config)
        if decode and self._decode_options is not None:
            decls = [(n, tuple(v), d) for n, v, d in self._decode_options(config.as_dict())]
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

    # -- naming
    def config_name(self, config: KernelConfig) -> str:
        """`<family>_<first arch>_<acc>_<layout>_<the family's part>`, lower case, [a-z0-9_]
        only. Raises ValueError for an invalid config (an invalid config has no name)."""
        _check(self, config)
        p = config.as_dict()
        # the first arch the config builds for (a family may claim sm_80 for some configs only)
        arch = next((a for a in self.arches if not self.problems(config, a)), self.arches[0])
        head = [self.name, arch.replace("_", ""), str(p.get("ACC", "f32")),
                str(p.get("LAYOUT", "RR"))]
        name = "_".join(head + [self._name(p)]).lower()
        if not re.fullmatch(r"[a-z0-9_]+", name):
            raise ValueError(f"{self.name}: config name {name!r} is not file-name safe")
        return name

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
        arch = arch or self.arches[-1]
        _check(self, config, arch)
        return BuildSpec(instantiate(config), arch=arch, name=config.name())


def _check(family: Family, config: KernelConfig, arch: str | None = None) -> None:
    """Raises ValueError unless `config` builds for `arch` or, with no arch, for at least one arch
    the family claims (a deep pipeline may fit sm_90a's shared memory and not sm_80's: it is a
    kernel, named after the arch it builds for)."""
    if arch is not None:
        bad = family.problems(config, arch)
    elif any(not family.problems(config, a) for a in family.arches):
        return
    else:
        bad = family.problems(config)
    if bad:
        raise ValueError(f"invalid {family.name} config {config.label()}"
                         f"{f' for {arch}' if arch else ''}: " + "; ".join(bad))


# The accumulator and layout choices of a family that offers both (a target's requirements).
_ACC_LAYOUT = {"ACC": ("f32", "f16"), "LAYOUT": ("RR", "RC")}

FAMILIES: dict[str, Family] = {}


def _register(f: Family) -> None:
    FAMILIES[f.name] = f


def with_acc(config: KernelConfig, acc: str) -> KernelConfig | None:
    """`config` accumulating in `acc` ("f32" or "f16"), whichever parameter its family uses for
    it; None when the family only accumulates in f32 and f16 is asked."""
    names = config.as_dict()
    if "ACC" in names:
        return config.with_(ACC=acc)
    if "ACC_F16" in names:
        return config.with_(ACC_F16=int(acc == "f16"))
    return config if acc == "f32" else None


def enumerate_space(family, *, arch: str | None = None, acc: str = "f32", layout: str = "RR",
                    seed: int = 0) -> list[KernelConfig]:
    """Every valid config of a family for one target (accumulator, B layout, arch), sampled
    uniformly when the product is huge. ACC and LAYOUT are requirements, not knobs."""
    space = family.space()
    names = sorted(space)
    size = math.prod(len(space[n]) for n in names)
    # a family without an ACC knob (skinny: f32 only) serves f32 targets only
    default = with_acc(family.default(), acc)
    if default is None:
        return []
    default = default.with_(LAYOUT=layout)
    if size <= MAX_ENUMERATE:
        combos: Iterable = itertools.product(*(space[n] for n in names))
    else:
        rng = random.Random(seed)
        combos = (tuple(rng.choice(space[n]) for n in names) for _ in range(MAX_ENUMERATE))
    out, seen = [], set()
    for values in combos:
        cfg = default.with_(**dict(zip(names, values)))
        if cfg not in seen and family.valid(cfg, arch):
            seen.add(cfg)
            out.append(cfg)
    return out


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


_CONFIG_LINE_RE = re.compile(r"^// config: ([a-z0-9_]+):([A-Za-z0-9_=,.\-]*)$", re.M)


def config_of(source: str) -> KernelConfig | None:
    """The config whose instantiation `source` is, byte for byte; None when it is not one (no
    "// config:" banner line, an unknown family, an invalid config, or any byte changed: a
    kernel that only looks like ours). Our own families' code is ours, not a generated claim,
    so dispatch trusts such a kernel's meta in full (docs/dispatch.md)."""
    if not isinstance(source, str):
        return None
    m = _CONFIG_LINE_RE.search(source)
    if m is None or m.group(1) not in FAMILIES:
        return None
    params = []
    for part in filter(None, m.group(2).split(",")):
        k, eq, v = part.partition("=")
        if not eq:
            return None
        params.append((k, int(v) if re.fullmatch(r"-?[0-9]+", v) else v))
    try:
        config = KernelConfig(m.group(1), tuple(params))
        return config if instantiate(config) == source else None
    except ValueError:
        return None
