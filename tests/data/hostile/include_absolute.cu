// Hostile (audit): includes an absolute path (reads the build machine's files into the binary).
#include <cuda_runtime.h>
#include </etc/hostname>
