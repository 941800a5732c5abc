/* device.h -- the current device: every CUDA call of an object is made with
 * its context's device current (device.c).  Internal; never installed. */
#ifndef CUSAFE_DEVICE_H
#define CUSAFE_DEVICE_H

#include "calls.h"

/* Makes `device` current for the calling thread; *saved receives the device
 * to restore with cs_device_leave() (-1: nothing to restore). */
cusafe_status cs_device_switch(int device, int *saved);
/* cs_device_switch(), free where the process sees one device: it is then
 * always current.  A macro, so that `device` -- a context's field, a line
 * that a launch or replay need not read otherwise -- is read only where
 * the process sees several devices. */
#define cs_device_enter(device, saved)                                         \
  (CS_LIKELY(                                                                  \
       atomic_load_explicit(&cs_hot.single_device, memory_order_relaxed))      \
       ? (*(saved) = -1, CUSAFE_SUCCESS)                                       \
       : cs_device_switch((device), (saved)))
static inline void cs_device_leave(int saved) {
  if (CS_UNLIKELY(saved >= 0))
    cs_cu->set_device(saved);
}
/* cs_device_enter() for a teardown that must synchronise the right device
 * before it frees: a failure is tried once more. */
cusafe_status cs_device_enter_teardown(int device, int *saved);
/* Destroys a CUDA object of `device`: destroy(what), with the device
 * current -- also when it cannot be made current, since the object would
 * outlive its context.  A failure of destroy names `function`. */
cusafe_status cs_device_teardown(int device, cudaError_t (*destroy)(void *),
                                 void *what, const char *function);
/* Waits for the work queued before it on `stream`, or before the latest
 * record of `event` (the other one NULL), with `device` current -- or,
 * with `query`, asks whether it is done: CUSAFE_ERROR_NOT_READY if not. */
cusafe_status cs_device_wait(int device, cudaStream_t stream, cudaEvent_t event,
                             bool query);
/* cs_device_enter_teardown(), then waits until the device is idle: the
 * start of a teardown that frees what queued work may still use. */
cusafe_status cs_device_idle(int device, int *saved);

/* Lets devices a and b reach each other's memory, once per pair and
 * where the hardware allows it: peer access between their contexts and to
 * each other's memory pool, so that peer copies go directly instead of
 * through the host.  What fails is left undone (CUDA stages such copies
 * through the host) and leaves no CUDA error behind; only the look-up of
 * the caller's current device, to be restored, is an error (nothing done,
 * tried again next time).  Thread-safe. */
cusafe_status cs_peer_enable(int a, int b);
/* Forgets what cs_peer_enable() did for `device`, whose primary context
 * goes (a new one has no peer access). */
void cs_peer_forget(int device);

/* Makes the calling thread's capture mode CUDA's relaxed one, so that
 * cusafe's own calls of a teardown (frees, waits) do not break a capture
 * that other code began in global mode on another thread; true if it did,
 * and then cs_unrelax() restores *saved. */
static inline bool cs_relax(enum cudaStreamCaptureMode *saved) {
  *saved = cudaStreamCaptureModeRelaxed;
  return cs_cu->thread_exchange_stream_capture_mode(saved) == cudaSuccess;
}
static inline void cs_unrelax(bool relaxed, enum cudaStreamCaptureMode saved) {
  if (relaxed)
    cs_cu->thread_exchange_stream_capture_mode(&saved);
}

#endif /* CUSAFE_DEVICE_H */
