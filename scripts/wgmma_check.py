#!/usr/bin/env python3
"""One-call GPU check of the wgmma family (cudal2/templates/wgmma_hgemm.cuh) on a Hopper GPU.

    python scripts/wgmma_check.py --so DIR_OR_SO ...   # prebuilt kernel .so files (or folders of them)
    python scripts/wgmma_check.py --build               # build the family's default configs here (nvcc)
    python scripts/wgmma_check.py --build --lt-so FILE  # also time the cuBLASLt baseline built elsewhere
    python scripts/wgmma_check.py --export DIR          # CPU machine: build the defaults and the
                                                        # cuBLASLt baseline into DIR, then stop
    python scripts/wgmma_check.py --so DIR --lt-so DIR/cublaslt.so   # ... and run them on the GPU

1. correctness against a float32 torch reference on grid shapes, residues (M, N, K not multiples
   of the tile, odd cluster rows), padded leading dimensions, K = 0, and every runtime option
   (raster x swizzle x sm_count) on two mid-size shapes; no write outside C;
2. timing of 4096^3 and 8192^3 with CUDA events (warm-up, median of >= 20 reps, 2-3 rotating
   input sets) against torch.matmul and, when available, cuBLASLt autotuned (every algorithm
   the heuristic returns timed, the best kept), sweeping the runtime options;
3. a compact table of TFLOP/s, printed last.

Finishes in well under 3 minutes on an H100 for the five default configs. Exit status 1 when any
correctness check fails. `--json FILE` writes every measurement.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import math
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

CHECK_SHAPES = [  # (M, N, K, note)
    (128, 256, 64, "one tile"),
    (256, 512, 128, "grid"),
    (1024, 1024, 1024, "grid"),
    (4096, 4096, 4096, "grid"),
    (1000, 1000, 1000, "residue"),
    (600, 1000, 2048, "odd cluster row"),
    (77, 136, 264, "residue"),
    (1, 8, 8, "tiny"),
    (129, 264, 8, "K = 8"),
    (3000, 2056, 520, "residue"),
    (64, 8192, 64, "wide"),
    (8192, 64, 128, "tall"),
    (100, 1003, 72, "N % 8 != 0"),
    (64, 64, 0, "K = 0"),
    (0, 64, 64, "M = 0"),
]
OPTION_SHAPES = [(1536, 2304, 512), (1000, 1000, 1000)]
TIME_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192)]


def log(*a):
    print(*a, flush=True)


# ---- libraries -----------------------------------------------------------------------------
def find_libraries(args) -> list[Path]:
    out: list[Path] = []
    for item in args.so or []:
        p = Path(item)
        if p.is_dir():   # every kernel library in it (not the baseline --export puts beside them)
            out += sorted(q for q in p.glob("*.so") if not q.name.startswith("cublas"))
        elif p.is_file():
            out.append(p)
        else:
            log(f"warning: {p} does not exist")
    if args.build or not out:
        from cudal2.core.build import build
        from cudal2.templates import FAMILIES
        fam = FAMILIES["wgmma"]
        for cfg in fam.defaults():
            t = time.time()
            r = build(fam.build_spec(cfg, "sm_90a"))
            log(f"build {cfg.label()}: {r.status} regs={r.max_registers} spills={r.spills} "
                f"({time.time() - t:.1f} s)")
            if not r.ok:
                log(r.log[-3000:])
                continue
            out.append(Path(r.so_path))
    return out


def label(meta) -> str:
    p = meta.get("params", {})
    return (f"{p.get('BM')}x{p.get('BN')}x{p.get('BK')} s{p.get('STAGES')} c{p.get('CONSUMERS')} "
            f"cl{p.get('CLUSTER_M')} {p.get('EPILOGUE')} {meta['layout']}")


# ---- one call ------------------------------------------------------------------------------
class Case:
    """Operands of one shape for one layout, with guard padding, plus the float32 reference."""

    def __init__(self, torch, M, N, K, rc, *, lda=None, ldb=None, ldc=None, seed=0):
        dev = torch.device("cuda")
        self.M, self.N, self.K, self.rc = M, N, K, rc
        self.lda = lda or max(K, 1)
        self.ldb = ldb or max(K if rc else N, 1)
        self.ldc = ldc or max(N, 1)
        g = torch.Generator(device=dev).manual_seed(seed + M * 7919 + N * 131 + K)
        b_rows = N if rc else K
        self.a_store = ((torch.rand(max(M, 1) * self.lda + 64, device=dev, generator=g) * 2 - 1)).half()
        self.b_store = ((torch.rand(max(b_rows, 1) * self.ldb + 64, device=dev, generator=g) * 2 - 1)).half()
        self.A = self.a_store[:M * self.lda].view(M, self.lda)[:, :K]
        Bm = self.b_store[:b_rows * self.ldb].view(b_rows, self.ldb)[:, :(K if rc else N)]
        self.B = Bm.t() if rc else Bm                      # logical K x N
        self.sentinel = -7.0
        self.c_store = torch.full((max(M, 1) * self.ldc + 64,), self.sentinel, device=dev,
                                  dtype=torch.float16)
        self.C = self.c_store[:M * self.ldc].view(M, self.ldc)

    def launch(self, lib, opts, stream):
        return lib.launch(self.a_store.data_ptr(), self.b_store.data_ptr(), self.c_store.data_ptr(),
                          self.M, self.N, self.K, self.lda, self.ldb, self.ldc, 0, 0, stream, options=opts)

    def check(self, torch) -> str | None:
        """None when C is right and nothing outside it was written, else why not."""
        M, N, K = self.M, self.N, self.K
        if M == 0 or N == 0:
            return None if bool((self.c_store == self.sentinel).all()) else "wrote C for an empty output"
        if K:
            ref = self.A.float() @ self.B.float()
        else:
            ref = torch.zeros(M, N, device="cuda")
        got = self.C[:, :N].float()
        tol = ref.abs() * 2.0 ** -10 + 2.0 ** -14 * (1 + math.sqrt(K)) + 1e-3
        err = (got - ref).abs()
        bad = err > tol
        if bool(bad.any()) or not bool(torch.isfinite(got).all()):
            idx = torch.nonzero(bad)[:3].tolist()
            return (f"{int(bad.sum())} of {M * N} elements off (max err {float(err.max()):.4g}; "
                    f"first at {idx})")
        if self.ldc > N and not bool((self.C[:, N:] == self.sentinel).all()):
            return "wrote into the padding of C"
        if not bool((self.c_store[M * self.ldc:] == self.sentinel).all()):
            return "wrote past the end of C"
        return None


def correctness(torch, lib, meta) -> list[str]:
    from cudal2.core.abi import meta_accepts
    rc = meta["layout"] == "RC"
    stream = torch.cuda.current_stream().cuda_stream
    fails = []
    default = lib.options({})
    cases = [(M, N, K, {}, note) for M, N, K, note in CHECK_SHAPES]
    cases += [(200, 136, 72, dict(lda=80, ldb=(80 if rc else 144), ldc=144), "padded ld")]
    for M, N, K, lds, note in cases:
        if not meta_accepts(meta, M, N, K):
            P = 1 << 20
            err = lib.launch(P, P, P, M, N, K, max(K, 1), max(N, K, 1), max(N, 1), 0, 0, stream,
                             options=default)
            status = "refused" if err == 1 else f"NOT REFUSED (returned {err})"
            if err != 1:
                fails.append(f"{M}x{N}x{K} ({note}): outside divisible {meta.get('divisible')} but {status}")
            log(f"    {M}x{N}x{K:<6} {note:<16} {status}")
            continue
        case = Case(torch, M, N, K, rc, **lds)
        err = case.launch(lib, default, stream)
        torch.cuda.synchronize()
        why = f"returned {err}" if err else case.check(torch)
        log(f"    {M}x{N}x{K:<6} {note:<16} {'ok' if why is None else 'FAIL: ' + why}")
        if why:
            fails.append(f"{M}x{N}x{K} ({note}): {why}")
        del case
    # every runtime option on two shapes
    names = [o["name"] for o in meta["options"]]
    values = {o["name"]: o["values"] for o in meta["options"]}
    for M, N, K in OPTION_SHAPES:
        case = Case(torch, M, N, K, rc, seed=1)
        bad = []
        n = 0
        for raster in values["raster"]:
            for swz in (values["swizzle"] if raster in (1, 2) else [values["swizzle"][0]]):
                for sm in values["sm_count"]:
                    opts = lib.options({"raster": raster, "swizzle": swz, "sm_count": sm})
                    case.c_store.fill_(case.sentinel)
                    err = case.launch(lib, opts, stream)
                    torch.cuda.synchronize()
                    why = f"returned {err}" if err else case.check(torch)
                    n += 1
                    if why:
                        bad.append(f"raster={raster} swizzle={swz} sm_count={sm}: {why}")
        log(f"    {M}x{N}x{K} options ({', '.join(names)}): {n - len(bad)}/{n} ok")
        for b in bad[:6]:
            log(f"      FAIL {b}")
        fails += [f"{M}x{N}x{K} {b}" for b in bad]
        del case
    # invalid option values are refused
    arr = (ctypes.c_int * 3)(7, 8, 0)
    P = 1 << 20
    err = lib.launch(P, P, P, 128, 128, 128, 128, 128, 128, 0, 0, stream, options=arr)
    if err != 1:
        fails.append(f"raster=7 not refused (returned {err})")
    return fails


# ---- timing --------------------------------------------------------------------------------
def time_calls(torch, fn, n_sets, reps, warmup):
    """Median and min microseconds of fn(i) over `reps` calls cycling through the input sets."""
    for i in range(warmup):
        fn(i % n_sets)
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for i in range(reps):
        starts[i].record()
        fn(i % n_sets)
        ends[i].record()
    torch.cuda.synchronize()
    us = [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]
    return statistics.median(us), min(us)


def time_interleaved(torch, fns: dict, n_sets, rounds, per_round, warmup=3):
    """{name: (median us, min us)}: every candidate runs `per_round` calls per round, rounds in
    turn (order reversed every other round), so clock and temperature drift hit all alike."""
    names = list(fns)
    for name in names:
        for i in range(warmup):
            fns[name](i % n_sets)
    samples = {n: [] for n in names}
    k = 0
    for r in range(rounds):
        order = names if r % 2 == 0 else names[::-1]
        events = []
        for name in order:
            for _ in range(per_round):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fns[name](k % n_sets)
                e.record()
                k += 1
                events.append((name, s, e))
        torch.cuda.synchronize()
        for name, s, e in events:
            samples[name].append(s.elapsed_time(e) * 1000.0)
    return {n: (statistics.median(v), min(v)) for n, v in samples.items()}


def gpu_state() -> str:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        sm = pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        pw = pynvml.nvmlDeviceGetPowerUsage(h) / 1000
        t = pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
        return f"SM {sm} MHz, {pw:.0f} W, {t} C"
    except Exception as exc:  # no NVML: say so
        return f"(no NVML: {exc.__class__.__name__})"


def option_sweep(meta, quick):
    values = {o["name"]: o["values"] for o in meta["options"]}
    combos = [{"raster": 0, "swizzle": 8, "sm_count": 0}]
    for sm in ([0, 128] if not quick else [0]):
        combos.append({"raster": 3, "swizzle": 8, "sm_count": sm})
        for raster in (1, 2):
            for swz in ((8, 16) if not quick else (8,)):
                if swz in values["swizzle"]:
                    combos.append({"raster": raster, "swizzle": swz, "sm_count": sm})
    out = []
    for c in combos:
        if c not in out:
            out.append(c)
    return out


def opt_label(c) -> str:
    return f"r{c['raster']} s{c['swizzle']} sm{c['sm_count']}"


class LtBaseline:
    """cuBLASLt autotuned: every algorithm its heuristic returns for the shape timed, best kept
    (the harness's baseline library, cudal2/harness/baselines/cublaslt_gemm.cu)."""

    def __init__(self, torch, so_path):
        from cudal2.harness.baselines import CublasLtLib, WORKSPACE_BYTES
        self.torch = torch
        self.lib = CublasLtLib(str(so_path))
        self.h = self.lib.create()
        self.ws_bytes = WORKSPACE_BYTES
        self.ws = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device="cuda")

    def best(self, M, N, K, rc, sets, reps, warmup):
        algos = self.lib.prepare(self.h, M, N, K, K, K if rc else N, N, rc, False, self.ws_bytes)
        stream = self.torch.cuda.current_stream().cuda_stream
        best = None
        for idx in range(algos):
            def fn(i, idx=idx):
                a, b, c = sets[i]
                return self.lib.run(self.h, idx, a.data_ptr(), b.data_ptr(), c.data_ptr(),
                                    self.ws.data_ptr(), self.ws_bytes, stream)
            if fn(0) != 0:
                continue
            med, _ = time_calls(self.torch, fn, len(sets), max(6, reps // 3), 2)
            if best is None or med < best[0]:
                best = (med, idx)
        if best is None:
            return None
        idx = best[1]
        fn = (lambda i: self.lib.run(self.h, idx, sets[i][0].data_ptr(), sets[i][1].data_ptr(),
                                     sets[i][2].data_ptr(), self.ws.data_ptr(), self.ws_bytes, stream))
        return fn, idx, algos


def find_lt(args):
    if args.lt_so:
        return args.lt_so
    if args.no_lt:
        return None
    try:
        from cudal2.harness.baselines import build_baselines
        return build_baselines("sm_90a")["cublaslt"]
    except Exception as exc:  # no nvcc / headers here: torch only
        log(f"cuBLASLt baseline unavailable ({str(exc).splitlines()[0][:120]})")
        return None


def export(folder: Path) -> int:
    """Build here (nvcc, no GPU) what a GPU run of this script needs and copy it to `folder`."""
    import shutil
    from cudal2.core.build import build
    from cudal2.templates import FAMILIES
    folder.mkdir(parents=True, exist_ok=True)
    fam = FAMILIES["wgmma"]
    for i, cfg in enumerate(fam.defaults()):
        r = build(fam.build_spec(cfg, "sm_90a"))
        if not r.ok:
            log(f"build {cfg.label()}: {r.status}\n{r.log[-3000:]}")
            return 1
        shutil.copy(r.so_path, folder / f"wgmma_{i}.so")
        log(f"{folder / f'wgmma_{i}.so'}  {cfg.label()}  regs={r.max_registers} spills={r.spills}")
    try:
        from cudal2.harness.baselines import build_baselines
        shutil.copy(build_baselines("sm_90a")["cublaslt"], folder / "cublaslt.so")
        log(f"{folder / 'cublaslt.so'}  cuBLASLt baseline")
    except Exception as exc:
        log(f"cuBLASLt baseline not built ({str(exc).splitlines()[0][:160]})")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--so", nargs="*", help="prebuilt kernel .so files or folders of them")
    ap.add_argument("--build", action="store_true", help="build the wgmma default configs here")
    ap.add_argument("--lt-so", help="prebuilt cuBLASLt baseline .so (else built here if nvcc works)")
    ap.add_argument("--no-lt", action="store_true", help="skip the cuBLASLt baseline")
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--quick", action="store_true", help="fewer option combinations in the timing sweep")
    ap.add_argument("--reps", type=int, default=30, help="calls per candidate in the option sweep")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of the final interleaved comparison")
    ap.add_argument("--json", type=Path, help="write every result here")
    ap.add_argument("--export", type=Path, metavar="DIR",
                    help="build the default configs and the cuBLASLt baseline (no GPU needed), copy "
                         "the .so files into DIR (wgmma_<i>.so, cublaslt.so) and exit")
    args = ap.parse_args(argv)
    if args.export:
        return export(args.export)

    import torch
    from cudal2.core.abi import load_library, meta_accepts
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False
    t0 = time.time()
    log(f"device: {torch.cuda.get_device_name()} ({torch.cuda.get_device_properties(0).multi_processor_count} SMs), "
        f"torch {torch.__version__}")
    libs = []
    for so in find_libraries(args):
        try:
            lib = load_library(so)
            meta = lib.meta
        except Exception as exc:
            log(f"cannot load {so}: {exc}")
            continue
        libs.append((so, lib, meta))
        log(f"loaded {label(meta)}  smem={meta.get('smem_bytes')}  {so}")
    if not libs:
        log("no kernels")
        return 2
    results = {"device": torch.cuda.get_device_name(), "kernels": {}, "timing": []}
    failed = False

    if not args.no_check:
        for so, lib, meta in libs:
            log(f"correctness: {label(meta)}")
            t = time.time()
            try:
                fails = correctness(torch, lib, meta)
            except Exception as exc:   # a crash (e.g. illegal instruction) poisons the context
                fails = [f"exception: {exc!r}"]
                log(f"    EXCEPTION {exc!r}")
                results["kernels"][label(meta)] = {"so": str(so), "fails": fails}
                failed = True
                break
            results["kernels"][label(meta)] = {"so": str(so), "fails": fails}
            failed |= bool(fails)
            log(f"    -> {'OK' if not fails else str(len(fails)) + ' FAILURES'} ({time.time() - t:.1f} s)")

    rows = []
    if not args.no_timing:
        lt_so = find_lt(args)
        lt = None
        if lt_so:
            try:
                lt = LtBaseline(torch, lt_so)
            except Exception as exc:
                log(f"cuBLASLt baseline unavailable ({exc})")
        stream = torch.cuda.current_stream().cuda_stream
        for M, N, K in TIME_SHAPES:
            flop = 2.0 * M * N * K
            n_sets = 2 if M * K >= 8192 * 8192 else 3
            reps = args.reps
            warmup = 5
            for rc in (False, True):
                layout = "RC" if rc else "RR"
                mine = [(so, lib, meta) for so, lib, meta in libs
                        if meta["layout"] == layout and meta_accepts(meta, M, N, K)]
                if not mine:
                    continue
                sets = []
                for s in range(n_sets):
                    a = torch.randn(M, K, device="cuda").half()
                    b = (torch.randn(N, K, device="cuda").half() if rc else torch.randn(K, N, device="cuda").half())
                    c = torch.empty(M, N, device="cuda", dtype=torch.float16)
                    sets.append((a, b, c))
                bt = [(a, b.t() if rc else b, c) for a, b, c in sets]
                shape = f"{M}x{N}x{K}"
                finals = {"torch.matmul": lambda i: torch.matmul(bt[i][0], bt[i][1], out=bt[i][2])}
                notes = {"torch.matmul": ""}
                if lt is not None:
                    try:
                        r = lt.best(M, N, K, rc, sets, reps, warmup)
                        if r:
                            finals["cublaslt_autotuned"] = r[0]
                            notes["cublaslt_autotuned"] = f"algo {r[1]}/{r[2]}"
                    except Exception as exc:
                        log(f"cuBLASLt {shape} {layout}: {exc}")
                ref = bt[0][0].float() @ bt[0][1].float() if M <= 4096 else None
                for so, lib, meta in mine:
                    fns = {}
                    for combo in option_sweep(meta, args.quick):
                        opts = lib.options(combo)

                        def fn(i, opts=opts, lib=lib):
                            a, b, c = sets[i]
                            return lib.launch(a.data_ptr(), b.data_ptr(), c.data_ptr(), M, N, K, K,
                                              K if rc else N, N, 0, 0, stream, options=opts)
                        if fn(0) != 0:
                            log(f"{label(meta)} {combo}: launch failed")
                            continue
                        if ref is not None:
                            torch.cuda.synchronize()
                            e = float((sets[0][2].float() - ref).abs().max())
                            if not e < 0.05 * math.sqrt(K / 64):
                                log(f"{label(meta)} {combo}: WRONG RESULT (max err {e:.3g})")
                                failed = True
                                continue
                        fns[opt_label(combo)] = (fn, combo)
                    if not fns:
                        continue
                    # the option sweep, interleaved among this kernel's combos and torch
                    cand = {k: v[0] for k, v in fns.items()}
                    cand["torch"] = finals["torch.matmul"]
                    res = time_interleaved(torch, cand, n_sets, rounds=3, per_round=max(3, reps // 6))
                    t_med = res.pop("torch")[0]
                    for k, (med_k, mn_k) in sorted(res.items(), key=lambda kv: kv[1][0]):
                        combo = fns[k][1]
                        results["timing"].append({"shape": [M, N, K], "kernel": label(meta), "options": combo,
                                                  "median_us": med_k, "min_us": mn_k, "torch_us": t_med,
                                                  "tflops": flop / med_k / 1e6})
                        log(f"  {shape} {label(meta):<34} {k:<14}: {med_k:8.1f} us {flop / med_k / 1e6:6.1f} "
                            f"TFLOP/s ({t_med / med_k:.3f}x torch)")
                    best = min(res, key=lambda k: res[k][0])
                    finals[label(meta)] = fns[best][0]
                    notes[label(meta)] = best
                # the final word: the best of each kernel, torch and cuBLASLt, interleaved
                log(f"  final {shape} {layout}: {gpu_state()}")
                res = time_interleaved(torch, finals, n_sets, rounds=args.rounds, per_round=max(3, reps // 6))
                log(f"  after: {gpu_state()}")
                t_med = res["torch.matmul"][0]
                lt_med = res.get("cublaslt_autotuned", (None,))[0]
                for name, (med_k, mn_k) in res.items():
                    rel_lt = f"{lt_med / med_k:9.3f}" if lt_med else f"{'-':>9}"
                    rows.append((shape, layout, name, notes[name], med_k, flop / med_k / 1e6,
                                 t_med / med_k, rel_lt))
                    results["timing"].append({"shape": [M, N, K], "final": True, "kernel": name,
                                              "options": notes[name], "median_us": med_k, "min_us": mn_k,
                                              "tflops": flop / med_k / 1e6, "torch_us": t_med,
                                              "cublaslt_us": lt_med})
                del sets, bt, ref
                torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    log("")
    if not args.no_check:
        log("correctness: " + ("ALL OK" if not failed else "FAILURES"))
        for name, r in results["kernels"].items():
            log(f"  {name:<36} {'ok' if not r['fails'] else str(len(r['fails'])) + ' failures: ' + r['fails'][0][:100]}")
    if rows:
        log(f"\n{'shape':<16}{'B':<4}{'kernel':<36}{'options':<16}{'us':>9}{'TFLOP/s':>9}{'x torch':>9}{'x Lt':>9}")
        for shape, layout, name, opt, us, tf, rel, rel_lt in rows:
            log(f"{shape:<16}{layout:<4}{name:<36}{opt:<16}{us:9.1f}{tf:9.1f}{rel:9.3f}{rel_lt}")
    log(f"({time.time() - t0:.0f} s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
