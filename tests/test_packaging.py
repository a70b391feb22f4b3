"""Packaging a user can trust: a wheel built from this checkout, installed into a fresh virtual
environment (no editable install, no checkout on the path), ships the kernel table and serves
it, and the RL package installs under its own name (cudal2_rl)."""
import json
import os
import subprocess
import sys
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]

_PROBE = r"""
import json, sys, torch, cudal2, cudal2_rl
from cudal2.core import knobs
from cudal2.core.store import KernelIndex
idx = KernelIndex.load()                      # verify=True: files present, hashes match
a, b = torch.randn(33, 70), torch.randn(70, 9)
print(json.dumps({
    "cudal2": cudal2.__file__, "cudal2_rl": cudal2_rl.__file__, "kernels": str(knobs.kernels_dir()),
    "tuned": sorted([r.arch, r.acc, r.layout, r.M, r.N, r.K, r.sha256] for r in idx.tuned_rows()),
    "rows": len(idx), "templates": sorted(p.name for p in (knobs.kernels_dir().parent / "templates").glob("*.cuh")),
    "matmul_equal": bool(torch.equal(cudal2.matmul(a, b), torch.matmul(a, b))),
    "rl_data": sorted(p.name for p in (__import__("pathlib").Path(cudal2_rl.__file__).parent / "data").iterdir()),
}))
"""


def _see_the_running_torch(py: Path) -> None:
    """Give the fresh venv of `py` a .pth file naming the site-packages folders of the
    interpreter running the tests (torch and its dependencies live there, in a virtual
    environment or not). `--system-site-packages` would only reach the base interpreter's site,
    which has no torch when the tests run in a virtual environment. A .pth entry comes after the
    venv's own site-packages, so cudal2 still comes from the wheel; it is written after pip
    installed the wheel, so pip never sees the outer installation of cudal2."""
    site_dirs = [p for p in sys.path if Path(p).name in ("site-packages", "dist-packages")
                 and Path(p).is_dir()]
    import torch
    assert any(Path(torch.__file__).is_relative_to(d) for d in site_dirs), (torch.__file__, site_dirs)
    own_site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(own_site) / "outer_site.pth").write_text("".join(f"{d}\n" for d in site_dirs))


def test_wheel_in_a_fresh_venv_ships_and_serves_the_kernel_table(tmp_path):
    dist = tmp_path / "dist"
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(dist), str(REPO)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (
        "building the wheel without build isolation needs setuptools>=70.1 in the interpreter "
        "running the tests (`pip install -e .[dev]` brings it)\n" if "bdist_wheel" in r.stderr
        or "No module named 'setuptools'" in r.stderr else "") + r.stdout[-2000:] + r.stderr[-2000:]
    (wheel,) = dist.glob("cudal2-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    _see_the_running_torch(py)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "CUDAL2_KERNELS")}
    r = subprocess.run([str(py), "-I", "-c", _PROBE], capture_output=True, text=True, cwd=tmp_path,
                       env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["cudal2"].startswith(str(venv)) and got["cudal2_rl"].startswith(str(venv)), got
    assert got["kernels"].startswith(str(venv)) and got["kernels"].endswith("cudal2/generated_kernels")
    from cudal2.core.store import KernelIndex
    repo_idx = KernelIndex.load(REPO / "generated_kernels")
    want = sorted([r.arch, r.acc, r.layout, r.M, r.N, r.K, r.sha256] for r in repo_idx.tuned_rows())
    assert got["tuned"] == want and got["rows"] == len(repo_idx)
    assert got["matmul_equal"]
    assert {"mma_hgemm.cuh", "cutlass_sm90.cuh"} <= set(got["templates"])
    assert "abi.md" in got["rl_data"]


def _package_dir(pkg: str, dirs: dict) -> str:
    """Where setuptools finds `pkg`: its longest parent named in package-dir, then the rest."""
    parts = pkg.split(".")
    for i in range(len(parts), 0, -1):
        head = ".".join(parts[:i])
        if head in dirs:
            return "/".join([dirs[head], *parts[i:]])
    return pkg.replace(".", "/")


def test_package_data_names_real_files():
    """Every package-data pattern in pyproject.toml matches at least one file of its folder."""
    import tomllib
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg["package-dir"]
    for pkg, patterns in cfg["package-data"].items():
        root = REPO / dirs.get(pkg, pkg.replace(".", "/"))
        for pat in patterns:
            assert list(root.glob(pat)), f"{pkg}: package-data {pat!r} matches no file under {root}"
    for pkg in cfg["packages"]:
        assert (REPO / _package_dir(pkg, dirs)).is_dir(), pkg
