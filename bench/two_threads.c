/* Trace-size workload for docs/benchmarks.md: two threads, each doing N
 * malloc(random size)+free pairs (sizes from a fixed-seed LCG, 1..4096
 * bytes), as in the heaptrack comparison of issue 2. */
#include <pthread.h>
#include <stdlib.h>

static void *volatile sink;

static void *work(void *arg)
{
    unsigned long n = (unsigned long)arg, x = n * 2654435761u + 1;
    for (unsigned long i = 0; i < n; i++) {
        x = x * 6364136223846793005ul + 1442695040888963407ul;
        void *p = malloc(1 + (x >> 33) % 4096);
        sink = p;
        free(p);
    }
    return 0;
}

int main(int argc, char **argv)
{
    unsigned long n = argc > 1 ? strtoul(argv[1], 0, 10) : 1000000;
    pthread_t a, b;
    pthread_create(&a, 0, work, (void *)n);
    pthread_create(&b, 0, work, (void *)(n + 1));
    pthread_join(a, 0);
    pthread_join(b, 0);
    return 0;
}
