/* nccl_mpi.c -- an all-reduce through NCCL across processes, bootstrapped
 * by MPI, on cusafe buffers and streams: the form that runs unchanged on
 * one host or many,
 *
 *   mpirun -np 2 ./nccl_mpi                      (one host, two GPUs)
 *   mpirun -np 8 -H node1:4,node2:4 ./nccl_mpi   (two hosts, four GPUs each)
 *
 * One process per GPU: MPI gives each its rank, and its rank among the
 * processes of its host picks its device.  Rank 0 makes NCCL's unique id
 * and MPI broadcasts it; each process joins the communicator
 * (ncclCommInitRank), fills a buffer of N floats with rank + 1 + i % 7,
 * tells cusafe that its stream now uses the buffer, queues the in-place
 * all-reduce (sum) on the buffer's address and the stream's cudaStream_t,
 * and releases its reference to the buffer while the collective is in
 * flight: cusafe frees the memory stream-ordered after it.  A second
 * reference reads the result, which every rank checks element by element
 * against the exact sum.
 *
 * Before each step that the others wait for, the ranks agree (an
 * MPI_Allreduce of their success): NCCL's collectives wait for every rank,
 * so a rank that failed before its part would leave the others waiting
 * for ever.  NVLink multicast (NVLS) stays off unless the environment says
 * otherwise.
 *
 * Output: rank 0 prints "nccl_mpi: R ranks on H hosts, N floats, W wrong".
 * Exit status: 0 when every element of every rank is right; 77 (automake's
 * SKIP) on every rank when some host has no CUDA driver or device, or
 * fewer GPUs than processes; 1 on any failure, with a message on stderr. */
#define _POSIX_C_SOURCE 200809L

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cusafe.h>
#include <mpi.h>
#include <nccl.h>

#define N ((size_t)1 << 20) /* floats per rank */

static int rank, nranks;

/* Whether every rank has ok set: each step that involves the others goes
 * ahead only when all agree. */
static int all_ok(int ok) {
  int all = 0;
  if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD) !=
      MPI_SUCCESS) {
    fprintf(stderr, "nccl_mpi: rank %d: MPI_Allreduce failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  return all;
}

static int cusafe_failed(const char *what, cusafe_status st) {
  fprintf(stderr, "nccl_mpi: rank %d: %s: %s: %s\n", rank, what,
          cusafe_status_string(st), cusafe_last_error_message());
  return 0;
}

static int nccl_failed(const char *what, ncclResult_t res, ncclComm_t comm) {
  fprintf(stderr, "nccl_mpi: rank %d: %s: %s (%s)\n", rank, what,
          ncclGetErrorString(res), ncclGetLastError(comm));
  return 0;
}

#define TRY(call, label)                                                       \
  do {                                                                         \
    cusafe_status st_ = (call);                                                \
    if (st_ != CUSAFE_SUCCESS) {                                               \
      cusafe_failed(#call, st_);                                               \
      goto label;                                                              \
    }                                                                          \
  } while (0)

/* Exact sums of small integers: sum over ranks q of q + 1 + i % 7. */
static size_t count_wrong(const float *host) {
  size_t wrong = 0;
  for (size_t i = 0; i < N; i++) {
    float expected = (float)(nranks * (nranks + 1) / 2 + nranks * (int)(i % 7));
    if (host[i] != expected && wrong++ == 0)
      fprintf(stderr, "nccl_mpi: rank %d: element %zu is %g, expected %g\n",
              rank, i, host[i], expected);
  }
  return wrong;
}

/* This process's rank among those of its host, their number, and the
 * number of hosts. */
static void local_rank(int *local, int *nlocal, int *nhosts) {
  MPI_Comm node;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                      &node);
  MPI_Comm_rank(node, local);
  MPI_Comm_size(node, nlocal);
  MPI_Comm_free(&node);
  int first = *local == 0;
  MPI_Allreduce(&first, nhosts, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
  if (setenv("NCCL_NVLS_ENABLE", "0", 0) != 0) {
    perror("nccl_mpi: setenv NCCL_NVLS_ENABLE");
    return 1;
  }
  if (MPI_Init(&argc, &argv) != MPI_SUCCESS) {
    fprintf(stderr, "nccl_mpi: MPI_Init failed\n");
    return 1;
  }
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  int local = 0, nlocal = 1, nhosts = 1;
  local_rank(&local, &nlocal, &nhosts);

  /* Every host needs a GPU per process: else every rank skips. */
  int ndev = 0;
  cusafe_status st = cusafe_device_count(&ndev);
  int usable = st == CUSAFE_SUCCESS && nlocal <= ndev && nranks >= 2;
  int fatal = st != CUSAFE_SUCCESS && st != CUSAFE_ERROR_NO_DRIVER &&
              st != CUSAFE_ERROR_NO_DEVICE;
  if (fatal)
    cusafe_failed("cusafe_device_count", st);
  if (!all_ok(usable)) {
    int any_fatal = 0;
    MPI_Allreduce(&fatal, &any_fatal, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD);
    if (rank == 0 && !any_fatal) {
      if (nranks < 2)
        printf("SKIP: an all-reduce needs 2 ranks or more; run it with "
               "mpirun -np 2 or more\n");
      else if (st != CUSAFE_SUCCESS)
        printf("SKIP: %s\n", cusafe_last_error_message());
      else
        printf("SKIP: %d processes on a host of %d GPU(s), or a host "
               "without CUDA: one GPU per process\n",
               nlocal, ndev);
    }
    MPI_Finalize();
    return any_fatal ? 1 : 77;
  }

  /* The communicator lives in the device's primary context: a reference
   * on the cusafe context keeps it from before the communicator until
   * after. */
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_stream stream = CUSAFE_NULL_HANDLE;
  cusafe_buffer buf = CUSAFE_NULL_HANDLE, reader = CUSAFE_NULL_HANDLE;
  ncclComm_t comm = NULL;
  ncclUniqueId id;
  ncclResult_t res;
  void *ptr = NULL, *cuda_stream = NULL;
  const size_t bytes = N * sizeof(float);
  float *host = malloc(bytes);
  size_t wrong = 0;
  int ok = 0;

  if (!host) {
    fprintf(stderr, "nccl_mpi: rank %d: out of host memory\n", rank);
    goto setup_done;
  }
  for (size_t i = 0; i < N; i++)
    host[i] = (float)(rank + 1 + (int)(i % 7));
  TRY(cusafe_context_create(&ctx, local), setup_done);
  TRY(cusafe_stream_create(&stream, ctx, CUSAFE_STREAM_NON_BLOCKING, 0),
      setup_done);
  TRY(cusafe_buffer_alloc(&buf, ctx, CUSAFE_MEMORY_DEVICE, bytes), setup_done);
  TRY(cusafe_buffer_write(buf, 0, host, bytes), setup_done);
  TRY(cusafe_buffer_interop_pointer(&ptr, buf), setup_done);
  TRY(cusafe_stream_interop_handle(&cuda_stream, stream), setup_done);
  TRY(cusafe_buffer_retain(buf), setup_done);
  reader = buf;
  ok = 1;
  if (rank == 0 && (res = ncclGetUniqueId(&id)) != ncclSuccess)
    ok = nccl_failed("ncclGetUniqueId", res, NULL);
setup_done:
  if (!all_ok(ok)) {
    ok = 0;
    goto cleanup;
  }

  /* NCCL's unique id, from rank 0 to every rank, wherever it runs; then
   * the communicator, with the device current (cusafe's calls leave the
   * calling thread's device as they found it, and NCCL uses it). */
  ok = 0;
  if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD) != MPI_SUCCESS) {
    fprintf(stderr, "nccl_mpi: rank %d: MPI_Bcast failed\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (cudaSetDevice(local) != cudaSuccess) {
    fprintf(stderr, "nccl_mpi: rank %d: cudaSetDevice(%d) failed\n", rank,
            local);
    MPI_Abort(MPI_COMM_WORLD, 1); /* the others wait in ncclCommInitRank */
  }
  res = ncclCommInitRank(&comm, nranks, id, rank);
  if (res != ncclSuccess) {
    nccl_failed("ncclCommInitRank", res, NULL);
    MPI_Abort(MPI_COMM_WORLD, 1); /* the others may wait in it for ever */
  }
  TRY(cusafe_stream_use_buffers(stream, &buf, 1), queued);
  res = ncclAllReduce(ptr, ptr, N, ncclFloat, ncclSum, comm,
                      (cudaStream_t)cuda_stream);
  if (res != ncclSuccess) {
    nccl_failed("ncclAllReduce", res, comm);
    goto queued;
  }
  /* Legal with the all-reduce still running: the memory goes back only
   * after it, stream-ordered (and here, `reader` holds it too). */
  st = cusafe_buffer_release(buf);
  buf = CUSAFE_NULL_HANDLE;
  if (st != CUSAFE_SUCCESS) {
    cusafe_failed("cusafe_buffer_release(buf)", st);
    goto queued;
  }
  ok = 1;
queued:
  if (!all_ok(ok)) {
    /* Some rank queued no all-reduce: ours would wait for it for ever.
     * Aborting the communicator ends it (a local call). */
    if (comm && (res = ncclCommAbort(comm)) != ncclSuccess)
      nccl_failed("ncclCommAbort", res, NULL);
    comm = NULL;
    ok = 0;
    goto cleanup;
  }

  /* The read is ordered after the stream's work, the all-reduce included. */
  ok = 0;
  TRY(cusafe_buffer_read(reader, 0, host, bytes), cleanup);
  wrong = count_wrong(host);
  ok = 1;

cleanup:
  if ((st = cusafe_buffer_release(buf)) != CUSAFE_SUCCESS)
    ok = cusafe_failed("cusafe_buffer_release(buf)", st);
  if ((st = cusafe_buffer_release(reader)) != CUSAFE_SUCCESS)
    ok = cusafe_failed("cusafe_buffer_release(reader)", st);
  if ((st = cusafe_stream_release(stream)) != CUSAFE_SUCCESS)
    ok = cusafe_failed("cusafe_stream_release", st);
  /* The communicator goes before its context: finalize waits for the
   * other ranks, so all agree first. */
  if (comm) {
    if (all_ok(ok)) {
      if ((res = ncclCommFinalize(comm)) != ncclSuccess)
        ok = nccl_failed("ncclCommFinalize", res, comm);
      if ((res = ncclCommDestroy(comm)) != ncclSuccess)
        ok = nccl_failed("ncclCommDestroy", res, NULL);
    } else if ((res = ncclCommAbort(comm)) != ncclSuccess) {
      ok = nccl_failed("ncclCommAbort", res, NULL);
    }
  }
  if ((st = cusafe_context_release(ctx)) != CUSAFE_SUCCESS)
    ok = cusafe_failed("cusafe_context_release", st);
  free(host);

  unsigned long long mine = wrong, total = 0;
  MPI_Reduce(&mine, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, 0,
             MPI_COMM_WORLD);
  int all = all_ok(ok);
  if (rank == 0 && all)
    printf("nccl_mpi: %d ranks on %d host%s, %zu floats, %llu wrong\n", nranks,
           nhosts, nhosts == 1 ? "" : "s", N, total);
  MPI_Finalize();
  return all && total == 0 ? 0 : 1;
}
