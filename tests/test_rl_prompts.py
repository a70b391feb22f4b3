"""rl.prompts: what the policy is told (compact and full styles, references, feedback)."""
import re

import pytest

from cudal2.templates import FAMILIES
from cudal2_rl import prompts as P
from cudal2_rl.extract import extract
from cudal2_rl.reward import Attempt


def test_compact_prompt_names_shape_arch_acc():
    p = P.compact_prompt((64, 4096, 512), "sm_90a", "f32")
    assert p == "hgemm M=64 N=4096 K=512 arch=sm_90a acc=f32"
    assert len(p) < 80             # fits the built-in policy's context with room for the kernel


def test_full_prompt_states_abi_rules_and_references():
    p = P.full_prompt((128, 256, 512), "sm_90a", "f32")
    assert "M=128, N=256, K=512" in p and "sm_90a" in p and "f32" in p
    assert "cudal2_hgemm" in p and "cudal2_meta" in p and "workspace" in p       # the ABI
    assert "synchronises" in p and "allocates" in p and "too fast" in p          # audit rules
    assert "cublaslt_autotuned" in p
    refs = P.template_references((128, 256, 512), "sm_90a", "f32")
    assert refs, "a template family must accept this shape"
    for title, text in refs:
        assert text in p and extract(text).ok     # every reference is itself a valid answer
        family = FAMILIES[re.search(r"`(\w+)`", title).group(1)]
        # the requested accumulator, where the family offers a choice (skinny and streamk are f32)
        assert "ACC_F16 0" in text or "ACC" not in family.choices(), title
    assert "previous attempts" not in p           # first round: no feedback


def test_references_respect_arch():
    refs = P.template_references((4096, 4096, 4096), "sm_80", "f32", limit=10)
    assert refs and all("cutlass_sm90" not in title for title, _ in refs)
    refs16 = P.template_references((4096, 4096, 4096), "sm_90a", "f16", limit=10)
    assert all("ACC_F16 1" in text for _, text in refs16)


def test_feedback_is_contrastive_and_trimmed():
    log = "\n".join(["ptxas info    : Used 40 registers"] * 30
                    + ["kernel.cu(12): error: identifier \"BMM\" is undefined"])
    fast = Attempt((64, 64, 64), "ok", 0.3, 1.35, False, "a" * 64, 1, False, "",
                   {"registers": 128, "shared_bytes": 49152, "spills": 0}, "cublas_tn",
                   '#define BM 64\n#include "mma_hgemm.cuh"\n')
    broken = Attempt((64, 64, 64), "build_error", -0.8, None, False, "b" * 64, 2, False,
                     "build compile_error", {"log_tail": log}, "", "#define BMM 1\n")
    text = P.feedback_text([broken, fast, fast])
    assert text.index("speedup 1.35x") < text.index("build_error")        # best first
    assert text.count("speedup 1.35x") == 1                                 # duplicates once
    assert "128 regs, 49152 B smem, 0 B spills" in text
    assert "fastest baseline cublas_tn" in text
    assert 'identifier "BMM" is undefined' in text and "Used 40 registers" not in text
    p = P.full_prompt((64, 64, 64), attempts=[fast, broken])
    assert "previous attempts for this shape" in p and "reward +0.30" in p


def test_estimated_feedback_is_marked():
    a = Attempt((64, 64, 64), "not_measured", 0.1, 1.1, True, "c" * 64, 3, False, "", {}, "",
                '#define BM 64\n#include "mma_hgemm.cuh"\n')
    assert "estimated speedup 1.10x" in P.attempt_line(a)
    near = P.nearby_best((64, 64, 128), {(64, 64, 64): a})
    assert near and "estimated" in near[0][0] and near[0][1] == a.source


def test_unknown_style_is_an_error():
    with pytest.raises(ValueError, match="prompt style"):
        P.make_prompt("verbose", (64, 64, 64))


@pytest.mark.parametrize("style", ["brief", "full"])
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_prompts_name_the_arch_s_families_and_show_a_family_file(style, arch):
    from cudal2.templates import FAMILIES
    from cudal2_rl.corpus import parse_family_file
    p = P.make_prompt(style, (4096, 4096, 4096), arch, "f32")
    for name, fam in FAMILIES.items():
        assert (f"{name} ({fam.header})" in p) == (arch in fam.arches), name
    example = P.family_example(arch, "f32")
    cfg = parse_family_file(example)
    assert cfg is not None and example.strip() in p and arch in FAMILIES[cfg.family].arches
    assert extract(example).ok                    # the example is itself a valid answer


def test_the_family_example_takes_the_accumulator():
    assert "#define ACC_F16 1" in P.family_example("sm_90a", "f16")
    assert "#define ACC_F16 0" in P.brief_prompt((64, 64, 64), "sm_90a", "f32")
