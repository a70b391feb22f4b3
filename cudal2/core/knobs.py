"""Every environment knob cudal2 reads, declared once, typed, named CUDAL2_*.

Knobs are read through these functions when needed, never at import, so a test or a user can
set them at any time. The README's knob table is this list, written by
`python -m cudal2.core.knobs` (tests/test_readme.py holds them equal).
"""
from __future__ import annotations

import difflib
import os
from dataclasses import dataclass
from pathlib import Path

from cudal2.core.vocab import ARCHES

_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Knob:
    name: str
    default: str
    help: str
    internal: bool = False      # read by the harness, the GPU kit or the tests, not a user setting


KNOBS: tuple[Knob, ...] = (
    Knob("CUDAL2_CACHE", "~/.cache/cudal2", "build cache and on-disk dispatch verdicts"),
    Knob("CUDAL2_DISABLE", "0", "1: cudal2.matmul is exactly torch.matmul and cudal2.patch a no-op"),
    Knob("CUDAL2_KERNELS", "<repo>/generated_kernels", "the tuned kernel table that ships with cudal2"),
    Knob("CUDAL2_USER_KERNELS", "<CUDAL2_CACHE>/kernels", "your own tuned kernels: export and "
         "`campaign run` write here; dispatch layers them over CUDAL2_KERNELS (the faster "
         "measured row of a shape wins)"),
    Knob("CUDAL2_BUILD_IN_CALL", "1", "1: a call that needs a kernel not yet built builds it "
         "(announced at WARNING); 0: torch serves that shape until `cudal2 warmup` has built it"),
    Knob("CUDAL2_PDL", "0", "1: dispatch launches the kernels that offer option pdl (the skinny "
         "families, sm_90a) with programmatic dependent launch; the tuner never times it: "
         "compare `cudal2 bench --model` with 0 and 1"),
    Knob("CUDAL2_ARCH", "", "target arch when no GPU is visible: sm_80, sm_86, sm_89 or sm_90a"),
    Knob("CUDAL2_BUILD_JOBS", "<cpu count>", "parallel nvcc processes for build_many"),
    Knob("CUDAL2_LOG", "warning", "log level of the cudal2 logger"),
    Knob("CUDAL2_ADAPTER", "<repo>/rl/data/adapter", "the LoRA adapter the default policy (smollm2) merges"),
    Knob("CUDAL2_FAKE_DEVICE", "", "a time scale (e.g. 0.1): GPU workers answer as a fake device "
         "(synthetic timings, sleeps scaled), for CPU rehearsals of GPU runs; nothing it makes exports"),
    Knob("CUDA_HOME", "", "CUDA toolkit root, searched first for nvcc (standard name)"),
)


KNOBS += (
    Knob("CUDAL2_CALL_GUARD", "1", "0: GPU workers run without the call guard (the GPU kit's "
         "fallback when the canary fails on a device; the audit's dry call always has it)", True),
    Knob("CUDAL2_FAKE_FAULTS", "", "with CUDAL2_FAKE_DEVICE, `<so sha256 prefix>:trap|hang|wrong,...`: "
         "injected faults for the screening's and the finals' fault rehearsals", True),
    Knob("CUDAL2_TEST_CACHE", "<pytest cache>/d/cudal2-builds", "the build cache the tests use "
         "(tests/conftest.py sets CUDAL2_CACHE to it: a test run never builds into yours)", True),
    Knob("CUDAL2_COLLECTED_FILE", "", "the tests write the ids pytest selected there (the GPU "
         "kit tells a run cut at its time share from one that ran everything)", True),
    Knob("CUDAL2_TEST_PACK", "", "a campaign pack whose cutlass_sm90 builds test_templates "
         "checks on a GPU", True),
    Knob("CUDAL2_LOWLAT_ALL", "", "1: the lowlat tests build every config of the space, not a "
         "covering set", True),
    Knob("CUDAL2_SKINNY_ALL", "", "1: the skinny tests build every config of the space", True),
    Knob("CUDAL2_WGMMA_ALL", "", "1: the wgmma tests build every instantiation", True),
)
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def _get(name: str, environ=None) -> str:
    return (os.environ if environ is None else environ).get(name, "").strip()


def _switch(name: str, value: str, default: str) -> bool:
    """A 0/1 knob ('' = default). Anything else (true, yes, 2) is refused, not read as either:
    a typo must not silently mean the opposite of what was meant."""
    value = value or default
    if value not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, got {value!r}")
    return value == "1"


def cache_dir() -> Path:
    value = _get("CUDAL2_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "cudal2"


def disabled(environ=None) -> bool:
    """CUDAL2_DISABLE: 0 (default) or 1; anything else is refused."""
    return _switch("CUDAL2_DISABLE", _get("CUDAL2_DISABLE", environ), "0")


def user_kernels_dir() -> Path:
    """CUDAL2_USER_KERNELS, else <CUDAL2_CACHE>/kernels: the user's own table, outside the
    installed package so that upgrading cudal2 never erases it."""
    value = _get("CUDAL2_USER_KERNELS")
    return Path(value).expanduser() if value else cache_dir() / "kernels"


def build_in_call(environ=None) -> bool:
    """CUDAL2_BUILD_IN_CALL: 1 (default) or 0; anything else is refused."""
    return _switch("CUDAL2_BUILD_IN_CALL", _get("CUDAL2_BUILD_IN_CALL", environ), "1")


def pdl(environ=None) -> bool:
    """CUDAL2_PDL: 0 (default) or 1; anything else is refused, not read as either."""
    return _switch("CUDAL2_PDL", _get("CUDAL2_PDL", environ), "0")


def kernels_dir() -> Path:
    """CUDAL2_KERNELS, else the table that ships with the package: cudal2/generated_kernels in an
    installed wheel (packaged from the repository's top-level generated_kernels/), the
    repository's generated_kernels/ in a source checkout or editable install."""
    value = _get("CUDAL2_KERNELS")
    if value:
        return Path(value).expanduser()
    packaged = Path(__file__).resolve().parents[1] / "generated_kernels"
    return packaged if packaged.is_dir() else _REPO_ROOT / "generated_kernels"


def default_arch(environ=None) -> str | None:
    """CUDAL2_ARCH: one of vocab.ARCHES as spelled there, or None when unset."""
    value = _get("CUDAL2_ARCH", environ)
    if value and value not in ARCHES:
        raise ValueError(f"CUDAL2_ARCH must be one of {', '.join(ARCHES)}, got {value!r}")
    return value or None


def build_jobs(environ=None) -> int:
    value = _get("CUDAL2_BUILD_JOBS", environ)
    if value:
        try:
            jobs = int(value)
        except ValueError:
            raise ValueError(f"CUDAL2_BUILD_JOBS must be an integer, got {value!r}") from None
        if jobs < 1:
            raise ValueError(f"CUDAL2_BUILD_JOBS must be >= 1, got {value!r}")
        return jobs
    return os.cpu_count() or 1


def log_level(environ=None) -> str:
    """CUDAL2_LOG: a logging level name (any case), lower-cased; warning when unset."""
    value = _get("CUDAL2_LOG", environ)
    level = value.lower() or "warning"
    if level not in LOG_LEVELS:
        raise ValueError(f"CUDAL2_LOG must be a log level ({', '.join(LOG_LEVELS)}), got {value!r}")
    return level


def adapter_dir() -> Path | None:
    """CUDAL2_ADAPTER: a LoRA adapter folder for the default policy (e.g. one trained on a GPU);
    None: the adapter that ships in rl/data/adapter."""
    value = _get("CUDAL2_ADAPTER")
    return Path(value).expanduser() if value else None


def fake_device_scale(environ=None) -> float | None:
    """CUDAL2_FAKE_DEVICE: the time scale of the fake device (cudal2/harness/fakedevice.py), or
    None when unset (the real GPU, if any)."""
    value = _get("CUDAL2_FAKE_DEVICE", environ)
    if not value:
        return None
    try:
        scale = float(value)
    except ValueError:
        raise ValueError(f"CUDAL2_FAKE_DEVICE must be a time scale (a number > 0), got {value!r}") from None
    if not scale > 0:
        raise ValueError(f"CUDAL2_FAKE_DEVICE must be > 0, got {value!r}")
    return scale


def repo_root() -> Path:
    return _REPO_ROOT


# The knobs whose value can be wrong, read through their accessors by check_env.
_VALIDATED = {"CUDAL2_DISABLE": disabled, "CUDAL2_BUILD_IN_CALL": build_in_call, "CUDAL2_PDL": pdl,
              "CUDAL2_ARCH": default_arch, "CUDAL2_BUILD_JOBS": build_jobs,
              "CUDAL2_LOG": log_level, "CUDAL2_FAKE_DEVICE": fake_device_scale}


def known_names() -> tuple[str, ...]:
    return tuple(k.name for k in KNOBS if k.name.startswith("CUDAL2_"))


def markdown_table() -> str:
    """The README's knob table: every knob, the users' first, then the internal ones."""
    def row(k: Knob) -> str:
        text = k.help.replace("|", "\\|")    # a pipe would end the cell
        return f"| `{k.name}` | {k.default} | {text} |"
    lines = ["| knob | default | meaning |", "| --- | --- | --- |"]
    lines += [row(k) for k in KNOBS if not k.internal]
    lines += ["", "Read by the harness, the GPU kit and the tests (accepted by name, not user settings):",
              "", "| knob | default | meaning |", "| --- | --- | --- |"]
    return "\n".join(lines + [row(k) for k in KNOBS if k.internal]) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")


def check_env(environ=None) -> None:
    """Refuse, with one line naming it, a CUDAL2_* variable that is set to a value its knob does
    not take, or whose name is no knob (a typo such as CUDAL2_DISABLED would otherwise do
    nothing, silently). `environ`: os.environ when None."""
    environ = os.environ if environ is None else environ
    known = known_names()
    for name in sorted(n for n in environ if n.startswith("CUDAL2_")):
        if name not in known:
            near = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ValueError(f"unknown environment variable {name}{hint}; cudal2 reads "
                             f"{', '.join(known)}")
        if name in _VALIDATED:
            _VALIDATED[name](environ)
