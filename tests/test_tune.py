"""tune: shape files, the deduplicated plan, the search strategies, and the build farm CLI.

The search tests drive `search()` with a stand-in evaluate() that returns SYNTHETIC timings
(a known function of the config), to test the strategy logic without a GPU; the build-farm test
compiles real mma/ptx candidates with nvcc (marked compile).
"""
import math
import re
from pathlib import Path

import pytest

from cudal2 import templates
from cudal2.search import tune
from cudal2.harness.types import Evaluation, Shape
from cudal2.templates.budget import DEEPK, is_decode, is_deep_k, ruled

SMALL = [Shape(64, 64, 64), Shape(256, 256, 256), Shape(1024, 512, 256)]


def test_read_shapes(tmp_path):
    p = tmp_path / "s.csv"
    p.write_text("M,N,K,weight\n64,64,64,0.5\n64,64,64,0.5\n128,64,32,1\n")
    assert tune.read_shapes(p) == [Shape(64, 64, 64), Shape(128, 64, 32)]
    p.write_text("M,N\n1,2\n")
    with pytest.raises(ValueError, match="missing"):
        tune.read_shapes(p)
    p.write_text("M,N,K\n1,2,zero\n")
    with pytest.raises(ValueError, match=r"s.csv:2"):
        tune.read_shapes(p)
    with pytest.raises(ValueError, match="cannot read"):
        tune.read_shapes(tmp_path / "nope.csv")
    assert len(tune.read_shapes("shapes/stratified_100.csv")) == 100
    assert len(tune.read_shapes("shapes/llm_trace.csv")) == 48


def test_families_for_rejects_unknown_and_wrong_arch():
    with pytest.raises(ValueError, match="unknown family"):
        tune.families_for("sm_90a", ["nope"])
    names = {f.name for f in tune.families_for("sm_90a")}
    assert {"mma", "ptx"} <= names
    if "cutlass_sm90" in names:
        with pytest.raises(ValueError, match="does not target"):
            tune.families_for("sm_80", ["cutlass_sm90"])


def test_plan_dedups_across_shapes():
    p = tune.plan(SMALL, "sm_90a", families=["mma", "ptx"])
    # one candidate per distinct source; every config here takes M, N, K at run time, so a
    # candidate serves several shapes and the builds needed are far fewer than the pairs
    assert len({c.source for c in p.candidates}) == len(p.candidates)
    assert p.pairs == sum(len(v) for v in p.per_shape.values())
    assert len(p.candidates) < p.pairs
    assert max(len(c.shapes) for c in p.candidates) == len(SMALL)
    # with a per-shape limit each shape keeps its N best by the prior
    q = tune.plan(SMALL, "sm_90a", families=["mma", "ptx"], limit_per_shape=2)
    assert all(len(v) == 2 for v in q.per_shape.values())
    assert len(q.candidates) <= 2 * len(SMALL)


def _fake_evaluate(calls):
    """SYNTHETIC: time = a smooth function of the config with one best point; status ok."""
    def evaluate(req, db=None, pool=None):
        calls.append(req)
        import hashlib
        sha = hashlib.sha256(req.source.encode()).hexdigest()
        # read the config back from the instantiated source's #define lines (test only)
        d = dict(re.findall(r"#define (\w+) (\d+)", req.source))
        t = 10.0 + abs(math.log2(int(d.get("BM", 128)) / 64)) + abs(math.log2(int(d.get("BN", 128)) / 128)) \
            + 0.5 * abs(int(d.get("STAGES", 3)) - 4)
        return Evaluation(status="ok", source_sha=sha, shape=req.shape, arch=req.arch, acc="f32",
                          layout="RR", timings={"offline": {"candidate": {"median_us": t}}},
                          origin=req.origin)
    return evaluate


@pytest.mark.parametrize("strategy", ["evolutionary", "model", "exhaustive"])
def test_search_respects_budget_and_never_repeats(strategy):
    calls = []
    res = tune.search(Shape(1024, 1024, 1024), "sm_90a", families=["mma"], budget_evals=12,
                      strategy=strategy, evaluate=_fake_evaluate(calls), log=lambda *a: None)
    assert len(calls) == len(res.trials) == 12
    assert len({c.source for c in calls}) == 12          # no config evaluated twice
    assert all(c.origin == "tune" for c in calls)
    assert res.best is not None and not res.best.estimated
    assert res.best.time_us == min(t.time_us for t in res.trials)


def test_search_auto_is_exhaustive_for_small_spaces():
    calls = []
    ptx = tune.families_for("sm_90a", ["ptx"])[0]
    # the sm_90a space: configs valid there (some fit sm_90a's shared memory only)
    space = [c for c in tune.enumerate_space(ptx, arch="sm_90a")
             if ptx.serves(c, 256, 256, 256, checked=True)]
    res = tune.search(Shape(256, 256, 256), "sm_90a", families=["ptx"], budget_evals=len(space) + 5,
                      evaluate=_fake_evaluate(calls), log=lambda *a: None)
    assert res.strategy == "exhaustive" and len(res.trials) == len(space)


def test_search_without_gpu_uses_estimates():
    def not_measured(req, db=None, pool=None):
        return Evaluation(status="not_measured", source_sha="0" * 64, shape=req.shape, arch=req.arch,
                          build={"registers": 128, "shared_bytes": 0, "spills": 0})
    res = tune.search(Shape(512, 512, 512), "sm_90a", families=["mma"], budget_evals=4,
                      evaluate=not_measured, log=lambda *a: None)
    assert len(res.trials) == 4 and all(t.estimated for t in res.trials) and res.best.estimated


@pytest.mark.compile
def test_build_only_cli_dedups_and_second_run_is_cached(tmp_path, tmp_cache, capsys):
    from cudal2.cli import main
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n64,64,64\n128,128,128\n4096,64,64\n")
    argv = ["tune", "--build-only", "--shapes", str(shapes), "--arch", "sm_90a",
            "--families", "mma", "ptx", "--limit-per-shape", "1", "--jobs", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    m = re.search(r"(\d+) unique candidates for 3 shapes \((\d+) shape x candidate pairs\).*?"
                  r"(\d+) compiled, (\d+) cached, (\d+) failed", out)
    assert m, out
    unique, pairs, compiled, cached, failed = map(int, m.groups())
    assert pairs == 3 and 1 <= unique <= 3 and failed == 0 and compiled == unique and cached == 0
    assert "peak compiler memory" in out
    assert main(argv) == 0                       # the cache makes the second run free
    out = capsys.readouterr().out
    m2 = re.search(r"(\d+) compiled, (\d+) cached", out)
    assert m2 and int(m2.group(1)) == 0 and int(m2.group(2)) == unique


@pytest.mark.compile
def test_tune_cli_without_gpu_builds_audits_and_estimates(tmp_path, tmp_cache, capsys):
    """The real pipeline on a CPU machine: evaluate() builds and audits each candidate, stores a
    not_measured row, and the search ranks by the cost model, saying so."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("covers the no-GPU path")
    from cudal2.cli import main
    from cudal2.harness.db import ResultsDB
    shapes = tmp_path / "shapes.csv"
    shapes.write_text("M,N,K\n256,256,256\n")
    db = tmp_path / "results.db"
    assert main(["tune", "--shapes", str(shapes), "--arch", "sm_90a", "--families", "mma",
                 "--budget-evals", "2", "--strategy", "model", "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert "ESTIMATED, no GPU" in out
    rows = ResultsDB(db).rows()
    assert len(rows) == 2 and {r.status for r in rows} == {"not_measured"}
    assert all(r.origin == "tune" and not r.estimated for r in rows)


def test_plan_spreads_a_shapes_slots_over_configs_the_model_can_tell_apart():
    """At most two near-tied configs per shape before the next group: on the H100 plan the four
    slots of a large shape were four cluster shapes of one tile (the model prices them alike)."""
    shape = Shape(12288, 16384, 16384)
    p = tune.plan([shape], "sm_90a", families=["cutlass_sm90"], limit_per_shape=4)
    cfgs = [c.config.as_dict() for c in p.per_shape[shape]]
    assert len(cfgs) == 4
    assert len({(c["BM"], c["BN"], c["SCHEDULE"]) for c in cfgs}) >= 2, cfgs
    # the raster term: a large GEMM wants a swizzled raster, now a runtime option of the build
    first = p.per_shape[shape][0]
    assert first.options[shape][0]["swizzle"] == 8


def test_plan_carries_runtime_options_per_shape():
    """A build is planned once per (accumulator, layout) target; per shape it serves, the plan
    carries the runtime options (kernel ABI 2) worth timing: every combination CUTLASS runs
    differently on that shape when there are few, else the cost model's best max_options."""
    from cudal2.templates import FAMILIES
    cut = FAMILIES["cutlass_sm90"]
    shapes = [Shape(12288, 16384, 16384), Shape(512, 512, 16384), Shape(64, 64, 64)]
    p = tune.plan(shapes, "sm_90a", families=["cutlass_sm90", "mma"], limit_per_shape=3, max_options=5)
    assert (p.acc, p.layout) == ("f32", "RR")
    assert p.evaluations == sum(len(p.sweeps(s)) for s in shapes)
    assert p.evaluations == sum(len(c.options[s]) for s in shapes for c in p.per_shape[s])
    for s in shapes:
        for c in p.per_shape[s]:
            fam = FAMILIES[c.family]
            opts = c.options[s]
            assert 1 <= len(opts) <= 5
            assert all(fam.option_problems(c.config, o) == [] for o in opts)
            if c.family == "mma":
                assert opts == [{}]                  # ABI 1: one way to call it
            else:
                assert set(opts[0]) == set(fam.options(c.config))
        for c, o in p.sweeps(s):
            assert o in c.options[s]
    # small MN, long K: a stream-K build's best way to run it splits K
    small = Shape(512, 512, 16384)
    sk = [c for c in p.per_shape[small] if c.config.get("SCHEDULER") == "streamk"]
    assert sk and (sk[0].options[small][0]["splits"] > 1 or sk[0].options[small][0]["decomposition"] == 3)
    # without a cap: every combination that runs differently on the shape, once
    one_tile = Shape(64, 64, 4096)
    q = tune.plan([one_tile], "sm_90a", families=["cutlass_sm90"], max_options=None)
    cfg = cut.default().with_(BN=128, CLUSTER_M=1, SCHEDULER="streamk")
    cand = next(c for c in q.candidates if c.config == cfg)
    full = cand.options[one_tile]
    # one output tile: swizzle and raster collapse, the K decompositions stay
    assert len(full) == len({(o["splits"], o["decomposition"]) for o in full}) > 1
    assert len(full) < len(cut.option_space(cfg))
    assert [o for o in q.per_shape[one_tile][0].options[one_tile]]         # every build has options
    assert len(q.candidates) == len(tune.enumerate_space(cut))


def test_plan_times_the_highest_ceiling_instruction_on_every_shape():
    """Skinny deep-K shapes: the prior ranks mma.sync split-K first (the first H100 campaign of
    ABI 2 packed them with mma/ptx alone: measured 0.2-0.57x cuBLAS; today lowlat_mma's
    in-kernel split-K leads); a wgmma build must still get a slot. The reverse is not forced:
    large shapes stay wgmma-only."""
    skinny, large = Shape(128, 64, 12288), Shape(8192, 8192, 8192)
    p = tune.plan([skinny, large], "sm_90a", limit_per_shape=4)
    fams = {s: [c.family for c in p.per_shape[s]] for s in (skinny, large)}
    # the limit's picks first; on a deep-K row the streamk sweep joins after them
    instr = [templates.FAMILIES[f].instruction for f in fams[skinny][:4]]
    assert instr[0] == "mma.sync" and "wgmma" in instr, fams
    assert len(fams[skinny]) > 4 and set(fams[skinny][4:]) == {"streamk"}, fams
    instr = {templates.FAMILIES[f].instruction for f in fams[large]}
    assert instr == {"wgmma"}, fams
    # the hedge needs two slots: one slot stays the prior's best
    one = tune.plan([skinny], "sm_90a", limit_per_shape=1)
    assert [c.family for c in one.per_shape[skinny]][0] == fams[skinny][0]
    # an arch without wgmma families is unaffected
    a100 = tune.plan([skinny], "sm_80", limit_per_shape=4)
    assert {templates.FAMILIES[c.family].instruction for c in a100.per_shape[skinny]} == {"mma.sync"}


class _CheapModel:
    """SYNTHETIC: a deterministic stand-in for the cost model (a checksum of the config plus a
    size term), fast enough to plan the stratified 100 over every family in a test. The rule
    under test (per-family quotas, a least count, defaults packed) does not depend on the
    model's values; the real prior takes minutes for this plan."""

    def __init__(self):
        self._sums = {}    # id(meta) -> checksum: plan keeps one meta dict per config

    def predict_us(self, meta, resources, shape, options=None):
        import zlib
        key = id(meta)
        if key not in self._sums:
            self._sums[key] = (meta, zlib.crc32(repr(sorted(meta.items())).encode()) % 1000 / 100.0)
        return 3.0 + self._sums[key][1] + shape.M * shape.N * shape.K * 1e-9

    def rank_options(self, meta, resources, shape, candidates, facts=None):
        first = next(iter(candidates))
        return [(self.predict_us(meta, resources, shape), dict(first))]


@pytest.mark.parametrize("layout", ["RR", "RC"])
def test_campaign_plan_packs_every_family_that_serves_each_shape(layout):
    """The campaign's rule (prepare: per_family=2, limit_per_shape=8), planned without building
    over shapes/stratified_100.csv: every family that serves a shape has builds for it, each
    family's first default among them where it serves the shape (the wgmma 128x256 default
    included), and at least 8 builds per shape where the families' spaces have 8."""
    import inspect
    from cudal2.runs import campaign
    from cudal2.templates import FAMILIES
    defaults = inspect.signature(campaign.prepare).parameters
    quota, least = defaults["per_family"].default, defaults["limit_per_shape"].default
    assert (quota, least) == (2, 8)
    shapes = tune.read_shapes(Path(__file__).resolve().parents[1] / "shapes" / "stratified_100.csv")
    assert len(shapes) == 100
    arch = "sm_90a"
    p = tune.plan(shapes, arch, limit_per_shape=least, per_family=quota, model=_CheapModel(),
                  layout=layout, max_options=1)
    spaces = {f.name: tune.enumerate_space(f, arch=arch, layout=layout)   # valid for the arch
              for f in tune.families_for(arch)}
    assert {"lowlat", "lowlat_mma", "wgmma", "cutlass_sm90", "mma"} <= set(spaces)
    for s in shapes:
        serving = {n: [c for c in cfgs if FAMILIES[n].serves(c, s.M, s.N, s.K, checked=True)]
                   for n, cfgs in spaces.items()}
        serving = {n: cfgs for n, cfgs in serving.items() if cfgs}
        # a decode row (cudal2.templates.budget): mma / ptx are not planned, and a streaming
        # family only with configs whose budget holds (test_budget.py holds that rule)
        decode = {n for n in serving if is_decode(n, s.M, s.N, s.K)}
        if decode:
            serving = {n: v for n, v in serving.items() if n not in tune.DECODE_SKIP}
        # the deep-K families: planned on deep-K rows only, under the budget's rule
        # (tests/test_streamk_family.py holds that rule)
        if not is_deep_k(s.M, s.N, s.K):
            serving = {n: v for n, v in serving.items() if n not in DEEPK}
        decode |= {n for n in serving if ruled(n, s.M, s.N, s.K)}
        packed = p.per_shape[s]
        assert set(serving) - decode <= {c.family for c in packed} <= set(serving), (s, sorted(serving))
        assert len(packed) >= min(least, sum(len(v) for n, v in serving.items() if n not in decode)), s
        for n in set(serving) - decode:
            mine = [c.config for c in packed if c.family == n]
            assert len(mine) >= min(quota, len(serving[n])), (s, n)
            default = FAMILIES[n].default().with_(LAYOUT=layout)
            if default in serving[n]:
                assert default in mine, (s, n)
    big = FAMILIES["wgmma"].default().with_(LAYOUT=layout)
    assert big.get("BN") == 256 and any(c.config == big for c in p.candidates)


def test_plan_packs_the_mirror_for_few_output_features_with_b_column_major():
    """N <= 64 with B column-major (a LoRA down-projection, a router): the skinny mirror is
    planned beside the rest; with B row-major, or N > 64, it serves nothing."""
    from cudal2.templates import FAMILIES
    lora, router, wide = Shape(8192, 16, 4096), Shape(2048, 8, 4096), Shape(8192, 128, 4096)
    rc = tune.plan([lora, router, wide], "sm_90a", limit_per_shape=8, per_family=2,
                   model=_CheapModel(), layout="RC", max_options=1)
    for s in (lora, router):
        fams = [c.family for c in rc.per_shape[s]]
        assert fams.count("skinny_n") >= 2 and "skinny" not in fams, (s, fams)
        assert all(FAMILIES["skinny_n"].valid(c.config, "sm_90a")
                   and FAMILIES["skinny_n"].serves(c.config, s.M, s.N, s.K, checked=True)
                   for c in rc.per_shape[s] if c.family == "skinny_n")
    assert "skinny_n" not in {c.family for c in rc.per_shape[wide]}
    rr = tune.plan([lora], "sm_90a", limit_per_shape=8, per_family=2, model=_CheapModel(),
                   layout="RR", max_options=1)
    assert "skinny_n" not in {c.family for c in rr.per_shape[lora]}


def test_a_row_tops_up_with_builds_other_rows_already_carry():
    """_decode_picks: after each family's best `builds`, a row short of its screenings takes
    the configs other rows already build before new ones (they add screenings, not builds), and
    only new builds count against `most`."""
    class Fam:
        name = "streamk"
    fam = Fam()
    # config i: budget time i, two screenings each
    cfgs = [f"c{i}" for i in range(6)]
    ranked = {c: [(float(i), {}), (float(i) + 0.5, {})] for i, c in enumerate(cfgs)}
    deep = [(fam, c) for c in cfgs]
    # the best 1; then, short of 7 x DECODE_MARGIN screenings, the carried c4 and c5 (slower)
    # before the new c1; `most` counts new builds only
    def got(target, most):
        return [c for _, c in tune._decode_picks([], deep, ranked, 1, None, target=target,
                                                 most=most, built=frozenset({"c4", "c5"}))]
    assert got(3, 1) == ["c0", "c4"]
    assert got(7, 2) == ["c0", "c4", "c5", "c1"]
    assert got(7, 1) == ["c0", "c4", "c5"]


def test_rows_ranked_in_forked_processes_plan_the_same():
    """plan(jobs=2) ranks the rows' options in two forked processes: the same candidates, in the
    same order, with the same rows, options and reduction-only rows as in one process (a decode
    row, a deep-K row and a plain one, each family's rule among them)."""
    rows = [Shape(16, 4096, 4096), Shape(128, 128, 16384), Shape(512, 1024, 2048)]
    kw = dict(families=["lowlat", "skinny", "streamk", "gemv"], limit_per_shape=8, per_family=2,
              layout="RC")

    def dump(p):
        return ([(c.family, c.config, c.source, c.shapes, c.options, c.reduction_only) for c in p.candidates],
                [(s, [p.candidates.index(c) for c in cs]) for s, cs in p.per_shape.items()],
                p.pairs, p.evaluations)
    seen = []
    assert dump(tune.plan(rows, "sm_90a", jobs=2, progress=seen.append, **kw)) == dump(tune.plan(rows, "sm_90a", **kw))
    assert seen == rows
