/* event.h -- events (event.c).  Internal; never installed. */
#ifndef CUSAFE_EVENT_H
#define CUSAFE_EVENT_H

#include <pthread.h>

#include "handle.h"

/* capture_id of an event last recorded in a capture of other code. */
#define CS_EVENT_OTHER_CAPTURE UINT64_MAX

struct cs_event {
  struct cs_object hdr;
  struct cs_context *ctx; /* referenced */
  cudaEvent_t event;
  unsigned int flags;
  /* The capture (its id, graph.h) that the event's latest record was in,
   * 0 if it was not in one, CS_EVENT_OTHER_CAPTURE if in a capture of
   * other code (on a wrapped stream). */
  _Atomic uint64_t capture_id;
  /* A record and what depends on where the latest one was are one step
   * against each other (event.c, "records and waits"): records and
   * streams' waits take the lock; host_waits counts the synchronisations,
   * queries and timings in progress, which a record into a capture waits
   * for. */
  pthread_mutex_t lock;
  unsigned host_waits; /* under lock */
};

#endif /* CUSAFE_EVENT_H */
