/* The leak scan's pause (docs/benchmarks.md): N blocks of 32 bytes, nine
 * in ten on a linked list a global points to (read and followed by the
 * scan), one in ten lost. Exits at once: `memleak record -- ./scan_pause N`
 * scans it at exit and prints the pause. */
#include <stdlib.h>

struct node {
    struct node *next;
    char pad[24];
};

static struct node *head;

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 10000;
    for (long i = 0; i < n; i++) {
        struct node *b = malloc(sizeof *b);
        b->next = 0;
        if (i % 10 == 9)
            continue; /* lost */
        b->next = head;
        head = b;
    }
    return 0;
}
