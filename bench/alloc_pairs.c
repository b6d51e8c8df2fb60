/* Recorder overhead workload: N malloc(32)+free pairs, plus LEAKS blocks
 * leaked through a three-deep call chain. Prints the loop's wall time in
 * ns on stdout (with write(2): stdio would allocate). */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NOINL __attribute__((noinline))

static void *volatile sink;

NOINL static void *leak3(size_t n) { void *p = malloc(n); sink = p; return p; }
NOINL static void *leak2(size_t n) { void *p = leak3(n); sink = p; return p; }
NOINL static void *leak1(size_t n) { void *p = leak2(n); sink = p; return p; }

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

int main(int argc, char **argv)
{
    long pairs = argc > 1 ? atol(argv[1]) : 2000000;
    long leaks = argc > 2 ? atol(argv[2]) : 2000;
    long every = leaks ? pairs / leaks : pairs + 1;
    long long t0 = now_ns();
    for (long i = 0; i < pairs; i++) {
        void *p = malloc(32);
        sink = p;
        free(p);
        if (leaks && i % every == 0)
            leak1(64);
    }
    long long dt = now_ns() - t0;
    char buf[32];
    int n = 0;
    char tmp[32];
    do { tmp[n++] = '0' + dt % 10; dt /= 10; } while (dt);
    for (int i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    buf[n++] = '\n';
    write(1, buf, n);
    return 0;
}
