"""Fill a build cache (CUDAL2_CACHE) with every kernel the GPU tests and the hostile-corpus stage
build, so a GPU machine whose nvcc has the same version finds them built.

The spec lists come from the tests themselves (their case lists and data folders), not copies,
so a test that gains a kernel is prefilled too. The builds happen in a persistent cache (--seed,
default ~/.cache/cudal2: the one the campaign packs build in, prepare.sh's PREPARE_BUILD_CACHE)
and their entries are copied into CUDAL2_CACHE: the key is content-addressed, so an entry with the
same key is the same binary, and a second prefill, or a pack that plans the same kernel, compiles
nothing again, whatever became of CUDAL2_CACHE (prepare.sh empties it for each verdict call).

    CUDAL2_CACHE=.gpu_cache python tools/gpu_session/prefill.py --arch sm_90a
"""
from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"


def _test_module(name: str):
    """Import tests/<name>.py by path (tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"_gpu_session_{name}", TESTS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def specs(arch: str) -> list:
    """(why, BuildSpec) for every cached build the GPU tests and the hostile stage make."""
    from cudal2.core.build import BuildSpec
    from cudal2.harness import baselines
    from cudal2.harness.audit import check_source
    from cudal2.templates import FAMILIES

    out = []
    # tests/test_templates.py::test_kernels_match_torch (default cache)
    for p in _test_module("test_templates")._gpu_cases():
        cfg = p.values[0]
        if arch in FAMILIES[cfg.family].arches:
            out.append(("test_templates", FAMILIES[cfg.family].build_spec(cfg, arch)))
    # tests/test_wgmma.py::test_matches_torch (the wgmma family's 14 covering instantiations, sm_90a only)
    if arch == "sm_90a":
        for p in _test_module("test_wgmma").CASES:
            out.append(("test_wgmma", FAMILIES["wgmma"].build_spec(p.values[0], arch)))
    # the GPU tiers of the families added since: lowlat/lowlat_mma (each covering case built
    # for its arch), skinny and skinny_n (defaults, built for the device's arch), the in-kernel
    # split-K builds (sm_90a)
    for p in _test_module("test_lowlat").CASES:
        cfg, a = p.values
        if a == arch:
            out.append(("test_lowlat", FAMILIES[cfg.family].build_spec(cfg, arch)))
    for cfg in _test_module("test_skinny").GPU_CASES:
        if arch in FAMILIES[cfg.family].arches:
            out.append(("test_skinny", FAMILIES[cfg.family].build_spec(cfg, arch)))
    for cfg in _test_module("test_streamk_family").GPU_CASES:
        out.append(("test_streamk_family", FAMILIES[cfg.family].build_spec(cfg, arch)))
    if arch == "sm_90a":
        splitk = _test_module("test_splitk")
        for cfg in splitk.GPU_CASES:
            out.append(("test_splitk", FAMILIES[cfg.family].build_spec(cfg, arch)))
        # the cluster test's builds and their workspace-only twins (the graph probe's among them)
        for cfg in splitk.CLUSTER_GPU_CASES:
            spec = FAMILIES[cfg.family].build_spec(cfg, arch)
            out += [("test_splitk", spec), ("test_splitk", splitk._global_only(spec))]
    # tests/test_check.py GPU tests: the planted-bug kernels
    for f in sorted((TESTS / "data" / "cheats").glob("*.cu")):
        out.append(("test_check", BuildSpec(f.read_text(), arch, name=f.stem)))
    # tests/test_hostile_gpu.py, tests/test_evaluate.py's GPU tests and the hostile stage
    # (`cudal2 bench --kernels tests/data/hostile`): evaluate() builds BuildSpec(source, arch)
    # for the files that pass its source rules; the others never reach nvcc there, so they don't
    # here either
    for f in sorted((TESTS / "data" / "hostile").glob("*.cu")):
        try:
            text = f.read_text()
        except UnicodeDecodeError:
            continue  # non-UTF-8 source is a verdict before any build
        if not check_source(text, missing=False):
            out.append(("test_hostile_gpu", BuildSpec(text, arch, name=f.stem)))
    # the verdict call's canary (tools/gpu_session/canary.py)
    out.append(("canary", BuildSpec((TESTS / "data" / "hostile" / "control_ok.cu").read_text(), arch,
                                    name="canary")))
    # tests/test_baselines.py and every measurement: the cuBLAS/cuBLASLt baseline libraries
    for lib in baselines.SOURCES:
        out.append(("baselines", BuildSpec(baselines.source(lib), arch, libraries=tuple(baselines.LIBRARIES),
                                           name=f"baseline-{lib}")))
    return out


def seed_entry(key: str, cache: Path, seed: Path) -> bool:
    """Copy a finished entry for `key` from `seed` into `cache`; True if copied."""
    src, dst = seed / "builds" / key[:2] / key, cache / "builds" / key[:2] / key
    if dst.exists() or not (src / "build.json").is_file():
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".seed")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    tmp.replace(dst)
    return True


def main(argv=None) -> int:
    from cudal2.core import knobs
    from cudal2.core.build import build_many, cache_key
    from cudal2.core.toolchain import find_toolchain

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--seed", default=str(Path.home() / ".cache" / "cudal2"),
                    help="the persistent build cache the kernels are built (or found) in, their "
                         "entries then copied into CUDAL2_CACHE ('' = build in CUDAL2_CACHE alone)")
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--list", action="store_true", help="print the specs and exit")
    ap.add_argument("--only", default="",
                    help="comma-separated tags to keep (test_lowlat, test_templates, ..., test_hostile_gpu, "
                         "canary, baselines; default: all)")
    args = ap.parse_args(argv)

    cache = knobs.cache_dir()
    todo = specs(args.arch)
    if args.only:
        keep = set(args.only.split(","))
        todo = [(why, s) for why, s in todo if why in keep]
    if args.list:
        for why, s in todo:
            print(f"{why:15s} {s.name}")
        return 0
    tc = find_toolchain()
    seed = Path(args.seed).expanduser() if args.seed else None
    if seed is not None and seed.resolve() == cache.resolve():
        seed = None
    print(f"prefill {cache}: {len(todo)} builds for {args.arch} with nvcc {tc.version}"
          + (f", built in {seed}" if seed else ""), flush=True)
    t0 = time.monotonic()
    results = build_many([s for _, s in todo], jobs=args.jobs, cache=seed,
                         progress=lambda r: print(f"  {r.name}: {r.status}"
                                                  f"{' (cached)' if r.cached else f' {r.seconds:.1f} s'}", flush=True))
    if seed is not None:     # every finished entry, a failed build's too (the GPU machine reads its verdict)
        copied = sum(seed_entry(cache_key(s, tc.version), cache, seed) for _, s in todo)
        print(f"  {copied} entries copied from {seed} into {cache}", flush=True)
    bad = [(why, r) for (why, _), r in zip(todo, results) if not r.ok and why != "test_hostile_gpu"]
    for why, r in bad:
        print(f"FAILED {why} {r.name}: {r.status}\n{r.log[-1500:]}", file=sys.stderr)
    print(f"prefill done in {time.monotonic() - t0:.0f} s: {sum(r.ok for r in results)} ok, "
          f"{sum(not r.ok for r in results)} not ok ({len(bad)} unexpected)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
