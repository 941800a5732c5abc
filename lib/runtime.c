/* runtime.c -- initialisation, exit, fork and devices. */
#include <linux/membarrier.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

_Alignas(64) struct cs_hot cs_hot = {.state = CS_RUNNING};

static pthread_mutex_t init_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int initialised;
static int handlers_registered;
static int device_count;

typedef CUresult (*retain_fn)(CUcontext *, CUdevice);
typedef CUresult (*release_fn)(CUdevice);
typedef CUresult (*get_module_fn)(CUmodule *, CUlibrary);
static retain_fn primary_retain;
static release_fn primary_release;
static get_module_fn library_get_module; /* NULL on drivers before 12.0 */

/* ---- threads inside calls ----------------------------------------------------- */

__thread struct cs_thread *cs_tls_thread
    __attribute__((tls_model("initial-exec")));

/* Registers for expedited membarrier(), which makes cheap calls possible;
 * where the kernel (or Valgrind) lacks it, calls keep their full fence. */
static void light_calls_init(void) {
#ifdef __NR_membarrier
  if (syscall(__NR_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0,
              0) == 0)
    atomic_store(&cs_hot.light_calls, 1);
#endif
}

/* A full memory barrier on every thread of the process. */
static void heavy_barrier(void) {
#ifdef __NR_membarrier
  if (atomic_load(&cs_hot.light_calls) &&
      syscall(__NR_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0)
    return;
#endif
  atomic_thread_fence(memory_order_seq_cst);
}
static _Atomic(struct cs_thread *) threads;
static pthread_key_t thread_key;
static pthread_once_t thread_once = PTHREAD_ONCE_INIT;
/* For a thread whose record could not be allocated: shared, so its depth
 * counts calls of several threads; it is updated atomically all the same. */
static struct cs_thread overflow_thread = {.in_use = 1, .shared = true};

static void thread_gone(void *p) {
  struct cs_thread *t = p;
  atomic_store(&t->in_use, 0); /* the record is reused by a later thread */
}

static void thread_key_make(void) { pthread_key_create(&thread_key, thread_gone); }

struct cs_thread *cs_thread_register(void) {
  pthread_once(&thread_once, thread_key_make);
  struct cs_thread *t;
  for (t = atomic_load(&threads); t; t = t->next) {
    int idle = 0;
    if (atomic_compare_exchange_strong(&t->in_use, &idle, 1))
      break;
  }
  if (!t) {
    t = aligned_alloc(_Alignof(struct cs_thread), sizeof *t);
    if (!t)
      return &overflow_thread;
    memset(t, 0, sizeof *t);
    atomic_init(&t->in_use, 1);
    t->next = atomic_load(&threads);
    while (!atomic_compare_exchange_weak(&threads, &t->next, t))
      ;
  }
  pthread_setspecific(thread_key, t);
  cs_tls_thread = t;
  return t;
}

void cs_pins_wait(void) {
  struct cs_thread *self = cs_tls_thread;
  for (struct cs_thread *t = atomic_load(&threads); t; t = t->next) {
    if (t == self && !t->shared)
      continue; /* the caller is not pinned */
    unsigned long begun = atomic_load(&t->pins_begun);
    for (unsigned spins = 0;
         (long)(atomic_load_explicit(&t->pins_ended, memory_order_acquire) -
                begun) < 0;
         spins++)
      if (spins >= 64)
        sched_yield(); /* the launch may be waiting for the GPU's queue */
  }
  /* The shared record counts the pins of several threads: wait for a
   * moment with none in progress (ended read first, so that equal counts
   * prove it). */
  struct cs_thread *o = &overflow_thread;
  for (;;) {
    unsigned long ended =
        atomic_load_explicit(&o->pins_ended, memory_order_acquire);
    if (atomic_load(&o->pins_begun) == ended)
      break;
    sched_yield();
  }
}

/* Waits until no other thread is inside a call; false after `seconds`. */
static bool drain_calls(int seconds) {
  struct cs_thread *self = cs_tls_thread;
  heavy_barrier(); /* calls that missed the new state are marked now */
  struct timespec nap = {0, 1000000};
  for (long waited = 0; waited < seconds * 1000L; waited++) {
    bool busy = false;
    for (struct cs_thread *t = atomic_load(&threads); t && !busy; t = t->next)
      busy = t != self && atomic_load(&t->depth) > 0;
    if (!busy && (self == &overflow_thread ||
                  atomic_load(&overflow_thread.depth) == 0))
      return true;
    nanosleep(&nap, NULL);
  }
  return false;
}

cusafe_status cs_state_error(void) {
  if (atomic_load(&cs_hot.state) == CS_FORKED)
    return cs_fail(CUSAFE_ERROR_FORKED, "cusafe cannot be used in a process "
                                        "forked after CUDA was initialised");
  return cs_fail(CUSAFE_ERROR_SHUTDOWN, "cusafe has been shut down");
}

/* A child forked after CUDA was initialised cannot use CUDA (the runtime
 * answers cudaErrorInitializationError), and its exit must touch nothing of
 * the parent's: from here on every call fails and releases do nothing. */
static void at_fork_child(void) {
  atomic_store(&cs_hot.state, CS_FORKED);
}

static void at_exit(void) { cusafe_shutdown(); }

static cusafe_status driver_missing(cudaError_t err) {
  const char *words = cs_cu->get_error_string(err);
  cs_fail(CUSAFE_ERROR_NO_DRIVER, "no CUDA driver found: %s",
          words ? words : "unknown error");
  cs_note_cuda_error(err);
  return CUSAFE_ERROR_NO_DRIVER;
}

static cusafe_status load_driver_entry(const char *symbol, void **fn) {
  enum cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  cudaError_t err = cs_cu->get_driver_entry_point(symbol, fn, 12000,
                                                  cudaEnableDefault, &found);
  if (err != cudaSuccess)
    return driver_missing(err);
  if (found != cudaDriverEntryPointSuccess || !*fn)
    return cs_fail(CUSAFE_ERROR_NO_DRIVER,
                   "no CUDA driver found: the driver lacks %s", symbol);
  return CUSAFE_SUCCESS;
}

cusafe_status cs_init(int *count) {
  if (CS_LIKELY(atomic_load_explicit(&initialised, memory_order_acquire))) {
    *count = device_count;
    return CUSAFE_SUCCESS;
  }
  cusafe_status st = CUSAFE_SUCCESS;
  pthread_mutex_lock(&init_lock);
  if (!atomic_load_explicit(&initialised, memory_order_relaxed)) {
    int n = 0;
    cudaError_t err = cs_cu->get_device_count(&n);
    if (err == cudaErrorInsufficientDriver || err == cudaErrorStubLibrary) {
      st = driver_missing(err);
    } else if (err == cudaErrorNoDevice || (err == cudaSuccess && n == 0)) {
      st = cs_fail(CUSAFE_ERROR_NO_DEVICE, "no CUDA device found");
      if (err != cudaSuccess)
        cs_note_cuda_error(err);
    } else if (err != cudaSuccess) {
      st = cs_fail_cuda(err, "cudaGetDeviceCount");
    } else {
      /* The runtime registered its teardown with atexit at that first call;
       * ours, registered after it, runs before it (DESIGN.md, "Exit"). */
      if (!handlers_registered) {
        atexit(at_exit);
        pthread_atfork(NULL, NULL, at_fork_child);
        light_calls_init();
        handlers_registered = 1;
      }
      st = load_driver_entry("cuDevicePrimaryCtxRetain",
                             (void **)&primary_retain);
      if (st == CUSAFE_SUCCESS)
        st = load_driver_entry("cuDevicePrimaryCtxRelease",
                               (void **)&primary_release);
      if (st == CUSAFE_SUCCESS) {
        enum cudaDriverEntryPointQueryResult found;
        if (cs_cu->get_driver_entry_point("cuLibraryGetModule",
                                          (void **)&library_get_module, 12000,
                                          cudaEnableDefault, &found) !=
                cudaSuccess ||
            found != cudaDriverEntryPointSuccess)
          library_get_module = NULL;
        device_count = n;
        atomic_store(&cs_hot.single_device, n == 1);
        atomic_store_explicit(&initialised, 1, memory_order_release);
      }
    }
  }
  pthread_mutex_unlock(&init_lock);
  *count = st == CUSAFE_SUCCESS ? device_count : 0;
  return st;
}

CUresult cs_primary_ctx_retain(CUcontext *ctx, int device) {
  return primary_retain(ctx, (CUdevice)device);
}

CUresult cs_primary_ctx_release(int device) {
  return primary_release((CUdevice)device);
}

CUresult cs_library_load_now(cudaLibrary_t library) {
  CUmodule module;
  return library_get_module ? library_get_module(&module, (CUlibrary)library)
                            : CUDA_SUCCESS;
}

cusafe_status cs_device_switch(int device, int *saved) {
  int current;
  *saved = -1;
  cudaError_t err = cs_cu->get_device(&current);
  if (CS_UNLIKELY(err != cudaSuccess))
    return cs_fail_cuda(err, "cudaGetDevice");
  if (CS_LIKELY(current == device))
    return CUSAFE_SUCCESS;
  err = cs_cu->set_device(device);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaSetDevice");
  *saved = current; /* the caller's device comes back afterwards */
  return CUSAFE_SUCCESS;
}

cusafe_status cs_device_enter_teardown(int device, int *saved) {
  cusafe_status st = cs_device_enter(device, saved);
  return st == CUSAFE_SUCCESS ? st : cs_device_enter(device, saved);
}


cusafe_status cs_check_range(const char *what, const char *which,
                             size_t offset, size_t size, size_t limit) {
  if (CS_LIKELY(offset <= limit && size <= limit - offset))
    return CUSAFE_SUCCESS;
  return cs_fail(CUSAFE_ERROR_OUT_OF_RANGE,
                 "%s of %zu bytes at offset %zu exceeds %s%sbuffer of %zu "
                 "bytes",
                 what, size, offset, which ? which : "", which ? " " : "",
                 limit);
}

cusafe_status cs_check_device(int device, int *count) {
  cusafe_status st = cs_init(count);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (device < 0 || device >= *count)
    return cs_fail(CUSAFE_ERROR_INVALID_DEVICE,
                   "device %d is out of range: %d device(s) found", device,
                   *count);
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_device_count(int *out) {
  if (out)
    *out = 0;
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  return cs_init(out);
}

CUSAFE_API cusafe_status cusafe_device_get_properties(
    cusafe_device_properties *out, int device) {
  CS_ENTER();
  if (!out)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  int count;
  cusafe_status st = cs_check_device(device, &count);
  if (st != CUSAFE_SUCCESS)
    return st;
  struct cudaDeviceProp prop;
  cudaError_t err = cs_cu->get_device_properties(&prop, device);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaGetDeviceProperties");
  int pools = 0;
  err = cs_cu->device_get_attribute(&pools, cudaDevAttrMemoryPoolsSupported,
                                    device);
  if (err != cudaSuccess)
    return cs_fail_cuda(err, "cudaDeviceGetAttribute");
  memset(out, 0, sizeof *out);
  snprintf(out->name, sizeof out->name, "%.*s", (int)sizeof prop.name,
           prop.name);
  out->total_memory = prop.totalGlobalMem;
  out->compute_capability_major = prop.major;
  out->compute_capability_minor = prop.minor;
  out->multiprocessor_count = prop.multiProcessorCount;
  out->max_threads_per_block = prop.maxThreadsPerBlock;
  for (int i = 0; i < 3; i++) {
    out->max_block_dim[i] = prop.maxThreadsDim[i];
    out->max_grid_dim[i] = prop.maxGridSize[i];
  }
  out->shared_memory_per_block = prop.sharedMemPerBlock;
  out->shared_memory_per_block_optin = prop.sharedMemPerBlockOptin;
  out->warp_size = prop.warpSize;
  out->managed_memory = prop.managedMemory;
  out->concurrent_managed_access = prop.concurrentManagedAccess;
  out->memory_pools = pools;
  out->pci_bus_id = prop.pciBusID;
  out->pci_device_id = prop.pciDeviceID;
  out->pci_domain_id = prop.pciDomainID;
  return CUSAFE_SUCCESS;
}

/* ---- shutdown -------------------------------------------------------------------- */

static const char *const kind_names[] = {"device", "pinned host", "managed"};

/* One line per handle the program still holds. */
static void report_leak(struct cs_object *obj, void *arg) {
  (void)arg;
  if (cs_user_refs(obj) == 0)
    return; /* kept alive by its children only: they are reported */
  char what[160];
  switch (obj->type) {
  case CS_CONTEXT:
    snprintf(what, sizeof what, "device %d",
             ((struct cs_context *)obj)->device);
    break;
  case CS_STREAM:
    snprintf(what, sizeof what, "device %d",
             ((struct cs_stream *)obj)->queue.ctx->device);
    break;
  case CS_EVENT:
    snprintf(what, sizeof what, "device %d",
             ((struct cs_event *)obj)->ctx->device);
    break;
  case CS_BUFFER: {
    struct cs_buffer *b = (struct cs_buffer *)obj;
    snprintf(what, sizeof what, "%s%zu bytes of %s memory on device %d",
             b->parent ? "view of " : "", b->size, kind_names[b->kind],
             b->ctx->device);
    break;
  }
  case CS_MODULE: {
    struct cs_module *m = (struct cs_module *)obj;
    snprintf(what, sizeof what, "%s on device %d", m->name, m->ctx->device);
    break;
  }
  case CS_KERNEL: {
    struct cs_kernel *k = (struct cs_kernel *)obj;
    snprintf(what, sizeof what, "%s on device %d", k->name,
             k->module->ctx->device);
    break;
  }
  }
  static const char *const names[] = {"", "context", "stream", "event",
                                      "buffer", "module", "kernel"};
  const char *label = atomic_load(&obj->label);
  fprintf(stderr, "cusafe: leak: %s 0x%016llx (%s)%s%s%s\n", names[obj->type],
          (unsigned long long)obj->handle, what, label ? " \"" : "",
          label ? label : "", label ? "\"" : "");
}

/* Exit is ordered: synchronise, then buffers and views, events, streams,
 * kernels, modules, and contexts last (invariant 5).  Objects are retired
 * but their host memory stays reachable, so that a late caller reads valid
 * memory and gets an error, never a crash. */
CUSAFE_API cusafe_status cusafe_shutdown(void) {
  int expected = CS_RUNNING;
  if (!atomic_compare_exchange_strong(&cs_hot.state, &expected, CS_SHUT_DOWN))
    return CUSAFE_SUCCESS; /* done already, or a forked child */
  if (!atomic_load(&initialised))
    return CUSAFE_SUCCESS;
  /* New calls now fail; those in progress finish before anything goes. */
  if (!drain_calls(5))
    return CUSAFE_SUCCESS;
  const char *report = getenv("CUSAFE_LEAK_REPORT");
  if (report && !strcmp(report, "1"))
    for (enum cs_type t = CS_CONTEXT; t <= CS_TYPE_LAST; t++)
      cs_handle_foreach(t, report_leak, NULL);
  cs_handle_foreach(CS_CONTEXT, cs_context_shutdown_sync, NULL);
  cs_handle_foreach(CS_BUFFER, cs_buffer_shutdown, (void *)1); /* views */
  cs_handle_foreach(CS_BUFFER, cs_buffer_shutdown, NULL);
  cs_handle_foreach(CS_EVENT, cs_event_shutdown, NULL);
  cs_handle_foreach(CS_STREAM, cs_stream_shutdown, NULL);
  cs_handle_foreach(CS_KERNEL, cs_kernel_shutdown, NULL);
  cs_handle_foreach(CS_MODULE, cs_module_shutdown, NULL);
  cs_handle_foreach(CS_CONTEXT, cs_context_shutdown, NULL);
  return CUSAFE_SUCCESS;
}
