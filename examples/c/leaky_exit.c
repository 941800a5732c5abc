/* leaky_exit.c -- exit with everything still alive and work still queued.
 *
 * Creates a context, streams, events, buffers, a view, the built-in module
 * and two of its kernels, queues a fill, copies and kernel launches without
 * waiting for them, and returns from main without releasing anything.
 * cusafe's exit handler waits for the work and destroys it all, in order,
 * before the CUDA runtime tears itself down: the program ends with status 0,
 * nothing on stderr, and no leak or error under
 * `compute-sanitizer --leak-check full`.  (With CUSAFE_LEAK_REPORT=1 the
 * library lists each handle still alive at exit on stderr.)
 *
 * Exit status: 0, or 1 when the machine has no CUDA driver or device, 2 on
 * any other failure. */
#include <stdio.h>
#include <stdlib.h>

#include <cusafe.h>

#define N ((size_t)1 << 20)

static int report(const char *what, cusafe_status status) {
  if (status == CUSAFE_ERROR_NO_DRIVER) {
    fprintf(stderr, "cusafe: no CUDA driver found\n");
    return 1;
  }
  if (status == CUSAFE_ERROR_NO_DEVICE) {
    fprintf(stderr, "cusafe: no CUDA device found\n");
    return 1;
  }
  fprintf(stderr, "leaky_exit: %s: %s: %s\n", what,
          cusafe_status_string(status), cusafe_last_error_message());
  return 2;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    cusafe_status st_ = (call);                                                \
    if (st_ != CUSAFE_SUCCESS)                                                 \
      return report(#call, st_);                                               \
  } while (0)

int main(void) {
  cusafe_context ctx;
  cusafe_stream s1, s2;
  cusafe_event start, done;
  cusafe_buffer x, y, z, tail;
  cusafe_module module;
  cusafe_kernel vecadd, fill;
  uint32_t block, grid;
  int nhandles = 12;
  float *ones;
  size_t i;

  CHECK(cusafe_context_create(&ctx, 0));
  CHECK(cusafe_stream_create(&s1, ctx, CUSAFE_STREAM_NON_BLOCKING, 0));
  CHECK(cusafe_stream_create(&s2, ctx, 0, 0));
  CHECK(cusafe_event_create(&start, ctx, 0));
  CHECK(cusafe_event_create(&done, ctx, CUSAFE_EVENT_DISABLE_TIMING));
  CHECK(cusafe_buffer_alloc(&x, ctx, CUSAFE_MEMORY_DEVICE, N * sizeof(float)));
  CHECK(cusafe_buffer_alloc(&y, ctx, CUSAFE_MEMORY_DEVICE, N * sizeof(float)));
  CHECK(cusafe_buffer_alloc(&z, ctx, CUSAFE_MEMORY_HOST_PINNED,
                            N * sizeof(float)));
  CHECK(cusafe_buffer_view(&tail, y, N / 2 * sizeof(float),
                           N / 2 * sizeof(float)));
  CHECK(cusafe_module_load_builtin(&module, ctx));
  CHECK(cusafe_module_get_kernel(&vecadd, module, "cusafe_vecadd_f32"));
  CHECK(cusafe_module_get_kernel(&fill, module, "cusafe_fill_f32"));

  ones = malloc(N * sizeof(float));
  if (ones == NULL) {
    fprintf(stderr, "leaky_exit: out of host memory\n");
    return 2;
  }
  for (i = 0; i < N; i++)
    ones[i] = 1.0f;
  CHECK(cusafe_buffer_write(x, 0, ones, N * sizeof(float)));
  free(ones);

  CHECK(cusafe_kernel_suggest_config(&block, &grid, vecadd, 0, N));
  cusafe_launch_config config = {{grid, 1, 1}, {block, 1, 1}, 0, s1};
  CHECK(cusafe_event_record(start, s1));
  CHECK(cusafe_buffer_fill(y, 0, N * sizeof(float), 0, s1));
  CHECK(CUSAFE_LAUNCH(fill, &config, CUSAFE_ARG_BUF(tail),
                      CUSAFE_ARG_F32V(2.0f), CUSAFE_ARG_U64V(N / 2)));
  for (i = 0; i < 8; i++) { /* queued, never waited for */
    CHECK(CUSAFE_LAUNCH(vecadd, &config, CUSAFE_ARG_BUF(y), CUSAFE_ARG_BUF(x),
                        CUSAFE_ARG_BUF(y), CUSAFE_ARG_U64V(N)));
    CHECK(cusafe_buffer_copy(z, 0, y, 0, N * sizeof(float), s2));
  }
  CHECK(cusafe_event_record(done, s2));

  printf("leaky_exit: exiting with %d live handles and work queued\n",
         nhandles);
  return 0;
}
