/* cudal2 call guard: an LD_PRELOAD library for the GPU worker. While a thread is armed (the
 * worker arms it around every call into a kernel library: load, meta, workspace, hgemm), each
 * CUDA runtime call the library makes through its import table is recorded; the calls the ABI
 * forbids (synchronisation, allocation, copies, streams, events, graphs, host functions, stream
 * attributes, device limits, function-by-symbol lookups) are refused with cudaErrorNotPermitted
 * and never reach the runtime; and the driver entry-point door (cudaGetDriverEntryPoint*,
 * cuGetProcAddress*) hands out only allowlisted driver functions, whatever name the code
 * assembled at run time. Disarmed (torch, the harness itself), every call is passed on as is.
 *
 * The name lists come from cudal2/harness/callguard.py (a generated header, -include'd):
 *   CUDAL2_RECORDED(X)  allowed runtime calls: recorded and passed on
 *   CUDAL2_REFUSED(X)   forbidden runtime calls: recorded and refused while armed
 *   CUDAL2_ENTRY_POINTS  NULL-terminated allowlist of driver functions
 * Wrappers forward integer-class arguments generically (12 slots: the registers and the first
 * stack slots, passed on unchanged); none of the listed functions takes floating-point
 * arguments or returns a struct. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <string.h>

typedef long (*cudal2_fn)(long, long, long, long, long, long, long, long, long, long, long, long);

#define CUDAL2_LOG_CAP 4096
#define CUDAL2_NAME_LEN 96
static char log_name[CUDAL2_LOG_CAP][CUDAL2_NAME_LEN];
static int log_refused[CUDAL2_LOG_CAP];
static atomic_int log_count;
static atomic_int log_dropped;
static __thread int armed;

/* Refusals also go to a log of their own, so a flood of allowed calls cannot push them out. */
#define CUDAL2_REFUSED_CAP 256
static char refused_name[CUDAL2_REFUSED_CAP][CUDAL2_NAME_LEN];
static atomic_int refused_count;

static void copy_name(char* dst, const char* prefix, const char* name) {
  size_t n = strlen(prefix);
  if (n >= CUDAL2_NAME_LEN) n = CUDAL2_NAME_LEN - 1;
  memcpy(dst, prefix, n);
  size_t m = name ? strnlen(name, CUDAL2_NAME_LEN - 1 - n) : 0;
  if (m) memcpy(dst + n, name, m);
  dst[n + m] = 0;
}

static void note(const char* prefix, const char* name, int refused) {
  if (refused) {
    int r = atomic_fetch_add(&refused_count, 1);
    if (r < CUDAL2_REFUSED_CAP) copy_name(refused_name[r], prefix, name);
  }
  int i = atomic_fetch_add(&log_count, 1);
  if (i >= CUDAL2_LOG_CAP) {
    atomic_fetch_add(&log_dropped, 1);
    return;
  }
  copy_name(log_name[i], prefix, name);
  log_refused[i] = refused;
}

struct lookup {
  const char* name;
  void* self;
  void* found;
};

static int find_elsewhere(struct dl_phdr_info* info, size_t size, void* data) {
  struct lookup* q = (struct lookup*)data;
  if (q->found || !info->dlpi_name || !info->dlpi_name[0]) return q->found != 0;
  void* h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  void* f = dlsym(h, q->name);
  if (f && f != q->self) q->found = f;
  dlclose(h);
  return q->found != 0;
}

/* The runtime's own function: the next definition after this library in the global scope
 * (libcudart as torch loads it), else any loaded library's (a runtime loaded RTLD_LOCAL). */
static cudal2_fn real(const char* name, cudal2_fn* slot, void* self) {
  cudal2_fn f = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
  if (!f) {
    f = (cudal2_fn)dlsym(RTLD_NEXT, name);
    if (!f) {
      struct lookup q = {name, self, 0};
      dl_iterate_phdr(find_elsewhere, &q);
      f = (cudal2_fn)q.found;
    }
    __atomic_store_n(slot, f, __ATOMIC_RELEASE);
  }
  return f;
}

#define CUDAL2_NOT_PERMITTED 800      /* cudaErrorNotPermitted */
#define CUDAL2_SYMBOL_NOT_FOUND 500   /* cudaErrorSymbolNotFound / CUDA_ERROR_NOT_FOUND */
#define CUDAL2_NO_SUCH_FUNCTION 36    /* cudaErrorInvalidResourceHandle-like "not loaded" */

#define CUDAL2_FORWARD(name)                                                                  \
  static cudal2_fn real_##name;                                                               \
  cudal2_fn f = real(#name, &real_##name, (void*)name);                                       \
  if (!f) return CUDAL2_NO_SUCH_FUNCTION;                                                     \
  return f(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);

#define CUDAL2_RECORD_WRAPPER(name)                                                           \
  long name(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8,  \
            long a9, long a10, long a11) {                                                    \
    if (armed) note("", #name, 0);                                                            \
    CUDAL2_FORWARD(name)                                                                      \
  }
#define CUDAL2_REFUSE_WRAPPER(name)                                                           \
  long name(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8,  \
            long a9, long a10, long a11) {                                                    \
    if (armed) {                                                                              \
      note("", #name, 1);                                                                     \
      return CUDAL2_NOT_PERMITTED;                                                            \
    }                                                                                         \
    CUDAL2_FORWARD(name)                                                                      \
  }

CUDAL2_RECORDED(CUDAL2_RECORD_WRAPPER)
CUDAL2_REFUSED(CUDAL2_REFUSE_WRAPPER)

static const char* const entry_points[] = {CUDAL2_ENTRY_POINTS};

static int entry_allowed(const char* symbol) {
  if (!symbol) return 0;
  for (int i = 0; entry_points[i]; ++i)
    if (strcmp(entry_points[i], symbol) == 0) return 1;
  return 0;
}

/* The door: symbol is argument 0, the function pointer out-parameter argument 1, the status
 * out-parameter argument `status_at` (0: none; a pointer to an enum whose "symbol not found"
 * is 1). */
#define CUDAL2_DOOR_WRAPPER(name, status_at)                                                  \
  long name(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8,  \
            long a9, long a10, long a11) {                                                    \
    if (armed) {                                                                              \
      const char* symbol = (const char*)a0;                                                   \
      if (!entry_allowed(symbol)) {                                                           \
        note(#name ":", symbol, 1);                                                           \
        if (a1) *(void**)a1 = 0;                                                              \
        long st = (status_at) == 3 ? a3 : (status_at) == 4 ? a4 : 0;                          \
        if (st) *(int*)st = 1;                                                                \
        return CUDAL2_SYMBOL_NOT_FOUND;                                                       \
      }                                                                                       \
      note(#name ":", symbol, 0);                                                             \
    }                                                                                         \
    CUDAL2_FORWARD(name)                                                                      \
  }

CUDAL2_DOOR_WRAPPER(cudaGetDriverEntryPoint, 3)
CUDAL2_DOOR_WRAPPER(cudaGetDriverEntryPointByVersion, 4)
CUDAL2_DOOR_WRAPPER(cuGetProcAddress, 0)      /* CUDA 11.3's: no status argument */
CUDAL2_DOOR_WRAPPER(cuGetProcAddress_v2, 4)

/* The worker's handle (ctypes). */
void cudal2_guard_arm(int on) { armed = on; }
int cudal2_guard_count(void) {
  int n = atomic_load(&log_count);
  return n < CUDAL2_LOG_CAP ? n : CUDAL2_LOG_CAP;
}
int cudal2_guard_dropped(void) { return atomic_load(&log_dropped); }
const char* cudal2_guard_name(int i) { return (i >= 0 && i < cudal2_guard_count()) ? log_name[i] : ""; }
int cudal2_guard_refused(int i) { return (i >= 0 && i < cudal2_guard_count()) ? log_refused[i] : 0; }
int cudal2_guard_refused_count(void) { return atomic_load(&refused_count); }
const char* cudal2_guard_refused_name(int i) {
  int n = atomic_load(&refused_count);
  return (i >= 0 && i < n && i < CUDAL2_REFUSED_CAP) ? refused_name[i] : "";
}
void cudal2_guard_reset(void) {
  atomic_store(&log_count, 0);
  atomic_store(&log_dropped, 0);
  atomic_store(&refused_count, 0);
}
