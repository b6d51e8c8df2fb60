/* Minimal, hand-written kernel type definitions for memleak's BPF program.
 *
 * Only what the probes touch is declared. Structs carry
 * preserve_access_index, so field offsets are relocated against the running
 * kernel's BTF (CO-RE): one object file runs across kernel versions, and
 * fields that do not exist can be tested with bpf_core_field_exists().
 */
#ifndef __MEMLEAK_VMLINUX_H__
#define __MEMLEAK_VMLINUX_H__
/* Tells bpf_tracing.h to use the kernel register names (di, si, ...). */
#define __VMLINUX_H__

typedef signed char __s8;
typedef unsigned char __u8;
typedef short int __s16;
typedef short unsigned int __u16;
typedef int __s32;
typedef unsigned int __u32;
typedef long long int __s64;
typedef long long unsigned int __u64;
typedef __u8 u8;
typedef __u16 u16;
typedef __u32 u32;
typedef __u64 u64;
typedef __s32 s32;
typedef __s64 s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef int pid_t;
typedef long unsigned int size_t;
typedef _Bool bool;
enum { false = 0, true = 1 };

enum bpf_map_type {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};

enum {
	BPF_ANY = 0,
	BPF_F_NO_PREALLOC = 1,
	BPF_F_MMAPABLE = 1024,
	BPF_F_USER_STACK = 256,
	BPF_LOCAL_STORAGE_GET_F_CREATE = 1,
	BPF_RB_NO_WAKEUP = 1,
	BPF_RB_FORCE_WAKEUP = 2,
	BPF_RB_AVAIL_DATA = 0,
};

struct pt_regs {
	long unsigned int r15;
	long unsigned int r14;
	long unsigned int r13;
	long unsigned int r12;
	long unsigned int bp;
	long unsigned int bx;
	long unsigned int r11;
	long unsigned int r10;
	long unsigned int r9;
	long unsigned int r8;
	long unsigned int ax;
	long unsigned int cx;
	long unsigned int dx;
	long unsigned int si;
	long unsigned int di;
	long unsigned int orig_ax;
	long unsigned int ip;
	long unsigned int cs;
	long unsigned int flags;
	long unsigned int sp;
	long unsigned int ss;
} __attribute__((preserve_access_index));

/* uprobes' per-thread list of pending returns: an allocator call is nested
 * when one of memleak's own calls is still waiting to return. */
struct return_consumer {
	__u64 cookie;
	__u64 id;
} __attribute__((preserve_access_index));

struct return_instance {
	unsigned long stack; /* user stack pointer at the probed call's entry */
	struct return_instance *next; /* the call below it */
	int cons_cnt;                            /* >= 6.14 */
	struct return_consumer consumer;         /* >= 6.14 */
	struct return_consumer *extra_consumers; /* >= 6.14 */
} __attribute__((preserve_access_index));

/* Kernel 6.13: the consumers are a flexible array. */
struct return_instance___v613 {
	int consumers_cnt;
	struct return_consumer consumers[0];
} __attribute__((preserve_access_index));

struct uprobe_task {
	struct return_instance *return_instances; /* most recent first */
} __attribute__((preserve_access_index));

/* Where uprobes' return trampoline is mapped in a process. */
struct xol_area {
	unsigned long vaddr;
} __attribute__((preserve_access_index));

struct uprobes_state {
	struct xol_area *xol_area;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
} __attribute__((preserve_access_index));

struct mm_struct {
	struct uprobes_state uprobes_state;
} __attribute__((preserve_access_index));

struct task_struct {
	void *stack;
	pid_t pid;
	pid_t tgid;
	struct mm_struct *mm;
	struct uprobe_task *utask;
	/* The registered signal stack (sigaltstack); size 0 when none, and
	 * while an SS_AUTODISARM handler runs on it. */
	unsigned long sas_ss_sp;
	size_t sas_ss_size;
} __attribute__((preserve_access_index));

struct kmem_cache {
	unsigned int size;
} __attribute__((preserve_access_index));

struct page {
	unsigned long flags;
} __attribute__((preserve_access_index));

struct trace_event_raw_mm_page_alloc {
	unsigned long pfn;
} __attribute__((preserve_access_index));

struct trace_event_raw_percpu_alloc_percpu {
	size_t size;
	void *ptr;
	size_t bytes_alloc;
} __attribute__((preserve_access_index));

struct trace_event_raw_percpu_free_percpu {
	void *ptr;
} __attribute__((preserve_access_index));

#endif
