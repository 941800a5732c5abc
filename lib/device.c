/* device.c -- devices: the current device of a call, the device count and
 * properties. */
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "init.h"

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

cusafe_status cs_device_teardown(int device, cudaError_t (*destroy)(void *),
                                 void *what, const char *function) {
  int saved;
  cusafe_status st = cs_device_enter(device, &saved);
  cudaError_t err = destroy(what);
  if (err != cudaSuccess && st == CUSAFE_SUCCESS)
    st = cs_fail_cuda(err, function);
  cs_device_leave(saved);
  return st;
}

cusafe_status cs_device_wait(int device, cudaStream_t stream, cudaEvent_t event,
                             bool query) {
  int saved;
  cusafe_status st = cs_device_enter(device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  if (event)
    st = query ? cs_status_pending(cs_cu->event_query(event), "cudaEventQuery")
               : cs_status_pending(cs_cu->event_synchronize(event),
                                   "cudaEventSynchronize");
  else
    st = query
             ? cs_status_pending(cs_cu->stream_query(stream), "cudaStreamQuery")
             : cs_status_pending(cs_cu->stream_synchronize(stream),
                                 "cudaStreamSynchronize");
  cs_device_leave(saved);
  return st;
}

cusafe_status cs_device_idle(int device, int *saved) {
  cusafe_status st = cs_device_enter_teardown(device, saved);
  if (st == CUSAFE_SUCCESS) {
    cudaError_t err = cs_cu->device_synchronize();
    if (err != cudaSuccess)
      st = cs_fail_cuda(err, "cudaDeviceSynchronize");
  }
  return st;
}

CUSAFE_API cusafe_status cusafe_device_count(int *out) {
  CS_ENTER_OUT(out, 0);
  return cs_init(out);
}

CUSAFE_API cusafe_status
cusafe_device_get_properties(cusafe_device_properties *out, int device) {
  CS_ENTER();
  if (!out)
    return cs_null("out");
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

/* ---- peers --------------------------------------------------------------- */

/* Devices beyond this many are left to CUDA's staged copies. */
#define PEER_DEVICES 64

enum { PEER_UNTRIED, PEER_BUSY, PEER_DONE };
/* Per pair a < b: whether cs_peer_enable() has run. */
static _Atomic unsigned char peer_state[PEER_DEVICES][PEER_DEVICES];

/* Lets `from` reach the memory of `to` (`from` current); false if a CUDA
 * call failed, and left its error as the thread's last. */
static bool peer_reach(int from, int to) {
  int can = 0;
  cudaError_t err = cs_cu->device_can_access_peer(&can, from, to);
  if (err != cudaSuccess || !can)
    return err == cudaSuccess;
  /* cudaErrorPeerAccessAlreadyEnabled: by another library sharing the
   * primary context; the pool's access list is set all the same. */
  bool clean = cs_cu->device_enable_peer_access(to, 0) == cudaSuccess;
  /* Memory from a pool (cudaMallocAsync, as cusafe allocates) follows the
   * pool's access list instead. */
  cudaMemPool_t pool;
  if (cs_cu->device_get_mem_pool(&pool, to) != cudaSuccess)
    return false;
  struct cudaMemAccessDesc desc = {
      .location = {.type = cudaMemLocationTypeDevice, .id = from},
      .flags = cudaMemAccessFlagsProtReadWrite};
  return cs_cu->mem_pool_set_access(pool, &desc, 1) == cudaSuccess && clean;
}

cusafe_status cs_peer_enable(int a, int b) {
  if (a > b) {
    int t = a;
    a = b;
    b = t;
  }
  if (a < 0 || b >= PEER_DEVICES || a == b)
    return CUSAFE_SUCCESS;
  unsigned char untried = PEER_UNTRIED;
  if (CS_LIKELY(atomic_load_explicit(&peer_state[a][b], memory_order_relaxed) !=
                PEER_UNTRIED) ||
      !atomic_compare_exchange_strong(&peer_state[a][b], &untried, PEER_BUSY))
    return CUSAFE_SUCCESS; /* done, or being done: the copy goes either way */
  int current;
  cudaError_t err = cs_cu->get_device(&current);
  if (err != cudaSuccess) {
    atomic_store(&peer_state[a][b], PEER_UNTRIED);
    return cs_fail_cuda(err, "cudaGetDevice");
  }
  /* In relaxed capture mode: these are no stream work, and must not break
   * a capture that other code began in global mode on another thread.
   * Both ways, whatever fails: each is worth having. */
  enum cudaStreamCaptureMode mode;
  bool relaxed = cs_relax(&mode);
  bool ok = cs_cu->set_device(a) == cudaSuccess && peer_reach(a, b);
  ok = cs_cu->set_device(b) == cudaSuccess && peer_reach(b, a) && ok;
  ok = cs_cu->set_device(current) == cudaSuccess && ok;
  cs_unrelax(relaxed, mode);
  if (!ok)
    cs_cu->get_last_error(); /* the copy's outcome is the copy's own */
  atomic_store(&peer_state[a][b], PEER_DONE);
  return CUSAFE_SUCCESS;
}

void cs_peer_forget(int device) {
  if (device < 0 || device >= PEER_DEVICES)
    return;
  for (int i = 0; i < PEER_DEVICES; i++) {
    atomic_store(&peer_state[device][i], PEER_UNTRIED);
    atomic_store(&peer_state[i][device], PEER_UNTRIED);
  }
}
