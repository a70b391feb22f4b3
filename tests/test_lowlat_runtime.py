"""The lowlat launcher against a fake CUDA runtime (no GPU; tests/data/reset_fake_cudart.c): a
tiny C library exporting the runtime calls lowlat_hgemm.cuh's host code makes, loaded before the
kernel library so its symbols win, records every launch (grid, block, dynamic shared memory, the
split kernel's k-tiles per split) and keeps a per-function shared-memory opt-in that a fake
cudaDeviceReset drops, as the real one does. Checked: one launch and no memset per call; the grid
(tiles along x, folded onto y past 2^31 - 1 tiles, the split on z) and the split plan against
lowlat.lowlat_splits on a given SM count; cudal2_workspace against lowlat_workspace_bytes; the
> 48 KiB opt-in made once per device, and made again, with the launch retried once and its error
consumed, after a device reset."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cudal2.templates import FAMILIES
from cudal2.templates.lowlat import lowlat_smem_bytes, lowlat_splits, lowlat_workspace_bytes

LL, LLM = FAMILIES["lowlat"], FAMILIES["lowlat_mma"]
INVALID_VALUE = 1
INT_MAX = 2**31 - 1


# Each step: ["call", M, N, K, option or None] | ["workspace", M, N, K, option or None] |
# ["set", sms, no_device, fail_with] | ["reset"]. Output per step: [rc, counts after it].
DRIVER = r"""
import ctypes, json, sys
fake = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)   # before the kernel's libcudart
lib = ctypes.CDLL(sys.argv[2])
lib.cudal2_workspace.restype = ctypes.c_size_t
lib.cudal2_workspace.argtypes = [ctypes.c_int] * 3 + [ctypes.c_void_p]
rc_layout = sys.argv[3] == "RC"
vp, P = ctypes.c_void_p, 1 << 20
out = []
for step in json.loads(sys.argv[4]):
    kind = step[0]
    if kind == "set":
        fake.fake_set(*step[1:])
        out.append(None)
        continue
    if kind == "reset":
        fake.fake_device_reset()
        out.append(None)
        continue
    M, N, K, opt = step[1:]
    arr = None if opt is None else (ctypes.c_int * 1)(opt)
    if kind == "workspace":
        out.append(int(lib.cudal2_workspace(M, N, K, arr)))
        continue
    rc = lib.cudal2_hgemm(vp(P), vp(P), vp(P), M, N, K, K, K if rc_layout else N, N, vp(P),
                          ctypes.c_size_t(1 << 62), vp(0), arr)
    c = (ctypes.c_int * 11)()
    fake.fake_counts(c)
    out.append([rc, list(c)])
print(json.dumps(out))
"""


def _lib(cfg):
    from cudal2.core.build import build
    r = build(FAMILIES[cfg.family].build_spec(cfg, "sm_90a"))
    assert r.ok, r.log[-3000:]
    return r.so_path


def _drive(fake, cfg, steps):
    """Runs the steps in a fresh process (the kernel caches the SM count per device)."""
    r = subprocess.run([sys.executable, "-c", DRIVER, str(fake), str(_lib(cfg)), cfg.get("LAYOUT"),
                        json.dumps(steps)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _tiles(cfg, M, N):
    return -(-M // cfg.get("BM")) * -(-N // cfg.get("BN"))


def _grid_2d(cfg, M, N):
    """(N tiles, M tiles): the grid up to 65535 M tiles, where a CTA's tile needs no division."""
    return [-(-N // cfg.get("BN")), -(-M // cfg.get("BM"))]


CFGS = [LL.default(), LL.default().with_(BM=128, BN=64, LAYOUT="RC"), LLM.default(),
        LLM.default().with_(BM=16, BN=64, LAYOUT="RC")]
# the deep-K shapes, a full grid, residues, explicit counts, a one-k-tile K
SHAPES = [(128, 64, 12288, 0), (128, 128, 2048, 0), (1024, 256, 16384, 0), (4096, 4096, 4096, 0),
          (77, 136, 264, 64), (77, 136, 1032, 0), (128, 64, 12288, 1), (128, 64, 12288, 4),
          (3, 1024, 4096, 0), (64, 64, 8, 0), (64, 64, 0, 0), (1, 8, 8192, None)]


@pytest.mark.compile
@pytest.mark.parametrize("cfg", CFGS, ids=lambda c: c.name())
def test_one_launch_on_the_planned_grid(cfg, reset_fake_cudart):
    """Per call one launch and no memset: grid (N tiles, M tiles, splits) with splits and the k-tiles per
    split as lowlat_splits plans them on 132 and on 66 SMs, block = the kernel's threads;
    cudal2_workspace answers lowlat_workspace_bytes of that plan; K == 0 launches the zero kernel."""
    BM, BN = cfg.get("BM"), cfg.get("BN")
    threads = 128 * BM // 64 if BM >= 64 else BN
    for sms in (132, 66):
        steps = [["set", sms, 0, 0]]
        for M, N, K, opt in SHAPES:
            steps += [["call", M, N, K, opt], ["workspace", M, N, K, opt]]
        got = _drive(reset_fake_cudart, cfg, steps)[1:]
        for i, (M, N, K, opt) in enumerate(SHAPES):
            (rc, c), ws = got[2 * i], got[2 * i + 1]
            assert rc == 0 and c[1] == i + 1 and c[2] == 0, (M, N, K, opt, rc, c)    # one launch each
            if K == 0:
                assert ws == 0 and c[8] == 256                                       # the zero kernel
                continue
            splits, per = lowlat_splits(M, N, K, BM, BN, 64, sms, opt or 0)
            assert c[5:8] == [*_grid_2d(cfg, M, N), splits], (M, N, K, opt, sms, c)
            assert c[8] == threads and c[9] == lowlat_smem_bytes(cfg.as_dict())
            assert c[10] == (per if splits > 1 else 0), (M, N, K, opt, c)
            assert ws == lowlat_workspace_bytes(M, N, splits, BM, BN), (M, N, K, opt, ws)
        if sms == 132 and cfg == LL.default():     # the shapes do split
            assert [got[2 * i][1][7] for i in range(3)] == [12, 4, 4]    # 1024x256: 32 tiles of 64x128


@pytest.mark.compile
def test_no_device_the_workspace_bounds_every_choice_and_the_call_says_why(reset_fake_cudart):
    """Without a device to ask for the SM count, cudal2_workspace at option 0 answers the bound
    over every split count (that of 64 splits), an explicit count needs no device, and a call at
    option 0 returns the runtime's error (past the guard, nothing launched)."""
    cfg = LL.default()
    steps = [["set", 132, 1, 0], ["workspace", 128, 64, 12288, 0], ["workspace", 128, 64, 12288, 4],
             ["call", 128, 64, 12288, 0], ["call", 128, 64, 12288, 1]]
    _, ws0, ws4, (rc0, c0), (rc1, c1) = _drive(reset_fake_cudart, cfg, steps)
    assert ws0 == lowlat_workspace_bytes(128, 64, 64, 64, 128)
    assert ws4 == lowlat_workspace_bytes(128, 64, 4, 64, 128)
    assert rc0 == 100 and c0[0] == 0                   # cudaErrorNoDevice, no launch attempted
    assert rc1 == 100 and c1[0] == 0                   # the opt-in asks for the device too


@pytest.mark.compile
def test_grid_serves_every_m_and_n_the_meta_claims(reset_fake_cudart):
    """The meta claims any M and N. Up to 65535 M tiles (grid.y's limit) the grid is (N tiles,
    M tiles); past that tiles run on grid.x, folded onto y past 2^31 - 1 tiles with x * y >=
    tiles > x * (y - 1), and x never equals the N tiles (how the kernel tells the two apart).
    Only a C of more than (2^31 - 1) * 65535 tiles (> 2^57 bytes: no address space holds it) is
    refused."""
    from cudal2.core.abi import meta_accepts
    for cfg in (LL.default(), LLM.default().with_(BM=16, BN=64)):
        shapes = [(1000, 1000, 8), (65535 * cfg.get("BM"), 8, 8), (65535 * cfg.get("BM") + 1, 8, 8),
                  (65535 * cfg.get("BM") + 1, 2048, 8), (INT_MAX, 8, 8), (1, INT_MAX - 7, 8),
                  (1 << 24, 1 << 24, 8), (INT_MAX, 1 << 20, 8), (INT_MAX, INT_MAX - 7, 8)]
        got = _drive(reset_fake_cudart, cfg, [["call", M, N, K, 1] for M, N, K in shapes])
        meta = {"any_shape": True, "tile": [cfg.get("BM"), cfg.get("BN"), 64], "divisible": [1, 8, 8]}
        for (M, N, K), (rc, c) in zip(shapes, got):
            assert meta_accepts(meta, M, N, K)
            tiles = _tiles(cfg, M, N)
            if tiles > INT_MAX * 65535:
                assert rc == INVALID_VALUE and M * N * 2 > 2**57, (M, N)
                continue
            x, y, z = (v & 0xFFFFFFFF for v in c[5:8])
            assert rc == 0 and z == 1 and 1 <= y <= 65535 and x <= INT_MAX, (M, N, c)
            tiles_n, tiles_m = _grid_2d(cfg, M, N)
            if tiles_m <= 65535:
                assert [x, y] == [tiles_n, tiles_m], (M, N, c)
                continue
            assert x != tiles_n and x * y >= tiles > x * (y - 1), (M, N, x, y, tiles)
            assert (y > 1) == (tiles > INT_MAX)


@pytest.mark.compile
def test_shared_memory_opt_in_is_made_again_after_a_device_reset(reset_fake_cudart):
    """The opt-in is made once per device and kernel; a device reset drops it: the next launch
    fails with cudaErrorInvalidValue, the launcher consumes that error, opts in again and retries
    once (the call succeeds, nothing pending); a launch that keeps failing is retried only once."""
    cfg = LL.default()
    assert lowlat_smem_bytes(cfg.as_dict()) > 48 * 1024
    steps = [["set", 132, 0, 0],
             ["call", 256, 256, 512, 1], ["call", 256, 256, 512, 1],     # plain kernel: one opt-in
             ["call", 128, 64, 12288, 0],                                # split kernel: its own
             ["reset"],
             ["call", 256, 256, 512, 1],                                 # gone: retried, made again
             ["call", 256, 256, 512, 1],
             ["call", 128, 64, 12288, 0],
             ["set", 132, 0, 2], ["call", 256, 256, 512, 1],             # every launch fails: 2
             ["set", 132, 0, 1], ["call", 256, 256, 512, 1]]             # every launch fails: 1
    got = [g for g in _drive(reset_fake_cudart, cfg, steps) if g is not None]
    # counts: attempts, launches, memsets, setattrs, pending
    assert [g[0] for g in got] == [0, 0, 0, 0, 0, 0, 2, 1]
    assert [g[1][:5] for g in got[:6]] == [[1, 1, 0, 1, 0], [2, 2, 0, 1, 0], [3, 3, 0, 2, 0],
                                           [5, 4, 0, 3, 0], [6, 5, 0, 3, 0], [8, 6, 0, 4, 0]]
    # a launch that fails with another error is not retried, its error left pending ...
    assert got[6][1][:5] == [9, 6, 0, 4, 2]
    # ... one that keeps failing with cudaErrorInvalidValue is retried once after one new opt-in
    assert got[7][1][:5] == [11, 6, 0, 5, 1]
    # a kernel within 48 KiB never opts in
    small = LLM.default().with_(BM=16, BN=64, STAGES=2)
    assert lowlat_smem_bytes(small.as_dict()) <= 48 * 1024
    got = _drive(reset_fake_cudart, small, [["call", 256, 256, 512, 1], ["call", 128, 64, 12288, 0]])
    assert got[0][1][:5] == [1, 1, 0, 0, 0] and got[1][1][:5] == [2, 2, 0, 0, 0]
