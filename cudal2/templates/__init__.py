"""Our reference HGEMM kernel families: `.cuh` data files plus the configs that instantiate them.

A family is one parameterised kernel file (`mma_hgemm.cuh`, `ptx_hgemm.cuh`, `cutlass_sm90.cuh`)
whose every parameter is a `#define` with a default. A `KernelConfig` names a family and its
parameter values; `instantiate(config)` writes a self-contained `.cu` file: a banner, the
`#define` lines, then the family's `.cuh` text with its local includes inlined. The kernel code
lives only in the `.cuh` files; each family's parameter space, static constraints (`Family.valid`)
and the shapes it serves (`Family.accepts`) live in a module beside its `.cuh` (mma.py,
cutlass_sm90.py, wgmma.py, ...); family.py holds KernelConfig, Family, the registry and
`instantiate`. This package is the registry: importing it registers every family.
docs/templates.md has the macro reference.
"""
from __future__ import annotations

from cudal2.templates.family import (_ACC_LAYOUT, _ENUM_MACROS, FAMILIES, SMEM_LIMIT,  # noqa: F401
                                     Family, KernelConfig, OptionDecl, Value, _check, _register,
                                     config_of, default_configs, enumerate_space, instantiate,
                                     MAX_ENUMERATE, template_dir, with_acc)

__all__ = ["KernelConfig", "Family", "FAMILIES", "instantiate", "template_dir", "SMEM_LIMIT",
           "default_configs", "with_acc", "config_of", "enumerate_space"]


# ---- the families: each one's parameters, rules and space live in a module beside its .cuh;
# importing it registers it (the order here is FAMILIES' order).
from cudal2.templates import mma as _mma  # noqa: F401  (mma and ptx)
from cudal2.templates import cutlass_sm90 as _cutlass_sm90  # noqa: F401
from cudal2.templates import wgmma as _wgmma  # noqa: F401
from cudal2.templates.wgmma import WGMMA_OPTIONS, _wgmma_smem_bytes, wgmma_option_space  # noqa: F401
from cudal2.templates import lowlat as _lowlat  # noqa: F401  (low-latency family)
from cudal2.templates import skinny as _skinny  # noqa: F401  (M <= 64: skinny_hgemm.cuh)
from cudal2.templates import gemv as _gemv  # noqa: F401  (M <= 8 on CUDA cores: gemv_hgemm.cuh)
from cudal2.templates import streamk as _streamk  # noqa: F401  (deep K, few tiles: streamk_hgemm.cuh)
