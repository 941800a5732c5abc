/* roundtrip.c -- copy 1 MiB through two device buffers and check every byte.
 *
 * Exit status: 0 when the data came back intact, 1 when the machine has no
 * CUDA driver or device, 2 on any other failure. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cusafe.h>

#define SIZE ((size_t)1 << 20)

/* Prints why a call failed and returns the exit status that goes with it. */
static int report(cusafe_status status) {
  if (status == CUSAFE_ERROR_NO_DRIVER) {
    fprintf(stderr, "cusafe: no CUDA driver found\n");
    return 1;
  }
  if (status == CUSAFE_ERROR_NO_DEVICE) {
    fprintf(stderr, "cusafe: no CUDA device found\n");
    return 1;
  }
  fprintf(stderr, "roundtrip: %s : %s\n", cusafe_status_string(status),
          cusafe_last_error_message());
  return 2;
}

/* A failed release is reported unless an earlier failure already was. */
static void release_checked(cusafe_status status, int *rc) {
  if (status != CUSAFE_SUCCESS && *rc == 0)
    *rc = report(status);
}

int main(void) {
  cusafe_context ctx = CUSAFE_NULL_HANDLE;
  cusafe_buffer a = CUSAFE_NULL_HANDLE, b = CUSAFE_NULL_HANDLE;
  cusafe_device_properties props;
  unsigned char *in = NULL, *out = NULL;
  cusafe_status st;
  int count = 0, rc = 2;
  size_t i;

  if ((st = cusafe_device_count(&count)) != CUSAFE_SUCCESS)
    return report(st);

  in = malloc(SIZE);
  out = malloc(SIZE);
  if (in == NULL || out == NULL) {
    fprintf(stderr, "roundtrip: out of host memory\n");
    goto done;
  }
  for (i = 0; i < SIZE; i++)
    in[i] = (unsigned char)(i * 31u + 7u);
  memset(out, 0, SIZE);

  if ((st = cusafe_device_get_properties(&props, 0)) != CUSAFE_SUCCESS ||
      (st = cusafe_context_create(&ctx, 0)) != CUSAFE_SUCCESS ||
      (st = cusafe_buffer_alloc(&a, ctx, CUSAFE_MEMORY_DEVICE, SIZE)) !=
          CUSAFE_SUCCESS ||
      (st = cusafe_buffer_alloc(&b, ctx, CUSAFE_MEMORY_DEVICE, SIZE)) !=
          CUSAFE_SUCCESS ||
      (st = cusafe_buffer_write(a, 0, in, SIZE)) != CUSAFE_SUCCESS ||
      (st = cusafe_buffer_copy(b, 0, a, 0, SIZE, CUSAFE_STREAM_DEFAULT)) !=
          CUSAFE_SUCCESS ||
      /* read waits for the copy: cusafe orders work on a buffer. */
      (st = cusafe_buffer_read(b, 0, out, SIZE)) != CUSAFE_SUCCESS) {
    rc = report(st);
    goto done;
  }

  for (i = 0; i < SIZE; i++) {
    if (out[i] != in[i]) {
      fprintf(stderr, "roundtrip: byte %zu is 0x%02x, expected 0x%02x\n", i,
              out[i], in[i]);
      goto done;
    }
  }
  rc = 0;

done:
  /* Children first; releasing CUSAFE_NULL_HANDLE is a no-op. */
  release_checked(cusafe_buffer_release(b), &rc);
  release_checked(cusafe_buffer_release(a), &rc);
  release_checked(cusafe_context_release(ctx), &rc);
  free(out);
  free(in);
  if (rc == 0)
    printf("roundtrip: %zu bytes verified on %s\n", SIZE, props.name);
  return rc;
}
