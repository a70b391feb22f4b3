"""rl.extract: the kernel file out of a completion, and its verdicts."""
from cudal2_rl.extract import NO_CODE, NOT_ABI, OK, TWO_FILES, completion_text, extract, template_headers

H = frozenset({"mma_hgemm.cuh", "ptx_hgemm.cuh"})
SHORT = '#define BM 64\n#define BN 64\n#include "mma_hgemm.cuh"\n'
RAW = ('#include <cuda_fp16.h>\nextern "C" int cudal2_hgemm(const void* A, const void* B, void* C, '
       'int M, int N, int K, int lda, int ldb, int ldc, void* ws, size_t wsb, void* s) { return 0; }\n'
       'extern "C" const char* cudal2_meta(void) { return "{}"; }\n')


def test_whole_text_template_include():
    e = extract(SHORT, headers=H)
    assert e.verdict == OK and e.source == SHORT and "mma_hgemm.cuh" in e.detail


def test_fenced_block_with_prose_around():
    e = extract(f"Here is my kernel:\n```cuda\n{RAW}```\nIt should be fast.", headers=H)
    assert e.verdict == OK and e.source.startswith("#include <cuda_fp16.h>")
    assert "It should be fast" not in e.source


def test_truncated_fence_still_extracts():
    e = extract(f"```cpp\n{SHORT}", headers=H)
    assert e.verdict == OK and '#include "mma_hgemm.cuh"' in e.source


def test_chat_message_list():
    msgs = [{"role": "assistant", "content": SHORT}]
    assert completion_text(msgs) == SHORT
    assert extract(msgs, headers=H).ok


def test_no_code():
    assert extract("", headers=H).verdict == NO_CODE
    assert extract("   \n", headers=H).verdict == NO_CODE
    assert extract("I cannot write this kernel, sorry", headers=H).verdict == NO_CODE
    assert extract(None, headers=H).verdict == NO_CODE


def test_two_fenced_kernels():
    text = f"```cuda\n{SHORT}```\nor\n```cuda\n{RAW}```"
    e = extract(text, headers=H)
    assert e.verdict == TWO_FILES and "2 different fenced" in e.detail


def test_two_entry_points_in_one_text():
    assert extract(RAW + RAW, headers=H).verdict == TWO_FILES
    assert extract(SHORT + '#include "ptx_hgemm.cuh"\n', headers=H).verdict == TWO_FILES
    assert extract(RAW + '#include "mma_hgemm.cuh"\n', headers=H).verdict == TWO_FILES


def test_explanation_block_plus_one_kernel_picks_the_kernel():
    text = f"```bash\nnvcc -O3 k.cu\n```\n```cuda\n{SHORT}```"
    e = extract(text, headers=H)
    assert e.verdict == OK and e.source == SHORT


def test_not_our_abi():
    e = extract("```cuda\n__global__ void k(float* x) { x[0] = 1; }\n```", headers=H)
    assert e.verdict == NOT_ABI and "cudal2_hgemm" in e.detail
    # the entry point alone is not enough: the meta function is part of the ABI
    e = extract('extern "C" int cudal2_hgemm(void* a) { return 0; }', headers=H)
    assert e.verdict == NOT_ABI and "cudal2_meta" in e.detail
    # a header nothing like a template is not our ABI
    assert extract('#include "cuda_fp16.h"\n__global__ void k() {}\n', headers=H).verdict == NOT_ABI


def test_real_template_headers_are_recognised():
    hs = template_headers()
    assert "mma_hgemm.cuh" in hs
    assert extract(SHORT).ok


# ---- what real models write: one kernel, not two files --------------------------------------

DECL = ('extern "C" int cudal2_hgemm(const void* A, const void* B, void* C, int M, int N, int K,\n'
        '                            int lda, int ldb, int ldc, void* workspace,\n'
        '                            size_t workspace_bytes, void* stream);\n')


def test_forward_declaration_then_definition_is_one_kernel():
    """The prompt's ABI section shows the declaration; a model that copies it above its
    definition wrote one kernel."""
    e = extract("```cuda\n" + DECL + RAW + "```", headers=H)
    assert e.verdict == OK and e.detail == "raw kernel"
    # a declaration alone is not a definition
    e = extract(DECL + 'extern "C" const char* cudal2_meta(void) { return "{}"; }\n', headers=H)
    assert e.verdict == NOT_ABI and "definition of cudal2_hgemm" in e.detail


def test_comments_strings_and_prose_naming_the_entry_point():
    commented = ("// cudal2_hgemm(A, B, C, M, N, K, ...) computes C = A @ B\n"
                 "/* old version:\nextern \"C\" int cudal2_hgemm(const void* A) { return 1; }\n*/\n"
                 + RAW.replace('return "{}"', 'return "{\\"note\\": \\"cudal2_hgemm() {}\\"}"'))
    e = extract(commented, headers=H)
    assert e.verdict == OK and e.detail == "raw kernel", e.detail
    prose = ("I implement `cudal2_hgemm(...)` with mma.sync; cudal2_hgemm() { is the entry.\n\n"
             "```cuda\n" + RAW + "```\nThe cudal2_hgemm( function returns 0.")
    assert extract(prose, headers=H).verdict == OK
    # a commented-out template include next to the real one is not a second kernel
    e = extract('// #include "ptx_hgemm.cuh"\n' + SHORT, headers=H)
    assert e.verdict == OK and "mma_hgemm.cuh" in e.detail


def test_usage_snippet_block_is_not_a_second_kernel():
    usage = "```cpp\n// host side\nint rc = cudal2_hgemm(A, B, C, M, N, K, K, N, N, nullptr, 0, s);\n```\n"
    e = extract(usage + "```cuda\n" + RAW + "```", headers=H)
    assert e.verdict == OK and e.source.startswith("#include <cuda_fp16.h>")


def test_reasoning_block_before_the_code():
    think = ("<think>\nLet me try a first draft:\n```cuda\n" + SHORT.replace("64", "128") +
             "```\nNo, 64 is better for this shape. Also cudal2_hgemm( needs the meta.\n</think>\n")
    e = extract(think + "```cuda\n" + SHORT + "```", headers=H)
    assert e.verdict == OK and e.source == SHORT
    # the chat template opened the block in the prompt: only the closing tag is in the completion
    e = extract("drafting...\n```cuda\n" + RAW + "```\n</think>\n```cuda\n" + SHORT + "```", headers=H)
    assert e.verdict == OK and e.source == SHORT
    # cut off while still thinking: no code, whatever drafts the reasoning holds
    e = extract("<think>\n```cuda\n" + SHORT + "```\nhmm", headers=H)
    assert e.verdict == NO_CODE and "reasoning" in e.detail
    e = extract("<reasoning>short</reasoning>\n" + SHORT, headers=H)
    assert e.verdict == OK


def test_unterminated_final_fence_after_prose_and_other_blocks():
    text = "Build with:\n```bash\nnvcc -O3 k.cu\n```\nHere is the kernel:\n```cuda\n" + RAW
    e = extract(text, headers=H)
    assert e.verdict == OK and e.source.strip() == RAW.strip()


def test_same_kernel_repeated_is_one_kernel():
    e = extract("```cuda\n" + SHORT + "```\nAgain, final answer:\n```cuda\n" + SHORT + "\n```", headers=H)
    assert e.verdict == OK and e.source == SHORT
    # two different kernels stay two files: we never guess
    e = extract("```cuda\n" + SHORT + "```\n```cuda\n" + SHORT.replace("64", "128") + "```", headers=H)
    assert e.verdict == TWO_FILES


def test_unfenced_kernel_with_prose_around_it():
    e = extract("Sure! Here is the kernel.\n" + RAW + "\nThis should be fast.", headers=H)
    assert e.verdict == OK and e.source.strip() == RAW.strip()


def test_misspelt_template_header_goes_to_the_build():
    """A misspelt header is the compiler's verdict (build error, -0.8), not 'not our ABI'."""
    for wrong in ("mma_hgem.cuh", "mma_hgemm.cu", "my_gemm.cuh"):
        e = extract(f'#define BM 64\n#include "{wrong}"\n', headers=H)
        assert e.verdict == OK and "the build decides" in e.detail and "mma_hgemm.cuh" in e.detail
