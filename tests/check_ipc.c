/* check_ipc.c -- memory shared between processes: shareable buffers, their
 * descriptions, the sockets that carry them, and what each process keeps
 * when the other releases, exits or is killed.
 *
 * Built twice: against the fake CUDA (check_ipc_fake: each test in a
 * process of its own), whose shareable memory is a memfd that other
 * processes map as a GPU's would be, and against the real one
 * (check_ipc_gpu).  The other process of a test is this program again,
 * started with "--child ROLE ...": a fresh process, as another program
 * would be (a forked child could not use CUDA). */
#define _GNU_SOURCE
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cusafe.h"
#include "testutil.h"
#ifdef CUSAFE_HAVE_DLPACK
#include "cusafe_dlpack.h"
#endif
#ifdef CUSAFE_TEST_FAKE
#include "fakecuda.h"
#include "fakeutil.h"
#endif

extern char **environ;

/* This program, as it was started: spawned again for the other process
 * (not /proc/self/exe, which under Valgrind is Valgrind's tool). */
static const char *self_path = "/proc/self/exe";

#define BYTES ((size_t)3 << 20) /* more than one granule of 2 MiB */

/* ---- the other process --------------------------------------------------- */

/* Exits the child with a line on stderr. */
static void child_die(const char *what, cusafe_status st) {
  fprintf(stderr, "child: %s: %s: %s\n", what, cusafe_status_string(st),
          cusafe_last_error_message());
  exit(3);
}
#define CHILD_OK(expr)                                                         \
  do {                                                                         \
    cusafe_status c_st_ = (expr);                                              \
    if (c_st_ != CUSAFE_SUCCESS)                                               \
      child_die(#expr, c_st_);                                                 \
  } while (0)

static void child_ack_wait(int sock) {
  char c;
  if (read(sock, &c, 1) != 1) {
    fprintf(stderr, "child: no ack\n");
    exit(3);
  }
}

/* export SOCK SIZE SEED END: allocates a shareable buffer, writes
 * tu_pattern(SEED) into it, exports it and sends the description; END:
 *   "release": waits for the parent's byte, releases, exits 0;
 *   "kill": SIGKILLs itself at once, buffer alive;
 *   "kill-after-ack": waits for the parent's byte, then SIGKILLs itself;
 *   "read": waits for the parent's byte, then checks that the memory holds
 *     tu_pattern(SEED + 1) (the parent's writes), releases, exits 0. */
static int child_export(int sock, size_t size, uint32_t seed, const char *end) {
  cusafe_context ctx;
  cusafe_buffer b;
  CHILD_OK(cusafe_context_create(&ctx, 0));
  CHILD_OK(cusafe_buffer_alloc_shareable(&b, ctx, size));
  unsigned char *data = tu_xmalloc(size);
  tu_pattern(data, size, seed);
  CHILD_OK(cusafe_buffer_write(b, 0, data, size));
  cusafe_ipc_desc d;
  CHILD_OK(cusafe_buffer_export(&d, b));
  CHILD_OK(cusafe_ipc_send(sock, &d));
  close(d.fd);
  if (strcmp(end, "kill") == 0)
    raise(SIGKILL);
  child_ack_wait(sock);
  if (strcmp(end, "kill-after-ack") == 0)
    raise(SIGKILL);
  if (strcmp(end, "read") == 0) {
    unsigned char *got = tu_xmalloc(size);
    tu_pattern(data, size, seed + 1);
    CHILD_OK(cusafe_buffer_read(b, 0, got, size));
    if (memcmp(got, data, size) != 0) {
      fprintf(stderr, "child: the parent's writes are not there\n");
      exit(4);
    }
    free(got);
  }
  CHILD_OK(cusafe_buffer_release(b));
  CHILD_OK(cusafe_context_release(ctx));
  free(data);
  return 0;
}

/* import SOCK SEED END: receives a description, imports it, checks that it
 * holds tu_pattern(SEED), writes tu_pattern(SEED + 1), sends a byte; END:
 *   "release": releases everything and exits 0;
 *   "leave": exits with the buffer and its context alive. */
static int child_import(int sock, uint32_t seed, const char *end) {
  cusafe_context ctx;
  cusafe_buffer b;
  cusafe_ipc_desc d;
  CHILD_OK(cusafe_context_create(&ctx, 0));
  CHILD_OK(cusafe_ipc_recv(sock, &d));
  CHILD_OK(cusafe_buffer_import(&b, ctx, &d));
  close(d.fd);
  size_t size = (size_t)d.size;
  unsigned char *want = tu_xmalloc(size), *got = tu_xmalloc(size);
  tu_pattern(want, size, seed);
  CHILD_OK(cusafe_buffer_read(b, 0, got, size));
  if (memcmp(got, want, size) != 0) {
    fprintf(stderr, "child: the imported memory does not hold the pattern\n");
    exit(4);
  }
  tu_pattern(want, size, seed + 1);
  CHILD_OK(cusafe_buffer_write(b, 0, want, size));
  char c = 'k';
  if (write(sock, &c, 1) != 1)
    exit(5);
  if (strcmp(end, "leave") == 0)
    exit(0);
  CHILD_OK(cusafe_buffer_release(b));
  CHILD_OK(cusafe_context_release(ctx));
  free(want);
  free(got);
  return 0;
}

static int child_main(int argc, char **argv) {
  if (argc == 7 && strcmp(argv[2], "export") == 0)
    return child_export(atoi(argv[3]), (size_t)strtoull(argv[4], NULL, 10),
                        (uint32_t)strtoul(argv[5], NULL, 10), argv[6]);
  if (argc == 6 && strcmp(argv[2], "import") == 0)
    return child_import(atoi(argv[3]), (uint32_t)strtoul(argv[4], NULL, 10),
                        argv[5]);
  fprintf(stderr, "child: bad arguments\n");
  return 2;
}

/* A child of this program: "--child" and args, with its end of a socket
 * pair (*sock: the parent's end) and its stderr into *err_fd. */
struct child {
  pid_t pid;
  int sock;   /* the parent's end */
  int err_fd; /* the child's stderr, to read */
};

static struct child spawn_child(const char *role, const char *a, const char *b,
                                const char *c) {
  int sv[2], ep[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  ck_assert_int_eq(pipe(ep), 0);
  char fd_arg[16];
  snprintf(fd_arg, sizeof fd_arg, "%d", sv[1]);
  char *args[8] = {"check_ipc", "--child", (char *)role, fd_arg,
                   (char *)a,   (char *)b, (char *)c,    NULL};
  if (!c)
    args[6] = NULL;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, ep[1], 2);
  posix_spawn_file_actions_addclose(&fa, ep[0]);
  posix_spawn_file_actions_addclose(&fa, sv[0]);
  struct child ch;
  ck_assert_int_eq(posix_spawn(&ch.pid, self_path, &fa, NULL, args, environ),
                   0);
  posix_spawn_file_actions_destroy(&fa);
  close(sv[1]);
  close(ep[1]);
  ch.sock = sv[0];
  ch.err_fd = ep[0];
  return ch;
}

/* Waits for the child: its wait status, its stderr into err. */
static int child_wait(struct child *ch, char *err, size_t n) {
  size_t len = 0;
  ssize_t got;
  while (len + 1 < n && (got = read(ch->err_fd, err + len, n - 1 - len)) > 0)
    len += (size_t)got;
  err[len] = '\0';
  int status = 0;
  ck_assert_int_eq(waitpid(ch->pid, &status, 0), ch->pid);
  close(ch->err_fd);
  close(ch->sock);
  return status;
}

static void ack(const struct child *ch) {
  char c = 'a';
  ck_assert_int_eq(write(ch->sock, &c, 1), 1);
}

#define CHILD_EXITED_0(status, err)                                            \
  TU_ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 0,                     \
            "child ended with status 0x%x; its stderr: %s", (status), (err))

/* ---- fixtures ------------------------------------------------------------ */

static cusafe_context ctx;

static void ctx_setup(void) {
  ctx = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_context_create(&ctx, 0));
}

static void ctx_teardown(void) {
  (void)cusafe_context_release(ctx);
  ctx = CUSAFE_NULL_HANDLE;
}

static cusafe_buffer shareable(size_t size) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc_shareable(&b, ctx, size));
  return b;
}

/* Another process's description of this one's export: imports it as the
 * other process would (the driver lets a process import its own). */
static cusafe_ipc_desc as_if_foreign(cusafe_ipc_desc d) {
  d.process ^= 0x5a5a5a5a5a5a5a5aull;
  return d;
}

static void check_pattern(cusafe_buffer b, size_t size, uint32_t seed) {
  unsigned char *want = tu_xmalloc(size), *got = tu_xmalloc(size);
  tu_pattern(want, size, seed);
  memset(got, 0, size);
  TU_OK(cusafe_buffer_read(b, 0, got, size));
  TU_BYTES_EQ(got, want, size);
  free(want);
  free(got);
}

static void write_pattern(cusafe_buffer b, size_t size, uint32_t seed) {
  unsigned char *data = tu_xmalloc(size);
  tu_pattern(data, size, seed);
  TU_OK(cusafe_buffer_write(b, 0, data, size));
  free(data);
}

/* ---- one process --------------------------------------------------------- */

/* A shareable buffer is a buffer like any other; its description says
 * where it lies in its allocation, rounded up to 2 MiB. */
START_TEST(test_export_describes) {
  cusafe_buffer b = shareable(1000), v = CUSAFE_NULL_HANDLE;
  size_t size = 0;
  TU_OK(cusafe_buffer_get_size(&size, b));
  ck_assert_uint_eq(size, 1000);
  cusafe_memory kind = CUSAFE_MEMORY_MANAGED;
  TU_OK(cusafe_buffer_get_memory(&kind, b));
  ck_assert_int_eq(kind, CUSAFE_MEMORY_DEVICE);
  write_pattern(b, 1000, 7);
  check_pattern(b, 1000, 7);
  TU_OK(cusafe_buffer_view(&v, b, 100, 50));
  cusafe_ipc_desc d, dv;
  TU_OK(cusafe_buffer_export(&d, b));
  TU_OK(cusafe_buffer_export(&dv, v));
  ck_assert_uint_eq(d.version, CUSAFE_IPC_VERSION);
  ck_assert_int_ge(d.fd, 0);
  ck_assert_int_ne(d.fd, dv.fd);
  ck_assert_int_eq(fcntl(d.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ck_assert_uint_eq(d.allocation % ((size_t)2 << 20), 0);
  ck_assert_uint_ge(d.allocation, 1000);
  ck_assert_uint_eq(d.offset, 0);
  ck_assert_uint_eq(d.size, 1000);
  ck_assert_uint_eq(dv.offset, 100);
  ck_assert_uint_eq(dv.size, 50);
  ck_assert_uint_eq(dv.allocation, d.allocation);
  ck_assert_uint_eq(d.process, dv.process);
  ck_assert_uint_eq(d.process >> 32, (uint64_t)getpid());
  for (int i = 0; i < 3; i++)
    ck_assert_uint_eq(d.reserved[i], 0);
  unsigned char zero[16] = {0};
  ck_assert_int_ne(memcmp(d.device_uuid, zero, 16), 0);
  ck_assert_int_eq(memcmp(d.device_uuid, dv.device_uuid, 16), 0);
  close(d.fd);
  close(dv.fd);
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* The imported mapping is the same memory: what one writes, the other
 * reads; each release unmaps its own mapping only. */
START_TEST(test_import_maps_same_memory) {
  cusafe_buffer b = shareable(BYTES), v = CUSAFE_NULL_HANDLE,
                in = CUSAFE_NULL_HANDLE, inv = CUSAFE_NULL_HANDLE;
  write_pattern(b, BYTES, 11);
  TU_OK(cusafe_buffer_view(&v, b, 4096, 8192));
  cusafe_ipc_desc d, dv;
  TU_OK(cusafe_buffer_export(&d, b));
  TU_OK(cusafe_buffer_export(&dv, v));
  cusafe_ipc_desc f = as_if_foreign(d), fv = as_if_foreign(dv);
  TU_OK(cusafe_buffer_import(&in, ctx, &f));
  TU_OK(cusafe_buffer_import(&inv, ctx, &fv));
  close(d.fd); /* the imports do not need it any more */
  close(dv.fd);
  size_t size = 0;
  TU_OK(cusafe_buffer_get_size(&size, inv));
  ck_assert_uint_eq(size, 8192);
  check_pattern(in, BYTES, 11);
  TU_OK(cusafe_buffer_release(b)); /* the exporter's mapping goes */
  TU_OK(cusafe_buffer_release(v));
  check_pattern(in, BYTES, 11);
  write_pattern(inv, 8192, 12);
  unsigned char want[8192], got[8192];
  tu_pattern(want, sizeof want, 12);
  TU_OK(cusafe_buffer_read(in, 4096, got, sizeof got));
  TU_BYTES_EQ(got, want, sizeof got);
  TU_OK(cusafe_buffer_release(in));
  TU_OK(cusafe_buffer_release(inv));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
#endif
}
END_TEST

START_TEST(test_alloc_refusals) {
  cusafe_buffer b = (cusafe_buffer)0x1234;
  TU_ERR(cusafe_buffer_alloc_shareable(&b, ctx, 0), CUSAFE_ERROR_INVALID_SIZE,
         "a shareable buffer of 0 bytes: it must have 1 or more");
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
  TU_ERR(cusafe_buffer_alloc_shareable(NULL, ctx, 8),
         CUSAFE_ERROR_INVALID_VALUE, "out is NULL");
  TU_STATUS(cusafe_buffer_alloc_shareable(&b, CUSAFE_NULL_HANDLE, 8),
            CUSAFE_ERROR_INVALID_HANDLE);
  TU_STATUS(cusafe_buffer_alloc_shareable(&b, ctx, SIZE_MAX),
            CUSAFE_ERROR_INVALID_SIZE);
  TU_STATUS(cusafe_buffer_alloc_shareable(&b, ctx, SIZE_MAX / 2),
            CUSAFE_ERROR_OUT_OF_MEMORY);
  ck_assert_uint_eq(b, CUSAFE_NULL_HANDLE);
}
END_TEST

START_TEST(test_export_refusals) {
  cusafe_buffer plain = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_alloc(&plain, ctx, CUSAFE_MEMORY_DEVICE, 64));
  TU_OK(cusafe_buffer_view(&v, plain, 8, 8));
  cusafe_ipc_desc d;
  d.fd = 5;
  TU_ERR(cusafe_buffer_export(&d, plain), CUSAFE_ERROR_INVALID_VALUE,
         "buffer 0x%llx is not shareable: allocate it with "
         "cusafe_buffer_alloc_shareable",
         TU_HX(plain));
  ck_assert_int_eq(d.fd, -1);
  TU_ERR(cusafe_buffer_export(&d, v), CUSAFE_ERROR_INVALID_VALUE,
         "buffer 0x%llx is not shareable: allocate it with "
         "cusafe_buffer_alloc_shareable",
         TU_HX(v));
  TU_ERR(cusafe_buffer_export(NULL, plain), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  TU_STATUS(cusafe_buffer_export(&d, CUSAFE_NULL_HANDLE),
            CUSAFE_ERROR_INVALID_HANDLE);
  TU_STATUS(cusafe_buffer_export(&d, ctx), CUSAFE_ERROR_INVALID_HANDLE);
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(plain));
  TU_STATUS(cusafe_buffer_export(&d, plain), CUSAFE_ERROR_INVALID_HANDLE);
  ck_assert_int_eq(d.fd, -1);
}
END_TEST

START_TEST(test_import_refusals) {
  cusafe_buffer b = shareable(4096), in = (cusafe_buffer)0x99;
  cusafe_ipc_desc d, f;
  TU_OK(cusafe_buffer_export(&d, b));

  TU_ERR(cusafe_buffer_import(&in, ctx, &d), CUSAFE_ERROR_INVALID_VALUE,
         "buffer exported by this process: use the buffer itself");
  ck_assert_uint_eq(in, CUSAFE_NULL_HANDLE);
  f = as_if_foreign(d);
  f.version = 2;
  TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_INVALID_VALUE,
         "desc has version 2; this cusafe reads version 1");
  f = as_if_foreign(d);
  f.reserved[1] = 3;
  TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_INVALID_VALUE,
         "desc has reserved[1] 3; it must be 0");
  f = as_if_foreign(d);
  f.fd = -1;
  TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_INVALID_VALUE,
         "desc's fd -1 is not an open file descriptor");
  int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ck_assert_int_ge(null_fd, 0);
  f.fd = null_fd;
  TU_ERR_PREFIX(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_INVALID_VALUE,
                "cuMemImportFromShareableHandle failed: ");
  TU_ASSERT(strstr(cusafe_last_error_message(),
                   " (the fd of desc is no shareable CUDA memory)"),
            "message \"%s\"", cusafe_last_error_message());
  close(null_fd);
  f.fd = null_fd; /* closed now */
  TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_INVALID_VALUE,
         "desc's fd %d is not an open file descriptor", null_fd);
  f = as_if_foreign(d);
  f.offset = f.allocation - 100;
  f.size = 101;
  TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_OUT_OF_RANGE,
         "a buffer of 101 bytes at offset %llu reaches beyond its "
         "allocation of %llu bytes",
         (unsigned long long)f.offset, (unsigned long long)f.allocation);
  f = as_if_foreign(d);
  f.size = UINT64_MAX;
  TU_STATUS(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_OUT_OF_RANGE);
  f = as_if_foreign(d);
  f.device_uuid[7] ^= 0xff;
  TU_ERR_PREFIX(cusafe_buffer_import(&in, ctx, &f),
                CUSAFE_ERROR_CONTEXT_MISMATCH, "the memory is on device GPU-");
  TU_ERR(cusafe_buffer_import(&in, ctx, NULL), CUSAFE_ERROR_INVALID_VALUE,
         "desc is NULL");
  TU_ERR(cusafe_buffer_import(NULL, ctx, &d), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  f = as_if_foreign(d);
  TU_STATUS(cusafe_buffer_import(&in, CUSAFE_NULL_HANDLE, &f),
            CUSAFE_ERROR_INVALID_HANDLE);
  ck_assert_uint_eq(in, CUSAFE_NULL_HANDLE);
  close(d.fd);
  TU_OK(cusafe_buffer_release(b));
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
#endif
}
END_TEST

static int open_fds(void) {
  int n = 0;
  for (int fd = 0; fd < 4096; fd++)
    n += fcntl(fd, F_GETFD) >= 0;
  return n;
}

/* Imported memory is exported again (CUDA exports no imported memory:
 * the buffer keeps a copy of the descriptor it came by), views too; no
 * descriptor is left once every buffer is released. */
START_TEST(test_import_exported_again) {
  int before = open_fds();
  cusafe_buffer b = shareable(8192), in = CUSAFE_NULL_HANDLE,
                in2 = CUSAFE_NULL_HANDLE, v = CUSAFE_NULL_HANDLE;
  write_pattern(b, 8192, 21);
  cusafe_ipc_desc d;
  TU_OK(cusafe_buffer_export(&d, b));
  cusafe_ipc_desc f = as_if_foreign(d);
  TU_OK(cusafe_buffer_import(&in, ctx, &f));
  close(d.fd); /* the buffer keeps its own copy */
  TU_OK(cusafe_buffer_view(&v, in, 4096, 4096));
  cusafe_ipc_desc d2;
  TU_OK(cusafe_buffer_export(&d2, v));
  ck_assert_int_ge(d2.fd, 0);
  ck_assert_int_eq(fcntl(d2.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  ck_assert_uint_eq(d2.offset, 4096);
  ck_assert_uint_eq(d2.size, 4096);
  ck_assert_uint_eq(d2.allocation, d.allocation);
  ck_assert_int_eq(memcmp(d2.device_uuid, d.device_uuid, 16), 0);
  cusafe_ipc_desc f2 = as_if_foreign(d2);
  TU_OK(cusafe_buffer_import(&in2, ctx, &f2));
  close(d2.fd);
  TU_OK(cusafe_buffer_release(v));
  TU_OK(cusafe_buffer_release(in));
  TU_OK(cusafe_buffer_release(b));
  /* The memory lives on in the last import's mapping. */
  unsigned char want[8192], got[4096];
  tu_pattern(want, sizeof want, 21);
  TU_OK(cusafe_buffer_read(in2, 0, got, sizeof got));
  TU_BYTES_EQ(got, want + 4096, sizeof got);
  TU_OK(cusafe_buffer_release(in2));
  ck_assert_int_eq(open_fds(), before);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
#endif
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* The descriptors of the fake's shareable memory open in this process. */
static int fake_memory_fds(void) {
  DIR *d = opendir("/proc/self/fd");
  ck_assert_ptr_nonnull(d);
  int n = 0;
  char link[300], target[256];
  for (struct dirent *e; (e = readdir(d));) {
    snprintf(link, sizeof link, "/proc/self/fd/%s", e->d_name);
    ssize_t k = readlink(link, target, sizeof target - 1);
    if (k > 0) {
      target[k] = '\0';
      n += strstr(target, "memfd:fakecuda-vmm-") != NULL;
    }
  }
  closedir(d);
  return n;
}
#endif

/* The lowest descriptor number not open: the one the next open takes. */
static int lowest_free_fd(void) {
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  ck_assert_int_ge(fd, 0);
  close(fd);
  return fd;
}

/* A child forked without exec does not inherit the descriptors imported
 * buffers keep: they would keep the memory of buffers the parent releases
 * allocated while the child lives, and it cannot use them.  The parent
 * keeps its own, and its buffers work on. */
START_TEST(test_fork_closes_kept_descriptors) {
  int before = open_fds();
  cusafe_buffer b = shareable(4096), in[3];
  write_pattern(b, 4096, 31);
  int kept[3];
  for (int i = 0; i < 3; i++) {
    cusafe_ipc_desc d;
    TU_OK(cusafe_buffer_export(&d, b));
    cusafe_ipc_desc f = as_if_foreign(d);
    kept[i] = lowest_free_fd(); /* the import's first descriptor */
    in[i] = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_buffer_import(&in[i], ctx, &f));
    ck_assert_int_eq(fcntl(kept[i], F_GETFD), FD_CLOEXEC);
#ifdef CUSAFE_TEST_FAKE
    struct stat s1, s2;
    ck_assert_int_eq(fstat(kept[i], &s1), 0);
    ck_assert_int_eq(fstat(d.fd, &s2), 0);
    ck_assert(s1.st_dev == s2.st_dev && s1.st_ino == s2.st_ino);
#endif
    close(d.fd);
  }
  TU_OK(cusafe_buffer_release(in[1])); /* closed: its number is free */
  ck_assert_int_eq(fcntl(kept[1], F_GETFD), -1);
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ne(pid, -1);
  if (pid == 0) {
    int ok = fcntl(kept[0], F_GETFD) == -1 && errno == EBADF &&
             fcntl(kept[2], F_GETFD) == -1 && errno == EBADF &&
             cusafe_buffer_release(in[0]) == CUSAFE_SUCCESS;
#ifdef CUSAFE_TEST_FAKE
    /* The fake's handles are descriptors, which a driver's are not: the
     * child holds no other descriptor of the memory. */
    ok = ok && fake_memory_fds() == (int)fake_vmm_fds();
#endif
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  ck_assert_int_eq(fcntl(kept[0], F_GETFD), FD_CLOEXEC);
  ck_assert_int_eq(fcntl(kept[2], F_GETFD), FD_CLOEXEC);
  TU_OK(cusafe_buffer_release(b));
  check_pattern(in[2], 4096, 31);
  /* Still exported again from the kept descriptor. */
  cusafe_ipc_desc d;
  TU_OK(cusafe_buffer_export(&d, in[0]));
  close(d.fd);
  TU_OK(cusafe_buffer_release(in[0]));
  TU_OK(cusafe_buffer_release(in[2]));
  ck_assert_int_eq(open_fds(), before);
#ifdef CUSAFE_TEST_FAKE
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
#endif
}
END_TEST

/* The device of a description, found by UUID among the devices this
 * process sees: that of every device's export; none for a UUID of no
 * device. */
START_TEST(test_ipc_device) {
  int count = 0;
  TU_OK(cusafe_device_count(&count));
  for (int dev = 0; dev < count; dev++) {
    cusafe_context c = CUSAFE_NULL_HANDLE;
    cusafe_buffer b = CUSAFE_NULL_HANDLE;
    TU_OK(cusafe_context_create(&c, dev));
    TU_OK(cusafe_buffer_alloc_shareable(&b, c, 64));
    cusafe_ipc_desc d;
    TU_OK(cusafe_buffer_export(&d, b));
    close(d.fd);
    d.fd = -1; /* not read */
    int got = -7;
    TU_OK(cusafe_ipc_device(&got, &d));
    ck_assert_int_eq(got, dev);
    TU_OK(cusafe_buffer_release(b));
    TU_OK(cusafe_context_release(c));
    if (dev > 0)
      continue;
    cusafe_ipc_desc f = d;
    f.version = 3;
    TU_ERR(cusafe_ipc_device(&got, &f), CUSAFE_ERROR_INVALID_VALUE,
           "desc has version 3; this cusafe reads version 1");
    ck_assert_int_eq(got, -1);
    f = d;
    memset(f.device_uuid, 0xab, sizeof f.device_uuid);
    got = 5;
    TU_ERR(cusafe_ipc_device(&got, &f), CUSAFE_ERROR_INVALID_DEVICE,
           "the memory is on device GPU-abababab-abab-abab-abab-abababababab, "
           "which this process does not see");
    ck_assert_int_eq(got, -1);
    TU_ERR(cusafe_ipc_device(&got, NULL), CUSAFE_ERROR_INVALID_VALUE,
           "desc is NULL");
    TU_ERR(cusafe_ipc_device(NULL, &d), CUSAFE_ERROR_INVALID_VALUE,
           "out is NULL");
  }
}
END_TEST

/* A description travels with its descriptor; what is not one is refused
 * with the socket's story. */
START_TEST(test_send_recv) {
  cusafe_buffer b = shareable(64);
  cusafe_ipc_desc d, got;
  TU_OK(cusafe_buffer_export(&d, b));
  int sv[2];
  ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  TU_OK(cusafe_ipc_send(sv[0], &d));
  TU_OK(cusafe_ipc_recv(sv[1], &got));
  ck_assert_int_ge(got.fd, 0);
  ck_assert_int_ne(got.fd, d.fd);
  ck_assert_int_eq(fcntl(got.fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  struct stat s1, s2;
  ck_assert_int_eq(fstat(d.fd, &s1), 0);
  ck_assert_int_eq(fstat(got.fd, &s2), 0);
  ck_assert_uint_eq(s1.st_ino, s2.st_ino);
  cusafe_ipc_desc expect = d;
  expect.fd = got.fd;
  ck_assert_int_eq(memcmp(&expect, &got, sizeof got), 0);
  close(got.fd);

  TU_ERR(cusafe_ipc_send(sv[0], NULL), CUSAFE_ERROR_INVALID_VALUE,
         "desc is NULL");
  cusafe_ipc_desc bad = d;
  bad.fd = -1;
  TU_ERR(cusafe_ipc_send(sv[0], &bad), CUSAFE_ERROR_INVALID_VALUE,
         "desc's fd is -1");
  bad = d;
  bad.version = 9;
  TU_ERR(cusafe_ipc_send(sv[0], &bad), CUSAFE_ERROR_INVALID_VALUE,
         "desc has version 9; this cusafe sends version 1");
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  TU_ERR(cusafe_ipc_send(p[1], &d), CUSAFE_ERROR_INVALID_VALUE,
         "cannot send on socket %d: %s", p[1], strerror(ENOTSOCK));
  TU_ERR(cusafe_ipc_recv(sv[1], NULL), CUSAFE_ERROR_INVALID_VALUE,
         "out is NULL");
  /* A foreign message, then one without a descriptor, then the end. */
  char junk[sizeof(cusafe_ipc_desc) + 8];
  memset(junk, 'x', sizeof junk);
  ck_assert_int_eq(write(sv[0], junk, sizeof junk), (ssize_t)sizeof junk);
  got.fd = 77;
  TU_ERR(cusafe_ipc_recv(sv[1], &got), CUSAFE_ERROR_INVALID_VALUE,
         "socket %d sent something that is not a description of "
         "cusafe_ipc_send",
         sv[1]);
  ck_assert_int_eq(got.fd, -1);
  char tagged[sizeof(cusafe_ipc_desc) + 8] = "cusafe1";
  memcpy(tagged + 8, &d, sizeof d);
  ck_assert_int_eq(write(sv[0], tagged, sizeof tagged), (ssize_t)sizeof tagged);
  TU_ERR(cusafe_ipc_recv(sv[1], &got), CUSAFE_ERROR_INVALID_VALUE,
         "socket %d sent a description without its file descriptor", sv[1]);
  /* A description with two descriptors: both are closed, none kept. */
  {
    struct {
      char tag[8];
      cusafe_ipc_desc desc;
    } w;
    memcpy(w.tag, "cusafe1", 8);
    w.desc = d;
    struct iovec iov = {&w, sizeof w};
    union {
      struct cmsghdr align;
      char buf[CMSG_SPACE(2 * sizeof(int))];
    } control;
    memset(&control, 0, sizeof control);
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control.buf,
                         .msg_controllen = sizeof control.buf};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int two[2] = {d.fd, d.fd};
    memcpy(CMSG_DATA(c), two, sizeof two);
    ck_assert_int_eq(sendmsg(sv[0], &msg, 0), (ssize_t)sizeof w);
    int next = dup(0); /* the lowest free descriptor before the call */
    close(next);
    TU_ERR(cusafe_ipc_recv(sv[1], &got), CUSAFE_ERROR_INVALID_VALUE,
           "socket %d sent more than one file descriptor", sv[1]);
    int after = dup(0);
    close(after);
    ck_assert_int_eq(after, next); /* nothing left open */
  }
  /* With the peer's credentials asked for, they come along. */
  int on = 1;
  ck_assert_int_eq(setsockopt(sv[1], SOL_SOCKET, SO_PASSCRED, &on, sizeof on),
                   0);
  TU_OK(cusafe_ipc_send(sv[0], &d));
  TU_OK(cusafe_ipc_recv(sv[1], &got));
  ck_assert_uint_eq(got.size, d.size);
  close(got.fd);
  close(sv[0]);
  TU_ERR(cusafe_ipc_recv(sv[1], &got), CUSAFE_ERROR_INVALID_VALUE,
         "socket %d closed by its peer", sv[1]);
  /* Sending to a closed peer is an error, not a SIGPIPE. */
  TU_ERR(cusafe_ipc_send(sv[1], &d), CUSAFE_ERROR_INVALID_VALUE,
         "cannot send on socket %d: %s", sv[1], strerror(EPIPE));
  int closed = dup(d.fd);
  close(closed);
  bad = d;
  bad.fd = closed;
  TU_ERR(cusafe_ipc_send(sv[1], &bad), CUSAFE_ERROR_INVALID_VALUE,
         "desc's fd %d is not an open file descriptor", closed);
  close(sv[1]);
  close(p[0]);
  close(p[1]);
  close(d.fd);
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* ---- two processes ------------------------------------------------------- */

/* The exporter is killed while the importer holds the memory: every
 * element is still there, and the importer writes, reads and releases. */
START_TEST(test_importer_outlives_killed_exporter) {
  char size_arg[32];
  snprintf(size_arg, sizeof size_arg, "%zu", BYTES);
  struct child ch = spawn_child("export", size_arg, "21", "kill-after-ack");
  cusafe_ipc_desc d;
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_ipc_recv(ch.sock, &d));
  TU_OK(cusafe_buffer_import(&in, ctx, &d));
  close(d.fd);
  ack(&ch);
  char err[1024];
  int status = child_wait(&ch, err, sizeof err);
  TU_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "exporter ended with status 0x%x, not killed; stderr: %s", status,
            err);
  check_pattern(in, BYTES, 21);
  write_pattern(in, BYTES, 22);
  check_pattern(in, BYTES, 22);
  TU_OK(cusafe_buffer_release(in));
}
END_TEST

/* The exporter releases its buffer and exits while the importer holds
 * the memory. */
START_TEST(test_importer_outlives_exporter_exit) {
  struct child ch = spawn_child("export", "65536", "81", "release");
  cusafe_ipc_desc d;
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_ipc_recv(ch.sock, &d));
  TU_OK(cusafe_buffer_import(&in, ctx, &d));
  close(d.fd);
  ack(&ch);
  char err[1024];
  int status = child_wait(&ch, err, sizeof err);
  CHILD_EXITED_0(status, err);
  ck_assert_str_eq(err, "");
  check_pattern(in, 65536, 81);
  write_pattern(in, 65536, 82);
  check_pattern(in, 65536, 82);
  TU_OK(cusafe_buffer_release(in));
}
END_TEST

/* The exporter is killed before the importer maps: the description's
 * descriptor, in flight, keeps the memory. */
START_TEST(test_import_after_exporter_killed) {
  struct child ch = spawn_child("export", "4096", "31", "kill");
  char err[1024];
  cusafe_ipc_desc d;
  TU_OK(cusafe_ipc_recv(ch.sock, &d));
  int status = child_wait(&ch, err, sizeof err);
  TU_ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
            "exporter ended with status 0x%x, not killed; stderr: %s", status,
            err);
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_import(&in, ctx, &d));
  close(d.fd);
  check_pattern(in, 4096, 31);
  TU_OK(cusafe_buffer_release(in));
}
END_TEST

/* The importer's writes reach the exporter, whose buffer keeps its memory
 * after the importer released and exited. */
START_TEST(test_exporter_sees_importers_writes) {
  cusafe_buffer b = shareable(BYTES);
  write_pattern(b, BYTES, 41);
  cusafe_ipc_desc d;
  TU_OK(cusafe_buffer_export(&d, b));
  struct child ch = spawn_child("import", "41", "release", NULL);
  TU_OK(cusafe_ipc_send(ch.sock, &d));
  close(d.fd);
  char c = 0, err[1024];
  ck_assert_int_eq(read(ch.sock, &c, 1), 1);
  int status = child_wait(&ch, err, sizeof err);
  CHILD_EXITED_0(status, err);
  ck_assert_str_eq(err, "");
  check_pattern(b, BYTES, 42);
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* An importer that exits with its buffer and context alive exits cleanly:
 * status 0, nothing on stderr; the exporter's memory is untouched by it. */
START_TEST(test_importer_exits_with_buffer_alive) {
  cusafe_buffer b = shareable(8192);
  write_pattern(b, 8192, 51);
  cusafe_ipc_desc d;
  TU_OK(cusafe_buffer_export(&d, b));
  struct child ch = spawn_child("import", "51", "leave", NULL);
  TU_OK(cusafe_ipc_send(ch.sock, &d));
  close(d.fd);
  char c = 0, err[1024];
  ck_assert_int_eq(read(ch.sock, &c, 1), 1);
  int status = child_wait(&ch, err, sizeof err);
  CHILD_EXITED_0(status, err);
  ck_assert_str_eq(err, "");
  check_pattern(b, 8192, 52);
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* The exporter reads what the importer wrote, after the importer's
 * release: each process owns its own mapping only. */
START_TEST(test_exporter_reads_after_importer_released) {
  char size_arg[32];
  snprintf(size_arg, sizeof size_arg, "%zu", (size_t)65536);
  struct child ch = spawn_child("export", size_arg, "61", "read");
  cusafe_ipc_desc d;
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_ipc_recv(ch.sock, &d));
  TU_OK(cusafe_buffer_import(&in, ctx, &d));
  close(d.fd);
  check_pattern(in, 65536, 61);
  write_pattern(in, 65536, 62);
  TU_OK(cusafe_buffer_release(in));
  TU_OK(cusafe_context_synchronize(ctx));
  ack(&ch);
  char err[1024];
  int status = child_wait(&ch, err, sizeof err);
  CHILD_EXITED_0(status, err);
  ck_assert_str_eq(err, "");
}
END_TEST

#ifdef CUSAFE_TEST_FAKE
/* ---- lifetimes in one process, against the fake ------------------------- */

/* The release of a shareable buffer whose work is queued unmaps only once
 * that work has run (the fake would report the use of an unmapped range). */
START_TEST(test_release_waits_for_queued_work) {
  cusafe_buffer b = shareable(4096);
  fake_set_paused(1);
  TU_OK(cusafe_buffer_fill(b, 0, 4096, 0x3c, CUSAFE_STREAM_DEFAULT));
  TU_OK(cusafe_buffer_release(b)); /* waits for the fill */
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
  ck_assert_uint_eq(fake_log_count("exec:cudaMemsetAsync"), 1);
  fake_set_paused(0);
}
END_TEST

/* An export waits for the work queued on the buffer on any stream: the
 * description is of the data that work wrote. */
START_TEST(test_export_waits_for_queued_work) {
  cusafe_buffer b = shareable(4096), in = CUSAFE_NULL_HANDLE;
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  fake_set_paused(1);
  TU_OK(cusafe_buffer_fill(b, 0, 4096, 0x5e, s));
  cusafe_ipc_desc d;
  TU_OK(cusafe_buffer_export(&d, b));
  ck_assert_uint_eq(fake_log_count("exec:cudaMemsetAsync"), 1);
  fake_set_paused(0);
  cusafe_ipc_desc f = as_if_foreign(d);
  TU_OK(cusafe_buffer_import(&in, ctx, &f));
  close(d.fd);
  unsigned char got[4096], want[4096];
  memset(want, 0x5e, sizeof want);
  TU_OK(cusafe_buffer_read(in, 0, got, sizeof got));
  TU_BYTES_EQ(got, want, sizeof got);
  TU_OK(cusafe_buffer_release(in));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_stream_release(s));
}
END_TEST

/* A graph that captured work on a shareable buffer holds it: released by
 * the caller, it is unmapped only with the graph. */
START_TEST(test_graph_holds_shareable) {
  cusafe_buffer b = shareable(4096);
  cusafe_stream s = CUSAFE_NULL_HANDLE;
  cusafe_graph g = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_stream_create(&s, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  TU_OK(cusafe_stream_begin_capture(s));
  TU_OK(cusafe_buffer_fill(b, 0, 4096, 0x11, s));
  TU_OK(cusafe_stream_end_capture(&g, s));
  TU_OK(cusafe_buffer_release(b));
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 1);
  TU_OK(cusafe_graph_launch(g, s));
  TU_OK(cusafe_stream_synchronize(s));
  TU_OK(cusafe_graph_release(g));
  TU_OK(cusafe_stream_release(s));
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
}
END_TEST

/* The shutdown unmaps what is alive before the primary context goes (the
 * fake would report a mapping alive at its release). */
START_TEST(test_shutdown_unmaps) {
  cusafe_buffer b = shareable(4096), v = CUSAFE_NULL_HANDLE;
  TU_OK(cusafe_buffer_view(&v, b, 0, 16));
  TU_OK(cusafe_buffer_release(b));
  TU_OK(cusafe_shutdown());
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
  TU_NOTHING_LIVE();
}
END_TEST

#ifdef CUSAFE_HAVE_DLPACK
/* A DLPack tensor of a shareable buffer keeps its mapping after the
 * buffer's release, until its deleter. */
START_TEST(test_dlpack_tensor_keeps_shareable) {
  cusafe_buffer b = shareable(4096);
  DLManagedTensorVersioned *t = NULL;
  int64_t n = 4096;
  TU_OK(cusafe_buffer_to_dlpack(&t, b, 0, (DLDataType){kDLUInt, 8, 1}, 1, &n,
                                NULL, CUSAFE_NULL_HANDLE));
  TU_OK(cusafe_buffer_release(b));
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 1);
  ck_assert_uint_eq(fake_live_allocations(-1), 1);
  memset(t->dl_tensor.data, 0x42, 4096); /* the fake's memory is the host's */
  t->deleter(t);
  TU_OK(cusafe_context_synchronize(ctx));
  ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
  ck_assert_uint_eq(fake_live_allocations(-1), 0);
}
END_TEST
#endif

/* A forked child can neither export nor import (every call is refused
 * there); the parent's shareable buffer is untouched by its exit. */
START_TEST(test_forked_child_refused) {
  cusafe_buffer b = shareable(4096);
  write_pattern(b, 4096, 71);
  cusafe_ipc_desc d;
  TU_OK(cusafe_buffer_export(&d, b));
  fflush(NULL);
  pid_t pid = fork();
  ck_assert_int_ne(pid, -1);
  if (pid == 0) {
    cusafe_ipc_desc e;
    cusafe_buffer in = CUSAFE_NULL_HANDLE;
    cusafe_ipc_desc f = as_if_foreign(d);
    int ok = cusafe_buffer_export(&e, b) == CUSAFE_ERROR_FORKED && e.fd == -1 &&
             cusafe_buffer_import(&in, ctx, &f) == CUSAFE_ERROR_FORKED &&
             in == CUSAFE_NULL_HANDLE &&
             cusafe_buffer_release(b) == CUSAFE_SUCCESS;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  check_pattern(b, 4096, 71);
  close(d.fd);
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* Each call of the driver failing: its status and message, and nothing
 * left behind. */
START_TEST(test_driver_failures) {
  static const char *const alloc_calls[] = {
      "cuMemGetAllocationGranularity", "cuMemCreate", "cuMemAddressReserve",
      "cuMemMap", "cuMemSetAccess"};
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  for (size_t i = 0; i < sizeof alloc_calls / sizeof *alloc_calls; i++) {
    fake_fail_function(alloc_calls[i], cudaErrorMemoryAllocation);
    TU_ERR(cusafe_buffer_alloc_shareable(&b, ctx, 100),
           CUSAFE_ERROR_OUT_OF_MEMORY, "%s failed: out of memory",
           alloc_calls[i]);
    fake_fail_function(alloc_calls[i], cudaSuccess);
    ck_assert_uint_eq(fake_live_vmm_handles(-1), 0);
    ck_assert_uint_eq(fake_live_allocations(-1), 0);
  }
  b = shareable(100);
  cusafe_ipc_desc d, f;
  fake_fail_function("cuMemExportToShareableHandle", cudaErrorUnknown);
  d.fd = 3;
  TU_ERR(cusafe_buffer_export(&d, b), CUSAFE_ERROR_CUDA,
         "cuMemExportToShareableHandle failed: unknown error");
  ck_assert_int_eq(d.fd, -1);
  fake_fail_clear();
  TU_OK(cusafe_buffer_export(&d, b));
  f = as_if_foreign(d);
  static const char *const import_calls[] = {"cuMemImportFromShareableHandle",
                                             "cuMemAddressReserve", "cuMemMap",
                                             "cuMemSetAccess"};
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  for (size_t i = 0; i < sizeof import_calls / sizeof *import_calls; i++) {
    fake_fail_function(import_calls[i], cudaErrorMemoryAllocation);
    TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_OUT_OF_MEMORY,
           "%s failed: out of memory", import_calls[i]);
    fake_fail_function(import_calls[i], cudaSuccess);
    ck_assert_uint_eq(fake_live_vmm_handles(-1), 1);
    ck_assert_uint_eq(fake_live_allocations(-1), 1);
  }
  /* Undoing fails too: the failure reported is the first one. */
  fake_fail_function("cuMemSetAccess", cudaErrorMemoryAllocation);
  fake_fail_function("cuMemAddressFree", cudaErrorUnknown);
  TU_ERR(cusafe_buffer_import(&in, ctx, &f), CUSAFE_ERROR_OUT_OF_MEMORY,
         "cuMemSetAccess failed: out of memory");
  fake_fail_clear();
  TU_OK(cusafe_buffer_import(&in, ctx, &f));
  TU_OK(cusafe_buffer_release(in));
  close(d.fd);
  TU_OK(cusafe_buffer_release(b));
}
END_TEST

/* Without the driver's virtual memory management: NOT_SUPPORTED, named. */
START_TEST(test_without_vmm) {
  cusafe_buffer b = CUSAFE_NULL_HANDLE;
  TU_ERR(cusafe_buffer_alloc_shareable(&b, ctx, 64), CUSAFE_ERROR_NOT_SUPPORTED,
         "shareable memory needs the driver's cuMemGetAllocationGranularity, "
         "which it lacks");
}
END_TEST

static void no_vmm_setup(void) {
  fake_set_vmm(0);
  ctx_setup();
}
#endif

static Suite *ipc_suite(void) {
  Suite *s = suite_create("ipc");
  TCase *tc = tcase_create("one");
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_export_describes);
  tcase_add_test(tc, test_import_maps_same_memory);
  tcase_add_test(tc, test_alloc_refusals);
  tcase_add_test(tc, test_export_refusals);
  tcase_add_test(tc, test_import_refusals);
  tcase_add_test(tc, test_ipc_device);
  tcase_add_test(tc, test_import_exported_again);
  tcase_add_test(tc, test_fork_closes_kept_descriptors);
  tcase_add_test(tc, test_send_recv);
  suite_add_tcase(s, tc);
  tc = tcase_create("two");
  tcase_set_timeout(tc, 120);
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_importer_outlives_killed_exporter);
  tcase_add_test(tc, test_import_after_exporter_killed);
  tcase_add_test(tc, test_importer_outlives_exporter_exit);
  tcase_add_test(tc, test_exporter_sees_importers_writes);
  tcase_add_test(tc, test_importer_exits_with_buffer_alive);
  tcase_add_test(tc, test_exporter_reads_after_importer_released);
  suite_add_tcase(s, tc);
#ifdef CUSAFE_TEST_FAKE
  tc = tcase_create("lifetimes");
  tcase_add_checked_fixture(tc, ctx_setup, ctx_teardown);
  tcase_add_test(tc, test_release_waits_for_queued_work);
  tcase_add_test(tc, test_export_waits_for_queued_work);
  tcase_add_test(tc, test_graph_holds_shareable);
  tcase_add_test(tc, test_shutdown_unmaps);
  tcase_add_test(tc, test_driver_failures);
  tcase_add_test(tc, test_forked_child_refused);
#ifdef CUSAFE_HAVE_DLPACK
  tcase_add_test(tc, test_dlpack_tensor_keeps_shareable);
#endif
  suite_add_tcase(s, tc);
  tc = tcase_create("no_vmm");
  tcase_add_checked_fixture(tc, no_vmm_setup, ctx_teardown);
  tcase_add_test(tc, test_without_vmm);
  suite_add_tcase(s, tc);
#endif
  return s;
}

int main(int argc, char **argv) {
  if (argc >= 2 && strcmp(argv[1], "--child") == 0)
    return child_main(argc, argv);
  static char path[4096];
  if (argv[0] && strchr(argv[0], '/') && realpath(argv[0], path))
    self_path = path;
#ifdef CUSAFE_TEST_FAKE
  return tu_run_suite(ipc_suite(), CK_FORK);
#else
  tu_require_gpu();
  return tu_run_suite(ipc_suite(), CK_NOFORK);
#endif
}
