// leak_c reached through libstdc++.so's own code: leak_b asks operator new
// for more memory than exists, operator new (in libstdc++.so) calls the
// new-handler, which calls leak_c. With `thread`, leak_a runs on a
// std::thread: libstdc++'s execute_native_thread_routine, libc's
// start_thread and clone3, a stack that ends at clone3's undefined return
// address rather than at _start. No exception is thrown: leak_c never
// returns.
#include <cstdio>
#include <cstring>
#include <new>
#include <thread>
#include <unistd.h>

volatile int sink;
static volatile int done;
static volatile unsigned long too_much = ~0ul >> 2;

extern "C" __attribute__((noinline, noclone)) void leak_c() {
    std::printf("%d\n", gettid());
    std::fflush(stdout);
    while (!done)
        pause();
    sink++;
}

extern "C" __attribute__((noinline, noclone)) void on_no_memory() {
    leak_c();
    sink++;
}

extern "C" __attribute__((noinline, noclone)) void leak_b() {
    std::set_new_handler(on_no_memory);
    void *p = ::operator new(too_much);
    sink += p != nullptr;
}

extern "C" __attribute__((noinline, noclone)) void leak_a() {
    leak_b();
    sink++;
}

int main(int argc, char **argv) {
    if (argc > 1 && std::strcmp(argv[1], "thread") == 0) {
        std::thread t(leak_a);
        t.join();
    } else {
        leak_a();
    }
    return sink;
}
