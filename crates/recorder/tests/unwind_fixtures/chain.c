/* main -> leak_a -> leak_b -> leak_c; leak_c prints its thread id and
 * waits in pause() for the test to interrupt it and unwind its stack.
 * With -DVIA_SIGNAL, leak_b spins until a timer signal arrives and the
 * handler calls leak_c, so the stack goes through __restore_rt and an
 * asynchronously interrupted leak_b.
 *
 * `sink++` after each call keeps the calls from becoming tail calls,
 * which would take the caller off the stack; noclone keeps the symbol
 * names plain. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <unistd.h>

volatile int sink;
static volatile int done;

__attribute__((noinline, noclone)) void leak_c(void) {
    printf("%d\n", gettid());
    fflush(stdout);
    while (!done)
        pause();
    sink++;
}

#ifdef VIA_SIGNAL
__attribute__((noinline, noclone)) static void on_alarm(int sig) {
    (void)sig;
    leak_c();
    sink++;
}

__attribute__((noinline, noclone)) void leak_b(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigaction(SIGALRM, &sa, NULL);
    struct itimerval t = {{0, 0}, {0, 1000}};
    setitimer(ITIMER_REAL, &t, NULL);
    while (!done)
        sink++;
}
#else
__attribute__((noinline, noclone)) void leak_b(void) {
    leak_c();
    sink++;
}
#endif

__attribute__((noinline, noclone)) void leak_a(void) {
    leak_b();
    sink++;
}

int main(void) {
    leak_a();
    return sink;
}
