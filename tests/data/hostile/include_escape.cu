// Hostile (audit): includes a file outside the kernel's own text by a relative path.
#include <cuda_runtime.h>
#include "../../../cudal2/harness/types.py"
