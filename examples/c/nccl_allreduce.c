/* nccl_allreduce.c -- an all-reduce through NCCL over every GPU of the
 * machine, on cusafe buffers and streams: foreign work on a cusafe stream,
 * recorded with cusafe_stream_use_buffers() so that lifetimes still hold.
 *
 * One process, one thread per GPU (rank r on device r).  Each thread fills
 * a buffer of N floats on its device with r + 1 + i % 7, tells cusafe that
 * its stream now uses the buffer, queues NCCL's in-place all-reduce (sum)
 * on the buffer's address and the stream's cudaStream_t, and releases its
 * reference to the buffer at once: the memory stays valid until NCCL's
 * work has run, since cusafe frees it stream-ordered after the recorded
 * use.  A second reference, taken before, reads the result, which every
 * rank checks against the exact sum.
 *
 * NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 unless the
 * environment says otherwise.
 *
 * Exit status: 0 when every element of every rank is right, 77 (automake's
 * SKIP) when the machine has no CUDA driver or device or fewer than 2 GPUs,
 * 1 on any failure, with a message on stderr. */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include <cusafe.h>
#include <nccl.h>

#define N ((size_t)1 << 20) /* floats per rank */

struct rank {
  int rank, nranks;
  ncclComm_t comm; /* set by main; NULL once this thread aborted it */
  size_t wrong;    /* elements that differ from the expected sum */
  float first;     /* the result's element 0 */
  int ok;          /* 1 when this rank's every call succeeded */
};

static pthread_barrier_t barrier;
/* One flag per point where the ranks agree (see all_ok). */
static atomic_int failed[2];

/* Waits for every rank at the point `phase` and tells whether all of them
 * got there with ok set.  NCCL's collectives wait for every rank: a rank
 * that failed before its part would leave the others' kernels waiting
 * forever, so each step that involves the others goes ahead only when all
 * agree. */
static int all_ok(int phase, int ok) {
  if (!ok)
    atomic_store(&failed[phase], 1);
  pthread_barrier_wait(&barrier);
  return !atomic_load(&failed[phase]);
}

static int cusafe_failed(const struct rank *r, const char *what,
                         cusafe_status st) {
  fprintf(stderr, "nccl_allreduce: rank %d: %s: %s: %s\n", r->rank, what,
          cusafe_status_string(st), cusafe_last_error_message());
  return 0;
}

static int nccl_failed(const struct rank *r, const char *what,
                       ncclResult_t res) {
  fprintf(stderr, "nccl_allreduce: rank %d: %s: %s (%s)\n", r->rank, what,
          ncclGetErrorString(res), ncclGetLastError(r->comm));
  return 0;
}

/* Compares rank r's result with the sum over all ranks q of q + 1 + i % 7:
 * small integers, so every sum is exact in float. */
static size_t count_wrong(const struct rank *r, const float *host) {
  const int n = r->nranks;
  size_t wrong = 0;
  for (size_t i = 0; i < N; i++) {
    float expected = (float)(n * (n + 1) / 2 + n * (int)(i % 7));
    if (host[i] != expected && wrong++ == 0)
      fprintf(stderr,
              "nccl_allreduce: rank %d: element %zu is %g, expected %g\n",
              r->rank, i, host[i], expected);
  }
  return wrong;
}

/* Evaluates a cusafe call; on failure reports it and jumps to `label`. */
#define TRY(call, label)                                                       \
  do {                                                                         \
    cusafe_status st_ = (call);                                                \
    if (st_ != CUSAFE_SUCCESS) {                                               \
      cusafe_failed(r, #call, st_);                                            \
      goto label;                                                              \
    }                                                                          \
  } while (0)

static void *run_rank(void *arg) {
  struct rank *r = arg;
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_stream stream = CUSAFE_NULL_HANDLE;
  cusafe_buffer buf = CUSAFE_NULL_HANDLE, reader = CUSAFE_NULL_HANDLE;
  void *ptr = NULL, *cuda_stream = NULL;
  const size_t bytes = N * sizeof(float);
  float *host = malloc(bytes);
  ncclResult_t res;
  cusafe_status st;
  int ok = 0;

  /* Each thread its own reference to its device's context (the primary
   * context, which NCCL uses too), its stream, and its buffer, filled
   * from the host. */
  if (!host) {
    fprintf(stderr, "nccl_allreduce: rank %d: out of host memory\n", r->rank);
    goto setup_done;
  }
  for (size_t i = 0; i < N; i++)
    host[i] = (float)(r->rank + 1 + (int)(i % 7));
  TRY(cusafe_context_create(&ctx, r->rank), setup_done);
  TRY(cusafe_stream_create(&stream, ctx, CUSAFE_STREAM_NON_BLOCKING, 0),
      setup_done);
  TRY(cusafe_buffer_alloc(&buf, ctx, CUSAFE_MEMORY_DEVICE, bytes), setup_done);
  TRY(cusafe_buffer_write(buf, 0, host, bytes), setup_done);
  TRY(cusafe_buffer_interop_pointer(&ptr, buf), setup_done);
  TRY(cusafe_stream_interop_handle(&cuda_stream, stream), setup_done);
  /* The reference that reads the result; `buf`'s own goes right after the
   * all-reduce is queued. */
  TRY(cusafe_buffer_retain(buf), setup_done);
  reader = buf;
  ok = 1;
setup_done:
  if (!all_ok(0, ok)) {
    ok = 0; /* nothing queued anywhere: no rank waits for another */
    goto cleanup;
  }

  /* Before NCCL's work is queued: the stream now uses the buffer, so it
   * waits for the buffer's earlier work, and the buffer stays alive until
   * the stream has passed what is queued next. */
  ok = 0;
  TRY(cusafe_stream_use_buffers(stream, &buf, 1), queued);
  res = ncclAllReduce(ptr, ptr, N, ncclFloat, ncclSum, r->comm,
                      (cudaStream_t)cuda_stream);
  if (res != ncclSuccess) {
    nccl_failed(r, "ncclAllReduce", res);
    goto queued;
  }
  /* Legal with the all-reduce still running: the memory goes back only
   * after it, stream-ordered (and here, `reader` holds it too). */
  st = cusafe_buffer_release(buf);
  buf = CUSAFE_NULL_HANDLE;
  if (st != CUSAFE_SUCCESS) {
    cusafe_failed(r, "cusafe_buffer_release(buf)", st);
    goto queued;
  }
  ok = 1;
queued:
  if (!all_ok(1, ok)) {
    /* Some rank queued no all-reduce: the others' would wait for it
     * forever.  Aborting the communicator ends them (a local call). */
    res = ncclCommAbort(r->comm);
    r->comm = NULL;
    if (res != ncclSuccess)
      nccl_failed(r, "ncclCommAbort", res);
    ok = 0;
    goto cleanup;
  }

  /* The read is ordered after the stream's work, the all-reduce included. */
  ok = 0;
  TRY(cusafe_buffer_read(reader, 0, host, bytes), cleanup);
  r->wrong = count_wrong(r, host);
  r->first = host[0];
  ok = 1;

cleanup:
  /* Releases of NULL handles are no-ops. */
  if ((st = cusafe_buffer_release(buf)) != CUSAFE_SUCCESS)
    ok = cusafe_failed(r, "cusafe_buffer_release(buf)", st);
  if ((st = cusafe_buffer_release(reader)) != CUSAFE_SUCCESS)
    ok = cusafe_failed(r, "cusafe_buffer_release(reader)", st);
  if ((st = cusafe_stream_release(stream)) != CUSAFE_SUCCESS)
    ok = cusafe_failed(r, "cusafe_stream_release", st);
  if ((st = cusafe_context_release(ctx)) != CUSAFE_SUCCESS)
    ok = cusafe_failed(r, "cusafe_context_release", st);
  free(host);
  r->ok = ok;
  return NULL;
}

int main(void) {
  /* Before NCCL reads its environment (at its first call); a value the
   * user set stays. */
  if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) {
    perror("nccl_allreduce: setenv NCCL_NVLS_ENABLE");
    return 1;
  }

  int ndev = 0;
  cusafe_status st = cusafe_device_count(&ndev);
  if (st == CUSAFE_ERROR_NO_DRIVER || st == CUSAFE_ERROR_NO_DEVICE) {
    printf("SKIP: %s\n", cusafe_last_error_message()); /* "no CUDA ..." */
    return 77;
  }
  if (st != CUSAFE_SUCCESS) {
    fprintf(stderr, "nccl_allreduce: cusafe_device_count: %s: %s\n",
            cusafe_status_string(st), cusafe_last_error_message());
    return 1;
  }
  if (ndev < 2) {
    printf("SKIP: an all-reduce needs 2 GPUs or more; this machine has %d\n",
           ndev);
    return 77;
  }

  ncclComm_t *comms = calloc((size_t)ndev, sizeof *comms);
  struct rank *ranks = calloc((size_t)ndev, sizeof *ranks);
  pthread_t *threads = calloc((size_t)ndev, sizeof *threads);
  cusafe_context *held = calloc((size_t)ndev, sizeof *held);
  if (!comms || !ranks || !threads || !held) {
    fprintf(stderr, "nccl_allreduce: out of host memory\n");
    return 1;
  }
  /* The communicators live in the devices' primary contexts: a reference
   * of main's on each device's cusafe context keeps them from before the
   * communicators until after (the threads' cusafe_context_create calls
   * return these contexts, with one more reference each). */
  for (int i = 0; i < ndev; i++)
    if ((st = cusafe_context_create(&held[i], i)) != CUSAFE_SUCCESS) {
      fprintf(stderr, "nccl_allreduce: cusafe_context_create(%d): %s: %s\n", i,
              cusafe_status_string(st), cusafe_last_error_message());
      return 1;
    }
  /* The communicators of all ranks at once, from this thread:
   * ncclCommInitAll makes each device current itself, where per-thread
   * ncclCommInitRank calls would each need a cudaSetDevice of ours first,
   * and it cannot leave one rank waiting forever for another that failed
   * before its init.  Each thread then drives one communicator, and NCCL
   * needs ncclGroupStart/End only where one thread queues the collectives
   * of several ranks (as main does for ncclCommFinalize below). */
  ncclResult_t res = ncclCommInitAll(comms, ndev, NULL);
  if (res != ncclSuccess) {
    fprintf(stderr, "nccl_allreduce: ncclCommInitAll: %s (%s)\n",
            ncclGetErrorString(res), ncclGetLastError(NULL));
    return 1;
  }

  int rc = pthread_barrier_init(&barrier, NULL, (unsigned)ndev);
  if (rc != 0) {
    fprintf(stderr, "nccl_allreduce: pthread_barrier_init failed (%d)\n", rc);
    return 1;
  }
  int started = 0;
  for (int i = 0; i < ndev; i++) {
    ranks[i] = (struct rank){i, ndev, comms[i], 0, 0.0f, 0};
    if ((rc = pthread_create(&threads[i], NULL, run_rank, &ranks[i])) != 0) {
      /* The started threads would wait at the barrier for this one. */
      fprintf(stderr, "nccl_allreduce: pthread_create failed (%d)\n", rc);
      return 1;
    }
    started++;
  }
  int ok = 1, aborted = 0;
  size_t wrong = 0;
  for (int i = 0; i < started; i++) {
    if ((rc = pthread_join(threads[i], NULL)) != 0) {
      fprintf(stderr, "nccl_allreduce: pthread_join failed (%d)\n", rc);
      return 1;
    }
  }
  for (int i = 0; i < ndev; i++) {
    ok &= ranks[i].ok;
    aborted |= ranks[i].comm == NULL;
    wrong += ranks[i].wrong;
    if (ranks[i].ok)
      printf("nccl_allreduce: rank %d (device %d): %zu floats, element 0 "
             "%g, %zu wrong\n",
             i, i, N, ranks[i].first, ranks[i].wrong);
  }

  /* The communicators go together: ncclCommFinalize waits for the other
   * ranks, so one thread finalizes all of them in a group, then destroys
   * each.  After a failure, ncclCommAbort (local) instead. */
  if (ok && !aborted) {
    if ((res = ncclGroupStart()) != ncclSuccess) {
      fprintf(stderr, "nccl_allreduce: ncclGroupStart: %s\n",
              ncclGetErrorString(res));
      return 1;
    }
    for (int i = 0; i < ndev; i++)
      if ((res = ncclCommFinalize(comms[i])) != ncclSuccess) {
        fprintf(stderr, "nccl_allreduce: ncclCommFinalize (rank %d): %s\n", i,
                ncclGetErrorString(res));
        ok = 0;
      }
    if ((res = ncclGroupEnd()) != ncclSuccess) {
      fprintf(stderr, "nccl_allreduce: ncclGroupEnd (finalize): %s\n",
              ncclGetErrorString(res));
      ok = 0;
    }
    for (int i = 0; i < ndev; i++)
      if ((res = ncclCommDestroy(comms[i])) != ncclSuccess) {
        fprintf(stderr, "nccl_allreduce: ncclCommDestroy (rank %d): %s\n", i,
                ncclGetErrorString(res));
        ok = 0;
      }
  } else {
    for (int i = 0; i < ndev; i++)
      if (ranks[i].comm && (res = ncclCommAbort(comms[i])) != ncclSuccess)
        fprintf(stderr, "nccl_allreduce: ncclCommAbort (rank %d): %s\n", i,
                ncclGetErrorString(res));
  }
  for (int i = 0; i < ndev; i++)
    if ((st = cusafe_context_release(held[i])) != CUSAFE_SUCCESS) {
      fprintf(stderr, "nccl_allreduce: cusafe_context_release(%d): %s: %s\n", i,
              cusafe_status_string(st), cusafe_last_error_message());
      ok = 0;
    }
  pthread_barrier_destroy(&barrier);
  free(held);
  free(threads);
  free(ranks);
  free(comms);

  if (!ok) {
    fprintf(stderr, "nccl_allreduce: failed (see above)\n");
    return 1;
  }
  printf("nccl_allreduce: %d GPUs, %zu floats, %zu wrong\n", ndev, N, wrong);
  return wrong == 0 ? 0 : 1;
}
