/* Pointer shapes with known leak verdicts, for the scan tests: each
 * block's name, address and size go to stdout ("mapping" marks an mmap
 * block), then "ready"; the process then waits to be scanned, or with the
 * argument "exit" returns from main (to be scanned at its exit). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static void *g_reach;    /* -> a -> b */
static char *g_interior; /* into c (offset 16); c -> d */
static char *g_newarray; /* new[]-style pointer past the count */
static char *g_map;      /* an mmap block, a page in it unreadable */
static volatile int ready;

static void report(const char *name, void *p, size_t n) {
    dprintf(1, "%s %lx %zu\n", name, (unsigned long)p, n);
}

void report_register(void *p) {
    report("register", p, 48);
    __atomic_add_fetch(&ready, 1, __ATOMIC_SEQ_CST);
}

/* A block only a register (r15) of a spinning thread points to: the
 * stack below it is zeroed and every other register cleared. */
void *hold_in_register(void *);
__asm__(".globl hold_in_register\n"
        "hold_in_register:\n"
        "  sub $8, %rsp\n"
        "  mov $48, %edi\n"
        "  call malloc@PLT\n"
        "  mov %rax, %r15\n"
        "  mov %rax, %rdi\n"
        "  call report_register@PLT\n"
        "  lea -4096(%rsp), %rdi\n"
        "  xor %eax, %eax\n"
        "  mov $512, %ecx\n"
        "  rep stosq\n"
        "  xor %edi, %edi\n  xor %esi, %esi\n  xor %edx, %edx\n"
        "  xor %r8d, %r8d\n  xor %r9d, %r9d\n  xor %r10d, %r10d\n"
        "  xor %r11d, %r11d\n"
        "1: pause\n"
        "  jmp 1b\n");

/* A block only this thread's stack points to. */
static void *on_stack(void *arg) {
    (void)arg;
    void *volatile p = malloc(40);
    report("stack", p, 40);
    __atomic_add_fetch(&ready, 1, __ATOMIC_SEQ_CST);
    for (;;)
        pause();
    return p;
}

struct node {
    struct node *l, *r;
};

static struct node *tree(int depth) {
    struct node *n = calloc(1, sizeof *n);
    report(depth == 0 ? "tree_root" : "tree_inner", n, sizeof *n);
    if (depth < 2) {
        n->l = tree(depth + 1);
        n->r = tree(depth + 1);
    }
    return n;
}

static __attribute__((noinline)) void build(void) {
    void **a = malloc(32);
    void *b = malloc(24);
    a[0] = b;
    g_reach = a;
    report("reach_a", a, 32);
    report("reach_b", b, 24);

    void **c = calloc(1, 64);
    void *d = malloc(16);
    c[0] = d;
    g_interior = (char *)c + 16;
    report("possible_c", c, 64);
    report("possible_d", d, 16);

    void **e = malloc(16), **f = malloc(16);
    e[0] = f;
    f[0] = e;
    report("cycle", e, 16);
    report("cycle", f, 16);

    tree(0);

    long *na = malloc(8 + 10 * 4);
    na[0] = 10;
    g_newarray = (char *)(na + 1);
    report("newarray", na, 48);

    report("lost", malloc(100), 100);

    /* Three pages, the middle one unreadable; the last holds the only
     * pointer to a block. */
    char *m = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    void *behind = malloc(56);
    memcpy(m + 2 * 4096 + 64, &behind, sizeof behind);
    mprotect(m + 4096, 4096, PROT_NONE);
    g_map = m;
    report("mapping", m, 3 * 4096);
    report("behind_unreadable", behind, 56);
}

/* Zeroes the stack the calls above used. */
static __attribute__((noinline)) void scrub(void) {
    volatile char buf[16384];
    memset((char *)buf, 0, sizeof buf);
}

int main(int argc, char **argv) {
    build();
    pthread_t t1, t2;
    pthread_create(&t1, NULL, on_stack, NULL);
    pthread_create(&t2, NULL, hold_in_register, NULL);
    while (ready < 2)
        usleep(1000);
    scrub();
    dprintf(1, "ready\n");
    if (argc > 1 && strcmp(argv[1], "exit") == 0)
        return 0;
    for (;;)
        pause();
}
