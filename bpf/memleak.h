/* The event layout shared by the BPF program and user space.
 *
 * This header is the single definition: crates/recorder decodes the same
 * bytes, and a test in the memleak binary checks the Rust decoder's offsets
 * against the skeleton's BTF-generated type.
 */
#ifndef __MEMLEAK_H__
#define __MEMLEAK_H__

#define MEMLEAK_MAX_FRAMES 127

/* Event kinds; the numeric codes equal memleak_trace::EventKind. */
enum memleak_kind {
	MK_MALLOC = 0,
	MK_CALLOC = 1,
	MK_REALLOC = 2,
	MK_REALLOCARRAY = 3,
	MK_FREE = 4,
	MK_POSIX_MEMALIGN = 5,
	MK_MEMALIGN = 6,
	MK_ALIGNED_ALLOC = 7,
	MK_VALLOC = 8,
	MK_PVALLOC = 9,
	MK_MMAP = 10,
	MK_MUNMAP = 11,
	MK_MREMAP = 12,
	MK_NEW = 13,
	MK_NEW_ARRAY = 14,
	MK_DELETE = 15,
	MK_DELETE_ARRAY = 16,
	MK_KMALLOC = 32,
	MK_KFREE = 33,
	MK_KMEM_CACHE_ALLOC = 34,
	MK_KMEM_CACHE_FREE = 35,
	MK_PAGE_ALLOC = 36,
	MK_PAGE_FREE = 37,
	MK_PERCPU_ALLOC = 38,
	MK_PERCPU_FREE = 39,
	MK_EXEC = 48,
	MK_EXIT = 49,
	MK_FORK = 50,
};

/* Probe cookies of libc functions that allocate on the caller's behalf.
 * They are recorded as the outermost call, so the stack starts at the
 * caller even though libc has no frame pointers; the event carries the
 * kind of the underlying allocation. Never stored in a trace. */
enum memleak_wrapper {
	MW_STRDUP = 64,   /* returns the block; size = last nested allocation */
	MW_ASPRINTF = 65, /* block stored at *arg0 on success (ret >= 0) */
	MW_GETLINE = 66,  /* block at *arg0, possibly reallocated from *arg0 at entry */
	MW_SILENT = 67,   /* libc housekeeping (thread-exit tcache flush): frees inside are not the program's */
};

/* Reasons an event or part of one was lost; indexes of the `lost` map. */
enum memleak_lost {
	ML_RING_FULL = 0,    /* ring buffer had no room: event dropped */
	ML_STACK_FAILED = 1, /* event kept, stack could not be captured */
	ML_INFLIGHT_FULL = 2,/* no per-thread state or event buffer: call not traced */
	ML_FAILED_ALLOC = 3, /* not a loss: allocations that returned NULL */
	ML_NR = 4,
};

/* Flags of memleak_event.flags. */
#define MEF_KERNEL_STACK 1u /* frames are a kernel stack */
#define MEF_STACK_FULL 2u   /* the depth limit was reached */

/* The cookie of each allocator probe: kind in the low byte, and where the
 * function's arguments are (for C++ operators: size or pointer is arg 0). */
#define MEMLEAK_COOKIE(kind) ((__u64)(kind))

struct memleak_event {
	__u64 ts_ns;
	__u64 addr;
	__u64 size;
	__u64 old_addr;
	__u64 old_size;
	__u32 pid;
	__u32 tid;
	__u8 kind;
	__u8 flags;
	__u16 nframes; /* number of frames that follow the header */
	__s32 stack_err; /* negative errno of the stack capture, or 0 */
	__u64 frames[MEMLEAK_MAX_FRAMES];
};

#define MEMLEAK_HDR_SIZE 56

#endif
