"""The C source of the GEMM pool (kernels/gemm_calls.py): a product's BLAS calls (or a fused
loop's pieces: a large parameter's AdamW ranges, a blocked transpose's; gemm_calls.PooledCalls)
run by the calling thread and the library's own worker threads, none of which takes the
interpreter lock.
Compiled into the one fused library by kernels/native.py."""

GEMM_SOURCE = r"""
#include <pthread.h>
#include <stdatomic.h>
#include <sched.h>
#include <time.h>
/* ---- the GEMM pool: cblas_sgemm calls (numpy's own BLAS, through its ILP64 symbol) claimed one
   at a time by the calling thread and the pool's workers; the caller returns when every call is
   done and waits only for calls a worker has begun (a worker the machine has not run yet claims
   none: the caller runs them). One job at a time: a caller that finds the pool busy (another
   thread's job) runs its calls itself. Idle workers spin `spin_ns` for the next job (a sleeping
   thread took ~40 us to wake on the 2-vCPU VM, longer after a long sleep), then sleep on a condition
   variable; gemm_hush sends them to sleep at once. */
typedef void (*sgemm64_fn)(int, int, int, int64_t, int64_t, int64_t, float, const float *, int64_t,
                           const float *, int64_t, float, float *, int64_t);
typedef void (*adamw_fn)(int64_t, const float *, const float *, const float *, const float *, float *,
                         float *, float *, const float *, int64_t, int);
typedef void (*transpose_fn)(const uint32_t *, uint32_t *, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t);
typedef void (*rows_fn)(const float *, float *, int64_t, int64_t, int64_t);
/* a call of kind GC_SGEMM: order, trans a, trans b, m, n, k, a, lda, b, ldb, c, ldc (alpha 1, beta
   0: numpy's); of kind GC_ADAMW: adamw_f32's n, p, g, m, v, p', m', v', constants, step, mode (a
   range of one parameter's update: kernels/optimizer.py), the last field unused; of kind
   GC_TRANSPOSE32: transpose32's x, y, rows, cols, b0, b1, c0, c1 (kernels/transpose.py); of kind
   GC_ROWS: a row loop's x, y, r0, r1, c (rows r0..r1 of [rows, c] arrays: softmax_rows_f32; of
   single elements: gelu_f32, and gelu_grad_f32 with dy as x, dx as y and x's address as c) */
enum { GC_FIELDS = 12, GC_MAX_WORKERS = 256, GC_SGEMM = 0, GC_ADAMW = 1, GC_TRANSPOSE32 = 2, GC_ROWS = 3 };
static struct {
    pthread_mutex_t mu;
    pthread_cond_t wake;
    long gen;               /* bumped under mu for each job handed out */
    int workers;            /* started */
    int hooked;             /* pthread_atfork registered */
    atomic_int busy;        /* a job is in the pool */
    atomic_int open;        /* workers may claim the job's calls */
    atomic_int active;      /* workers inside the job */
    atomic_llong next;      /* the next call to claim */
    atomic_llong done;      /* calls finished */
    atomic_long spin_ns;
    atomic_long seen;       /* the last job a worker looked at (a spinning worker's signal) */
    atomic_long hush;       /* bumped by gemm_hush: spinning workers sleep now */
    void *fn;
    int kind;
    const int64_t *calls;
    int64_t count;
} GP = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER};

static double gp_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void gp_call(int kind, void *fn, const int64_t *c) {
    if (kind == GC_ADAMW)
        ((adamw_fn)fn)(c[0], (const float *)(intptr_t)c[1], (const float *)(intptr_t)c[2],
                       (const float *)(intptr_t)c[3], (const float *)(intptr_t)c[4], (float *)(intptr_t)c[5],
                       (float *)(intptr_t)c[6], (float *)(intptr_t)c[7], (const float *)(intptr_t)c[8], c[9],
                       (int)c[10]);
    else if (kind == GC_ROWS)
        ((rows_fn)fn)((const float *)(intptr_t)c[0], (float *)(intptr_t)c[1], c[2], c[3], c[4]);
    else if (kind == GC_TRANSPOSE32)
        ((transpose_fn)fn)((const uint32_t *)(intptr_t)c[0], (uint32_t *)(intptr_t)c[1], c[2], c[3], c[4], c[5], c[6],
                           c[7]);
    else
        ((sgemm64_fn)fn)((int)c[0], (int)c[1], (int)c[2], c[3], c[4], c[5], 1.0f, (const float *)(intptr_t)c[6],
                         c[7], (const float *)(intptr_t)c[8], c[9], 0.0f, (float *)(intptr_t)c[10], c[11]);
}

static int64_t gp_drain(void) {
    int64_t ran = 0, i;
    while ((i = atomic_fetch_add(&GP.next, 1)) < GP.count) {
        gp_call(GP.kind, GP.fn, GP.calls + i * GC_FIELDS);
        atomic_fetch_add(&GP.done, 1);
        ran++;
    }
    return ran;
}

static void *gp_worker(void *arg) {
    (void)arg;
    long seen = atomic_load(&GP.seen);
    for (;;) {
        double until = gp_now() + 1e-9 * (double)atomic_load(&GP.spin_ns);
        long hush = atomic_load(&GP.hush);
        while (atomic_load(&GP.seen) == seen && atomic_load(&GP.hush) == hush && gp_now() < until) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#endif
        }
        pthread_mutex_lock(&GP.mu);
        while (GP.gen == seen) pthread_cond_wait(&GP.wake, &GP.mu);
        seen = GP.gen;
        pthread_mutex_unlock(&GP.mu);
        atomic_fetch_add(&GP.active, 1);
        if (atomic_load(&GP.open)) gp_drain();
        atomic_fetch_sub(&GP.active, 1);
    }
    return 0;
}

static void gp_after_fork(void) {  /* the child has none of the workers: start afresh */
    pthread_mutex_init(&GP.mu, 0);
    pthread_cond_init(&GP.wake, 0);
    GP.workers = 0;
    atomic_store(&GP.busy, 0);
    atomic_store(&GP.open, 0);
    atomic_store(&GP.active, 0);
}

static int gp_start(int want) {
    if (!GP.hooked) { pthread_atfork(0, 0, gp_after_fork); GP.hooked = 1; }
    if (want > GC_MAX_WORKERS) want = GC_MAX_WORKERS;
    while (GP.workers < want) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, gp_worker, 0);
        pthread_attr_destroy(&attr);
        if (failed) break;
        GP.workers++;
    }
    return GP.workers < want ? GP.workers : want;
}

/* Spinning workers go to sleep now: another pool (kernels/parallel.py's Python workers) is about
   to need the cores. */
void gemm_hush(void) { atomic_fetch_add(&GP.hush, 1); }

/* Run `count` calls of `kind` (GC_FIELDS int64 each) to `fn` with up to `workers` pool threads
   beside this one; out[0] = seconds this thread spent on its own calls, out[1] = how many it ran;
   returns the seconds from the start to the last call done. */
double gemm_calls(void *fn, const int64_t *calls, int64_t count, int64_t workers, int64_t spin_ns, double *out,
                  int64_t kind) {
    double t0 = gp_now();
    int expected = 0;
    if (workers <= 0 || count <= 1 || !atomic_compare_exchange_strong(&GP.busy, &expected, 1)) {
        for (int64_t i = 0; i < count; i++) gp_call((int)kind, fn, calls + i * GC_FIELDS);
        out[0] = gp_now() - t0;
        out[1] = (double)count;
        return out[0];
    }
    GP.fn = fn;
    GP.kind = (int)kind;
    GP.calls = calls;
    GP.count = count;
    atomic_store(&GP.spin_ns, spin_ns);
    atomic_store(&GP.done, 0);
    atomic_store(&GP.next, 0);
    atomic_store(&GP.open, 1);
    pthread_mutex_lock(&GP.mu);
    int woken = gp_start((int)(workers < count - 1 ? workers : count - 1));
    GP.gen++;
    atomic_store(&GP.seen, GP.gen);
    if (woken > 1) pthread_cond_broadcast(&GP.wake); else pthread_cond_signal(&GP.wake);
    pthread_mutex_unlock(&GP.mu);
    int64_t ran = gp_drain();
    out[0] = gp_now() - t0;
    out[1] = (double)ran;
    atomic_store(&GP.open, 0);  /* a worker that comes later claims nothing */
    for (long spins = 0; atomic_load(&GP.done) < count || atomic_load(&GP.active) > 0; spins++) {
        if (spins > 4096) sched_yield();  /* a worker's call runs on: let the machine run it */
#if defined(__x86_64__) || defined(__i386__)
        else __builtin_ia32_pause();
#endif
    }
    atomic_store(&GP.busy, 0);
    return gp_now() - t0;
}
"""
