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
    assert e.verdict == TWO_FILES and "2 fenced" in e.detail


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
    # an unknown header is not a template
    assert extract('#define BM 64\n#include "my_gemm.cuh"\n', headers=H).verdict == NOT_ABI


def test_real_template_headers_are_recognised():
    hs = template_headers()
    assert "mma_hgemm.cuh" in hs
    assert extract(SHORT).ok
