"""What each timer reads for the same GEMM (GPU): the evidence that kernel time is GPU time.

torch.matmul on a few shapes, timed five ways:
    events      per-call CUDA events around each host call (the first H100 campaign's timer)
    graph10     a CUDA graph of 10 calls replayed between events, no spin (its old graph timer)
    kernel      spin + N back-to-back calls on cold operands (> 3x L2) between events: kernel time
    kernel_hot  the same on one operand set (L2-resident operands)
    wall        CUDA-L2's host clock: synchronise, one call, synchronise
Prints a table (µs per call) and writes JSON. Speed numbers are measurements of this machine,
not test assertions.

    python benchmarks/timer_check.py [--json out.json] [--shapes 64,64,64 1024,1024,1024 ...]
"""
from __future__ import annotations

import argparse
import json
import sys

SHAPES = ("64,64,64", "256,256,256", "1024,1024,1024", "128,8192,64", "4096,4096,4096",
          "8192,8192,8192")


def main(argv=None) -> int:
    import torch

    from cudal2.timing import kerneltime as KT
    from cudal2.harness.measure import OperandPool, _WallBackend
    from cudal2.harness.timing import TimingConfig, run_schedule

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES))
    ap.add_argument("--json", default=None)
    ap.add_argument("--diagnose", nargs="*", default=[],
                    help="shapes to time with the kernel timer at forced N (1, 3, 10, 30), with "
                         "and without an untimed call before the start event")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("timer_check: not measured: no GPU")
        return 0
    be = KT.CudaKernelBackend()
    rows = []
    for spec in args.shapes:
        M, N, K = (int(x) for x in spec.split(","))
        n = KT.n_operand_sets(OperandPool.bytes_per_set(M, N, K), be.l2_bytes)
        pool = OperandPool(M, N, K, n, "cuda")
        c = torch.empty(M, N, dtype=torch.float16, device="cuda")
        f = {"torch": lambda i, pool=pool, c=c: torch.matmul(pool.a(i), pool.b_rr(i), out=c)}
        out = {"shape": [M, N, K], "operand_sets": n}
        ev = run_schedule(f, TimingConfig(mode="offline", rounds_per_set=10, n_sets=3),
                          _LegacyEvents(be), n_buffers=min(3, n))
        out["events"] = ev.stats["torch"].median_us
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            f["torch"](0)
        torch.cuda.current_stream().wait_stream(s)
        with torch.cuda.graph(g):
            for i in range(10):
                f["torch"](i % n)
        times = []
        for _ in range(20):
            e0, e1 = be.record(), None
            g.replay()
            e1 = be.record()
            times.append(be.elapsed_us(e0, e1) / 10)
        out["graph10"] = sorted(times)[len(times) // 2]
        kt = KT.time_kernels(f, KT.KernelTimeConfig(), be, n_sets=n)
        out["kernel"] = kt.time("torch").median
        out["kernel_session"] = kt.session_dict()
        hot = KT.time_kernels(f, KT.KernelTimeConfig(operands="hot"), be, n_sets=1)
        out["kernel_hot"] = hot.time("torch").median
        w = run_schedule(f, TimingConfig(mode="wall", rounds_per_set=10, n_sets=3),
                         _WallBackend(be), n_buffers=min(3, n))
        out["wall"] = w.stats["torch"].median_us
        rows.append(out)
        del pool
        torch.cuda.empty_cache()
    gpu = torch.cuda.get_device_name()
    print(f"torch.matmul fp16 on {gpu}: median µs per call by timer")
    print(f"{'shape':>18} {'events':>9} {'graph10':>9} {'kernel':>9} {'kern_hot':>9} {'wall':>9}"
          f" {'N/sample':>8} {'sets':>5}")
    for r in rows:
        M, N, K = r["shape"]
        print(f"{f'{M}x{N}x{K}':>18} {r['events']:9.2f} {r['graph10']:9.2f} {r['kernel']:9.2f} "
              f"{r['kernel_hot']:9.2f} {r['wall']:9.2f} {r['kernel_session']['calls_per_sample']:8d} "
              f"{r['operand_sets']:5d}")
    diag = []
    for spec in args.diagnose:
        M, N, K = (int(x) for x in spec.split(","))
        for operands in ("cold", "hot"):
            n = KT.n_operand_sets(OperandPool.bytes_per_set(M, N, K), be.l2_bytes, operands)
            pool = OperandPool(M, N, K, max(n, 2), "cuda")
            c = torch.empty(M, N, dtype=torch.float16, device="cuda")
            f = {"torch": lambda i, pool=pool, c=c: torch.matmul(pool.a(i), pool.b_rr(i), out=c)}
            base = KT.calibrate(f, KT.KernelTimeConfig(), be, n_sets=n)
            for calls in (1, 3, 10, 30):
                for pre in (False, True):
                    cal = KT.Calibration(base.gpu_us, base.host_us, calls,
                                         {"torch": 1.5 * calls * base.host_us["torch"] + 50})
                    kt = KT.time_kernels(f, KT.KernelTimeConfig(precall=pre, min_rounds=10,
                                                                max_rounds=10), be, n_sets=n,
                                         calibration=cal)
                    t = kt.time("torch")
                    diag.append({"shape": [M, N, K], "operands": operands, "calls": calls,
                                 "precall": pre, "median_us": t.median, "lo_us": t.lo,
                                 "hi_us": t.hi, "per_round": kt.per_round["torch"],
                                 "session": kt.session_dict()})
                    print(f"diagnose {M}x{N}x{K} {operands:>4} N={calls:>2} precall={pre!s:>5}: "
                          f"{t.median:9.2f} us [{t.lo:.2f}, {t.hi:.2f}]")
            del pool
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"gpu": gpu, "torch": torch.__version__, "rows": rows, "diagnose": diag},
                      fh, indent=1)
    return 0


class _LegacyEvents:
    """timing.run_schedule's per-call events backend (the first campaign's timer), on CUDA."""

    def __init__(self, kb):
        self.kb = kb

    def now(self):
        return self.kb.now()

    def synchronize(self):
        self.kb.synchronize()

    def sleep(self, s):
        self.kb.sleep(s)

    def flush_l2(self):
        self.kb.flush_l2()

    def start(self):
        return self.kb.record()

    def stop(self, token):
        return (token, self.kb.record())

    def elapsed_us(self, handle):
        return self.kb.elapsed_us(*handle)

    def capture(self, fn, calls):
        raise NotImplementedError


if __name__ == "__main__":
    sys.exit(main())
