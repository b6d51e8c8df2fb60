/* The shared memory between memleak's in-process agent (agent.c, preloaded
 * into a command by `record --capture preload`) and the recorder.
 *
 * One memfd, made by the recorder and mapped by both sides:
 *
 *   [header][unwind tables][unwind rows][ring of slots]
 *
 * - The header holds the configuration, the ring's positions, the loss
 *   counters and the processes the agent may record in.
 * - The unwind tables and rows are those the BPF probe reads
 *   (bpf/memleak.h), written by the same code (an UnwindSink), so the
 *   agent walks stacks exactly as the probe does.
 * - The ring is a bounded multi-producer queue of fixed-size slots (after
 *   Vyukov's): a slot's `seq` says whose turn it is. A producer takes
 *   position p when slot p % n has seq == p (a compare-and-swap on `head`),
 *   fills it and publishes seq = p + 1; the consumer reads it and frees it
 *   for the next lap with seq = p + n. No lock and no system call on
 *   either side. Slots are claimed in the order the calls happen, so the
 *   ring's order is causal, like the BPF ring's.
 *
 * Every offset below is fixed, and asserted here and in the Rust mirror
 * (crates/recorder/src/inprocess/layout.rs). */
#ifndef __MEMLEAK_AGENT_H__
#define __MEMLEAK_AGENT_H__

#include <stddef.h>
#include <linux/types.h>
#include "../bpf/memleak.h"

#define MLA_MAGIC 0x31544e4547414c4dULL /* "MLAGENT1" */
#define MLA_VERSION 2
/* Processes the agent may record in (the command, and the processes it
 * forks under --follow-forks). */
#define MLA_MAX_PIDS 4096
/* The agent's own memfd is named MLA_NAME followed by the number of the
 * shared memory's descriptor, in the recorder and, inherited, in the
 * command. */
#define MLA_NAME "memleak-agent.so."

/* The value the agent's own SIGSTOPs carry (SI_QUEUE), so that the
 * recorder tells them from a user's: src/record/child.rs. */
#define MLA_STOP_VALUE 0x4d4c5354

/* lost[] index, the agent's own (after enum memleak_lost): a sampled
 * allocation not recorded because the set of sampled addresses had no
 * room for it (record --sample). */
#define MLA_LOST_SAMPLE_SET 5

struct mla_header {
	__u64 magic;         /* 0 */
	__u32 version;       /* 8 */
	__u32 recorder_pid;  /* 12 */
	__u64 total_bytes;   /* 16: the memfd's size */
	__u64 ring_off;      /* 24 */
	__u32 nslots;        /* 32: a power of two */
	__u32 slot_bytes;    /* 36 */
	__u64 rows_off;      /* 40 */
	__u32 row_capacity;  /* 48 */
	__u32 ntables;       /* 52 */
	__u64 tables_off;    /* 56 */
	__u64 min_size;      /* 64 */
	__u64 max_size;      /* 72 */
	__u32 max_frames;    /* 80: --stack-depth */
	__u32 unwind_mode;   /* 84: enum memleak_unwind_mode */
	__u32 reserved0;     /* 88 */
	__u32 npids;         /* 92: used entries of pids[] */
	__u64 tables_gen;    /* 96: bumped after every table write */
	__u32 stop;          /* 104: the recording ended: record nothing more */
	__u32 wake_seq;      /* 108: a futex the recorder sleeps on */
	__u32 sleeping;      /* 112: the recorder is asleep on wake_seq */
	__u32 room_seq;      /* 116: a futex writers wait on for room */
	__u32 room_waiting;  /* 120: a writer waits on room_seq */
	__u8 pad0[132];
	__u64 head;          /* 256: next position to claim */
	__u8 pad1[56];
	__u64 tail;          /* 320: next position the recorder reads */
	__u8 pad2[56];
	__u64 lost[8];       /* 384: by enum memleak_lost */
	__u64 agents;        /* 448: processes whose agent started */
	__u64 sample_mean;   /* 456: record --sample: mean bytes between samples; 0 records every call */
	__u64 sandboxed;     /* 464: processes whose agent saw a seccomp filter come */
	__u8 pad3[40];
	__u32 pids[MLA_MAX_PIDS]; /* 512 */
};

#define MLA_HEADER_BYTES 20480

/* A process's unwind table, guarded by a sequence count: odd while the
 * recorder writes it. */
struct mla_table {
	__u32 pid;  /* 0: free slot */
	__u32 seq;
	__u64 reserved;
	struct unwind_proc proc;
};

/* One ring slot. `len` is the event's length (header and frames); 0 means
 * the slot carries no event (a call that failed after claiming it). */
struct mla_slot {
	__u64 seq;
	__u32 pid; /* the writer's process, stored first: a slot left unfinished
		    * by a process that died is skipped, never one still being
		    * written */
	__u32 len;
	struct memleak_event ev;
};

#define MLA_SLOT_BYTES 1088

_Static_assert(offsetof(struct mla_header, stop) == 104, "stop");
_Static_assert(offsetof(struct mla_header, room_seq) == 116, "room_seq");
_Static_assert(offsetof(struct mla_header, room_waiting) == 120, "room_waiting");
_Static_assert(offsetof(struct mla_header, head) == 256, "head");
_Static_assert(offsetof(struct mla_header, tail) == 320, "tail");
_Static_assert(offsetof(struct mla_header, lost) == 384, "lost");
_Static_assert(offsetof(struct mla_header, sample_mean) == 456, "sample_mean");
_Static_assert(offsetof(struct mla_header, sandboxed) == 464, "sandboxed");
_Static_assert(offsetof(struct mla_header, pids) == 512, "pids");
_Static_assert(sizeof(struct mla_header) <= MLA_HEADER_BYTES, "header");
_Static_assert(sizeof(struct mla_table) == 16 + 16 + 32 * UNWIND_MAX_MAPS, "table");
_Static_assert(sizeof(struct mla_slot) == MLA_SLOT_BYTES, "slot");
_Static_assert(offsetof(struct mla_slot, ev) == 16, "slot ev");

#endif
