"""The campaign's CPU half (plan, build, pack, dry run) and the run half's plumbing without a GPU.

Compiles real mma candidates and the two cuBLAS baseline libraries with nvcc (marked compile);
the pack is built once per module and shared by the tests.
"""
import json
import shutil

import pytest

from cudal2 import campaign

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("campaign")
    shapes = root / "shapes.csv"
    shapes.write_text("M,N,K\n64,64,64\n256,128,512\n")
    out = root / "pack"
    lines = []
    mp = pytest.MonkeyPatch()
    mp.setenv("CUDAL2_CACHE", str(root / "cache"))
    try:
        manifest = campaign.prepare(shapes, "sm_90a", out, families=["mma"], limit_per_shape=1,
                                    jobs=2, log=lines.append)
    finally:
        mp.undo()
    return out, manifest, lines, root


def test_prepare_packs_and_dry_runs(pack):
    out, manifest, lines, _ = pack
    m = campaign.load_manifest(out)
    assert m["arch"] == "sm_90a" and m["shapes"] == [[64, 64, 64], [256, 128, 512]]
    assert 1 <= len(m["candidates"]) <= 2
    assert sorted(b["name"] for b in m["baselines"]) == ["cublas", "cublaslt"]
    for e in m["candidates"] + m["baselines"]:
        assert (out / e["dir"] / "kernel.so").is_file() and (out / e["dir"] / "kernel.cu").is_file()
    assert 0 < m["pack_bytes"] < campaign.MAX_PACK_BYTES
    assert any("dry run" in l and "0 problem(s)" in l for l in lines)
    assert (out / "shapes.csv").is_file()
    with pytest.raises(ValueError, match="not empty"):
        campaign.prepare(out / "shapes.csv", "sm_90a", out, families=["mma"])


def test_dry_run_catches_a_corrupt_pack(pack, tmp_path):
    out, _, _, _ = pack
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    m = json.loads((bad / "manifest.json").read_text())
    so = bad / m["candidates"][0]["dir"] / "kernel.so"
    so.write_bytes(b"\x7fELF not really")
    problems = campaign.dry_run(bad, log=lambda *a: None)
    assert any("does not match its sha256" in p for p in problems)
    # a library that hashes right but is not a shared object fails to load in the worker
    m["candidates"][0]["so_sha256"] = campaign._sha_file(so)
    (bad / "manifest.json").write_text(json.dumps(m))
    problems = campaign.dry_run(bad, log=lambda *a: None)
    assert any("loading" in p and "error" in p for p in problems)
    (bad / "manifest.json").write_text("{}")
    with pytest.raises(ValueError, match="schema"):
        campaign.load_manifest(bad)


def test_seed_cache_makes_pack_builds_cache_hits(pack, tmp_path, monkeypatch):
    from cudal2.build import BuildSpec, build
    out, m, _, _ = pack
    cache = tmp_path / "fresh-cache"
    n = campaign.seed_cache(out, cache, "sm_90a")
    assert n == len(m["candidates"]) + len(m["baselines"])
    c = m["candidates"][0]
    r = build(BuildSpec((out / c["dir"] / "kernel.cu").read_text(), arch="sm_90a"), cache=cache)
    assert r.ok and r.cached                    # no nvcc: the packed binary answers
    assert campaign.seed_cache(out, cache, "sm_90a") == 0
