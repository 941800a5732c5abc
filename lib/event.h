/* event.h -- events (event.c).  Internal; never installed. */
#ifndef CUSAFE_EVENT_H
#define CUSAFE_EVENT_H

#include "handle.h"

struct cs_event {
  struct cs_object hdr;
  struct cs_context *ctx; /* referenced */
  cudaEvent_t event;
  unsigned int flags;
  /* The capture (its id, graph.h) that the event's latest record was in,
   * 0 if it was not in one. */
  _Atomic uint64_t capture_id;
};

#endif /* CUSAFE_EVENT_H */
