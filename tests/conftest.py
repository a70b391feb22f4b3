"""Test tiers by hardware need: unit (pure Python), compile (nvcc, no GPU), gpu (marked, skipped
with a reason on machines without a CUDA device). Nothing here touches the GPU at import time.

The run: on every core (pytest-xdist, `-n auto --dist worksteal`, unless -n is given, xdist is
absent or blocked by `-p no:xdist`), building into the tests' own cache (CUDAL2_TEST_CACHE, else
a folder of pytest's cache under the rootdir), never the user's CUDAL2_CACHE. The cache is keyed by
content with a lock per entry, so a kernel several tests (or workers) build is compiled once."""

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """`-n auto --dist worksteal` by default (before xdist reads the options): the suite is
    mostly nvcc processes, one core each, and a 2-core machine halves its wall time."""
    opt = config.option
    if (getattr(opt, "numprocesses", 0) is None and getattr(opt, "dist", None) == "no"
            and not hasattr(config, "workerinput") and not opt.collectonly
            and not getattr(opt, "usepdb", False)):
        opt.numprocesses, opt.dist = "auto", "worksteal"


def _test_cache(config) -> Path:
    given = os.environ.get("CUDAL2_TEST_CACHE")
    if given:
        return Path(given)
    cache = getattr(config, "cache", None)          # None under -p no:cacheprovider
    if cache is not None:
        return cache.mkdir("cudal2-builds")
    return Path(tempfile.gettempdir()) / f"cudal2-tests-{os.getuid()}"


def pytest_configure(config):
    """The tests' build cache, set before any test (or xdist worker, which inherits it) builds:
    a test run must not grow or read the user's CUDAL2_CACHE."""
    os.environ["CUDAL2_CACHE"] = str(_test_cache(config))


def _gpu_reason():
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA GPU visible (torch.cuda.is_available() is False)"
    return None


def pytest_collection_modifyitems(config, items):
    reason = None
    checked = False
    for item in items:
        if "gpu" in item.keywords:
            if not checked:
                reason, checked = _gpu_reason(), True
            if reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu test: {reason}"))


@pytest.fixture(scope="session")
def prebuild(request):
    """prebuild(specs): in a one-process run, build these now, one nvcc per core
    (CUDAL2_BUILD_JOBS), so the tests that follow read the cache. Under xdist nothing: the
    workers are the parallelism, each test builds its own and the cache shares (a prebuild in
    every worker would hold both on the same entries' locks)."""
    def run(specs):
        if not hasattr(request.config, "workerinput"):
            from cudal2.core.build import build_many
            build_many(list(specs))
    return run


@pytest.fixture(autouse=True)
def _own_user_table(tmp_path_factory, monkeypatch):
    """Every test gets an empty user kernel table of its own (CUDAL2_USER_KERNELS): an export
    with no root writes there, and dispatch layers it over the shipped table, so nothing leaks
    between tests or from the developer's ~/.cache/cudal2/kernels. A test of the default itself
    deletes the variable."""
    monkeypatch.setenv("CUDAL2_USER_KERNELS", str(tmp_path_factory.mktemp("user_kernels")))


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """An empty build cache for this test only."""
    d = tmp_path / "cache"
    monkeypatch.setenv("CUDAL2_CACHE", str(d))
    return d


@pytest.fixture(scope="session")
def fake_runtime(tmp_path_factory):
    """fake_runtime(name): tests/data/<name>.c, a fake of the CUDA runtime calls a kernel's
    launcher makes, built as a shared library once per session; its path. Loaded with
    RTLD_GLOBAL before a kernel .so, its symbols win over libcudart's. Skips without a C compiler."""
    built = {}

    def lib(name: str) -> Path:
        if name not in built:
            cc = shutil.which("gcc") or shutil.which("cc")
            if cc is None:
                pytest.skip("no C compiler")
            so = tmp_path_factory.mktemp(name) / f"lib{name}.so"
            src = Path(__file__).parent / "data" / f"{name}.c"
            subprocess.run([cc, "-shared", "-fPIC", "-O1", str(src), "-o", str(so)],
                           check=True, capture_output=True, text=True)
            built[name] = so
        return built[name]
    return lib


@pytest.fixture(scope="session")
def reset_fake_cudart(fake_runtime):
    """The fake runtime whose shared-memory opt-in is kept per function and dropped by a fake
    device reset (tests/data/reset_fake_cudart.c)."""
    return fake_runtime("reset_fake_cudart")


_FAKE_RUN = r"""
import ctypes, json, sys
fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # before the kernel's libcudart
lib = ctypes.CDLL(sys.argv[2])
dev = json.loads(sys.argv[4])
fake.fake_set_sm_count(dev["sms"])
fake.fake_set_blocks_per_sm(dev["per_sm"])
fake.fake_set_max_clusters(dev["clusters"])
vp, P = ctypes.c_void_p, 1 << 20
abi2 = hasattr(lib, "cudal2_workspace")
if abi2:
    lib.cudal2_workspace.restype = ctypes.c_size_t
out = []
for M, N, K, opts, ws in json.loads(sys.argv[3]):
    fake.fake_reset()
    o = (ctypes.c_int * len(opts))(*opts) if opts is not None else None
    need = lib.cudal2_workspace(M, N, K, o) if abi2 else None
    if ws == -1:            # exactly what cudal2_workspace asks for
        ws = need
    args = [vp(P), vp(P), vp(P), M, N, K, K, K, N, vp(P if ws else 0), ctypes.c_size_t(ws), vp(0)]
    if abi2:
        args.append(o)
    rc = lib.cudal2_hgemm(*args)
    g, cl = (ctypes.c_uint * 3)(), (ctypes.c_uint * 3)()
    fake.fake_last_grid(g)
    fake.fake_last_cluster(cl)
    out.append({"rc": rc, "launches": fake.fake_launches(), "ex": fake.fake_ex_launches(),
                "memsets": fake.fake_memsets(), "grid": list(g), "cluster": list(cl), "need": need,
                "pdl": fake.fake_last_pdl()})
print(json.dumps(out))
"""


@pytest.fixture(scope="session")
def fake_launches(fake_runtime):
    """fake_launches(so_path, calls, sms=132, per_sm=2, clusters=16): runs cudal2_hgemm of a built
    .so against tests/data/splitk_fake_cudart.c (no GPU), in a process of its own (kernels cache
    the SM count, the resident slots and the cluster residency per device), on a fake device of
    `sms` SMs, `per_sm` resident CTAs per SM and `clusters` resident clusters (0: none can be
    resident). calls: [M, N, K, options or None, workspace bytes (-1: what cudal2_workspace asks
    for)], with lda = ldb = K and ldc = N. Per call: rc, launches, ex (of them cudaLaunchKernelEx),
    memsets, grid and cluster dims of the last launch, pdl (its programmatic stream serialisation),
    need (cudal2_workspace)."""
    import json
    import sys
    fake = fake_runtime("splitk_fake_cudart")

    def run(so_path, calls, sms=132, per_sm=2, clusters=16):
        dev = {"sms": sms, "per_sm": per_sm, "clusters": clusters}
        r = subprocess.run([sys.executable, "-c", _FAKE_RUN, str(fake), str(so_path),
                            json.dumps(calls), json.dumps(dev)], capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)
    return run


def pytest_collection_finish(session):
    """CUDAL2_COLLECTED_FILE set: the node ids selected to run (after -m and --deselect), one a
    line, so a run stopped at its time share is told from one that ran everything
    (tools/gpu_session/families.py record). Not in xdist workers: under -n (whose controller
    collects nothing) no file is written and record goes by the junit alone."""
    import os
    path = os.environ.get("CUDAL2_COLLECTED_FILE")
    if path and not hasattr(session.config, "workerinput"):
        with open(path, "w") as f:
            f.writelines(f"{item.nodeid}\n" for item in session.items)
