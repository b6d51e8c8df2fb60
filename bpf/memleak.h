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
	ML_UNSAFE_RETURN = 4,/* call not traced: asking for its return could crash the program */
	ML_NR = 5,
};

/* Flags of memleak_event.flags. */
#define MEF_KERNEL_STACK 1u /* frames are a kernel stack */
#define MEF_STACK_FULL 2u   /* the depth limit was reached */
/* Bits 2-5: why the walk of a user stack ended (enum memleak_unwind_end). */
#define MEF_END_SHIFT 2
#define MEF_END_MASK 0xfu

/* How user stacks are walked (--unwind). */
enum memleak_unwind_mode {
	MU_FP = 0,    /* frame pointers only */
	MU_AUTO = 1,  /* unwind rows where the object has them, frame pointers elsewhere */
	MU_DWARF = 2, /* unwind rows only */
};

/* Why a user stack walk ended; also the indexes of the `unwind_ends`
 * counters. The names are memleak_recorder::event::UNWIND_ENDS. */
enum memleak_unwind_end {
	UE_NONE = 0,            /* no user stack walked (kernel stacks, frees) */
	UE_COMPLETE = 1,        /* an END row: the outermost frame was reached */
	UE_FP_END = 2,          /* the frame-pointer chain ended: complete or not is unknown */
	UE_MAX_DEPTH = 3,       /* --stack-depth frames were recorded */
	UE_NO_MAPPING = 4,      /* pc in no executable mapping of the process's table */
	UE_NO_TABLE = 5,        /* the process has no table (yet) */
	UE_MAPS_FULL = 6,       /* pc in a mapping the full table left out */
	UE_ANONYMOUS = 7,       /* pc in anonymous executable memory (JIT code, [vdso]) */
	UE_NO_UNWIND_INFO = 8,  /* an object without unwind rows (--unwind dwarf) */
	UE_ROWS_FULL = 9,       /* the object's rows did not fit the row array */
	UE_INVALID_ROW = 10,    /* no usable rule at this pc */
	UE_READ_FAILED = 11,    /* reading the stack failed */
	UE_NULL_RA = 12,        /* the return address is 0 */
	UE_NOT_PROGRESSING = 13,/* the caller's stack pointer is not above this frame's */
	UE_NR = 14,
};

/* One row of an object's unwind table: crates/recorder/src/unwind/row.rs
 * documents `info` (kind in bits 0-2, saved-rbp slot in 3-10, signed CFA
 * offset in 11-31). A table applies from a row's pc to the next row's. */
struct unwind_row {
	__u32 pc;   /* object vaddr: runtime pc - load bias */
	__u32 info;
};

#define UR_KIND_MASK 0x7u
#define UR_RBP_SHIFT 3
#define UR_CFA_SHIFT 11
#define UR_INVALID 0
#define UR_CFA_RSP 1
#define UR_CFA_RBP 2
#define UR_PLT 3
#define UR_SIGNAL 4
#define UR_END 5
/* Where a signal frame keeps the interrupted registers, from rsp in the
 * trampoline (struct rt_sigframe's ucontext, see row.rs). */
#define UR_SIGNAL_RIP (40 + 128)
#define UR_SIGNAL_RSP (40 + 120)
#define UR_SIGNAL_RBP (40 + 80)
#define UR_PLT_PUSHED_FROM 11
/* Halvings of a row search: tables hold fewer than 2^24 rows. */
#define UR_SEARCH_STEPS 24

/* An executable mapping of a traced process. */
struct unwind_map {
	__u64 start;
	__u64 end;       /* exclusive */
	__u64 bias;      /* runtime address - object vaddr */
	__u32 first_row; /* index of the object's first row in unwind_rows */
	__u32 nrows;     /* 0: no rows; first_row then holds the reason (UE_*) */
};

/* The executable mappings of a process, sorted by start. */
#define UNWIND_MAX_MAPS 256
#define UPF_MAPS_FULL 1u /* mappings past UNWIND_MAX_MAPS were left out */
struct unwind_proc {
	__u32 nmaps;
	__u32 flags;
	__u32 gen;       /* unique per table written: keys the probe's rule cache */
	__u32 reserved;
	struct unwind_map maps[UNWIND_MAX_MAPS];
};

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
