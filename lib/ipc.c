/* ipc.c -- device memory shared between processes: shareable buffers
 * (cusafe_buffer_alloc_shareable), their descriptions (cusafe_buffer_export,
 * cusafe_buffer_import) and the passing of those over Unix domain sockets
 * (cusafe_ipc_send, cusafe_ipc_recv).
 *
 * The memory is CUDA's virtual memory management: physical memory of
 * cuMemCreate, shareable as a POSIX file descriptor, mapped into a range of
 * cuMemAddressReserve and made accessible to its device.  The driver keeps
 * physical memory while any process holds a handle to it or maps it, so
 * that each process's buffer owns only its own mapping: a shareable or
 * imported buffer is a wrapped root (cs_buffer_wrap_new) whose give-back
 * (shared_end) unmaps, frees the range and releases the handle, after the
 * work queued on it -- and, as every give-back, before the primary context
 * goes and at the shutdown. */
#define _GNU_SOURCE /* MSG_CMSG_CLOEXEC, F_DUPFD_CLOEXEC */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "buffer.h"
#include "calls.h"
#include "context.h"
#include "device.h"
#include "init.h"

_Static_assert(sizeof(cusafe_ipc_desc) == 80, "cusafe_ipc_desc is 80 bytes");

/* ---- the driver's calls, looked up at the first use ---------------------- */

static struct {
  CUresult (*granularity)(size_t *, const CUmemAllocationProp *,
                          CUmemAllocationGranularity_flags);
  CUresult (*create)(CUmemGenericAllocationHandle *, size_t,
                     const CUmemAllocationProp *, unsigned long long);
  CUresult (*release)(CUmemGenericAllocationHandle);
  CUresult (*reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr,
                      unsigned long long);
  CUresult (*address_free)(CUdeviceptr, size_t);
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long);
  CUresult (*unmap)(CUdeviceptr, size_t);
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
  CUresult (*export_fd)(void *, CUmemGenericAllocationHandle,
                        CUmemAllocationHandleType, unsigned long long);
  CUresult (*import_fd)(CUmemGenericAllocationHandle *, void *,
                        CUmemAllocationHandleType);
} vmm;
static pthread_mutex_t vmm_lock = PTHREAD_MUTEX_INITIALIZER;
static bool vmm_found;

/* Looks the calls up once they are all there (a failed look-up is tried
 * again next time). */
static cusafe_status vmm_load(void) {
  static const char *const names[] = {"cuMemGetAllocationGranularity",
                                      "cuMemCreate",
                                      "cuMemRelease",
                                      "cuMemAddressReserve",
                                      "cuMemAddressFree",
                                      "cuMemMap",
                                      "cuMemUnmap",
                                      "cuMemSetAccess",
                                      "cuMemExportToShareableHandle",
                                      "cuMemImportFromShareableHandle"};
  void **slots[] = {(void **)&vmm.granularity,  (void **)&vmm.create,
                    (void **)&vmm.release,      (void **)&vmm.reserve,
                    (void **)&vmm.address_free, (void **)&vmm.map,
                    (void **)&vmm.unmap,        (void **)&vmm.set_access,
                    (void **)&vmm.export_fd,    (void **)&vmm.import_fd};
  _Static_assert(sizeof names / sizeof *names == sizeof slots / sizeof *slots,
                 "one slot per name");
  cusafe_status st = CUSAFE_SUCCESS;
  pthread_mutex_lock(&vmm_lock);
  for (size_t i = 0; i < sizeof names / sizeof *names && !vmm_found; i++) {
    st = cs_driver_lookup(names[i], slots[i]);
    if (st == CUSAFE_ERROR_NOT_FOUND)
      st = cs_fail(CUSAFE_ERROR_NOT_SUPPORTED,
                   "shareable memory needs the driver's %s, which it lacks",
                   names[i]);
    if (st != CUSAFE_SUCCESS)
      break;
  }
  if (st == CUSAFE_SUCCESS)
    vmm_found = true;
  pthread_mutex_unlock(&vmm_lock);
  return st;
}

static cusafe_status drv_failed(CUresult res, const char *function) {
  return cs_fail_cuda((cudaError_t)res, function);
}

/* ---- a process's mapping of shareable memory ----------------------------- */

struct shared_mem {
  CUmemGenericAllocationHandle handle;
  CUdeviceptr base; /* the mapping of the whole allocation */
  size_t size;      /* the allocation's bytes */
  int device;
  /* Of imported memory, which CUDA does not export again: a copy of the
   * descriptor it came by, which its exports copy; else -1.  In the list
   * of kept descriptors (below) while it is open. */
  int fd;
  struct shared_mem *prev, *next;
};

/* ---- the descriptors that imported memory keeps -------------------------
 *
 * Such a descriptor keeps the driver's memory allocated while it is open,
 * in any process.  An exec closes it (close-on-exec), but a child forked
 * without one would inherit it, and keep the memory of a buffer that the
 * parent has released until the child exits -- though the child can never
 * use it (every call fails in a forked child, and releases do nothing).  So
 * a fork closes them all in the child.  The list is guarded by kept_lock,
 * which a fork holds from its start (kept_prepare) until it is done in
 * both processes, so that the child finds it whole; a descriptor is opened
 * and closed under the lock, so that no fork sees one open and not listed,
 * or listed and closed. */

static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static struct shared_mem *kept; /* the list's head */
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;
static int kept_registered; /* pthread_atfork's result, set once */

static void kept_prepare(void) { pthread_mutex_lock(&kept_lock); }

static void kept_parent(void) { pthread_mutex_unlock(&kept_lock); }

static void kept_child(void) {
  for (struct shared_mem *m = kept; m; m = m->next) {
    close(m->fd);
    m->fd = -1;
  }
  kept = NULL;
  pthread_mutex_unlock(&kept_lock);
}

static void kept_register(void) {
  kept_registered = pthread_atfork(kept_prepare, kept_parent, kept_child);
}

/* Sets m->fd to a close-on-exec copy of fd, listed; -1 and errno on
 * failure. */
static int kept_dup(struct shared_mem *m, int fd) {
  pthread_once(&kept_once, kept_register);
  if (kept_registered != 0) {
    errno = kept_registered;
    return m->fd = -1;
  }
  pthread_mutex_lock(&kept_lock);
  m->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  int err = errno;
  if (m->fd >= 0) {
    m->prev = NULL;
    m->next = kept;
    if (kept)
      kept->prev = m;
    kept = m;
  }
  pthread_mutex_unlock(&kept_lock);
  errno = err;
  return m->fd;
}

/* Closes m->fd, if open, and takes it off the list. */
static void kept_close(struct shared_mem *m) {
  if (m->fd < 0)
    return;
  pthread_mutex_lock(&kept_lock);
  if (m->prev)
    m->prev->next = m->next;
  else
    kept = m->next;
  if (m->next)
    m->next->prev = m->prev;
  close(m->fd);
  m->fd = -1;
  pthread_mutex_unlock(&kept_lock);
}

static void allocation_prop(CUmemAllocationProp *prop, int device) {
  memset(prop, 0, sizeof *prop);
  prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop->location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop->location.id = device;
  prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
}

/* Undoes what mapped m, from step `done` down (3: all of it), the
 * device current; the first failure is the result.  A range whose unmap
 * failed is still mapped, and stays reserved; the handle is released in
 * any case (a mapping left keeps the memory as long as it lasts). */
static cusafe_status unmap_steps(const struct shared_mem *m, int done) {
  cusafe_status st = CUSAFE_SUCCESS;
  CUresult res;
  if (done >= 3 && (res = vmm.unmap(m->base, m->size)) != CUDA_SUCCESS)
    st = drv_failed(res, "cuMemUnmap");
  if (done >= 2 && st == CUSAFE_SUCCESS &&
      (res = vmm.address_free(m->base, m->size)) != CUDA_SUCCESS)
    st = drv_failed(res, "cuMemAddressFree");
  if (done >= 1 && (res = vmm.release(m->handle)) != CUDA_SUCCESS)
    st = cs_first(st, drv_failed(res, "cuMemRelease"));
  return st;
}

/* unmap_steps() after a failure, whose message and CUDA error stay the
 * thread's. */
static void undo(const struct shared_mem *m, int done) {
  struct cs_saved_error e;
  cs_error_save(&e);
  (void)unmap_steps(m, done);
  cs_error_restore(&e);
}

/* Maps m->handle's m->size bytes for m->device (current): m->base. */
static cusafe_status map_all(struct shared_mem *m) {
  CUresult res = vmm.reserve(&m->base, m->size, 0, 0, 0);
  if (res != CUDA_SUCCESS) {
    cusafe_status st = drv_failed(res, "cuMemAddressReserve");
    undo(m, 1);
    return st;
  }
  res = vmm.map(m->base, m->size, 0, m->handle, 0);
  if (res != CUDA_SUCCESS) {
    cusafe_status st = drv_failed(res, "cuMemMap");
    undo(m, 2);
    return st;
  }
  CUmemAccessDesc access;
  memset(&access, 0, sizeof access);
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = m->device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  res = vmm.set_access(m->base, m->size, &access, 1);
  if (res != CUDA_SUCCESS) {
    cusafe_status st = drv_failed(res, "cuMemSetAccess");
    undo(m, 3);
    return st;
  }
  return CUSAFE_SUCCESS;
}

/* The give-back of a shareable or imported buffer, once its work is done:
 * this process's mapping goes; the memory lives on in other processes'. */
static void shared_end(void *user) {
  struct shared_mem *m = user;
  int saved = -1;
  bool entered = cs_device_switch(m->device, &saved) == CUSAFE_SUCCESS;
  (void)unmap_steps(m, 3);
  if (entered)
    cs_device_leave(saved);
  kept_close(m);
  free(m);
}

/* Wraps the mapping m as a buffer of ctx of [offset, offset + size). */
static cusafe_status wrap_shared(cusafe_buffer *out, struct cs_context *ctx,
                                 struct shared_mem *m, size_t offset,
                                 size_t size) {
  return cs_buffer_wrap_new(out, ctx, CUSAFE_MEMORY_DEVICE,
                            (char *)(uintptr_t)m->base + offset, size,
                            shared_end, m);
}

/* The mapping of b's memory, if it is shareable. */
static const struct shared_mem *shared_of(const struct cs_buffer *b) {
  const struct cs_buffer *root = b->root;
  return root->wrapped && root->release == shared_end ? root->user : NULL;
}

/* ---- the process's name -------------------------------------------------- */

/* This process as cusafe names it in descriptions: its pid and a random
 * word, drawn again after a fork. */
static uint64_t process_token(void) {
  static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
  static uint64_t token;
  static pid_t token_pid;
  pid_t pid = getpid();
  pthread_mutex_lock(&lock);
  if (token_pid != pid) {
    uint64_t r = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd < 0 || read(fd, &r, sizeof r) != (ssize_t)sizeof r) {
      struct timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      r = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec;
    }
    if (fd >= 0)
      close(fd);
    token = (uint64_t)(uint32_t)pid << 32 | (r & 0xffffffffu);
    token_pid = pid;
  }
  uint64_t t = token;
  pthread_mutex_unlock(&lock);
  return t;
}

/* ---- allocation ---------------------------------------------------------- */

CUSAFE_API cusafe_status cusafe_buffer_alloc_shareable(cusafe_buffer *out,
                                                       cusafe_context ctx_h,
                                                       size_t size) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  CS_HOLD_OR_RETURN(cs_context, ctx, ctx_h, CS_CONTEXT, "context");
  if (size == 0)
    return cs_fail(CUSAFE_ERROR_INVALID_SIZE,
                   "a shareable buffer of 0 bytes: it must have 1 or more");
  cusafe_status st = vmm_load();
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  CUmemAllocationProp prop;
  allocation_prop(&prop, ctx->device);
  size_t granule = 0;
  CUresult res =
      vmm.granularity(&granule, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
  struct shared_mem *m = NULL;
  if (res != CUDA_SUCCESS) {
    st = drv_failed(res, "cuMemGetAllocationGranularity");
  } else if (granule == 0 || size > SIZE_MAX - (granule - 1)) {
    st = cs_fail(CUSAFE_ERROR_INVALID_SIZE,
                 "a shareable buffer of %zu bytes cannot be rounded up to "
                 "the device's granularity of %zu bytes",
                 size, granule);
  } else if (!(m = calloc(1, sizeof *m))) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  } else {
    m->size = (size + granule - 1) / granule * granule;
    m->device = ctx->device;
    m->fd = -1;
    if (m->size > ctx->total_memory)
      st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                   "allocation of %zu bytes exceeds the %zu bytes of device "
                   "%d",
                   m->size, ctx->total_memory, ctx->device);
    else if ((res = vmm.create(&m->handle, m->size, &prop, 0)) != CUDA_SUCCESS)
      st = drv_failed(res, "cuMemCreate");
    else
      st = map_all(m); /* on failure, the handle is released */
    if (st == CUSAFE_SUCCESS) {
      st = wrap_shared(out, ctx, m, 0, size);
      if (st != CUSAFE_SUCCESS)
        undo(m, 3);
    }
    if (st != CUSAFE_SUCCESS) {
      free(m);
      m = NULL;
    }
  }
  cs_device_leave(saved);
  if (st == CUSAFE_SUCCESS)
    ctx = NULL; /* the buffer's reference now */
  return st;
}

/* ---- export and import --------------------------------------------------- */

CUSAFE_API cusafe_status cusafe_buffer_export(cusafe_ipc_desc *out,
                                              cusafe_buffer buffer) {
  if (out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
  }
  CS_ENTER();
  if (!out)
    return cs_null("out");
  CS_HOLD_OR_RETURN(cs_buffer, b, buffer, CS_BUFFER, "buffer");
  const struct shared_mem *m = shared_of(b);
  if (!m)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "buffer 0x%llx is not shareable: allocate it with "
                   "cusafe_buffer_alloc_shareable",
                   (unsigned long long)buffer);
  struct cs_context *ctx = b->ctx;
  /* The work queued on it so far, on any stream, is done first: the
   * context's own stream takes the buffer's chain, and is waited for. */
  struct cs_buffer *bufs[1] = {b};
  cusafe_status st = cs_buffers_use_on(bufs, 1, &ctx->queue, false);
  if (st == CUSAFE_SUCCESS)
    st = cs_device_wait(ctx->device, ctx->queue.stream, NULL, false);
  if (st != CUSAFE_SUCCESS)
    return st;
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS)
    return st;
  int fd = -1;
  CUresult res = CUDA_SUCCESS;
  if (m->fd >= 0) /* imported: a copy of the descriptor it came by */
    fd = fcntl(m->fd, F_DUPFD_CLOEXEC, 0);
  else
    res = vmm.export_fd(&fd, m->handle,
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  cs_device_leave(saved);
  if (res != CUDA_SUCCESS)
    return drv_failed(res, "cuMemExportToShareableHandle");
  if (fd < 0)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                   "cannot copy the descriptor of imported memory: %s",
                   strerror(errno));
  /* The driver's descriptor, close-on-exec as every one cusafe hands out. */
  (void)fcntl(fd, F_SETFD, FD_CLOEXEC);
  out->version = CUSAFE_IPC_VERSION;
  out->fd = fd;
  out->allocation = m->size;
  out->offset = (uint64_t)(b->ptr - (char *)(uintptr_t)m->base);
  out->size = b->size;
  memcpy(out->device_uuid, ctx->uuid, sizeof out->device_uuid);
  out->process = process_token();
  return CUSAFE_SUCCESS;
}

/* "GPU-01234567-89ab-cdef-0123-456789abcdef" */
static void uuid_words(const unsigned char u[16], char *out, size_t n) {
  snprintf(out, n,
           "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
           "%02x%02x%02x%02x%02x%02x",
           u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10],
           u[11], u[12], u[13], u[14], u[15]);
}

/* Checks what a description says before anything is asked of CUDA. */
static cusafe_status desc_check(const cusafe_ipc_desc *d,
                                const struct cs_context *ctx) {
  if (d->version != CUSAFE_IPC_VERSION)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "desc has version %u; this cusafe reads version %u",
                   d->version, CUSAFE_IPC_VERSION);
  for (int i = 0; i < 3; i++)
    if (d->reserved[i])
      return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                     "desc has reserved[%d] %llu; it must be 0", i,
                     (unsigned long long)d->reserved[i]);
  if (d->process == process_token())
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "buffer exported by this process: use the buffer itself");
  if (d->fd < 0 || fcntl(d->fd, F_GETFD) < 0)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "desc's fd %d is not an open file descriptor", (int)d->fd);
  if (d->size > d->allocation || d->offset > d->allocation - d->size)
    return cs_fail(CUSAFE_ERROR_OUT_OF_RANGE,
                   "a buffer of %llu bytes at offset %llu reaches beyond its "
                   "allocation of %llu bytes",
                   (unsigned long long)d->size, (unsigned long long)d->offset,
                   (unsigned long long)d->allocation);
  if (memcmp(d->device_uuid, ctx->uuid, sizeof ctx->uuid) != 0) {
    char theirs[48], ours[48];
    uuid_words(d->device_uuid, theirs, sizeof theirs);
    uuid_words(ctx->uuid, ours, sizeof ours);
    return cs_fail(CUSAFE_ERROR_CONTEXT_MISMATCH,
                   "the memory is on device %s but context belongs to device "
                   "%d (%s)",
                   theirs, ctx->device, ours);
  }
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_buffer_import(cusafe_buffer *out,
                                              cusafe_context ctx_h,
                                              const cusafe_ipc_desc *desc) {
  CS_ENTER_OUT(out, CUSAFE_NULL_HANDLE);
  if (!desc)
    return cs_null("desc");
  CS_HOLD_OR_RETURN(cs_context, ctx, ctx_h, CS_CONTEXT, "context");
  cusafe_status st = desc_check(desc, ctx);
  if (st == CUSAFE_SUCCESS)
    st = vmm_load();
  if (st != CUSAFE_SUCCESS)
    return st;
  struct shared_mem *m = calloc(1, sizeof *m);
  if (!m)
    return cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY, "out of host memory");
  m->size = (size_t)desc->allocation;
  m->device = ctx->device;
  if (kept_dup(m, desc->fd) < 0) {
    st = cs_fail(CUSAFE_ERROR_OUT_OF_MEMORY,
                 "cannot keep a copy of desc's fd %d: %s", (int)desc->fd,
                 strerror(errno));
    free(m);
    return st;
  }
  int saved;
  st = cs_device_enter(ctx->device, &saved);
  if (st != CUSAFE_SUCCESS) {
    kept_close(m);
    free(m);
    return st;
  }
  CUresult res = vmm.import_fd(&m->handle, (void *)(intptr_t)desc->fd,
                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  /* Drivers answer a descriptor of no shareable memory variously (an
   * invalid value, handle, or an unknown error): all but running out of
   * memory say that of the descriptor. */
  if (res == CUDA_ERROR_OUT_OF_MEMORY) {
    st = drv_failed(res, "cuMemImportFromShareableHandle");
  } else if (res != CUDA_SUCCESS) {
    const char *words = cs_cu->get_error_string((cudaError_t)res);
    st = cs_fail_as(CUSAFE_ERROR_INVALID_VALUE, (cudaError_t)res,
                    "cuMemImportFromShareableHandle failed: %s (the fd of "
                    "desc is no shareable CUDA memory)",
                    words ? words : "unknown error");
  } else
    st = map_all(m); /* on failure, the handle is released */
  if (st == CUSAFE_SUCCESS) {
    st = wrap_shared(out, ctx, m, (size_t)desc->offset, (size_t)desc->size);
    if (st != CUSAFE_SUCCESS)
      undo(m, 3);
  }
  cs_device_leave(saved);
  if (st != CUSAFE_SUCCESS) {
    kept_close(m);
    free(m);
    return st;
  }
  ctx = NULL; /* the buffer's reference now */
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_ipc_device(int *out,
                                           const cusafe_ipc_desc *desc) {
  CS_ENTER_OUT(out, -1);
  if (!desc)
    return cs_null("desc");
  if (desc->version != CUSAFE_IPC_VERSION)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "desc has version %u; this cusafe reads version %u",
                   desc->version, CUSAFE_IPC_VERSION);
  int count;
  cusafe_status st = cs_init(&count);
  if (st != CUSAFE_SUCCESS)
    return st;
  for (int d = 0; d < count; d++) {
    struct cudaDeviceProp prop;
    cudaError_t err = cs_cu->get_device_properties(&prop, d);
    if (err != cudaSuccess)
      return cs_fail_cuda(err, "cudaGetDeviceProperties");
    if (memcmp(prop.uuid.bytes, desc->device_uuid, sizeof desc->device_uuid) ==
        0) {
      *out = d;
      return CUSAFE_SUCCESS;
    }
  }
  char words[48];
  uuid_words(desc->device_uuid, words, sizeof words);
  return cs_fail(CUSAFE_ERROR_INVALID_DEVICE,
                 "the memory is on device %s, which this process does not "
                 "see",
                 words);
}

/* ---- descriptors over Unix domain sockets -------------------------------- */

/* What travels: a tag, then the description (its fd field as sent). */
struct wire {
  char tag[8];
  cusafe_ipc_desc desc;
};
static const char wire_tag[8] = "cusafe1";

CUSAFE_API cusafe_status cusafe_ipc_send(int socket,
                                         const cusafe_ipc_desc *desc) {
  CS_ENTER();
  if (!desc)
    return cs_null("desc");
  if (desc->version != CUSAFE_IPC_VERSION)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "desc has version %u; this cusafe sends version %u",
                   desc->version, CUSAFE_IPC_VERSION);
  if (desc->fd < 0)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "desc's fd is %d",
                   (int)desc->fd);
  if (fcntl(desc->fd, F_GETFD) < 0)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "desc's fd %d is not an open file descriptor",
                   (int)desc->fd);
  struct wire w;
  memset(&w, 0, sizeof w);
  memcpy(w.tag, wire_tag, sizeof w.tag);
  w.desc = *desc;
  struct iovec iov = {&w, sizeof w};
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
  } control;
  memset(&control, 0, sizeof control);
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  int fd = desc->fd;
  memcpy(CMSG_DATA(c), &fd, sizeof fd);
  ssize_t n;
  do
    n = sendmsg(socket, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "cannot send on socket %d: %s",
                   socket, strerror(errno));
  if ((size_t)n != sizeof w)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "socket %d took %zd of the %zu bytes of a description",
                   socket, n, sizeof w);
  return CUSAFE_SUCCESS;
}

CUSAFE_API cusafe_status cusafe_ipc_recv(int socket, cusafe_ipc_desc *out) {
  if (out) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
  }
  CS_ENTER();
  if (!out)
    return cs_null("out");
  struct wire w;
  struct iovec iov = {&w, sizeof w};
  /* Room for what else the socket may carry with it: the peer's
   * credentials (SO_PASSCRED), a security label, and descriptors beyond
   * the one expected, which are closed. */
  union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(256) +
             CMSG_SPACE(16 * sizeof(int))];
  } control;
  struct msghdr msg = {.msg_iov = &iov,
                       .msg_iovlen = 1,
                       .msg_control = control.buf,
                       .msg_controllen = sizeof control.buf};
  ssize_t n;
  do
    n = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
  while (n < 0 && errno == EINTR);
  if (n < 0)
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE,
                   "cannot receive on socket %d: %s", socket, strerror(errno));
  /* Every descriptor that came is this call's: one is kept, at most. */
  int fd = -1, extra = 0;
  for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < k; i++) {
        int got;
        memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof got);
        if (fd < 0) {
          fd = got;
        } else {
          close(got);
          extra++;
        }
      }
    }
  const char *why = NULL;
  if (n == 0)
    why = "closed by its peer";
  else if ((size_t)n != sizeof w || memcmp(w.tag, wire_tag, sizeof w.tag))
    why = "sent something that is not a description of cusafe_ipc_send";
  else if (msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC))
    why = "sent a truncated message";
  else if (fd < 0)
    why = "sent a description without its file descriptor";
  else if (extra)
    why = "sent more than one file descriptor";
  if (why) {
    if (fd >= 0)
      close(fd);
    return cs_fail(CUSAFE_ERROR_INVALID_VALUE, "socket %d %s", socket, why);
  }
  *out = w.desc;
  out->fd = fd;
  return CUSAFE_SUCCESS;
}
