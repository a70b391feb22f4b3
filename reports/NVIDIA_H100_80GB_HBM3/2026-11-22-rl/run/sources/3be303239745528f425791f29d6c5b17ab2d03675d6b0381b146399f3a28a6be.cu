#define ACC_F16 0
#define BK 32
#define BM 256
#define BN 256
#define LAYOUT_RC 0
#define SPLITK 1
#define SPLITK_MAX_MN 2097152
#define STAGES 3
#define SWIZZLE 16
#define WM 64
#define WN 64
#include "ptx_hgemm.cuh"
