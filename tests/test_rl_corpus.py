"""The warm-start corpus (rl/corpus.py, rl/data/corpus/*.cu): complete kernel files that define
the ABI's entry points themselves, with a meta rendered from the same parameters as the code."""
import json
import re

import pytest

from cudal2.core.abi import meta_problems
from cudal2_rl.corpus import (PRINTED_META, SMALL_TEMPLATES, TEMPLATES, pairs, render,
                               sample_variants, variants)
from cudal2_rl.extract import extract
from cudal2_rl.prompts import brief_prompt, make_prompt

_META_RE = re.compile(r'cudal2_meta\(void\) \{\n  return "(.*)";\n\}', re.S)
_PRINTED_RE = re.compile(r'snprintf\(meta, sizeof meta, "(.*)", BM, BN, WARPS_M \* WARPS_N \* 32, GROUP_M\);')


def _meta_in_source(src: str, v) -> dict:
    """The meta the file returns: its literal, or (PRINTED_META) its format printed with the
    values its constants give (the compile tests check the built .so says the same)."""
    if v.template in PRINTED_META:
        m = _PRINTED_RE.search(src)
        assert m and not _META_RE.search(src), "no printed meta in the rendered file"
        p = v.p
        BM, BN = p["WM"] * p["WARPS_M"], p["WN"] * p["WARPS_N"]
        text = m.group(1).replace('\\"', '"') % (BM, BN, p["WARPS_M"] * p["WARPS_N"] * 32, p["GROUP_M"])
        return json.loads(text)
    m = _META_RE.search(src)
    assert m, "no meta literal in the rendered file"
    return json.loads(m.group(1).replace('\\"', '"'))


@pytest.mark.parametrize("template", TEMPLATES)
def test_every_variant_renders_a_complete_abi_file(template):
    vs = variants(template)
    assert len(vs) >= 20
    for v in vs:
        src = render(v)
        assert "${" not in src, v.label()
        ex = extract(src)
        assert ex.ok and ex.detail == "raw kernel", (v.label(), ex)
        assert '#include "' not in src          # no template header: the file is the whole kernel
        meta = _meta_in_source(src, v)
        assert meta == v.meta() and meta_problems(meta, "sm_90a") == []


def test_constants_in_the_code_match_the_meta():
    for v in variants("ptx_pipe")[:20] + variants("wmma_pipe")[:40]:
        src, p, meta = render(v), v.p, v.meta()
        assert f"BM = {p['BM']}, BN = {p['BN']}, BK = {p['BK']}" in src
        assert meta["tile"] == [p["BM"], p["BN"], p["BK"]]
        assert f"STAGES = {p['STAGES']}" in src
    for v in variants("wmma"):
        p = v.p
        assert v.meta()["tile"] == [p["WM"] * p["WARPS_M"], p["WN"] * p["WARPS_N"], 16]
        assert ("using Acc = half;" in render(v)) == (v.acc == "f16")


def test_wgmma_variants_say_what_their_code_does():
    """The inline-PTX wgmma file: sm_90a only, one warpgroup per 64 rows, BK one swizzle atom,
    any M (N, K multiples of 8); constants and meta from the same values."""
    vs = variants("wgmma")
    assert {v.layout for v in vs} == {"RR", "RC"} and {v.acc for v in vs} == {"f32"}
    assert variants("wgmma", "sm_90") == [] and variants("wgmma", "sm_80") == []
    for v in vs:
        src, p, meta = render(v), v.p, v.meta()
        assert f"BM = {p['BM']}, BN = {p['BN']}, BK = 64, STAGES = {p['STAGES']}" in src
        assert f"constexpr bool RC = {'true' if v.layout == 'RC' else 'false'};" in src
        assert meta["tile"] == [p["BM"], p["BN"], 64] and meta["threads"] == 128 * p["BM"] // 64
        assert meta["layout"] == v.layout and meta["smem_bytes"] <= 227 * 1024
        assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in src
    assert vs[0].serves(1000, 8, 24) and not vs[0].serves(1000, 12, 24)


def test_split_k_variants_declare_their_workspace_and_shape_limits():
    sk = [v for v in variants("wmma_pipe") if v.p["SPLITS"] > 1]
    assert sk and all(v.acc == "f32" for v in sk)
    v = sk[0]
    meta = v.meta()
    assert meta["workspace_bytes"] == v.p["SPLITS"] * meta["splitk_max_mn"] * 4
    assert meta["divisible"] == [1, 1, v.p["BK"] * v.p["SPLITS"]]
    assert not v.serves(4096, 4096, 4096)            # M*N above the workspace's cover
    assert v.serves(1024, 1024, 4096)


def test_pairs_serve_their_shapes_and_carry_the_brief_prompt():
    shapes = [(64, 64, 64), (128, 4096, 64), (8192, 128, 16384), (1024, 1024, 1024)]
    ps = pairs(shapes, brief_prompt, templates=SMALL_TEMPLATES, per_shape=2, seed=3)
    assert len(ps) == 8
    for prompt, src, shape, v in ps:
        assert v.template in SMALL_TEMPLATES and v.serves(*shape)
        assert f"M={shape[0]} N={shape[1]} K={shape[2]}" in prompt
        assert src == v.source()
    assert {v.template for *_, v in ps} == set(SMALL_TEMPLATES)


def test_prompts_teach_hardware_abi_and_show_complete_kernels():
    brief = make_prompt("brief", (256, 512, 1024))
    assert "132 SMs" in brief and "50 MB L2" in brief and "cudal2_meta" in brief
    full = make_prompt("full", (2048, 512, 8192))
    assert "wgmma + TMA" in full and "complete kernel file" in full
    assert "cuBLASLt autotuned" in full             # a measured kernel of the shipped table


@pytest.mark.compile
def test_sampled_raw_and_ptx_variants_build_and_pass_the_audit():
    from cudal2.harness.audit import audit_source
    vs = sample_variants(4, templates=("wmma", "ptx", "wmma_pipe", "ptx_pipe"), seed=11)
    vs += [next(v for v in variants("ptx") if v.layout == "RC"),
           next(v for v in variants("wmma") if v.acc == "f16"),
           next(v for v in variants("wmma_pipe") if v.p["SPLITS"] > 1)]
    for v in vs:
        res = audit_source(v.source(), "sm_90a", name=v.label())
        assert res.ok, res.line()
        assert res.meta == v.meta()                     # the .so says what the corpus rendered


@pytest.mark.compile
@pytest.mark.slow
def test_one_cutlass_variant_builds_and_passes_the_audit():
    from cudal2.harness.audit import audit_source
    v = variants("cutlass")[0]
    res = audit_source(v.source(), "sm_90a", name=v.label())
    assert res.ok, res.line()
    assert res.meta["style"] == "cutlass" and res.mma      # wgmma in the PTX


def _wgmma_extremes():
    vs = variants("wgmma")
    return [next(v for v in vs if v.layout == "RR" and (v.p["BM"], v.p["BN"]) == (64, 64)),
            next(v for v in vs if v.layout == "RC" and (v.p["BM"], v.p["BN"], v.p["STAGES"]) == (128, 256, 4))]


@pytest.mark.compile
def test_wgmma_variants_build_without_spills_pass_the_audit_and_run_hgmma():
    """The smallest RR and the largest RC wgmma variant: built for sm_90a with no spills, the
    audit and the meta-versus-binary check pass (threads and tile verified), the PTX holds
    wgmma.mma_async f32 and, where cuobjdump is installed, the SASS HGMMA (no HMMA).
    (rl/corpus.py audit --templates wgmma -n 36 builds all of them.)"""
    import subprocess
    from cudal2.core.build import BuildSpec, build
    from cudal2.harness.audit import audit_build
    from test_wgmma import _cuobjdump
    tool = _cuobjdump()
    for v in _wgmma_extremes():
        br = build(BuildSpec(source=v.source(), arch="sm_90a", name=v.label()))
        res = audit_build(v.source(), br, "sm_90a", name=v.label())
        assert res.ok, res.line()
        assert res.meta == v.meta() and set(res.meta_verified) == {"threads", "tile"}
        assert sum(r["spill_stores"] + r["spill_loads"] for r in res.resources) == 0
        assert set(res.mma) == {"wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16"}
        if tool:
            sass = subprocess.run([tool, "-sass", str(br.so_path)], capture_output=True, text=True).stdout
            if "Function" in sass:
                assert set(re.findall(r"HGMMA\.64x(\d+)x16\.F32", sass)) == {"64"}
                assert "HMMA" not in sass.replace("HGMMA", "")


@pytest.mark.compile
def test_a_wgmma_completion_goes_through_the_reward_path(tmp_path):
    """The policy's reward path takes the wgmma file as it takes the other large templates:
    extracted from a fenced completion, built, audited and (no GPU) given the flat reward."""
    from cudal2.harness.db import ResultsDB
    from cudal2_rl import reward as R
    from cudal2_rl.executor import LocalExecutor
    ex = LocalExecutor(jobs=1)
    if ex.gpu_name():
        pytest.skip("a GPU is visible: rewards are measured (the GPU tier runs the kernel)")
    v = _wgmma_extremes()[0]
    rf = R.KernelReward(ex, ResultsDB(tmp_path / "r.db"), timeout_s=300)
    rs = rf(prompts=[""], completions=[f"```cuda\n{v.source()}```"], M=[1000], N=[520], K=[72])
    ex.close()
    a = rf.attempts[-1][0]
    assert a.verdict == "not_measured" and rs == [R.FLAT_ESTIMATE], (a.verdict, a.detail)


@pytest.mark.compile
def test_a_printed_meta_stays_true_when_the_constants_change():
    """What the policy does most: another variant's constants in a file. With a literal meta
    the audit rejects the lie (threads vs launch bounds, tile vs the kernel's own guard); the
    printed meta describes the new constants and passes."""
    from cudal2.harness.audit import audit_source
    a, b = (next(v for v in variants("wmma") if v.p["WARPS_M"] * v.p["WARPS_N"] == n and v.acc == "f32")
            for n in (2, 8))
    line = "constexpr int WM = {WM}, WN = {WN}, WARPS_M = {WARPS_M}, WARPS_N = {WARPS_N}, GROUP_M = {GROUP_M};"
    src = render(a).replace(line.format(**a.p), line.format(**b.p))
    assert src != render(a)
    res = audit_source(src, "sm_90a", name="wmma with b's constants")
    assert res.ok, res.line()
    assert res.meta == b.meta()


# -- family files (issue 33, reach) and the space the default policy writes in --------------
def _family_configs():
    from cudal2.templates import FAMILIES
    return [FAMILIES["mma"].default(), FAMILIES["ptx"].default().with_(BM=64, STAGES=2)]


def test_a_family_file_is_the_instantiation_s_defines_and_its_header():
    from cudal2.templates import FAMILIES, instantiate
    from cudal2_rl.corpus import family_file, parse_family_file
    for name, fam in FAMILIES.items():
        cfg = fam.default()
        text = family_file(cfg)
        head = instantiate(cfg).split("\n\n")[0]           # banner + #define lines, before the body
        defines = [line for line in head.splitlines() if line.startswith("#define ")]
        assert text.splitlines() == defines + [f'#include "{fam.header}"'], name
        assert parse_family_file(text) == cfg, name
        assert parse_family_file("// a comment\n" + text.replace(" ", "  ")) == cfg, name
    bad = family_file(FAMILIES["mma"].default()).replace("#define BM 128", "#define BM 96")
    assert parse_family_file(bad) is None
    assert parse_family_file("#define BM 128\n") is None


@pytest.mark.compile
@pytest.mark.parametrize("cfg", _family_configs(), ids=lambda c: c.family)
def test_a_family_file_builds_the_instantiation_s_binary(cfg):
    from cudal2.core.build import BuildSpec, build
    from cudal2.templates import instantiate
    from cudal2_rl.corpus import family_file
    short = build(BuildSpec(family_file(cfg), arch="sm_90a", name="family file"))
    full = build(BuildSpec(instantiate(cfg), arch="sm_90a", name="instantiation"))
    assert short.ok and full.ok, (short.log[-500:], full.log[-500:])
    if short.binary_key is None:
        pytest.skip("no cuobjdump here: builds carry no binary key")
    assert short.binary_key == full.binary_key


def test_family_kinds_list_every_family_of_the_arch():
    from cudal2.templates import FAMILIES
    from cudal2_rl.corpus import FAMILY_PREFIX, family_kinds
    assert family_kinds("sm_90a") == tuple(FAMILY_PREFIX + n for n in FAMILIES)
    assert set(family_kinds("sm_80")) == {FAMILY_PREFIX + n for n, f in FAMILIES.items() if "sm_80" in f.arches}
    vs = variants("family:mma")
    assert len(vs) > 1000 and {v.acc for v in vs} == {"f32", "f16"} and {v.layout for v in vs} == {"RR", "RC"}
    v = vs[0]
    assert v.source().endswith('#include "mma_hgemm.cuh"\n')
    assert v.serves(4096, 4096, 4096) == FAMILIES["mma"].serves(v.config(), 4096, 4096, 4096)
    with pytest.raises(ValueError, match="unknown family kind"):
        variants("family:cutlass_sm90", "sm_80")


def _saved_completions(*checks: str):
    """(name, kernel file) of every saved completion of the default policy that built, in the
    `policy check --out` folders `checks` (under reports/cpu)."""
    from pathlib import Path
    reports = Path(__file__).resolve().parent.parent / "reports/cpu"
    out = []
    for sub in checks:
        rows = json.loads((reports / sub / "check.json").read_text())["rows"]
        files = sorted((reports / sub).glob("[0-9][0-9]_*.txt"))
        assert len(files) == len(rows)
        out += [(f.name, extract(f.read_text()).source) for f, r in zip(files, rows) if r.get("built")]
    return out


def test_every_saved_completion_that_builds_is_a_corpus_variant():
    from cudal2_rl.corpus import parse_corpus_file
    saved = _saved_completions("2026-11-25-smollm2-printed-meta/new-adapter",
                               "2026-11-25-smollm2-printed-meta/new-adapter-heldout")
    assert len(saved) == 28
    parsed = {name: parse_corpus_file(src) for name, src in saved}
    assert all(parsed.values()), [n for n, v in parsed.items() if v is None]
    one_warp = [v for v in parsed.values() if v.p["WARPS_M"] * v.p["WARPS_N"] == 1]
    assert len(one_warp) == 9
    # the table-trained adapter's check: family files, each a variant of its family's space
    family = {name: parse_corpus_file(src) for name, src in _saved_completions("2026-11-28-table-warmstart/check")}
    assert len(family) == 16 and all(v is not None and v.family for v in family.values()), family


def test_every_variant_parses_back_to_itself():
    from cudal2_rl.corpus import CONSTEXPR_TEMPLATES, parse_corpus_file
    for t in CONSTEXPR_TEMPLATES + ("family:mma", "family:skinny"):
        for v in variants(t)[::37]:
            assert parse_corpus_file(render(v)) == v, v.label()
    src = render(variants("wmma")[0])
    assert parse_corpus_file(src.replace("mma_sync(acc[i][j]", "mma_sync(acc[0][j]")) is None
