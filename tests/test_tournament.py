"""The harness's one tournament (cudal2/harness/tournament.py) with a fake backend (no GPU): the
finalist rule, a failing finalist replaced by the next screened one, one finals session per
shape with the baselines timed once in it, server mode and the end-to-end call only for a
candidate past the export bar, and the three callers reaching it (no second copy)."""
import ast
import re
from pathlib import Path

import pytest

from cudal2.core.identity import source_sha
from cudal2.harness import tournament as TN
from cudal2.harness.types import EvalRequest, Evaluation, Shape

REPO = Path(__file__).resolve().parents[1]
S = Shape(1024, 1024, 1024)


def _req(i, **kw):
    return EvalRequest(source=f"int kernel{i};\n", shape=S, origin="t", **kw)


def _row(req, status, stage, us=None):
    ev = Evaluation(status=status, source_sha=source_sha(req.source), shape=req.shape,
                    arch=req.arch, stage=stage)
    if us is not None:
        ev.timings = {"screen": {"candidate": {"median_us": us}}}
    return ev


class FakeBackend:
    """Screening times from `screen_us` (None: wrong at the smoke check); finals verdicts from
    `final_status` (default ok). Counts sessions and how often each baseline was timed."""

    def __init__(self, screen_us, final_status=None, baselines=("cublas_nn", "cublaslt_autotuned")):
        self.screen_us, self.final_status = screen_us, final_status or {}
        self.baselines = baselines
        self.screened, self.sessions, self.baseline_timings = [], [], {}

    def _i(self, e):
        return int(e.request.source.split("kernel")[1].split(";")[0])

    def screen(self, shape, entrants):
        self.screened.append([self._i(e) for e in entrants])
        return [_row(e.request, "ok" if self.screen_us[self._i(e)] else "wrong", "screen",
                     self.screen_us[self._i(e)]) for e in entrants], {"torch_us": 5.0}

    def finals(self, shape, entrants):
        self.sessions.append((shape, [self._i(e) for e in entrants]))
        for b in self.baselines:          # one interleaved session: each baseline once
            self.baseline_timings[(shape, b)] = self.baseline_timings.get((shape, b), 0) + 1
        return [_row(e.request, self.final_status.get(self._i(e), "ok"), "final") for e in entrants]


def test_finalist_rule_top_near_ties_cap_reference_and_groups():
    P = TN.FinalistPolicy
    f = TN.finalists
    g = ""
    assert f([(10.0, g), (12.0, g), (30.0, g), (None, g)], P(top=2)) == ([0, 1], [2])
    assert f([(10.0, g), (12.0, g), (10.2, g)], P(top=1))[0] == [0, 2]           # within 3% joins
    assert f([(10.0, g), (10.1, g), (10.2, g), (10.25, g)], P(top=1, cap=3))[0] == [0, 1, 2]
    # anything within noise of the reference (torch) also goes to finals
    assert f([(10.0, g), (10.8, g)], P(top=1), reference_us=10.5)[0] == [0, 1]
    assert f([(None, g)], P()) == ([], [])
    # per group (the experiment's arms): each group's fastest; the rest of it in reserve
    assert f([(10.0, "a"), (5.0, "b"), (7.0, "a"), (9.0, "b")], P(per_group=True)) == ([1, 2], [3, 0])
    # no timing at all (no GPU): runnable entrants in input order, `top` of them
    assert f([(None, g)] * 3, P(top=2), runnable=[False, True, True]) == ([1, 2], [])
    with pytest.raises(ValueError, match="top and cap"):
        P(top=0)


def test_one_session_per_shape_baselines_once_and_the_next_candidate_replaces_a_failure():
    # fastest (1) crashes in finals, 3 was a near-tie finalist; the next screened (0) replaces 1
    be = FakeBackend({0: 20.0, 1: 10.0, 2: None, 3: 10.2, 4: 40.0}, {1: "crashed"})
    ents = [TN.Entrant(_req(i)) for i in range(5)]
    res = TN.run(S, ents, be, TN.FinalistPolicy(top=1, cap=2))
    assert be.screened == [[0, 1, 2, 3, 4]]
    assert be.sessions == [(S, [1, 3]), (S, [0])]           # the replacement: one more session
    assert res.replaced == [(1, 0)] and res.finalists == [1, 3, 0]
    assert [r.stage for r in res.rows] == ["final", "final", "screen", "final", "screen"]
    assert res.winner()[0] == 3
    # no failure: exactly one session per shape, every baseline timed once in it
    be2 = FakeBackend({0: 20.0, 1: 10.0, 2: 10.1})
    T2 = Shape(64, 64, 64)
    for shape in (S, T2):
        TN.run(shape, [TN.Entrant(EvalRequest(source=f"int kernel{i};\n", shape=shape)) for i in range(3)],
               be2, TN.FinalistPolicy())
    assert [s for s, _ in be2.sessions] == [S, T2] and [ix for _, ix in be2.sessions] == [[1, 2], [1, 2]]
    assert set(be2.baseline_timings.values()) == {1} and len(be2.baseline_timings) == 4
    # replacements exhausted: at most 1 + replacements sessions
    be3 = FakeBackend({0: 10.0, 1: 20.0, 2: 30.0}, {0: "wrong", 1: "wrong", 2: "wrong"})
    res3 = TN.run(S, [TN.Entrant(_req(i)) for i in range(3)], be3,
                  TN.FinalistPolicy(top=1, within=0, replacements=1))
    assert len(be3.sessions) == 2 and res3.winner()[1].status == "wrong"


def test_prescreened_entrants_groups_and_a_kernel_two_groups_found():
    be = FakeBackend({0: 5.0, 1: 6.0, 2: 7.0}, {0: "timeout"})
    rows = {i: _row(_req(i), "ok", "screen", us) for i, us in ((0, 5.0), (1, 6.0), (2, 7.0))}
    ents = [TN.Entrant(_req(0), group="rl", screened=rows[0]),
            TN.Entrant(_req(2), group="rl", screened=rows[2]),
            TN.Entrant(_req(1), group="tune", screened=rows[1]),
            TN.Entrant(_req(1), group="exhaustive", screened=rows[1])]
    res = TN.run(S, ents, be, TN.FinalistPolicy(per_group=True))
    assert be.screened == []                                 # already screened: not again
    assert be.sessions == [(S, [0, 1]), (S, [2])]            # kernel 1 runs once for two groups
    assert res.winner("rl")[0] == 1 and res.winner("tune")[1] is res.winner("exhaustive")[1]
    # the kernel two groups share (their fastest) fails: each group sends its own next fastest
    be2 = FakeBackend({0: 8.0, 1: 5.0, 2: 9.0}, {1: "wrong"})
    rows2 = {i: _row(_req(i), "ok", "screen", us) for i, us in ((0, 8.0), (1, 5.0), (2, 9.0))}
    ents2 = [TN.Entrant(_req(1), group="a", screened=rows2[1]), TN.Entrant(_req(1), group="b", screened=rows2[1]),
             TN.Entrant(_req(0), group="a", screened=rows2[0]), TN.Entrant(_req(2), group="b", screened=rows2[2])]
    res2 = TN.run(S, ents2, be2, TN.FinalistPolicy(per_group=True))
    assert be2.sessions == [(S, [1]), (S, [0, 2])]
    assert res2.winner("a")[0] == 2 and res2.winner("b")[0] == 3


def test_a_lone_entrant_goes_straight_to_finals():
    be = FakeBackend({0: None})
    res = TN.run(S, [TN.Entrant(_req(0))], be)
    assert be.screened == [] and be.sessions == [(S, [0])] and res.rows[0].stage == "final"


def test_option_variants_of_one_binary_collapse_to_its_fastest_finalist():
    """Several screened entrants of one build that differ only in runtime options: only the
    fastest variant goes to finals; the others wait behind every other binary, so a failing
    finalist is replaced by a different binary first."""
    P, f = TN.FinalistPolicy, TN.finalists
    keys = [("X", (("swizzle", 1),)), ("X", (("swizzle", 2),)), ("Y", ()), ("X", (("swizzle", 4),)),
            ("Z", ())]
    times = [(10.0, ""), (10.1, ""), (10.2, ""), (10.05, ""), (30.0, "")]
    # without the keys X's three variants would fill every place within 3%
    assert f(times, P(top=1, cap=3))[0] == [0, 3, 1]
    assert f(times, P(top=1, cap=3), keys=keys) == ([0, 2], [4, 3, 1])
    # one kernel entered twice (same options) is one entrant, not a variant
    assert f([(10.0, ""), (10.0, "")], P(top=2), keys=[("X", ()), ("X", ())])[0] == [0, 1]
    # per group, variants collapse within an arm only (each arm's best still meets the others)
    assert f([(10.0, "a"), (9.0, "b"), (12.0, "a")], P(per_group=True),
             keys=[("X", (("s", 1),)), ("X", (("s", 2),)), ("Y", ())]) == ([1, 0], [2])
    # through run(): the failing X variant is replaced by Z (another binary), not by X again
    be = FakeBackend({0: 10.0, 1: 10.1, 2: 30.0}, {0: "wrong"})
    src = {0: "int kernel0;\n", 1: "int kernel0;\n", 2: "int kernel2;\n"}
    ents = [TN.Entrant(EvalRequest(source=src[0], shape=S, options={"swizzle": 1})),
            TN.Entrant(EvalRequest(source=src[1], shape=S, options={"swizzle": 2})),
            TN.Entrant(EvalRequest(source=src[2], shape=S))]
    be._i = lambda e: 1 if e.request.options == (("swizzle", 2),) else int(e.request.source[10])
    res = TN.run(S, ents, be, TN.FinalistPolicy(top=1, cap=3))
    assert be.sessions == [(S, [0]), (S, [2])] and res.replaced == [(0, 2)]


def test_the_deadline_is_checked_before_every_finals_session():
    """tournament.run passes its deadline to the backend (only when it has one) and starts no
    finals session past it: the finalists it would have run are in not_reached and keep their
    screening rows; a screening row the deadline cut never goes to finals."""
    import time
    from cudal2.harness.pipeline import MIN_SLICE_S, NOT_REACHED, budget_cut

    class Clocked(FakeBackend):
        def __init__(self, *a, slow_s=0.0, **kw):
            super().__init__(*a, **kw)
            self.slow_s, self.deadlines = slow_s, []

        def screen(self, shape, entrants, *, deadline=None):
            self.deadlines.append(("screen", deadline))
            return super().screen(shape, entrants)

        def finals(self, shape, entrants, *, deadline=None):
            self.deadlines.append(("finals", deadline))
            time.sleep(self.slow_s)
            return super().finals(shape, entrants)

    ents = [TN.Entrant(_req(i)) for i in range(3)]
    # the first session fails and runs out the clock: no replacement session starts
    be = Clocked({0: 10.0, 1: 20.0, 2: 30.0}, {0: "crashed"}, slow_s=0.5)
    deadline = time.monotonic() + MIN_SLICE_S + 0.3     # a unit needs MIN_SLICE_S left to start
    res = TN.run(S, ents, be, TN.FinalistPolicy(top=1, within=0), deadline=deadline)
    assert be.sessions == [(S, [0])] and be.deadlines == [("screen", deadline), ("finals", deadline)]
    assert res.not_reached == [1] and res.rows[1].stage == "screen" and res.finalists == [0]
    # past the deadline before finals: nothing runs
    be2 = Clocked({0: 10.0, 1: 20.0, 2: 30.0})
    res2 = TN.run(S, ents, be2, TN.FinalistPolicy(top=2), deadline=time.monotonic() - 1)
    assert be2.sessions == [] and res2.not_reached == [0, 1] and res2.finalists == []
    # no deadline: the backend is called as before (FakeBackend takes no deadline argument)
    TN.run(S, ents, FakeBackend({0: 10.0, 1: 20.0, 2: 30.0}), TN.FinalistPolicy())
    # a screening row the deadline cut is not a finalist (unlike a no-GPU not_measured row)
    cut = _row(_req(1), "not_measured", "screen")
    cut.detail = NOT_REACHED
    assert budget_cut(cut)
    nogpu = [TN.Entrant(_req(0), screened=_row(_req(0), "not_measured", "screen")),
             TN.Entrant(_req(1), screened=cut)]
    res3 = TN.run(S, nogpu, FakeBackend({}), TN.FinalistPolicy(top=2))
    assert res3.finalists == [0]


# ---- server mode and the end-to-end call only past the bar (measure.time_group) ----------------

def test_server_and_e2e_only_for_a_candidate_past_the_export_bar():
    """measure.time_group on CPU tensors with the kernel timer's fake GPU: cand0 beats the
    baseline 2x, cand1 loses; with gate_margin set, only cand0 gets server mode and the e2e
    call, and the gated row still answers a request with the same bar (the cache rule)."""
    pytest.importorskip("torch")
    from dataclasses import replace
    from cudal2.harness import bounds
    from cudal2.harness.measure import time_group
    from cudal2.harness.pipeline import answers, settings
    from cudal2.timing import kerneltime as KT
    from tests.test_kerneltime import FakeGpu, _kernels

    gpu = FakeGpu()
    gpu.gpu_us = {"cand0": 10.0, "cand1": 40.0, "torch": 20.0}
    kernel = _kernels(gpu)
    req = EvalRequest("x", Shape(32, 48, 64), modes=("offline", "server", "e2e"),
                      server_gaps_ms=(1.0,), gate_margin=0.02)
    e2e_calls = []
    out = time_group({"cand0": kernel("cand0"), "cand1": kernel("cand1")},
                     {"torch": lambda name, pool, verify: kernel(name)}, req, acc="f32",
                     device="cpu", peak=bounds.peak_for_name("H100"), notes={}, backend=gpu,
                     l2_bytes=64 << 10, kernel_config=KT.KernelTimeConfig(max_calls=4, max_rounds=8),
                     server_config=KT.ServerConfig(gaps_ms=(1.0,), max_rounds=6),
                     e2e=lambda name, t: e2e_calls.append(name) or {"timings": {}, "speedups": {}})
    assert out["cand0"]["gate"]["passed"] and not out["cand1"]["gate"]["passed"]
    assert out["cand1"]["gate"]["skipped"] == ["server", "e2e"]
    assert "server_1ms" in out["cand0"]["timings"] and "server_1ms" not in out["cand1"]["timings"]
    assert e2e_calls == ["cand0"]
    ev = Evaluation(status="ok", source_sha="s", shape=req.shape, arch=req.arch, stage="final",
                    timings=out["cand1"]["timings"],
                    env={"settings": settings(req), "gate": out["cand1"]["gate"]})
    assert answers(ev, req)
    assert not answers(ev, replace(req, gate_margin=None))      # wants server for every kernel


# ---- one implementation ---------------------------------------------------------------------

def _py_files():
    for root in ("cudal2", "rl", "scripts", "benchmarks", "tools"):
        d = REPO / root
        if d.is_dir():
            yield from (p for p in d.rglob("*.py") if "generated_kernels" not in p.parts)


def test_no_second_tournament_in_the_source_tree():
    """Finalist picking and finals sessions live in cudal2/harness/tournament.py only: no other
    module defines a function whose name says it picks finalists, and only the pipeline (which
    defines it) and the tournament call evaluate_group."""
    home = REPO / "cudal2" / "harness" / "tournament.py"
    pipeline = REPO / "cudal2" / "harness" / "pipeline.py"
    pick = re.compile(r"finalist|pick_winner|choose_finals|select_finals", re.I)
    offenders = []
    for p in _py_files():
        tree = ast.parse(p.read_text(), filename=str(p))
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and pick.search(node.name) \
                    and p.resolve() != home.resolve():
                offenders.append(f"{p.relative_to(REPO)}: def {node.name}")
            if isinstance(node, ast.Call):
                fn = node.func
                name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
                if name == "evaluate_group" and p.resolve() not in (home.resolve(), pipeline.resolve()):
                    offenders.append(f"{p.relative_to(REPO)}:{node.lineno}: calls evaluate_group")
    assert not offenders, "a second tournament: " + "; ".join(offenders)


def test_the_callers_reach_tournament_run():
    """campaign.run (through its per-GPU lanes) and GroupRunner.run
    call tournament.run (read from their code: a caller that stops using it fails here)."""
    import inspect
    from cudal2.runs import campaign
    from cudal2_rl import executor
    for fn in (campaign._LocalLane.run, executor.GroupRunner.run):
        src = inspect.getsource(fn)
        assert "tournament.run(" in src, f"{fn.__qualname__} does not call tournament.run"
    run_src = inspect.getsource(campaign.run)
    assert "_drive(" in run_src and "_open_lanes(" in run_src
    assert "lane.run(" in inspect.getsource(campaign._shape)
    lanes_src = inspect.getsource(campaign._open_lanes)
    assert "_LocalLane(" in lanes_src and "_RayLane(" in lanes_src
    assert "_LocalLane(" in inspect.getsource(campaign._CampaignActor.run)    # Ray actors too
