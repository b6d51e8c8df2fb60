/* Recorder overhead workload: N malloc(32)+free pairs, plus LEAKS blocks
 * leaked through a three-deep call chain, run DEPTH calls deep (default 0:
 * straight from main; each level is a frame of about 80 bytes). Prints the loop's wall time and
 * the thread's CPU time (user + system, which includes the probes' cost
 * and not time spent preempted), in ns, on one line on stdout (with
 * write(2): stdio would allocate). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINL __attribute__((noinline))

static void *volatile sink;
static volatile long depth_sink;

NOINL static void *leak3(size_t n) { void *p = malloc(n); sink = p; return p; }
NOINL static void *leak2(size_t n) { void *p = leak3(n); sink = p; return p; }
NOINL static void *leak1(size_t n) { void *p = leak2(n); sink = p; return p; }

static long long now_ns(clockid_t clock)
{
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int put_num(char *buf, long long v)
{
    char tmp[32];
    int n = 0, k = 0;
    do { tmp[n++] = '0' + v % 10; v /= 10; } while (v);
    while (n)
        buf[k++] = tmp[--n];
    return k;
}

NOINL static void run(long pairs, long leaks, int depth, long long *wall, long long *cpu)
{
    volatile char pad[48];

    pad[0] = (char)depth;
    if (depth > 0) {
        run(pairs, leaks, depth - 1, wall, cpu);
        depth_sink = pad[0]; /* not a tail call: the frame stays */
        return;
    }
    long every = leaks ? pairs / leaks : pairs + 1;
    long long t0 = now_ns(CLOCK_MONOTONIC);
    long long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < pairs; i++) {
        void *p = malloc(32);
        sink = p;
        free(p);
        if (leaks && i % every == 0)
            leak1(64);
    }
    *wall = now_ns(CLOCK_MONOTONIC) - t0;
    *cpu = now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
}

struct job {
    long pairs, leaks;
    int depth;
    long long wall, cpu;
};

static void *thread_main(void *arg)
{
    struct job *j = arg;
    run(j->pairs, j->leaks, j->depth, &j->wall, &j->cpu);
    return 0;
}

/* THREADS > 1: each thread runs the loop (PAIRS pairs each); the line
 * says the slowest thread's wall time and the threads' mean CPU time. */
int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 2000000;
    long leaks = argc > 2 ? atol(argv[2]) : 2000;
    int depth = argc > 3 ? atoi(argv[3]) : 0;
    int threads = argc > 4 ? atoi(argv[4]) : 1;
    long long dt = 0, dc = 0;

    /* ALLOC_PAIRS_WAIT: say "ready" and wait for a line on stdin first,
     * for a recorder that attaches to the running process. */
    if (getenv("ALLOC_PAIRS_WAIT")) {
        char c;
        write(1, "ready\n", 6);
        while (read(0, &c, 1) == 1 && c != '\n')
            ;
    }
    if (threads <= 1) {
        run(pairs, leaks, depth, &dt, &dc);
    } else {
        struct job jobs[64];
        pthread_t t[64];
        if (threads > 64)
            threads = 64;
        for (int i = 0; i < threads; i++) {
            jobs[i] = (struct job){pairs, leaks, depth, 0, 0};
            pthread_create(&t[i], 0, thread_main, &jobs[i]);
        }
        for (int i = 0; i < threads; i++) {
            pthread_join(t[i], 0);
            if (jobs[i].wall > dt)
                dt = jobs[i].wall;
            dc += jobs[i].cpu;
        }
        dc /= threads;
    }
    char buf[64];
    int n = put_num(buf, dt);
    buf[n++] = ' ';
    n += put_num(buf + n, dc);
    buf[n++] = '\n';
    write(1, buf, n);
    return 0;
}
