/* consumer.c -- a program built against an installed cusafe through its
 * CMake package (tests/consumer/CMakeLists.txt): scales 1 Mi floats with
 * cusafe's built-in kernel and checks every one.
 *
 * Exit status: 0 when every element is right, 1 when the machine has no
 * CUDA driver or device (one line on stderr says which), 2 on any other
 * failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cusafe.h>

#define N ((size_t)1 << 20)

static int report(cusafe_status status) {
  if (status == CUSAFE_ERROR_NO_DRIVER) {
    fprintf(stderr, "cusafe: no CUDA driver found\n");
    return 1;
  }
  if (status == CUSAFE_ERROR_NO_DEVICE) {
    fprintf(stderr, "cusafe: no CUDA device found\n");
    return 1;
  }
  fprintf(stderr, "consumer: %s: %s\n", cusafe_status_string(status),
          cusafe_last_error_message());
  return 2;
}

int main(void) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_buffer buf = CUSAFE_NULL_HANDLE;
  cusafe_module module = CUSAFE_NULL_HANDLE;
  cusafe_kernel scale = CUSAFE_NULL_HANDLE;
  cusafe_device_properties props;
  cusafe_launch_config config;
  float *host = NULL;
  cusafe_status st;
  int count = 0, rc = 2;
  size_t i;

  /* The header, the library and the CMake package must agree. */
  if (strcmp(cusafe_version_string(), CONSUMER_CUSAFE_VERSION) != 0) {
    fprintf(stderr, "consumer: found cusafe %s, runs with cusafe %s\n",
            CONSUMER_CUSAFE_VERSION, cusafe_version_string());
    return 2;
  }
  if ((st = cusafe_device_count(&count)) != CUSAFE_SUCCESS)
    return report(st);

  host = malloc(N * sizeof *host);
  if (host == NULL) {
    fprintf(stderr, "consumer: out of host memory\n");
    return 2;
  }
  for (i = 0; i < N; i++)
    host[i] = (float)(i % 1000) - 500.0f;

  memset(&config, 0, sizeof config);
  config.grid[1] = config.grid[2] = config.block[1] = config.block[2] = 1;
  if ((st = cusafe_device_get_properties(&props, 0)) != CUSAFE_SUCCESS ||
      (st = cusafe_context_create(&ctx, 0)) != CUSAFE_SUCCESS ||
      (st = cusafe_buffer_alloc(&buf, ctx, CUSAFE_MEMORY_DEVICE,
                                N * sizeof *host)) != CUSAFE_SUCCESS ||
      (st = cusafe_buffer_write(buf, 0, host, N * sizeof *host)) !=
          CUSAFE_SUCCESS ||
      (st = cusafe_module_load_builtin(&module, ctx)) != CUSAFE_SUCCESS ||
      (st = cusafe_module_get_kernel(&scale, module, "cusafe_scale_f32")) !=
          CUSAFE_SUCCESS ||
      (st = cusafe_kernel_suggest_config(&config.block[0], &config.grid[0],
                                         scale, 0, N)) != CUSAFE_SUCCESS ||
      (st = CUSAFE_LAUNCH(scale, &config, CUSAFE_ARG_BUF(buf),
                          CUSAFE_ARG_F32V(2.0f), CUSAFE_ARG_U64V(N))) !=
          CUSAFE_SUCCESS ||
      /* The read is ordered after the kernel. */
      (st = cusafe_buffer_read(buf, 0, host, N * sizeof *host)) !=
          CUSAFE_SUCCESS) {
    rc = report(st);
    goto done;
  }
  for (i = 0; i < N; i++) {
    float want = ((float)(i % 1000) - 500.0f) * 2.0f;
    if (host[i] != want) {
      fprintf(stderr, "consumer: element %zu is %g, expected %g\n", i,
              (double)host[i], (double)want);
      goto done;
    }
  }
  printf("consumer: cusafe %s, %zu floats scaled on %s\n",
         cusafe_version_string(), N, props.name);
  rc = 0;

done:
  /* Releases in any order: children keep their parents alive. */
  if ((st = cusafe_context_release(ctx)) != CUSAFE_SUCCESS && rc == 0)
    rc = report(st);
  if ((st = cusafe_kernel_release(scale)) != CUSAFE_SUCCESS && rc == 0)
    rc = report(st);
  if ((st = cusafe_module_release(module)) != CUSAFE_SUCCESS && rc == 0)
    rc = report(st);
  if ((st = cusafe_buffer_release(buf)) != CUSAFE_SUCCESS && rc == 0)
    rc = report(st);
  free(host);
  return rc;
}
