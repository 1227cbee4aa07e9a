/* The kernels' threads: one product split by output rows over the cores the caller was given.
 *
 * A decode step reads every weight once. At real size (1-8B) one core streams them at about half
 * of what the memory gives two (BENCHMARKS.md), so the step's products, the head and the sign
 * slices split their output rows over `zenedge_set_threads(n)` threads: the caller and n - 1
 * persistent workers, started on first use and kept. Every output element is summed by one thread
 * in the same order as on one, so the split changes no bit (tests/kernels/native checks it).
 *
 * A job is cut into more chunks than threads, and each thread takes the next chunk as it finishes
 * one (an atomic ticket), the caller included. So no thread waits for another to *start*: a
 * worker whose core is held by another process just takes fewer chunks, or none. The caller waits
 * only for chunks already taken, at most one per worker. (runtime/threads.py also gives the step
 * fewer threads while other processes hold cores.)
 *
 * The ticket is one 64-bit word: the job's generation (32 bits), how many threads may take part
 * (8), its chunk count (12) and the next chunk (12). A worker takes chunk i of generation g by a
 * compare-and-swap of the word it read; a worker that read an older job's word fails the swap and
 * looks again. A chunk taken belongs to the job in force, whose caller cannot return before it is
 * done, so the job's fields it then reads are that job's.
 *
 * Workers spin on the ticket for SPIN_NS after a job (a step's next product follows within
 * microseconds), then sleep on a condition variable. One caller at a time uses the workers; a
 * second one (another Python thread's kernels, at the same moment) runs its job alone, in its own
 * thread. Threads that cannot be started are not an error: the jobs run on those that were
 * (`zenedge_set_threads` returns how many).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include "pool.h"

#define MAX_THREADS 64
#define MAX_CHUNKS 4095
#define SPIN_NS 200000          /* how long an idle worker watches for the next job before it sleeps */

#if defined(__x86_64__) || defined(__i386__)
#define RELAX() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define RELAX() __asm__ __volatile__("yield")
#else
#define RELAX() ((void)0)
#endif

typedef struct {
    zenedge_job job;
    const void *arg;
    int64_t count, per_chunk;   /* items, and items per chunk */
} job_fields;

static struct {
    _Atomic uint64_t ticket;
    _Atomic int64_t done;       /* chunks of the job in force finished */
    job_fields job;
    pthread_mutex_t caller;     /* held by the one caller using the workers */
    pthread_mutex_t lock;       /* the workers' sleep */
    pthread_cond_t wake;
    int sleeping;
    int started;                /* workers running */
} pool = {.caller = PTHREAD_MUTEX_INITIALIZER, .lock = PTHREAD_MUTEX_INITIALIZER, .wake = PTHREAD_COND_INITIALIZER};

static _Thread_local int64_t wanted = 1;

#define GENERATION(t) ((uint32_t)((t) >> 32))
#define HELPERS(t) ((int)(((t) >> 24) & 0xFF))
#define CHUNKS(t) ((int64_t)(((t) >> 12) & 0xFFF))
#define NEXT(t) ((int64_t)((t) & 0xFFF))

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void run_chunk(const job_fields *job, int64_t chunk) {
    const int64_t begin = chunk * job->per_chunk;
    const int64_t end = begin + job->per_chunk < job->count ? begin + job->per_chunk : job->count;
    job->job(job->arg, begin, end);
}

/* Take and run chunks of generation `generation` while there are some; `index` is this thread's
   place (0: the caller), which takes part only below the job's helper count. */
static void take_chunks(uint32_t generation, int index) {
    uint64_t t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    while (GENERATION(t) == generation && index < HELPERS(t) && NEXT(t) < CHUNKS(t)) {
        if (!atomic_compare_exchange_weak_explicit(&pool.ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;                               /* t now holds the word as it is: look again */
        run_chunk(&pool.job, NEXT(t));
        atomic_fetch_add_explicit(&pool.done, 1, memory_order_release);
        t = atomic_load_explicit(&pool.ticket, memory_order_acquire);
    }
}

static void *worker(void *place) {
    const int index = (int)(intptr_t)place;
    uint32_t seen = GENERATION(atomic_load(&pool.ticket));
    for (;;) {
        const int64_t since = now_ns();
        uint32_t generation;
        for (int spins = 0; (generation = GENERATION(atomic_load_explicit(&pool.ticket, memory_order_acquire))) == seen;
             spins++) {
            RELAX();
            if (spins % 256 == 255 && now_ns() - since > SPIN_NS) {
                pthread_mutex_lock(&pool.lock);
                while ((generation = GENERATION(atomic_load(&pool.ticket))) == seen) {
                    pool.sleeping++;
                    pthread_cond_wait(&pool.wake, &pool.lock);
                    pool.sleeping--;
                }
                pthread_mutex_unlock(&pool.lock);
                break;
            }
        }
        seen = generation;
        take_chunks(generation, index);
    }
    return NULL;
}

/* Start workers until `threads` threads (the caller and its workers) can run; how many can */
static int64_t start_workers(int64_t threads) {
    pthread_mutex_lock(&pool.caller);
    while (pool.started + 1 < threads) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attributes, 1 << 20);
        const int failed = pthread_create(&thread, &attributes, worker, (void *)(intptr_t)(pool.started + 1));
        pthread_attr_destroy(&attributes);
        if (failed)
            break;
        pool.started++;
    }
    const int64_t running = pool.started + 1;
    pthread_mutex_unlock(&pool.caller);
    return running;
}

int64_t zenedge_set_threads(int64_t threads) {
    threads = threads < 1 ? 1 : threads > MAX_THREADS ? MAX_THREADS : threads;
    const int64_t running = threads > 1 ? start_workers(threads) : 1;
    wanted = running < threads ? running : threads;
    return wanted;
}

int64_t zenedge_threads(void) {
    return wanted;
}

void zenedge_parallel(zenedge_job job, const void *arg, int64_t count, int64_t grain) {
    grain = grain < 1 ? 1 : grain;
    const int64_t units = (count + grain - 1) / grain;
    int64_t threads = wanted < units ? wanted : units;
    if (threads <= 1 || pthread_mutex_trylock(&pool.caller)) {
        if (count > 0)
            job(arg, 0, count);            /* one thread, or the workers are another caller's now */
        return;
    }
    /* About 8 chunks per thread: fine enough that a slow thread holds up little, coarse enough
       that taking one costs nothing next to its work. */
    int64_t chunks = threads * 8 < units ? threads * 8 : units;
    chunks = chunks > MAX_CHUNKS ? MAX_CHUNKS : chunks;
    const int64_t per_chunk = (units + chunks - 1) / chunks * grain;
    chunks = (count + per_chunk - 1) / per_chunk;
    pool.job = (job_fields){job, arg, count, per_chunk};
    atomic_store_explicit(&pool.done, 0, memory_order_relaxed);
    const uint32_t generation = GENERATION(atomic_load(&pool.ticket)) + 1;
    atomic_store_explicit(&pool.ticket, (uint64_t)generation << 32 | (uint64_t)threads << 24 | (uint64_t)chunks << 12,
                          memory_order_release);
    pthread_mutex_lock(&pool.lock);
    if (pool.sleeping)
        pthread_cond_broadcast(&pool.wake);
    pthread_mutex_unlock(&pool.lock);
    take_chunks(generation, 0);
    for (int spins = 0; atomic_load_explicit(&pool.done, memory_order_acquire) < chunks; spins++) {
        RELAX();
        if (spins > 4096)
            sched_yield();                 /* a worker holding a chunk lost its core: give it ours */
    }
    pthread_mutex_unlock(&pool.caller);
}
