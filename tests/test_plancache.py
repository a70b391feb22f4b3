"""The plan kept on disk (cudal2.search.plancache): read back whole, keyed by every input, never
read stale."""
import gzip

from cudal2.harness.types import Shape
from cudal2.search import plancache, tune
from cudal2.search.costmodel import CostModel

# a decode row (the streaming families' budget and their options) and a plain row
ROWS = [Shape(16, 4096, 4096), Shape(256, 512, 1024)]
ARGS = dict(families=["lowlat", "skinny", "gemv"], limit_per_shape=4, per_family=2, layout="RC",
            model=CostModel.default(arch="sm_90a"))


def _dump(p: tune.BuildPlan) -> list:
    return [p.arch, p.acc, p.layout, p.pairs, p.evaluations, p.shapes,
            [(c.family, c.config, c.source, c.shapes, list(c.options.items()), sorted(
                (s.M, s.N, s.K) for s in c.reduction_only), c.build) for c in p.candidates],
            [(s, [p.candidates.index(c) for c in cs]) for s, cs in p.per_shape.items()]]


def test_a_plan_is_read_back_as_planned(tmp_path):
    lines = []
    planned = tune.plan(ROWS, "sm_90a", **ARGS)
    first = plancache.cached_plan(ROWS, "sm_90a", cache_dir=tmp_path, log=lines.append, **ARGS)
    assert len(list(tmp_path.glob("*.json.gz"))) == 1 and not lines
    again = plancache.cached_plan(ROWS, "sm_90a", cache_dir=tmp_path, log=lines.append, **ARGS)
    assert any("read from" in line for line in lines)
    assert _dump(first) == _dump(planned) == _dump(again)
    # the rows' candidates are the plan's own objects, as tune.plan shares them
    assert all(c in again.candidates for cs in again.per_shape.values() for c in cs)
    assert again.sweeps(ROWS[0]) and [o for _, o in again.sweeps(ROWS[0])] == [o for _, o in planned.sweeps(ROWS[0])]


def test_every_input_is_in_the_key(tmp_path):
    key = plancache.plan_key(ROWS, "sm_90a", code="c", **ARGS)
    assert key == plancache.plan_key(list(ROWS), "sm_90a", code="c", **dict(ARGS))
    others = [plancache.plan_key(ROWS[::-1], "sm_90a", code="c", **ARGS),
              plancache.plan_key(ROWS[:1], "sm_90a", code="c", **ARGS),
              plancache.plan_key(ROWS, "sm_80", code="c", **dict(ARGS, families=["skinny", "gemv"])),
              plancache.plan_key(ROWS, "sm_90a", code="c", **dict(ARGS, families=["skinny", "gemv"])),
              plancache.plan_key(ROWS, "sm_90a", code="d", **ARGS),
              plancache.plan_key(ROWS, "sm_90a", code="c", **dict(ARGS, layout="RR")),
              plancache.plan_key(ROWS, "sm_90a", code="c", **dict(ARGS, limit_per_shape=5)),
              plancache.plan_key(ROWS, "sm_90a", code="c", **dict(ARGS, model=CostModel.default(gpu="H200"))),
              plancache.plan_key(ROWS, "sm_90a", code="c", **dict(ARGS, max_options=3))]
    assert len({key, *others}) == len(others) + 1
    # the package's code: any file's bytes or name
    pkg = tmp_path / "pkg"
    (pkg / "templates").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "templates" / "k.cuh").write_text("// k\n")
    digest = plancache.code_digest(pkg)
    (pkg / "__pycache__").mkdir()
    (pkg / "__pycache__" / "a.pyc").write_bytes(b"\0")
    assert plancache.code_digest(pkg) == digest
    (pkg / "templates" / "k.cuh").write_text("// k2\n")
    assert plancache.code_digest(pkg) != digest


def test_a_foreign_or_broken_entry_is_planned_again(tmp_path):
    lines = []
    p = plancache.cached_plan(ROWS[:1], "sm_90a", cache_dir=tmp_path, log=lines.append, **ARGS)
    (entry,) = tmp_path.glob("*.json.gz")
    entry.write_bytes(gzip.compress(entry.read_bytes()[:100]))       # truncated
    q = plancache.cached_plan(ROWS[:1], "sm_90a", cache_dir=tmp_path, log=lines.append, **ARGS)
    assert not lines and _dump(p) == _dump(q)
    # an entry whose stored key is another's (a name collision) is not read
    body = gzip.decompress(entry.read_bytes()).decode()
    key = plancache.plan_key(ROWS[:1], "sm_90a", code=plancache.code_digest(), **ARGS)
    entry.write_bytes(gzip.compress(body.replace(key, "0" * 64).encode()))
    plancache.cached_plan(ROWS[:1], "sm_90a", cache_dir=tmp_path, log=lines.append, **ARGS)
    assert not lines


def test_a_stand_in_model_is_never_cached(tmp_path):
    class Model:
        def rank_options(self, meta, resources, shape, candidates, facts=None):
            return [(1.0, dict(next(iter(candidates))))]

        def predict_us(self, *a, **kw):
            return 1.0

    plancache.cached_plan(ROWS[:1], "sm_90a", cache_dir=tmp_path, log=print, **dict(ARGS, model=Model()))
    assert not list(tmp_path.iterdir())


def test_the_newest_entries_are_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(plancache, "PLANS_KEPT", 2)
    for i in range(4):
        plancache.cached_plan(ROWS[1:], "sm_90a", cache_dir=tmp_path, log=print,
                              **dict(ARGS, limit_per_shape=i + 1))
    assert len(list(tmp_path.glob("*.json.gz"))) == 2
