/* dlpack_tensor.c -- memory of another library, wrapped by cusafe, filled
 * by a cusafe kernel, and handed on to a third party as a DLPack tensor;
 * each side lets go when it likes, and the memory goes back to its owner
 * once, after the last of them and after the work queued on it.
 *
 * "matlib" plays the library that owns the memory (it allocates through
 * cusafe too, to need nothing but cusafe; a real one would call cudaMalloc
 * or its own pool) and "consumer" the framework that receives the tensor
 * (it imports it into cusafe; a real one would read dl_tensor.data).
 *
 * Exit status: 0 when the consumer saw the right values and the memory
 * went back once, 1 when the machine has no CUDA driver or device, 2 on
 * any other failure. */
#include <stdio.h>
#include <stdlib.h>

#include <cusafe.h>
#include <cusafe_dlpack.h>

#define ROWS 4
#define COLS 256

static int report(const char *what, cusafe_status status) {
  if (status == CUSAFE_ERROR_NO_DRIVER || status == CUSAFE_ERROR_NO_DEVICE) {
    fprintf(stderr, "cusafe: no CUDA %s found\n",
            status == CUSAFE_ERROR_NO_DRIVER ? "driver" : "device");
    return 1;
  }
  fprintf(stderr, "dlpack_tensor: %s: %s: %s\n", what,
          cusafe_status_string(status), cusafe_last_error_message());
  return 2;
}

#define TRY(call)                                                              \
  do {                                                                         \
    cusafe_status st_ = (call);                                                \
    if (st_ != CUSAFE_SUCCESS)                                                 \
      return report(#call, st_);                                               \
  } while (0)

/* ---- matlib: owns device memory; frees it when told ---------------------- */

static cusafe_buffer matlib_storage;
static int matlib_frees;

static void *matlib_alloc(cusafe_context ctx, size_t size) {
  void *ptr = NULL;
  if (cusafe_buffer_alloc(&matlib_storage, ctx, CUSAFE_MEMORY_DEVICE, size) ||
      cusafe_buffer_interop_pointer(&ptr, matlib_storage))
    return NULL;
  return ptr;
}

/* cusafe's release function for matlib's memory. */
static void matlib_free(void *user) {
  (void)user;
  matlib_frees++;
  cusafe_buffer_release(matlib_storage);
}

/* ---- consumer: takes the tensor, checks it, deletes it --------------------
 */

static int consumer(cusafe_context ctx, DLManagedTensorVersioned *t) {
  const DLTensor *dl = &t->dl_tensor;
  if (dl->ndim != 2 || dl->shape[0] != ROWS || dl->shape[1] != COLS ||
      dl->dtype.code != kDLFloat || dl->dtype.bits != 32 ||
      dl->device.device_type != kDLCUDA) {
    fprintf(stderr, "dlpack_tensor: the tensor is not %d x %d floats\n", ROWS,
            COLS);
    t->deleter(t);
    return 2;
  }
  cusafe_buffer in = CUSAFE_NULL_HANDLE;
  cusafe_status st = cusafe_buffer_from_dlpack(&in, ctx, t);
  if (st != CUSAFE_SUCCESS) {
    t->deleter(t); /* refused: still ours */
    return report("cusafe_buffer_from_dlpack", st);
  }
  static float host[ROWS * COLS];
  TRY(cusafe_buffer_read(in, 0, host, sizeof host));
  TRY(cusafe_buffer_release(in)); /* deletes the tensor */
  for (int i = 0; i < ROWS * COLS; i++)
    if (host[i] != 2.5f) {
      fprintf(stderr, "dlpack_tensor: element %d is %g, expected 2.5\n", i,
              host[i]);
      return 2;
    }
  return 0;
}

int main(void) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_stream stream = CUSAFE_NULL_HANDLE;
  cusafe_buffer wrapped = CUSAFE_NULL_HANDLE;
  cusafe_module module = CUSAFE_NULL_HANDLE;
  cusafe_kernel fill = CUSAFE_NULL_HANDLE;
  DLManagedTensorVersioned *tensor = NULL;
  const size_t n = ROWS * COLS, bytes = n * sizeof(float);

  TRY(cusafe_context_create(&ctx, 0));
  TRY(cusafe_stream_create(&stream, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  void *ptr = matlib_alloc(ctx, bytes);
  if (!ptr)
    return report("matlib_alloc", CUSAFE_ERROR_OUT_OF_MEMORY);
  /* matlib's memory in cusafe: checked against what CUDA says of it. */
  TRY(cusafe_buffer_wrap(&wrapped, ctx, CUSAFE_MEMORY_DEVICE, ptr, bytes,
                         matlib_free, NULL));
  TRY(cusafe_module_load_builtin(&module, ctx));
  TRY(cusafe_module_get_kernel(&fill, module, "cusafe_fill_f32"));
  cusafe_launch_config cfg = {
      {(uint32_t)(n + 255) / 256, 1, 1}, {256, 1, 1}, 0, stream};
  cusafe_arg args[] = {CUSAFE_ARG_BUF(wrapped), CUSAFE_ARG_F32V(2.5f),
                       CUSAFE_ARG_U64V(n)};
  TRY(cusafe_kernel_launch(fill, &cfg, args, 3));
  /* The tensor for the consumer, on the same stream: it holds the buffer,
   * so every handle of ours can go at once -- the fill is still queued. */
  const int64_t shape[2] = {ROWS, COLS};
  TRY(cusafe_buffer_to_dlpack(&tensor, wrapped, 0,
                              (DLDataType){kDLFloat, 32, 1}, 2, shape, NULL,
                              stream));
  TRY(cusafe_buffer_release(wrapped));
  TRY(cusafe_kernel_release(fill));
  TRY(cusafe_module_release(module));
  TRY(cusafe_stream_release(stream));
  int rc = consumer(ctx, tensor);
  TRY(cusafe_context_release(ctx));
  if (rc == 0 && matlib_frees != 1) {
    fprintf(stderr, "dlpack_tensor: matlib's memory went back %d times\n",
            matlib_frees);
    rc = 2;
  }
  if (rc == 0)
    printf("dlpack_tensor: %d x %d floats verified; matlib's memory went back "
           "%d time\n",
           ROWS, COLS, matlib_frees);
  return rc;
}
