/* cudal2 call guard: an LD_PRELOAD library for the GPU worker. While a thread is armed (the
 * worker arms it around every call into a kernel library: load, meta, workspace, hgemm), each
 * CUDA runtime call the library makes through its import table is recorded; the calls the ABI
 * forbids (synchronisation, allocation, copies, streams, events, graphs, host functions, stream
 * attributes, device limits, function-by-symbol lookups) are refused with cudaErrorNotPermitted
 * and never reach the runtime; and the driver entry-point door (cudaGetDriverEntryPoint*,
 * cuGetProcAddress*) hands out only allowlisted driver functions, whatever name the code
 * assembled at run time. Every launch and memset (runtime calls, and the driver's launch
 * functions the door hands out, which it wraps) must be on the stream of the cudal2_hgemm call
 * the worker is making (cudal2_guard_expect), not on the per-thread or legacy default stream nor
 * any other, and may not set an L2 access-policy window; outside a call there is nothing to
 * launch. Disarmed (torch, the harness itself), every call is passed on as is.
 *
 * The name lists come from cudal2/harness/callguard.py (a generated header, -include'd):
 *   CUDAL2_RECORDED(X)  allowed runtime calls: recorded and passed on
 *   CUDAL2_REFUSED(X)   forbidden runtime calls: recorded and refused while armed
 *   CUDAL2_STREAM_CALLS(X)  launches and memsets X(name, stream argument, per-thread API 0/1):
 *                       passed on only on the call's stream
 *   CUDAL2_CONFIG_CALLS(X)  launches X(name, per-thread API) whose stream and attributes are
 *                       in a cudaLaunchConfig_t (argument 0): the same rule
 *   CUDAL2_ENTRY_POINTS  NULL-terminated allowlist of driver functions
 * Wrappers forward integer-class arguments generically (12 slots: the registers and the first
 * stack slots, passed on unchanged); none of the listed functions takes floating-point
 * arguments or returns a struct. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

typedef long (*cudal2_fn)(long, long, long, long, long, long, long, long, long, long, long, long);

#define CUDAL2_LOG_CAP 4096
#define CUDAL2_NAME_LEN 96
static char log_name[CUDAL2_LOG_CAP][CUDAL2_NAME_LEN];
static int log_refused[CUDAL2_LOG_CAP];
static atomic_int log_count;
static atomic_int log_dropped;
static __thread int armed;
static __thread int expecting;    /* inside a cudal2_hgemm call: launches allowed on `expected` */
static __thread long expected;    /* that call's stream, canonical (stream_canonical) */

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

/* ---- stream discipline ------------------------------------------------------------------- */
#define CUDAL2_LEGACY_STREAM 1L       /* cudaStreamLegacy / CU_STREAM_LEGACY */
#define CUDAL2_PER_THREAD_STREAM 2L   /* cudaStreamPerThread / CU_STREAM_PER_THREAD */
#define CUDAL2_ACCESS_POLICY_WINDOW 1 /* cudaLaunchAttributeAccessPolicyWindow (= the driver's) */
#define CUDAL2_MAX_ATTRS 64           /* more attributes than a launch has: refused unread */

/* The stream a handle names: 0 is the legacy stream through the plain API and the per-thread
 * stream through a per-thread (_ptsz) one, as the runtime reads it. */
static long stream_canonical(long stream, int per_thread) {
  return stream ? stream : (per_thread ? CUDAL2_PER_THREAD_STREAM : CUDAL2_LEGACY_STREAM);
}

static void refuse(const char* name, const char* why) {
  char line[CUDAL2_NAME_LEN];
  snprintf(line, sizeof line, "%s:%s", name, why);
  note("", line, 1);
}

/* Whether a launch (or memset) on `stream` may go on; recorded either way. */
static int stream_ok(const char* name, long stream, int per_thread) {
  long s = stream_canonical(stream, per_thread);
  if (expecting && s == expected) {
    note("", name, 0);
    return 1;
  }
  refuse(name, !expecting ? "outside cudal2_hgemm"
               : s == CUDAL2_PER_THREAD_STREAM ? "on cudaStreamPerThread"
               : s == CUDAL2_LEGACY_STREAM ? "on cudaStreamLegacy"
               : "on another stream than the call's");
  return 0;
}

/* cudaLaunchAttribute / CUlaunchAttribute, and the head of cudaLaunchConfig_t / CUlaunchConfig
 * up to its attributes (both put the stream at byte 32); tests/test_callguard.py checks these
 * offsets against the CUDA headers. */
struct cudal2_launch_attr {
  int id;
  char pad[4];
  char value[64];
};
struct cudal2_launch_config {
  unsigned dims[6];
  unsigned long long shared_bytes;  /* size_t here, unsigned + padding in the driver's */
  long stream;
  const struct cudal2_launch_attr* attrs;
  unsigned n_attrs;
};

static int config_ok(const char* name, long config, int per_thread) {
  const struct cudal2_launch_config* c = (const struct cudal2_launch_config*)config;
  if (!c) {                       /* the runtime's own error */
    note("", name, 0);
    return 1;
  }
  if (c->n_attrs > CUDAL2_MAX_ATTRS || (c->n_attrs && !c->attrs)) {
    refuse(name, "malformed launch attributes");
    return 0;
  }
  for (unsigned i = 0; i < c->n_attrs; ++i)
    if (c->attrs[i].id == CUDAL2_ACCESS_POLICY_WINDOW) {
      refuse(name, "L2 access-policy window");
      return 0;
    }
  return stream_ok(name, c->stream, per_thread);
}

#define CUDAL2_STREAM_WRAPPER(name, slot, per_thread)                                         \
  long name(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8,  \
            long a9, long a10, long a11) {                                                    \
    if (armed) {                                                                              \
      long args[12] = {a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11};                     \
      if (!stream_ok(#name, args[slot], per_thread)) return CUDAL2_NOT_PERMITTED;             \
    }                                                                                         \
    CUDAL2_FORWARD(name)                                                                      \
  }
#define CUDAL2_CONFIG_WRAPPER(name, per_thread)                                               \
  long name(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8,  \
            long a9, long a10, long a11) {                                                    \
    if (armed && !config_ok(#name, a0, per_thread)) return CUDAL2_NOT_PERMITTED;              \
    CUDAL2_FORWARD(name)                                                                      \
  }

CUDAL2_STREAM_CALLS(CUDAL2_STREAM_WRAPPER)
CUDAL2_CONFIG_CALLS(CUDAL2_CONFIG_WRAPPER)

/* The driver's launch functions, as the door hands them out: wrapped, per stream API (legacy 0,
 * per-thread 1: what the request's flags asked for), around the function the runtime gave. */
enum { DRV_LAUNCH, DRV_COOPERATIVE, DRV_LAUNCH_EX, DRV_COUNT };
static cudal2_fn driver_real[DRV_COUNT][2];

#define CUDAL2_DRIVER_WRAPPER(which, per_thread, name, check)                                 \
  static long guard_##name##_##per_thread(long a0, long a1, long a2, long a3, long a4,        \
                                          long a5, long a6, long a7, long a8, long a9,        \
                                          long a10, long a11) {                               \
    if (armed && !(check)) return CUDAL2_NOT_PERMITTED;                                       \
    cudal2_fn f = __atomic_load_n(&driver_real[which][per_thread], __ATOMIC_ACQUIRE);         \
    if (!f) return CUDAL2_NO_SUCH_FUNCTION;                                                   \
    return f(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);                               \
  }
/* cuLaunchKernel(f, grid xyz, block xyz, shared, hStream, ...): the stream is argument 8 */
CUDAL2_DRIVER_WRAPPER(DRV_LAUNCH, 0, cuLaunchKernel, stream_ok("cuLaunchKernel", a8, 0))
CUDAL2_DRIVER_WRAPPER(DRV_LAUNCH, 1, cuLaunchKernel, stream_ok("cuLaunchKernel", a8, 1))
CUDAL2_DRIVER_WRAPPER(DRV_COOPERATIVE, 0, cuLaunchCooperativeKernel,
                      stream_ok("cuLaunchCooperativeKernel", a8, 0))
CUDAL2_DRIVER_WRAPPER(DRV_COOPERATIVE, 1, cuLaunchCooperativeKernel,
                      stream_ok("cuLaunchCooperativeKernel", a8, 1))
CUDAL2_DRIVER_WRAPPER(DRV_LAUNCH_EX, 0, cuLaunchKernelEx, config_ok("cuLaunchKernelEx", a0, 0))
CUDAL2_DRIVER_WRAPPER(DRV_LAUNCH_EX, 1, cuLaunchKernelEx, config_ok("cuLaunchKernelEx", a0, 1))

static const struct {
  const char* name;
  cudal2_fn guarded[2];
} driver_launches[DRV_COUNT] = {
    {"cuLaunchKernel", {guard_cuLaunchKernel_0, guard_cuLaunchKernel_1}},
    {"cuLaunchCooperativeKernel", {guard_cuLaunchCooperativeKernel_0, guard_cuLaunchCooperativeKernel_1}},
    {"cuLaunchKernelEx", {guard_cuLaunchKernelEx_0, guard_cuLaunchKernelEx_1}},
};

/* A driver launch function the door found: hand out its guarded wrapper instead. */
static void wrap_driver_launch(const char* symbol, void** fn, long flags) {
  int per_thread = (flags & 2) != 0;  /* cudaEnablePerThreadDefaultStream, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM */
  for (int i = 0; i < DRV_COUNT; ++i)
    if (strcmp(symbol, driver_launches[i].name) == 0) {
      __atomic_store_n(&driver_real[i][per_thread], (cudal2_fn)*fn, __ATOMIC_RELEASE);
      *fn = (void*)driver_launches[i].guarded[per_thread];
    }
}

static const char* const entry_points[] = {CUDAL2_ENTRY_POINTS};

static int entry_allowed(const char* symbol) {
  if (!symbol) return 0;
  for (int i = 0; entry_points[i]; ++i)
    if (strcmp(entry_points[i], symbol) == 0) return 1;
  return 0;
}

/* The door: symbol is argument 0, the function pointer out-parameter argument 1, the flags
 * argument `flags_at`, the status out-parameter argument `status_at` (0: none; a pointer to an
 * enum whose "symbol not found" is 1). A driver launch function it finds is handed out wrapped. */
#define CUDAL2_DOOR_WRAPPER(name, flags_at, status_at)                                        \
  long name(long a0, long a1, long a2, long a3, long a4, long a5, long a6, long a7, long a8,  \
            long a9, long a10, long a11) {                                                    \
    const char* symbol = (const char*)a0;                                                     \
    if (armed) {                                                                              \
      if (!entry_allowed(symbol)) {                                                           \
        note(#name ":", symbol, 1);                                                           \
        if (a1) *(void**)a1 = 0;                                                              \
        long st = (status_at) == 3 ? a3 : (status_at) == 4 ? a4 : 0;                          \
        if (st) *(int*)st = 1;                                                                \
        return CUDAL2_SYMBOL_NOT_FOUND;                                                       \
      }                                                                                       \
      note(#name ":", symbol, 0);                                                             \
    }                                                                                         \
    static cudal2_fn real_##name;                                                             \
    cudal2_fn f = real(#name, &real_##name, (void*)name);                                     \
    if (!f) return CUDAL2_NO_SUCH_FUNCTION;                                                   \
    long rc = f(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11);                            \
    if (armed && rc == 0 && a1 && *(void**)a1)                                                \
      wrap_driver_launch(symbol, (void**)a1, (flags_at) == 2 ? a2 : a3);                      \
    return rc;                                                                                \
  }

CUDAL2_DOOR_WRAPPER(cudaGetDriverEntryPoint, 2, 3)
CUDAL2_DOOR_WRAPPER(cudaGetDriverEntryPointByVersion, 3, 4)
CUDAL2_DOOR_WRAPPER(cuGetProcAddress, 3, 0)      /* CUDA 11.3's: no status argument */
CUDAL2_DOOR_WRAPPER(cuGetProcAddress_v2, 3, 4)

/* The worker's handle (ctypes). */
void cudal2_guard_arm(int on) { armed = on; }
/* Inside a cudal2_hgemm call on `stream` (on = 1) or not (on = 0). */
void cudal2_guard_expect(int on, void* stream) {
  expecting = on;
  expected = stream_canonical((long)stream, 0);
}
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
