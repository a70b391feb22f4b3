// cudal2 kernel family "skinny_n": the mirror of "skinny" for N <= BM <= 64 with M large and B
// column-major (C = A @ W.t() with few output features: a LoRA down-projection, a router, a
// classifier head). It is skinny_hgemm.cuh computing C^T = B^T A^T: A is the operand streamed
// once from HBM, B^T stays small, and C is stored transposed back to row-major (see there).
#define CUDAL2_SKINNY_N 1
#include "skinny_hgemm.cuh"
