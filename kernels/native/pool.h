/* pool.c: the kernels' threads (output rows split over the caller and persistent workers) */
#ifndef ZENEDGE_POOL_H
#define ZENEDGE_POOL_H
#include <stdint.h>

/* Work on items begin..end-1 of a job (a range of output blocks): arg is the job's own structure */
typedef void (*zenedge_job)(const void *arg, int64_t begin, int64_t end);

/* job(arg, ·) over items 0..count-1, in ranges of whole multiples of `grain` items, on this
   thread's count of threads (zenedge_set_threads; 1 by default); returns when all are done */
void zenedge_parallel(zenedge_job job, const void *arg, int64_t count, int64_t grain);
/* The threads this calling thread's kernels use from now on (itself included): how many it gets,
   fewer where workers could not be started */
int64_t zenedge_set_threads(int64_t threads);
int64_t zenedge_threads(void);
#endif
