/* A steady allocation workload, for crash and soak tests: RATE malloc+free
 * pairs per second (sizes 16..1039 bytes), paced every millisecond, until
 * killed or SECONDS pass (0: forever). With a LOG path, appends a record
 * of two native u64s (CLOCK_MONOTONIC ns, pairs done so far) every 10 ms,
 * so a test can tell how many events ran up to any moment. Uses write(2),
 * not stdio, so it allocates nothing but the pairs.
 *
 *   steady RATE [SECONDS [LOG]]
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static void *volatile sink;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    uint64_t rate = strtoull(argv[1], NULL, 10);
    uint64_t seconds = argc > 2 ? strtoull(argv[2], NULL, 10) : 0;
    int log = argc > 3 ? open(argv[3], O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644) : -1;
    uint64_t start = now_ns(), pairs = 0, next_log = start;
    for (;;) {
        uint64_t t = now_ns();
        if (seconds && t - start >= seconds * 1000000000u)
            break;
        /* Catch up to where the rate says we should be. */
        uint64_t due = (t - start) / 1000 * rate / 1000000;
        while (pairs < due) {
            sink = malloc(16 + pairs % 1024);
            free(sink);
            pairs++;
        }
        if (log >= 0 && t >= next_log) {
            uint64_t rec[2] = {t, pairs};
            if (write(log, rec, sizeof rec) != sizeof rec)
                return 1;
            next_log = t + 10000000u;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
    return 0;
}
