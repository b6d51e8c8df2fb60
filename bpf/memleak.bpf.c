// SPDX-License-Identifier: GPL-2.0
/* memleak's probes.
 *
 * Two session programs (entry + return in one) serve the allocating
 * functions: one for malloc, one for the rest, where the attach cookie says
 * which function fired. free and munmap only need their arguments, so they
 * get plain entry probes, which can sit past a single-stepped first
 * instruction (see docs/placement.md).
 *
 * Only the outermost allocator call of a thread is recorded (calloc ->
 * malloc, operator new -> malloc, realloc -> free, malloc -> mmap). A call
 * is nested when memleak's tagged session cookie is pending on the
 * thread's list of uprobe returns (enclosing_call()); the few calls that
 * need more than their size at return keep it in task storage, keyed by
 * thread, never by process.
 *
 * Events go to a ring buffer without a wakeup; user space drains it on a
 * timer. A wakeup is forced only when the ring holds more than
 * `wakeup_bytes`, so a burst can never overrun a sleeping consumer.
 */
#include "vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "memleak.h"

char LICENSE[] SEC("license") = "GPL";

const volatile __u64 min_size = 0;
const volatile __u64 max_size = ~0ULL;
const volatile __u32 stack_bytes = MEMLEAK_MAX_FRAMES * 8;
const volatile __u64 wakeup_bytes = 1 << 20;
const volatile __u32 kernel_tgid = 0;
const volatile __u32 self_tgid = 0; /* the recorder: its own allocations are not traced */
const volatile bool kernel_stacks = true;
#define WRITE_ONCE(x, v) (*(volatile typeof(x) *)&(x) = (v))
#define READ_ONCE(x) (*(volatile typeof(x) *)&(x))

/* The top byte of memleak's session cookies: set per recording from a
 * random nonzero byte, so that another recorder's or tool's cookies are
 * not taken for ours. */
const volatile __u64 ck_tag = 0xa7ULL << 56;

/* Exported so the skeleton carries the type and a test can compare it with
 * the Rust decoder. Never written. */
struct memleak_event layout_probe = {};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 20);
} events SEC(".maps");

/* Words of user stack copied in one read when walking frame pointers. */
#define STACK_WINDOW_WORDS 64

/* An event being built, with room for the copy of the top of the user
 * stack that the frame walk reads. */
struct ev_buf {
	struct memleak_event ev;
	__u64 win[STACK_WINDOW_WORDS];
};

/* Per-thread state of the outermost calls that need more than their size
 * at return (realloc, posix_memalign, mremap, the libc wrappers), and the
 * buffer their event is built in. Uprobe programs are preemptible, so a
 * buffer that another thread's probe could take mid-event must be
 * claimed (see cpu_bufs); a per-thread one need not be. */
struct thread_state {
	__u64 a0;
	__u64 a1;
	__u64 a2;
	/* Wrappers: the last allocations made inside, to find the size of
	 * the block the wrapper hands out (getline also allocates a FILE
	 * buffer, asprintf a scratch buffer). */
	__u64 inner_addr[4];
	__u64 inner_sz[4];
	__u64 nested_size;
	__u64 entry_ptr; /* MW_GETLINE: *arg0 at entry */
	__u32 n_inner;
	__u8 active;
	__u8 kind;
	struct ev_buf buf;
};

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct thread_state);
} threads SEC(".maps");

/* The common allocations (malloc, calloc, new, ...: everything whose event
 * needs only the size kept by the session cookie) build their event in a
 * per-CPU buffer. Uprobe programs run with migration disabled but can be
 * preempted, and the preempting thread may enter the same program on the
 * same CPU, in any order, so a buffer is claimed with a compare-and-swap
 * and released after the copy to the ring. */
#define CPU_BUFS 4
struct cpu_buf {
	__u64 busy;
	struct ev_buf b;
};

struct cpu_bufs {
	__u64 submitted; /* events submitted on this CPU, by any program (racy:
			  * it only paces the ring queries) */
	/* The clock reading that user-space events of this CPU reuse
	 * (event_time()). */
	__u64 clock_ns;
	__u64 clock_tick; /* jiffies when it was read; 0 while it is replaced */
	__u64 clock_uses; /* events stamped with it since */
	struct cpu_buf slot[CPU_BUFS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_bufs);
} cpu_bufs SEC(".maps");

/* Kernel-context programs build events here. BTF tracepoint programs can
 * nest on a CPU (an interrupt's kfree inside a kmalloc handler), so each
 * nesting level has its own slot. */
#define SCRATCH_LEVELS 4
struct cpu_scratch {
	__u32 depth;
	struct memleak_event ev[SCRATCH_LEVELS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cpu_scratch);
} scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, ML_NR);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

/* Kernel objects whose free must be matched to the allocation: with
 * --kernel-pid, the objects that were recorded (only their frees are
 * wanted); otherwise the recorder's own objects (their frees are not). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, __u64);
	__type(value, __u8);
} kobjs SEC(".maps");

/* Processes whose lifecycle (exec, exit, fork) is recorded. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, __u8);
} traced SEC(".maps");

extern bool bpf_session_is_return(void) __ksym __weak;
extern __u64 *bpf_session_cookie(void) __ksym __weak;

/* The session cookie of an outermost allocator call: a tag that marks it
 * as memleak's among the thread's pending returns, flags, and the size the
 * return half records. Nested calls find it there, so the common path
 * needs no per-thread map at all. */
#define CK_TAG ck_tag
#define CK_TAG_MASK (0xffULL << 56)
#define CK_STATE (1ULL << 55)   /* the call's arguments are in task storage */
#define CK_WRAPPER (1ULL << 54) /* a libc wrapper: nested sizes are wanted */
#define CK_INNER (1ULL << 53)   /* an allocation nested in a wrapper */
#define CK_DONE (1ULL << 52)    /* nothing to record at return */
#define CK_KIND_SHIFT 48        /* the kind of a size-only call (< 16) */
#define CK_SIZE_MASK ((1ULL << 48) - 1)

static __always_inline void count_lost(__u32 reason)
{
	__u64 *v = bpf_map_lookup_elem(&lost, &reason);
	if (v)
		__sync_fetch_and_add(v, 1);
}

static __always_inline struct cpu_bufs *this_cpu_bufs(void)
{
	__u32 zero = 0;

	return bpf_map_lookup_elem(&cpu_bufs, &zero);
}

/* The time of a user-space allocator event. A clock read costs ~45 ns
 * here (rdtsc behind a serializing fence, through two calls), two per
 * malloc+free pair: 90 ns, a sixth of what recording adds to the pair.
 * jiffies costs nothing (the verifier inlines the load). So a CPU reuses
 * its last reading while the tick has not moved, for at most
 * CLOCK_REUSE events: every time is a real CLOCK_MONOTONIC reading,
 * taken on the event's CPU before the event, during the same tick (which
 * lasts 1-10 ms, longer if the CPU that advances jiffies stalls), at most
 * CLOCK_REUSE - 1 events earlier (more only if programs are preempted
 * inside this function: the count is not atomic). An idle thread reads
 * the clock at every event. The reading is published with its tick
 * cleared while it changes, and a reader checks the tick again after
 * loading it, so a reading replaced meanwhile (by a preempting program
 * or a kernel event's interrupt) is never taken for the new tick's.
 * Kernel and lifecycle events read the clock every time and publish it
 * for the user events that follow. User space then raises each row's time
 * to the row before's (ring order is causal), so rows are in time order. */
#define CLOCK_REUSE 16

/* Reads the clock and publishes the reading for `tick` (jiffies read
 * before the clock: a reading is never older than its tick). */
static __always_inline __u64 fresh_time(struct cpu_bufs *bufs, __u64 tick)
{
	__u64 now = bpf_ktime_get_ns();

	if (bufs) {
		WRITE_ONCE(bufs->clock_tick, 0);
		WRITE_ONCE(bufs->clock_ns, now);
		WRITE_ONCE(bufs->clock_uses, 0);
		WRITE_ONCE(bufs->clock_tick, tick);
	}
	return now;
}

static __always_inline __u64 event_time(struct cpu_bufs *bufs)
{
	__u64 tick = bpf_jiffies64(), uses, ts;

	if (bufs && READ_ONCE(bufs->clock_tick) == tick) {
		uses = READ_ONCE(bufs->clock_uses);
		ts = READ_ONCE(bufs->clock_ns);
		if (uses < CLOCK_REUSE - 1 && READ_ONCE(bufs->clock_tick) == tick) {
			WRITE_ONCE(bufs->clock_uses, uses + 1);
			return ts;
		}
	}
	return fresh_time(bufs, tick);
}

/* Fills the header of an event being built in `e`. */
static __always_inline struct memleak_event *init_event_of(struct memleak_event *e, __u8 kind,
							   __u32 pid, __u32 tid, __u64 ts)
{
	e->ts_ns = ts;
	e->pid = pid;
	e->tid = tid;
	e->kind = kind;
	e->flags = 0;
	e->nframes = 0;
	e->stack_err = 0;
	e->addr = 0;
	e->size = 0;
	e->old_addr = 0;
	e->old_size = 0;
	return e;
}

/* The same, for the current task. */
static __always_inline struct memleak_event *init_event(struct memleak_event *e, __u8 kind,
							__u64 ts)
{
	__u64 id = bpf_get_current_pid_tgid();

	return init_event_of(e, kind, id >> 32, (__u32)id, ts);
}

/* The time of a kernel or lifecycle event: a fresh reading, which the
 * CPU's user-space events then reuse (an exec's first allocations are not
 * stamped before the exec). */
static __always_inline __u64 kernel_event_time(void)
{
	return fresh_time(this_cpu_bufs(), bpf_jiffies64());
}

/* An event in the per-CPU buffer, for tracepoint programs (preemption
 * off). Pair with put_cpu_event(). */
static __always_inline struct memleak_event *get_cpu_event(__u8 kind)
{
	__u32 zero = 0;
	struct cpu_scratch *s = bpf_map_lookup_elem(&scratch, &zero);
	__u32 d;

	if (!s)
		return 0;
	d = s->depth;
	if (d >= SCRATCH_LEVELS) {
		count_lost(ML_INFLIGHT_FULL);
		return 0;
	}
	s->depth = d + 1;
	return init_event(&s->ev[d], kind, kernel_event_time());
}

static __always_inline void put_cpu_event(void)
{
	__u32 zero = 0;
	struct cpu_scratch *s = bpf_map_lookup_elem(&scratch, &zero);

	if (s && s->depth)
		s->depth--;
}

/* Walks the frame-pointer chain of the user stack at an allocator's
 * return, into e->frames. Every read of user memory costs about 70 ns
 * here, plus about 0.15 ns a byte (bpf_get_stack() pays one read per
 * frame), so the chain is walked inside copies of stack windows: a short
 * one at the caller's frame record (shallow stacks end there), then
 * longer ones wherever the chain leaves the current copy. */
#define WIN_FIRST_WORDS 32

struct walk {
	struct ev_buf *b;
	__u64 bp;
	__u64 base; /* the copy in b->win covers [base, end) */
	__u64 end;
	__u32 max;
	__u32 n;
	__u32 first; /* frame index of the bpf_loop callback's k = 0 */
	bool done;
};

/* Frame i of the walk. Returns 1 to stop. */
static __always_inline long walk_frame(__u64 i, struct walk *w)
{
	struct ev_buf *b = w->b;
	__u64 bp = w->bp, next_bp, ret, idx;

	if (i >= w->max || i >= MEMLEAK_MAX_FRAMES) {
		b->ev.flags |= MEF_STACK_FULL;
		return 1;
	}
	if (!bp || (bp & 7))
		return 1;
	if (bp < w->base || bp + 16 > w->end) {
		__u64 words = i == 1 ? WIN_FIRST_WORDS : STACK_WINDOW_WORDS;

		if (bpf_probe_read_user(b->win, words * 8, (void *)bp)) {
			/* The window ran past the end of the stack's mapping:
			 * copy just this frame record. */
			words = 2;
			if (bpf_probe_read_user(b->win, 16, (void *)bp))
				return 1;
		}
		w->base = bp;
		w->end = bp + words * 8;
	}
	idx = (bp - w->base) / 8;
	if (idx > STACK_WINDOW_WORDS - 2)
		return 1;
	next_bp = b->win[idx];
	ret = b->win[idx + 1];
	if (!ret)
		return 1;
	b->ev.frames[i] = ret;
	w->n = i + 1;
	/* Frames live higher up the stack; anything else is not a frame
	 * pointer (code built without them). */
	if (next_bp <= bp)
		return 1;
	w->bp = next_bp;
	return 0;
}

static long walk_frame_cb(__u64 k, void *data)
{
	struct walk *w = data;

	return walk_frame(k + w->first, w);
}

/* The first frames are walked inline: a callback per frame costs ~9 ns.
 * Deeper ones go through bpf_loop, which the verifier checks once; a
 * bounded loop over all 127 frames took it 100 ms at every start. */
#define INLINE_FRAMES 32

/* The frame-pointer walk (--unwind fp). Returns why it ended. */
static __always_inline __u32 fp_walk(struct pt_regs *ctx, struct ev_buf *b)
{
	struct walk w = {
		.b = b,
		.bp = PT_REGS_FP(ctx),
		.max = stack_bytes / 8,
		.n = 1,
		.first = INLINE_FRAMES,
	};

	b->ev.frames[0] = PT_REGS_IP(ctx);
	for (int i = 1; i < INLINE_FRAMES; i++) {
		if (walk_frame(i, &w))
			goto out;
	}
	bpf_loop(MEMLEAK_MAX_FRAMES - INLINE_FRAMES, walk_frame_cb, &w, 0);
out:
	b->ev.nframes = w.n;
	return b->ev.flags & MEF_STACK_FULL ? UE_MAX_DEPTH : UE_FP_END;
}

/* Unwinding with rows (--unwind auto|dwarf; issue 18).
 *
 * User space reduces each executable object's .eh_frame/.debug_frame to a
 * sorted table of 8-byte rows (crates/recorder/src/unwind), loads each
 * object's rows once into unwind_rows, at a range it allocates, and gives
 * every traced process its executable mappings, sorted by start, with the
 * load bias and the range of rows of each. A frame's step finds the
 * mapping (the previous frame's first, else a binary search), then the row
 * (a bounded binary search), and applies it exactly as the reference
 * unwinder does (crates/recorder/src/unwind/reference.rs): CFA from rsp,
 * rbp or the PLT rule, the return address at CFA - 8, rbp from its slot,
 * the interrupted registers from a signal frame's ucontext; an END row
 * ends a complete stack. The stack words come from the same window copies
 * as the frame-pointer walk, re-read only when a frame needs a word
 * outside the current copy. */
#define UNWIND_ROWS (4 << 20)

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	/* User space writes rows through a mapping of the array: one memcpy
	 * per object instead of a syscall per row. */
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UNWIND_ROWS);
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	/* 8 KiB a process: allocated on update, not 32 MiB up front. */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 4096);
	__type(key, __u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

/* User stack walks by how they ended (enum memleak_unwind_end). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UE_NR);
	__type(key, __u32);
	__type(value, __u64);
} unwind_ends SEC(".maps");

const volatile __u32 unwind_mode = MU_FP;

/* The state of a walk with rows. Scalars only: uw_step() is a global
 * function, and the verifier passes those pointers to structs of scalars
 * only. */
struct uwalk {
	__u64 pc;
	__u64 sp;
	__u64 bp;
	__u64 base; /* b->win holds the user stack at [base, end) */
	__u64 end;
	__u32 n;    /* frames recorded */
	__u32 max;
	__u32 hint; /* the previous frame's mapping */
	__u32 exact; /* look pc itself up, not pc - 1: the first frame's
		      * registers are those at pc, and so are those of a frame
		      * a signal interrupted */
	__u32 interrupted; /* a signal interrupted the frame at pc: recorded
			    * as pc + 1, so that user space, which
			    * symbolizes every frame at addr - 1, finds pc */
	__u32 reason;
};

/* Makes the stack at [lo, lo + len) readable in b->win, len <= 512: a
 * window from lo up (the callers' frames are above) unless the current
 * one holds it. A window that would cross the end of the stack's mapping
 * is replaced by a copy of just [lo, lo + len). */
static __always_inline bool uw_fetch(struct uwalk *w, struct ev_buf *b, __u64 lo, __u64 len)
{
	__u64 words;

	if (lo >= w->base && lo + len <= w->end && !((lo - w->base) & 7))
		return true;
	if (len == 0 || len > STACK_WINDOW_WORDS * 8)
		return false;
	/* The first copy is shorter: shallow stacks end in it. */
	words = w->end == 0 && len <= WIN_FIRST_WORDS * 8 ? WIN_FIRST_WORDS : STACK_WINDOW_WORDS;
	if (bpf_probe_read_user(b->win, words * 8, (void *)lo)) {
		if (bpf_probe_read_user(b->win, len, (void *)lo))
			return false;
		w->end = lo + len;
	} else {
		w->end = lo + words * 8;
	}
	w->base = lo;
	return true;
}

/* The stack word at addr, once uw_fetch() made it readable. */
static __always_inline __u64 uw_word(struct uwalk *w, struct ev_buf *b, __u64 addr)
{
	__u64 i = (addr - w->base) / 8;

	return i < STACK_WINDOW_WORDS ? b->win[i] : 0;
}

/* The mapping containing `at`, or UNWIND_MAX_MAPS. The searches are
 * global functions: inline, every way out of their loops was a path the
 * verifier followed through the rest of the step (200 ms at start-up). */
__noinline __u32 uw_find_map(struct unwind_proc *proc, __u64 at, __u32 hint)
{
	__u32 n, lo = 0, hi, mid;
	struct unwind_map *m;

	if (!proc)
		return UNWIND_MAX_MAPS;
	n = proc->nmaps;
	/* Not clamped to a constant: the verifier would follow the whole
	 * search tree of a 256-entry table, value by value. */
	if (n > UNWIND_MAX_MAPS)
		return UNWIND_MAX_MAPS;
	m = &proc->maps[hint & (UNWIND_MAX_MAPS - 1)];
	if (hint < n && at >= m->start && at < m->end)
		return hint;
	if (!n || at < proc->maps[0].start)
		return UNWIND_MAX_MAPS;
	hi = n;
	for (int s = 0; s < 9; s++) {
		if (hi - lo <= 1)
			break;
		mid = lo + (hi - lo) / 2;
		if (proc->maps[mid & (UNWIND_MAX_MAPS - 1)].start <= at)
			lo = mid;
		else
			hi = mid;
	}
	lo &= UNWIND_MAX_MAPS - 1;
	return at < proc->maps[lo].end ? lo : UNWIND_MAX_MAPS;
}

/* The info of the row covering `rel` among the n rows from `first`, or 0
 * (an Invalid row: no rule) below the first. row.rs's lookup(). */
__noinline __u32 uw_find_row(__u32 first, __u32 n, __u32 rel)
{
	__u32 lo = first, hi = first + n, mid;
	struct unwind_row *r = bpf_map_lookup_elem(&unwind_rows, &lo);

	if (!r || r->pc > rel)
		return UR_INVALID;
	for (int s = 0; s <= UR_SEARCH_STEPS; s++) {
		if (hi - lo <= 1)
			break;
		mid = lo + (hi - lo) / 2;
		r = bpf_map_lookup_elem(&unwind_rows, &mid);
		if (!r)
			return UR_INVALID;
		if (r->pc <= rel)
			lo = mid;
		else
			hi = mid;
	}
	r = bpf_map_lookup_elem(&unwind_rows, &lo);
	return r ? r->info : UR_INVALID;
}

/* A rule where there is no row: kind 7 (rows use 0-5), and why. */
#define UR_NONE 7
#define UR_NONE_RULE(reason) ((__u32)(reason) << 3 | UR_NONE)

/* The rule at `at` (a row's info, or UR_NONE_RULE), as the two searches
 * find it, through a per-CPU cache: allocation sites repeat, and a frame's
 * mapping and row searches cost ~150 instructions where a hit costs ~20.
 * An entry is valid for one table (its generation, which user space makes
 * unique at every write) and one address; the check word mixes both, so
 * an entry half-written when a preempting program took the CPU reads as
 * a miss. */
#define UW_CACHE_SLOTS 4096

struct uw_cache_slot {
	__u64 at;
	__u64 val; /* check << 32 | rule */
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, UW_CACHE_SLOTS);
	__type(key, __u32);
	__type(value, struct uw_cache_slot);
} uw_cache SEC(".maps");

static __always_inline __u32 uw_rule(struct uwalk *w, struct unwind_proc *proc, __u64 at)
{
	__u64 h = at * 0x9E3779B97F4A7C15ULL;
	__u32 key = h >> 52, check = (__u32)h ^ proc->gen, idx, rule;
	struct uw_cache_slot *c = bpf_map_lookup_elem(&uw_cache, &key);
	struct unwind_map *m;

	if (c && c->at == at && (c->val >> 32) == check)
		return (__u32)c->val;
	idx = uw_find_map(proc, at, w->hint);
	if (idx >= UNWIND_MAX_MAPS) {
		rule = UR_NONE_RULE(proc->flags & UPF_MAPS_FULL ? UE_MAPS_FULL : UE_NO_MAPPING);
	} else {
		w->hint = idx;
		m = &proc->maps[idx & (UNWIND_MAX_MAPS - 1)];
		if (!m->nrows)
			/* first_row says why there are no rows. */
			rule = UR_NONE_RULE(m->first_row < UE_NR ? m->first_row : UE_NONE);
		else if (at - m->bias > 0xffffffffULL)
			rule = UR_INVALID;
		else
			rule = uw_find_row(m->first_row, m->nrows, at - m->bias);
	}
	if (c) {
		c->val = (__u64)check << 32 | rule;
		c->at = at;
	}
	return rule;
}

static __always_inline int uw_end(struct uwalk *w, __u32 reason)
{
	w->reason = reason;
	return 1;
}

/* A frame-pointer step, for code without rows in auto mode (an object
 * without unwind information): what the frame-pointer walk would do. How
 * such a walk ends says nothing of completeness (UE_FP_END). */
static __always_inline int uw_fp_step(struct uwalk *w, struct ev_buf *b)
{
	__u64 bp = w->bp, ra;

	if (!bp || bp < w->sp || !uw_fetch(w, b, bp, 16))
		return uw_end(w, UE_FP_END);
	ra = uw_word(w, b, bp + 8);
	if (!ra)
		return uw_end(w, UE_FP_END);
	w->pc = ra;
	w->sp = bp + 16;
	w->bp = uw_word(w, b, bp);
	w->exact = 0;
	w->interrupted = 0;
	return 0;
}

/* Records frame w->n and steps to its caller. Returns 1 when the walk
 * ends (w->reason says why). A global function: the verifier checks it
 * once per program, not at each of the 128 iterations of the loop that
 * calls it. */
__noinline int uw_step(struct uwalk *w, struct ev_buf *b, struct unwind_proc *proc)
{
	__u64 pc, cfa, ra, bp, sp, lo, hi, at;
	__u32 i, rule, why;
	__s64 slot;

	if (!w || !b || !proc)
		return 1;
	i = w->n;
	if (i >= w->max || i >= MEMLEAK_MAX_FRAMES) {
		b->ev.flags |= MEF_STACK_FULL;
		return uw_end(w, UE_MAX_DEPTH);
	}
	pc = w->pc;
	b->ev.frames[i] = w->interrupted ? pc + 1 : pc;
	w->n = i + 1;
	/* A return address may be just past a call that ends its function:
	 * the call itself is at pc - 1. */
	at = w->exact ? pc : pc - 1;
	rule = uw_rule(w, proc, at);
	sp = w->sp;
	switch (rule & UR_KIND_MASK) {
	case UR_END:
		return uw_end(w, UE_COMPLETE);
	case UR_NONE:
		why = rule >> 3;
		if (unwind_mode == MU_AUTO && (why == UE_NO_UNWIND_INFO || why == UE_ROWS_FULL))
			return uw_fp_step(w, b);
		return uw_end(w, why);
	case UR_SIGNAL:
		/* The handler returned here, to the trampoline's first
		 * instruction: like an interrupted pc, that is where the
		 * frame is, so it is recorded as pc + 1 (glibc starts the
		 * trampoline's FDE a byte early for the pc - 1 lookup, but
		 * its symbol at pc). No progress check: the handler may run
		 * on a signal stack above or below the interrupted one. */
		b->ev.frames[i] = pc + 1;
		if (!uw_fetch(w, b, sp + UR_SIGNAL_RBP, UR_SIGNAL_RIP + 8 - UR_SIGNAL_RBP))
			return uw_end(w, UE_READ_FAILED);
		ra = uw_word(w, b, sp + UR_SIGNAL_RIP);
		if (!ra)
			return uw_end(w, UE_NULL_RA);
		w->pc = ra;
		w->bp = uw_word(w, b, sp + UR_SIGNAL_RBP);
		w->sp = uw_word(w, b, sp + UR_SIGNAL_RSP);
		w->exact = 1;
		w->interrupted = 1;
		return 0;
	case UR_CFA_RSP:
		cfa = sp;
		break;
	case UR_CFA_RBP:
		cfa = w->bp;
		break;
	case UR_PLT:
		/* Past the PLT entry's push, its argument is on the stack too. */
		cfa = sp + ((pc & 15) >= UR_PLT_PUSHED_FROM ? 8 : 0);
		break;
	default:
		return uw_end(w, UE_INVALID_ROW);
	}
	cfa += (__s64)((__s32)rule >> UR_CFA_SHIFT);
	slot = (__s8)(rule >> UR_RBP_SHIFT);
	bp = w->bp;
	/* The return address at CFA - 8 and, when this frame saved it, rbp
	 * from its slot (usually CFA - 16): one copy holds both when they are
	 * close. */
	lo = slot < 0 ? cfa + slot * 8 : cfa - 8;
	hi = slot > 0 ? cfa + slot * 8 + 8 : cfa;
	if (hi - lo <= STACK_WINDOW_WORDS * 8) {
		if (!uw_fetch(w, b, lo, hi - lo))
			return uw_end(w, UE_READ_FAILED);
		ra = uw_word(w, b, cfa - 8);
		if (slot)
			bp = uw_word(w, b, cfa + slot * 8);
	} else {
		if (!uw_fetch(w, b, cfa - 8, 8))
			return uw_end(w, UE_READ_FAILED);
		ra = uw_word(w, b, cfa - 8);
		if (!uw_fetch(w, b, cfa + slot * 8, 8))
			return uw_end(w, UE_READ_FAILED);
		bp = uw_word(w, b, cfa + slot * 8);
	}
	if (!ra)
		return uw_end(w, UE_NULL_RA);
	if (cfa <= sp)
		return uw_end(w, UE_NOT_PROGRESSING);
	w->pc = ra;
	w->sp = cfa;
	w->bp = bp;
	w->exact = 0;
	w->interrupted = 0;
	return 0;
}

static __always_inline void count_unwind_end(__u32 reason)
{
	__u64 *v = bpf_map_lookup_elem(&unwind_ends, &reason);

	if (v)
		__sync_fetch_and_add(v, 1);
}

/* Walks the user stack at an allocator's return into b->ev.frames, and
 * says in b->ev.flags why the walk ended.
 *
 * A global function, which the verifier checks once per program instead
 * of once per call site (there are two: the common allocations, and the
 * calls kept in task storage): inlined twice, it doubled the start-up
 * verification. */
__noinline int walk_user_stack(struct pt_regs *ctx, struct ev_buf *b)
{
	struct unwind_proc *proc = 0;
	__u32 reason, pid;

	if (!b || !ctx)
		return 0;
	if (unwind_mode != MU_FP) {
		pid = b->ev.pid;
		proc = bpf_map_lookup_elem(&unwind_procs, &pid);
	}
	if (proc) {
		struct uwalk w = {
			.pc = PT_REGS_IP(ctx),
			.sp = PT_REGS_SP(ctx),
			.bp = PT_REGS_FP(ctx),
			.max = stack_bytes / 8,
			.exact = 1,
		};

		for (int i = 0; i <= MEMLEAK_MAX_FRAMES; i++) {
			if (uw_step(&w, b, proc))
				break;
		}
		b->ev.nframes = w.n;
		reason = w.reason;
	} else if (unwind_mode != MU_FP) {
		/* Not known yet (with -p, for a moment after an exec): the
		 * stack ends at its first frame, and user space, told so,
		 * builds the table. Falling back to the frame-pointer walk
		 * here cost the verifier as much again at every start. */
		b->ev.frames[0] = PT_REGS_IP(ctx);
		b->ev.nframes = 1;
		reason = UE_NO_TABLE;
	} else {
		reason = fp_walk(ctx, b);
	}
	if (reason >= UE_NR)
		reason = UE_NONE;
	b->ev.flags |= reason << MEF_END_SHIFT;
	count_unwind_end(reason);
	return 0;
}

/* No wakeup per event (5-9 us each here); force one only when the ring is
 * filling up, so a burst cannot overrun a consumer asleep between polls.
 * The fill level is asked every 16th event of a CPU (a helper call per
 * event cost ~10 ns); 16 events are at most 17 KiB, far below
 * wakeup_bytes. */
#define WAKEUP_QUERY_EVERY 16

static __always_inline __u64 wakeup_flags(struct cpu_bufs *bufs)
{
	if (bufs && (bufs->submitted++ % WAKEUP_QUERY_EVERY))
		return BPF_RB_NO_WAKEUP;
	return bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA) >= wakeup_bytes ? BPF_RB_FORCE_WAKEUP
									    : BPF_RB_NO_WAKEUP;
}

/* stack: 0 none, 1 kernel stack via bpf_get_stack, 2 frames already in e.
 * `bufs`: this CPU's buffers, if the caller has them. */
static __always_inline void submit(void *ctx, struct memleak_event *e, int stack, bool kernel,
				   struct cpu_bufs *bufs)
{
	__u64 len = MEMLEAK_HDR_SIZE;
	__u64 flags;

	if (stack == 2) {
		__u64 n = e->nframes;

		if (n > MEMLEAK_MAX_FRAMES)
			n = MEMLEAK_MAX_FRAMES;
		/* Compute the length from the bounded n (the verifier needs
		 * the bound), not speculatively before the comparison. */
		barrier_var(n);
		len += n * 8;
	} else if (stack) {
		long n = bpf_get_stack(ctx, e->frames, stack_bytes, kernel ? 0 : BPF_F_USER_STACK);
		if (n < 0) {
			e->stack_err = n;
			count_lost(ML_STACK_FAILED);
		} else {
			if (n > MEMLEAK_MAX_FRAMES * 8)
				n = MEMLEAK_MAX_FRAMES * 8;
			e->nframes = n / 8;
			if (n >= stack_bytes)
				e->flags |= MEF_STACK_FULL;
			if (kernel)
				e->flags |= MEF_KERNEL_STACK;
			len += n & ~7UL;
		}
	}
	if (len > sizeof(*e))
		len = sizeof(*e);
	flags = wakeup_flags(bufs ? bufs : this_cpu_bufs());
	if (bpf_ringbuf_output(&events, e, len, flags))
		count_lost(ML_RING_FULL);
}

/* The current task for reading its fields. A pointer loaded from a field
 * of the trusted task costs the verifier two searches of the kernel's BTF
 * by name at every visit (for "task_struct__safe_trusted" and its
 * _or_null twin, which do not exist): 46 % of a recording's start-up CPU.
 * Loads through this read-only cast (no code at run time) are the same
 * faulting-safe loads without those searches. Helpers that take the task
 * (task storage, bpf_find_vma) still get the trusted one. */
static __always_inline struct task_struct *walkable(struct task_struct *task)
{
	return bpf_core_cast(task, struct task_struct);
}

/* memleak's tagged cookie among the consumers of a pending return, or 0.
 * Return instances are recycled with only their consumer count reset, so
 * nothing is read past it; one pushed by a uretprobe that is not a session
 * has no consumer at all. */
static __always_inline __u64 tagged_cookie(struct return_instance *ri)
{
	__u64 c, base;
	int n;

	if (bpf_core_field_exists(ri->consumer)) {
		n = ri->cons_cnt;
		if (n <= 0)
			return 0;
		c = ri->consumer.cookie;
		if ((c & CK_TAG_MASK) == CK_TAG)
			return c;
		/* Another tool's probe on the same function came first. */
		base = (__u64)ri->extra_consumers;
		n--;
	} else {
		struct return_instance___v613 *old = (void *)ri;

		n = old->consumers_cnt;
		base = (__u64)ri + bpf_core_field_offset(struct return_instance___v613, consumers);
	}
	for (int i = 0; i < 4; i++) {
		if (i >= n)
			break;
		if (bpf_probe_read_kernel(&c, sizeof(c), (void *)(base + i * sizeof(struct return_consumer))))
			break;
		if ((c & CK_TAG_MASK) == CK_TAG)
			return c;
	}
	return 0;
}

/* A pending return is live while the return address of its call still
 * points at uprobes' trampoline; a longjmp out of the call leaves the
 * instance behind (until the kernel next asks for a return at a shallower
 * stack pointer), and the stack it was on is soon written over. */
static __always_inline bool return_pending(struct task_struct *task, struct return_instance *ri)
{
	struct xol_area *area = walkable(task)->mm->uprobes_state.xol_area;
	__u64 ret;

	if (!area || bpf_probe_read_user(&ret, sizeof(ret), (void *)ri->stack))
		return false;
	return ret == area->vaddr;
}

struct vma_span {
	__u64 start;
	__u64 end;
};

static long vma_span_cb(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct vma_span *span = data;

	span->start = vma->vm_start;
	span->end = vma->vm_end;
	return 0;
}

/* Whether `addr` is in the same mapping as `sp`: a pending return below
 * the stack pointer on the same stack belongs to a frame already gone. If
 * the mapping cannot be looked up (its lock is busy), it is taken as
 * another stack, which can only cost a missed event. */
static __always_inline bool same_stack(struct task_struct *task, __u64 sp, __u64 addr)
{
	struct vma_span span = {};

	if (bpf_find_vma(task, sp, vma_span_cb, &span, 0))
		return false;
	return addr >= span.start && addr < span.end;
}

/* How many pending returns enclosing_call() looks through. Past that a
 * nested call would be taken for an outermost one; it takes four other
 * uretprobe users' calls, or longjmps out of allocators, in between. */
#define PENDING_LOOKUP 4

/* The cookie of memleak's innermost call that encloses this probe on this
 * thread, or 0. uprobes keep a thread's pending returns on a list, most
 * recent first; memleak's entry halves tag their cookies.
 * - One with no tagged consumer is another uprobe user's (or another
 *   recording's, whose pid filter skipped this process but whose session
 *   consumer still asked for the return: sized operator delete jumps to
 *   operator delete, which jumps to free, and a foreign return pending for
 *   the middle one must not hide ours below it).
 * - One at or above ours encloses us. A tail call (reallocarray ->
 *   realloc) enters with the same stack pointer, hence "at or above". The
 *   libc wrappers are the common way back into the program (printf
 *   handlers, fopencookie streams), which can longjmp out of them: a
 *   wrapper's return is checked to be live (its return address is still
 *   the trampoline), at one read of user memory. Checking every call cost
 *   C++ ~6 % (four reads per new[]/delete[] pair). Not caught: a longjmp
 *   out of operator new's new_handler, of an -O allocator's hook, or of a
 *   signal handler that interrupted malloc (nor were they by the task
 *   storage flag before).
 * - One below ours on the same stack belongs to a frame already gone (a
 *   longjmp or siglongjmp out of the call; its slot may still hold the
 *   trampoline), which the kernel drops when a return is next asked for.
 *   One below ours on another stack, and live, is a call that a signal
 *   handler on the signal stack interrupted: asking for a return there
 *   would make the kernel drop the interrupted call's return as abandoned
 *   (it keeps only those below the stack pointer of a new call), and the
 *   thread would die of SIGILL when that call returns. It encloses us,
 *   without its wrapper flag, so that the handler's calls never ask for a
 *   return. The mappings are compared rather than the registered signal
 *   stack, which an SS_AUTODISARM handler hides while it runs. Both checks
 *   run only in these rare cases.
 * The common case, an empty list, never gets here (enclosing_call()). */
__noinline __u64 pending_walk(struct pt_regs *ctx)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct return_instance *ri;

	if (!ctx)
		return 0;
	ri = walkable(task)->utask->return_instances;
	__u64 sp = PT_REGS_SP(ctx), c;

	for (int i = 0; i < PENDING_LOOKUP; i++) {
		if (!ri)
			return 0;
		c = tagged_cookie(ri);
		if (c && ri->stack >= sp) {
			if (!(c & CK_WRAPPER) || return_pending(task, ri))
				return c;
		} else if (c && !same_stack(task, sp, ri->stack) && return_pending(task, ri)) {
			return c & ~CK_WRAPPER;
		}
		ri = ri->next;
	}
	return 0;
}

/* The common case, no pending return, stays inline; the walk is a global
 * function, verified once per program: inlined at each entry probe, it
 * quadrupled the start-up verification. */
static __always_inline __u64 enclosing_call(struct pt_regs *ctx, struct task_struct *task)
{
	if (!walkable(task)->utask->return_instances)
		return 0;
	return pending_walk(ctx);
}

/* Records a free now. It is header-only: built on the stack and copied
 * by one helper call (reserve and submit are two), with the ids read from
 * the task the caller already has rather than by another call. */
static __always_inline void record_free(struct task_struct *task, __u8 kind, __u64 addr,
					__u64 size)
{
	__u64 hdr[MEMLEAK_HDR_SIZE / 8];
	struct memleak_event *e = (void *)hdr;
	struct cpu_bufs *bufs = this_cpu_bufs();

	init_event_of(e, kind, task->tgid, task->pid, event_time(bufs));
	e->addr = addr;
	e->size = size;
	if (bpf_ringbuf_output(&events, e, MEMLEAK_HDR_SIZE, wakeup_flags(bufs)))
		count_lost(ML_RING_FULL);
}

/* Entry of an outermost call whose return needs more than its size: keep
 * the arguments in task storage. */
static __always_inline int state_entry(struct pt_regs *ctx, struct task_struct *task, __u8 kind,
				       __u64 *cookie)
{
	struct thread_state *st;

	st = bpf_task_storage_get(&threads, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!st) {
		count_lost(ML_INFLIGHT_FULL);
		return 1;
	}
	st->active = 1;
	st->kind = kind;
	st->a0 = PT_REGS_PARM1(ctx);
	st->a1 = PT_REGS_PARM2(ctx);
	st->a2 = PT_REGS_PARM3(ctx);
	st->n_inner = 0;
	st->entry_ptr = 0;
	if (kind == MW_GETLINE && st->a0)
		bpf_probe_read_user(&st->entry_ptr, sizeof(st->entry_ptr), (void *)st->a0);
	*cookie = CK_TAG | CK_STATE | (kind >= MW_STRDUP ? CK_WRAPPER : 0);
	return 0;
}

/* Entry of a call nested in `outer`: not recorded. Directly inside a
 * wrapper, watch malloc, calloc and realloc return, to learn the size of
 * the block the wrapper hands out. */
static __always_inline int nested_entry(struct pt_regs *ctx, struct task_struct *task, __u8 kind,
					__u64 outer, __u64 *cookie)
{
	struct thread_state *st;

	if (!(outer & CK_WRAPPER))
		return 1;
	st = bpf_task_storage_get(&threads, task, 0, 0);
	if (!st || !st->active)
		return 1;
	if (kind == MK_MALLOC)
		st->nested_size = PT_REGS_PARM1(ctx);
	else if (kind == MK_CALLOC)
		st->nested_size = PT_REGS_PARM1(ctx) * PT_REGS_PARM2(ctx);
	else if (kind == MK_REALLOC)
		st->nested_size = PT_REGS_PARM2(ctx);
	else
		return 1;
	*cookie = CK_TAG | CK_INNER;
	return 0;
}

/* Whether a signal handler could run above this call's stack pointer: the
 * thread has a signal stack registered and it lies above the stack the
 * thread runs on. A pending return asked for here would then be at the
 * mercy of every other uprobe user: a handler's call on the signal stack
 * that any of them watches (another memleak recording of any process,
 * whose pid filter still asks for the return; bcc; bpftrace; a tracefs
 * uretprobe) makes the kernel drop every pending return below the
 * handler's stack pointer as abandoned, and the thread dies of SIGILL when
 * the interrupted call returns. memleak cannot stop another tool from
 * asking, so it asks for nothing on such a thread (a signal stack below
 * the thread's stack, the usual case, is harmless: a handler there runs
 * below every pending return). Two loads from the task. */
static __always_inline bool signal_stack_above(struct task_struct *task, __u64 sp)
{
	struct task_struct *t = walkable(task);

	return t->sas_ss_size && t->sas_ss_sp > sp;
}

/* An outermost call whose return memleak must not ask for: not traced,
 * and counted, so that reports say their figures are uncertain. operator
 * delete is simply not recorded at its entry: the free() inside it, which
 * then finds no enclosing call, records the block's release; a housekeeping
 * call (the thread-exit tcache flush) stays uncounted. */
static __always_inline int decline(__u8 kind)
{
	if (kind != MK_DELETE && kind != MK_DELETE_ARRAY && kind != MW_SILENT)
		count_lost(ML_UNSAFE_RETURN);
	return 1;
}

/* Entry half; `known` is the kind, or -1 to take it from the attach
 * cookie. Returns 1 to skip the return half. */
static __always_inline int alloc_entry(struct pt_regs *ctx, __u64 *cookie, int known)
{
	/* The argument first: read after the list walk, clang computed its
	 * address early and the verifier refused the offset context pointer. */
	__u64 a0 = PT_REGS_PARM1(ctx), n, size;
	struct task_struct *task = bpf_get_current_task_btf();
	__u8 kind = known >= 0 ? known : bpf_get_attach_cookie(ctx) & 0xff;
	__u64 outer = enclosing_call(ctx, task);

	if (outer)
		return nested_entry(ctx, task, kind, outer, cookie);
	if (signal_stack_above(task, PT_REGS_SP(ctx)))
		return decline(kind);
	switch (kind) {
	case MK_MALLOC:
	case MK_NEW:
	case MK_NEW_ARRAY:
	case MK_VALLOC:
	case MK_PVALLOC:
		size = a0;
		break;
	case MK_CALLOC:
		n = PT_REGS_PARM2(ctx);
		/* An overflowing calloc fails; its size only has to be big. */
		size = n && a0 > CK_SIZE_MASK / n ? CK_SIZE_MASK : a0 * n;
		break;
	case MK_MEMALIGN:
	case MK_ALIGNED_ALLOC:
	case MK_MMAP:
		size = PT_REGS_PARM2(ctx);
		break;
	case MK_DELETE:
	case MK_DELETE_ARRAY:
		/* Recorded now; the return half only has to exist, so that the
		 * free() inside finds this call and is not recorded twice. */
		if (!a0)
			return 1;
		record_free(task, kind, a0, 0);
		*cookie = CK_TAG | CK_DONE;
		return 0;
	case MW_SILENT:
		*cookie = CK_TAG | CK_DONE;
		return 0;
	default:
		return state_entry(ctx, task, kind, cookie);
	}
	*cookie = CK_TAG | (__u64)kind << CK_KIND_SHIFT | (size > CK_SIZE_MASK ? CK_SIZE_MASK : size);
	return 0;
}

/* Size of the nested allocation that produced `addr`, or ~0 if none. */
static __always_inline __u64 inner_size_of(struct thread_state *st, __u64 addr)
{
	__u64 size = ~0ULL;

	for (int i = 0; i < 4; i++) {
		if (i < st->n_inner && st->inner_addr[i] == addr)
			size = st->inner_sz[i];
	}
	return size;
}

/* Return of an allocation whose size is in the cookie. */
static __always_inline int fast_return(struct pt_regs *ctx, __u64 cookie)
{
	__u8 kind = (cookie >> CK_KIND_SHIFT) & 0xf;
	__u64 size = cookie & CK_SIZE_MASK;
	__u64 addr = PT_REGS_RC(ctx);
	struct cpu_bufs *bufs;
	struct cpu_buf *buf = 0;
	struct memleak_event *e;

	if (kind == MK_MMAP && (long)addr == -1)
		addr = 0;
	if (!addr) {
		count_lost(ML_FAILED_ALLOC);
		return 0;
	}
	if (size < min_size || size > max_size)
		return 0;
	bufs = this_cpu_bufs();
	if (!bufs)
		return 0;
	for (int i = 0; i < CPU_BUFS; i++) {
		if (__sync_val_compare_and_swap(&bufs->slot[i].busy, 0, 1) == 0) {
			buf = &bufs->slot[i];
			break;
		}
	}
	if (!buf) {
		count_lost(ML_INFLIGHT_FULL);
		return 0;
	}
	e = init_event(&buf->b.ev, kind, event_time(bufs));
	e->addr = addr;
	e->size = size;
	walk_user_stack(ctx, &buf->b);
	submit(ctx, e, 2, false, bufs);
	buf->busy = 0;
	return 0;
}

/* Return of a call whose arguments are in task storage (CK_STATE), or of
 * an allocation nested in a wrapper (CK_INNER). `known`: the program's
 * kind, as for session(). */
static __always_inline int state_return(struct pt_regs *ctx, __u64 cookie, int known)
{
	struct task_struct *task = bpf_get_current_task_btf();
	struct thread_state *st = bpf_task_storage_get(&threads, task, 0, 0);
	struct memleak_event *e;
	__u64 ret, addr = 0, size = 0, old = 0, old_size = 0;
	__u8 kind;

	if (!st || !st->active)
		return 0;
	ret = PT_REGS_RC(ctx);
	if (cookie & CK_INNER) {
		__u32 slot = st->n_inner++ & 3;

		st->inner_addr[slot] = ret;
		st->inner_sz[slot] = st->nested_size;
		return 0;
	}
	/* malloc keeps nothing in task storage (only its inner returns
	 * above): its program need not carry, nor the verifier walk, the
	 * other calls' returns (half of its load time). */
	if (known == MK_MALLOC)
		return 0;
	st->active = 0;
	kind = st->kind;
	switch (kind) {
	case MK_REALLOC:
		old = st->a0;
		size = st->a1;
		addr = ret;
		break;
	case MK_REALLOCARRAY:
		old = st->a0;
		size = st->a1 * st->a2;
		addr = ret;
		break;
	case MK_POSIX_MEMALIGN:
		size = st->a2;
		if ((int)ret == 0)
			bpf_probe_read_user(&addr, sizeof(addr), (void *)st->a0);
		break;
	case MK_MREMAP:
		old = st->a0;
		old_size = st->a1;
		size = st->a2;
		addr = (long)ret == -1 ? 0 : ret;
		break;
	case MW_STRDUP:
		kind = MK_MALLOC;
		addr = ret;
		size = inner_size_of(st, addr);
		break;
	case MW_ASPRINTF:
		kind = MK_MALLOC;
		if ((int)ret >= 0 && st->a0)
			bpf_probe_read_user(&addr, sizeof(addr), (void *)st->a0);
		size = inner_size_of(st, addr);
		break;
	case MW_GETLINE:
		if (st->a0)
			bpf_probe_read_user(&addr, sizeof(addr), (void *)st->a0);
		old = st->entry_ptr;
		size = inner_size_of(st, addr);
		if (size == ~0ULL)
			return 0; /* the caller's buffer was reused as is */
		kind = old ? MK_REALLOC : MK_MALLOC;
		break;
	default:
		return 0;
	}
	if (!addr) {
		/* realloc(p, 0) frees p and returns NULL: that is a free. Any
		 * other NULL is a failed call and changes nothing. */
		if (!((kind == MK_REALLOC || kind == MK_REALLOCARRAY) && old && size == 0)) {
			count_lost(ML_FAILED_ALLOC);
			return 0;
		}
	}
	if (!old && (size < min_size || size > max_size))
		return 0;
	e = init_event(&st->buf.ev, kind, event_time(this_cpu_bufs()));
	e->addr = addr;
	e->size = size;
	e->old_addr = old;
	e->old_size = old_size;
	if (addr)
		walk_user_stack(ctx, &st->buf);
	submit(ctx, e, addr ? 2 : 0, false, 0);
	return 0;
}

/* The kernel zeroes the session cookie before the entry half, and the
 * entry half tags it whenever it asks for the return half: a tagged
 * cookie means the return. One read instead of a bpf_session_is_return()
 * call in each half. */
static __always_inline int session(struct pt_regs *ctx, int known)
{
	__u64 *cookie = bpf_session_cookie();
	__u64 c = *cookie;

	if ((c & CK_TAG_MASK) != CK_TAG)
		return alloc_entry(ctx, cookie, known);
	if (c & CK_DONE)
		return 0;
	if (c & (CK_STATE | CK_INNER))
		return state_return(ctx, c, known);
	return fast_return(ctx, c);
}

/* Every allocator; the attach cookie says which one fired. */
SEC("uprobe.session")
int alloc_session(struct pt_regs *ctx)
{
	return session(ctx, -1);
}

/* malloc, the most frequent, has its own copy that needs no attach
 * cookie. */
SEC("uprobe.session")
int malloc_session(struct pt_regs *ctx)
{
	return session(ctx, MK_MALLOC);
}

/* free() and munmap(): entry only, skipped inside an outermost call. One
 * program each, so neither needs the attach cookie. */
static __always_inline int free_probe(struct pt_regs *ctx, __u8 kind, __u64 size)
{
	struct task_struct *task = bpf_get_current_task_btf();
	__u64 addr = PT_REGS_PARM1(ctx);

	if (!addr || enclosing_call(ctx, task))
		return 0;
	record_free(task, kind, addr, size);
	return 0;
}

SEC("uprobe.multi")
int free_entry(struct pt_regs *ctx)
{
	return free_probe(ctx, MK_FREE, 0);
}

SEC("uprobe.multi")
int munmap_entry(struct pt_regs *ctx)
{
	return free_probe(ctx, MK_MUNMAP, PT_REGS_PARM2(ctx));
}

/* The overhead floor for benchmarks: the same probes at the same places,
 * only counting hits (no state, event, stack or ring buffer). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} hits SEC(".maps");

static __always_inline void count_hit(void)
{
	__u32 zero = 0;
	__u64 *v = bpf_map_lookup_elem(&hits, &zero);

	if (v)
		*v += 1;
}

SEC("uprobe.session")
int count_session(struct pt_regs *ctx)
{
	count_hit();
	return 0;
}

SEC("uprobe.multi")
int count_entry(struct pt_regs *ctx)
{
	count_hit();
	return 0;
}

/* ld.so calls _dl_debug_state() around every change of the loaded objects,
 * before unmapping a dlclosed one. In -c mode every thread of the child is
 * ptraced; stopping the thread here lets the recorder drain the ring and
 * snapshot the maps while the library is still mapped, so a library that is
 * dlopened, leaks and is dlclosed at once still symbolizes. */
SEC("uprobe.multi")
int dl_state(struct pt_regs *ctx)
{
	bpf_send_signal_thread(19 /* SIGSTOP */);
	return 0;
}

static __always_inline int lifecycle(__u8 kind, __u32 tgid, __u64 arg)
{
	struct memleak_event *e;

	if (!bpf_map_lookup_elem(&traced, &tgid))
		return 0;
	e = get_cpu_event(kind);
	if (!e)
		return 0;
	e->pid = tgid;
	e->addr = arg;
	submit(0, e, 0, false, 0);
	put_cpu_event();
	return 0;
}

/* The lifecycle programs are BTF-typed (tp_btf), not perf-event
 * tracepoints: detaching a perf-event tracepoint waits for RCU grace
 * periods (100-180 ms here) at the end of every recording; a BTF
 * tracepoint link is released without waiting. */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(on_exec)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;

	/* The old image's mappings mean nothing now; the new image's first
	 * allocations must not be unwound with them. User space writes the
	 * new table (its exec stop or this event). */
	if (unwind_mode != MU_FP && bpf_map_lookup_elem(&traced, &tgid))
		bpf_map_delete_elem(&unwind_procs, &tgid);
	return lifecycle(MK_EXEC, tgid, 0);
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(on_exit)
{
	__u64 id = bpf_get_current_pid_tgid();

	if ((__u32)id != (id >> 32))
		return 0; /* a thread, not the process */
	return lifecycle(MK_EXIT, id >> 32, 0);
}

/* BTF-typed, to see the tasks: a new thread is not a fork. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(on_fork, struct task_struct *parent, struct task_struct *child)
{
	if (child->pid != child->tgid)
		return 0;
	return lifecycle(MK_FORK, parent->tgid, child->tgid);
}

/* Kernel allocators. */

static __always_inline int kernel_event(void *ctx, __u8 kind, __u64 addr, __u64 size)
{
	struct memleak_event *e;

	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u8 one = 1;

	/* Writing the trace makes the recorder allocate kernel memory too;
	 * recording that would only measure ourselves. --kernel-pid keeps the
	 * allocations of one process. Either way the free of an object may run
	 * in any task (RCU callbacks, workqueues, softirqs), so frees are
	 * matched by address, not by task. */
	if (size) {
		bool wanted = kernel_tgid ? tgid == kernel_tgid : tgid != self_tgid;
		bool remember = kernel_tgid ? wanted : !wanted;

		if (remember)
			bpf_map_update_elem(&kobjs, &addr, &one, BPF_ANY);
		else if (bpf_map_lookup_elem(&kobjs, &addr))
			/* A remembered object here was freed by a path with no
			 * tracepoint (bulk frees); forget it, or the free of this
			 * one would be taken for its. */
			bpf_map_delete_elem(&kobjs, &addr);
		if (!wanted)
			return 0;
	} else {
		/* A lookup is lock-free; most frees are of unremembered objects,
		 * so only those found pay for the delete. */
		bool known = bpf_map_lookup_elem(&kobjs, &addr) != 0;

		if (known)
			bpf_map_delete_elem(&kobjs, &addr);

		if (kernel_tgid ? !known : known)
			return 0;
	}
	e = get_cpu_event(kind);
	if (!e)
		return 0;
	e->addr = addr;
	e->size = size;
	submit(ctx, e, size && kernel_stacks, true, 0);
	put_cpu_event();
	return 0;
}

/* The slab and page tracepoints are BTF-typed (tp_btf): the kernel then
 * skips a program only when that same program is already active on the
 * CPU. As classic tracepoints, any other BPF program running there (say our
 * kmalloc handler, interrupted by an RCU callback's kmem_cache_free) made
 * the kernel drop the event, counted only in recursion_misses.
 *
 * A program interrupted by its own tracepoint still happens: softirqs that
 * free slab objects run on interrupt exit, anywhere in a program or in the
 * kernel code around it. So each of these tracepoints has three copies,
 * called in attach order for every event, and exactly one of them records
 * each event:
 *
 *  - Copy 1 records every event it is not skipped for, and first leaves
 *    the event's identity (args pointer, kind, object) as a token in a
 *    per-CPU slot chosen by where the args sit on the stack.
 *  - Copy 2 takes copy 1's token if it names the event; if there is none,
 *    copy 1 was skipped, so it records the event. Either way it leaves its
 *    own token.
 *  - Copy 3 takes copy 2's token (or copy 1's, if copy 2 was skipped);
 *    with none, both were skipped and it records the event.
 *
 * An interrupting event's args sit deeper on the same stack, or on the
 * interrupt stack, so its token never lands in the slot of the event it
 * interrupted: whatever the kernel skips, whenever the interrupt comes, an
 * event is recorded once. It is lost only when all three copies are active
 * below it, which takes three levels of nesting. The first copy's
 * recursion_misses minus the events the later copies recorded counts such
 * losses.
 *
 * Page events carry the struct page pointer; user space turns it into a
 * pfn once it has learned the kernel's vmemmap base (calib_* below). */
struct token {
	__u64 ctx;
	__u64 addr;
	__u64 kind;
};

#define TOKEN_SLOTS 2048 /* 16 KiB of stack, 8 bytes apart */

/* Per copy (1 and 2): on the task's stack or not, then the args' place. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2 * 2 * TOKEN_SLOTS);
	__type(key, __u32);
	__type(value, struct token);
} tokens SEC(".maps");

/* Events the later copies recorded: the kernel counts each of them as a
 * recursion miss of the first copy, so user space subtracts them. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} rescued SEC(".maps");

static __always_inline __u32 stack_slot(void *ctx)
{
	struct task_struct *t = bpf_get_current_task_btf();
	__u64 base = (__u64)BPF_CORE_READ(t, stack), at = 0;
	bool on_task;

	/* The verifier allows no arithmetic on the ctx pointer; a copy of its
	 * value is a plain number. */
	bpf_probe_read_kernel(&at, sizeof(at), &ctx);
	on_task = at - base < TOKEN_SLOTS * 8;

	return (on_task ? 0 : TOKEN_SLOTS) + ((at >> 3) & (TOKEN_SLOTS - 1));
}

static __always_inline struct token *token_slot(__u32 copy, __u32 slot)
{
	__u32 key = copy * 2 * TOKEN_SLOTS + slot;

	return bpf_map_lookup_elem(&tokens, &key);
}

/* Takes `t` if it names this event. */
static __always_inline bool take(struct token *t, void *ctx, __u8 kind, __u64 addr)
{
	if (!t || t->ctx != (__u64)ctx || t->addr != addr || t->kind != kind)
		return false;
	t->ctx = 0;
	return true;
}

static __always_inline void put(struct token *t, void *ctx, __u8 kind, __u64 addr)
{
	if (t) {
		t->ctx = (__u64)ctx;
		t->addr = addr;
		t->kind = kind;
	}
}

static __always_inline void rescue(void *ctx, __u8 kind, __u64 addr, __u64 size)
{
	__u32 zero = 0;
	__u64 *n = bpf_map_lookup_elem(&rescued, &zero);

	if (n)
		*n += 1;
	kernel_event(ctx, kind, addr, size);
}

static __always_inline int copy_1(void *ctx, __u8 kind, __u64 addr, __u64 size)
{
	put(token_slot(0, stack_slot(ctx)), ctx, kind, addr);
	return kernel_event(ctx, kind, addr, size);
}

static __always_inline int copy_2(void *ctx, __u8 kind, __u64 addr, __u64 size)
{
	__u32 slot = stack_slot(ctx);

	put(token_slot(1, slot), ctx, kind, addr);
	if (!take(token_slot(0, slot), ctx, kind, addr))
		rescue(ctx, kind, addr, size);
	return 0;
}

static __always_inline int copy_3(void *ctx, __u8 kind, __u64 addr, __u64 size)
{
	__u32 slot = stack_slot(ctx);

	if (!take(token_slot(1, slot), ctx, kind, addr) &&
	    !take(token_slot(0, slot), ctx, kind, addr))
		rescue(ctx, kind, addr, size);
	return 0;
}

#define COPIES(name, tp, args, kind, addr, size, skip)		\
	SEC("tp_btf/" tp)					\
	int BPF_PROG(on_##name, args)				\
	{							\
		return (skip) ? 0 : copy_1(ctx, kind, addr, size);	\
	}							\
	SEC("tp_btf/" tp)					\
	int BPF_PROG(on_##name##_nested, args)			\
	{							\
		return (skip) ? 0 : copy_2(ctx, kind, addr, size);	\
	}							\
	SEC("tp_btf/" tp)					\
	int BPF_PROG(on_##name##_nested2, args)			\
	{							\
		return (skip) ? 0 : copy_3(ctx, kind, addr, size);	\
	}

#define ARGS(...) __VA_ARGS__

COPIES(kmalloc, "kmalloc",
	   ARGS(unsigned long call_site, const void *ptr, size_t bytes_req, size_t bytes_alloc),
	   MK_KMALLOC, (__u64)ptr, bytes_alloc, !ptr)
COPIES(kfree, "kfree", ARGS(unsigned long call_site, const void *ptr),
	   MK_KFREE, (__u64)ptr, 0, !ptr)
COPIES(kmem_cache_alloc, "kmem_cache_alloc",
	   ARGS(unsigned long call_site, const void *ptr, struct kmem_cache *s),
	   MK_KMEM_CACHE_ALLOC, (__u64)ptr, BPF_CORE_READ(s, size), !ptr)
COPIES(kmem_cache_free, "kmem_cache_free", ARGS(unsigned long call_site, const void *ptr),
	   MK_KMEM_CACHE_FREE, (__u64)ptr, 0, !ptr)
COPIES(page_alloc, "mm_page_alloc", ARGS(struct page *page, unsigned int order),
	   MK_PAGE_ALLOC, (__u64)page, 4096ULL << order, false)
COPIES(page_free, "mm_page_free", ARGS(struct page *page, unsigned int order),
	   MK_PAGE_FREE, (__u64)page, 0, false)

/* Before 6.1 kmem_cache_alloc carried sizes instead of the cache, and the
 * _node variants were tracepoints of their own (merged since). User space
 * loads these only when the kernel's BTF has kmalloc_node. Not run on the
 * 6.18 machines this was built on. */
COPIES(kmem_cache_alloc_legacy, "kmem_cache_alloc",
	   ARGS(unsigned long call_site, const void *ptr, size_t bytes_req, size_t bytes_alloc),
	   MK_KMEM_CACHE_ALLOC, (__u64)ptr, bytes_alloc, !ptr)
COPIES(kmalloc_node, "kmalloc_node",
	   ARGS(unsigned long call_site, const void *ptr, size_t bytes_req, size_t bytes_alloc),
	   MK_KMALLOC, (__u64)ptr, bytes_alloc, !ptr)
COPIES(kmem_cache_alloc_node, "kmem_cache_alloc_node",
	   ARGS(unsigned long call_site, const void *ptr, size_t bytes_req, size_t bytes_alloc),
	   MK_KMEM_CACHE_ALLOC, (__u64)ptr, bytes_alloc, !ptr)

/* Page frame numbers. The BTF tracepoints give a struct page pointer;
 * the classic mm_page_alloc tracepoint gives the pfn of the same page.
 * For a moment at startup both are attached: the first stores the pointer
 * of each allocation on this CPU, the second (called after it for the same
 * event) derives vmemmap_base = pointer - pfn * sizeof(struct page).
 * User space takes a value several events agree on and converts page
 * events to pfns. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} calib_last SEC(".maps");

#define CALIB_SAMPLES 8
__u64 calib_base[CALIB_SAMPLES] = {};
__u32 calib_n = 0;
__u64 page_struct_size = 0;

SEC("tp_btf/mm_page_alloc")
int BPF_PROG(calib_page, struct page *page, unsigned int order)
{
	__u32 zero = 0;
	__u64 *last = bpf_map_lookup_elem(&calib_last, &zero);

	if (last)
		*last = (__u64)page;
	return 0;
}

SEC("tracepoint/kmem/mm_page_alloc")
int calib_pfn(struct trace_event_raw_mm_page_alloc *ctx)
{
	__u32 zero = 0, i;
	__u64 *last = bpf_map_lookup_elem(&calib_last, &zero);
	__u64 pfn = BPF_CORE_READ(ctx, pfn), size = bpf_core_type_size(struct page);

	if (!last || !*last || pfn == ~0ULL)
		return 0;
	page_struct_size = size;
	/* Racy across CPUs: a lost or doubled sample only delays agreement. */
	i = calib_n;
	calib_n = i + 1;
	if (i < CALIB_SAMPLES)
		calib_base[i] = *last - pfn * size;
	*last = 0;
	return 0;
}

SEC("tracepoint/percpu/percpu_alloc_percpu")
int on_percpu_alloc(struct trace_event_raw_percpu_alloc_percpu *ctx)
{
	/* bytes_alloc appeared in 5.x; older kernels only have size. */
	__u64 size = BPF_CORE_READ(ctx, size);

	if (bpf_core_field_exists(ctx->bytes_alloc))
		size = BPF_CORE_READ(ctx, bytes_alloc);
	return kernel_event(ctx, MK_PERCPU_ALLOC, (__u64)BPF_CORE_READ(ctx, ptr), size);
}

SEC("tracepoint/percpu/percpu_free_percpu")
int on_percpu_free(struct trace_event_raw_percpu_free_percpu *ctx)
{
	return kernel_event(ctx, MK_PERCPU_FREE, (__u64)ctx->ptr, 0);
}
