// SPDX-License-Identifier: MIT OR Apache-2.0
/* memleak's in-process agent: `record --capture preload` preloads it into
 * the command (LD_PRELOAD), where it takes the place of the BPF probes.
 *
 * It interposes the functions the probes watch (the malloc family, the C++
 * operators, mmap/munmap/mremap and libc's allocating wrappers), calls the
 * next definition (libc's, or a preloaded allocator's), and writes each
 * outermost call as the probe would: the same `struct memleak_event`, with
 * the same frames, walked with the same unwind rows by a port of the
 * probe's walker, into a ring of slots in memory shared with the recorder
 * (agent.h). The recorder drains that ring exactly as it drains the BPF
 * ring.
 *
 * Why C and not Rust (docs/design.md): the agent runs inside malloc, in
 * any program, before and after its runtime exists. It must not allocate,
 * lock, unwind a panic, or register thread destructors; it shares
 * bpf/memleak.h with the probe, so the layout and the walk are one
 * definition; and it is built by the clang that already builds the probe,
 * into a 30 KB object the memleak binary carries.
 *
 * Rules of the fast path: no allocation, no lock, no system call (the
 * clock is read through the vDSO). State is per thread, in initial-exec
 * TLS (no __tls_get_addr, which may allocate). A call made while another
 * of the agent's calls is in progress on the thread (malloc inside
 * calloc, inside operator new, inside strdup) is nested: passed through,
 * not recorded, as the probe's outermost-call rule says. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <alloca.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <linux/futex.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "sys.h"

/* The unwinder's entry points our cleanups need (-fexceptions: an
 * exception from operator new passes through the agent's frames), bound
 * weakly: the agent needs no libgcc_s of its own, which a container or a
 * musl system may not have. A process that can throw has an unwinder
 * loaded that defines them; in one that has none, no exception ever
 * reaches our frames. */
__asm__(".weak __gcc_personality_v0\n.weak _Unwind_Resume");

#define EXPORT __attribute__((visibility("default"), noinline))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)

typedef __u64 u64;
typedef __u32 u32;
typedef __u8 u8;

#define T (*self)

/* ---- the next definitions ---- */

static struct {
	void *(*malloc)(size_t);
	void *(*calloc)(size_t, size_t);
	void *(*realloc)(void *, size_t);
	void *(*reallocarray)(void *, size_t, size_t);
	void (*free)(void *);
	int (*posix_memalign)(void **, size_t, size_t);
	void *(*memalign)(size_t, size_t);
	void *(*aligned_alloc)(size_t, size_t);
	void *(*valloc)(size_t);
	void *(*pvalloc)(size_t);
	void *(*mmap)(void *, size_t, int, int, int, off_t);
	int (*munmap)(void *, size_t);
	void *(*mremap)(void *, size_t, size_t, int, ...);
	char *(*strdup)(const char *);
	char *(*strndup)(const char *, size_t);
	int (*vasprintf)(char **, const char *, va_list);
	ssize_t (*getdelim)(char **, size_t *, int, FILE *);
} real;

/* ---- process state ---- */

enum { ST_NONE, ST_INITING, ST_READY };
static int state = ST_NONE;
static struct mla_header *H;     /* the shared memory, or 0: record nothing */
static int on;                   /* this process is traced */
static u32 my_pid;
static u32 slot_mask;
static char *slots;
static struct mla_table *tables;
static struct unwind_row *rows;
static u32 table_idx = ~0u;      /* this process's table, once found */
/* Loaded into a running process by `record -p --capture inject`
 * (inject section, at the end): the agent is reached through the
 * call sites it patched, not by symbol lookup, and the next definitions
 * are the process's own (RTLD_DEFAULT: the agent is not in its global
 * scope). */
static int injected;
static void *next_handle = RTLD_NEXT;
/* A seccomp filter is in force, or about to be (seccomp section): the
 * agent makes no system call the program did not make. */
static int sandboxed;
static u64 table_gen_seen = ~0ull;

/* ---- thread state ---- */

struct thread {
	u32 tid;
	u32 depth;     /* 1 inside an outermost call, 2 inside a wrapper's
			* nested allocation */
	u32 wrapper;   /* the outermost call is a libc wrapper */
	u64 outer_frame; /* the outermost call's frame, and the return */
	u64 outer_ret;   /* address it saved there */
	u32 n_inner;
	u64 inner_addr[4];
	u64 inner_size[4];
	u64 stack_lo, stack_hi; /* the thread's stack, once known */
	u64 clock_ns, clock_coarse;
	u32 clock_uses;
	u32 stack_known;
	u32 off; /* not traced */
	int64_t sample_left; /* --sample: bytes to the next sample point */
	u64 rng;             /* --sample: xorshift64* state; 0 until seeded */
};

/* The caller's registers at our return, as the probe sees them at the
 * allocator's: pc is the return address, sp where it returns to, rbp the
 * caller's (our prologue saved it). Every entry point has a frame
 * (-fno-omit-frame-pointer). */
struct regs {
	u64 pc, sp, bp;
};

/* ---- bootstrap allocator: dlsym() allocates before `real` is known ---- */

static char boot[64 << 10] __attribute__((aligned(16)));
static size_t boot_used;

static int is_boot(const void *p)
{
	return (const char *)p >= boot && (const char *)p < boot + sizeof(boot);
}

static void *boot_alloc(size_t n)
{
	size_t at = (boot_used + 15) & ~(size_t)15;

	if (n > sizeof(boot) - 16 || at + 16 + n > sizeof(boot))
		return NULL;
	*(size_t *)(boot + at) = n;
	boot_used = at + 16 + n;
	return boot + at + 16;
}

static size_t boot_size(const void *p)
{
	return *(const size_t *)((const char *)p - 16);
}


static u64 ts_of_raw(const struct timespec *t)
{
	return (u64)t->tv_sec * 1000000000ull + (u64)t->tv_nsec;
}

/* ---- the environment: the program sees the one it was given ----
 *
 * The recorder names the agent in LD_PRELOAD (as /proc/RECORDER/fd/N, a
 * memfd whose name carries the shared memory's descriptor number). At
 * start the agent takes itself out of the program's environment, so that
 * a program that reads or copies it (perl's %ENV) allocates what it would
 * untraced, and puts itself back into the environment of a program the
 * process executes. An exec the agent does not see (libc's internal ones,
 * from system() for example, are covered; a raw execve system call is
 * not) runs the new program without it: the recorder then records that
 * process with the probes. */

extern char **environ;
static char agent_entry[128]; /* our LD_PRELOAD entry */

/* The path ld.so loaded us by, or NULL; `link` gets what it links to
 * (the name of the memfd behind it), or "". */
static const char *self_link(char *link, size_t len)
{
	Dl_info info;
	ssize_t n;

	link[0] = 0;
	if (!dladdr((void *)self_link, &info) || !info.dli_fname)
		return NULL;
	n = readlink(info.dli_fname, link, len - 1);
	link[n > 0 ? n : 0] = 0;
	return info.dli_fname;
}

/* Finds the path ld.so loaded us by, and the shared memory's spec
 * ("FD:PATH") from the name of the memfd behind it. */
static int find_self(char *spec, size_t len)
{
	char link[256];
	const char *path = self_link(link, sizeof(link));
	const char *at, *slash;
	long fd;

	if (!path || strlen(path) >= sizeof(agent_entry))
		return 0;
	strcpy(agent_entry, path);
	if (!link[0])
		return 0;
	at = strstr(link, MLA_NAME);
	slash = strrchr(agent_entry, '/');
	if (!at || !slash)
		return 0;
	fd = strtol(at + strlen(MLA_NAME), NULL, 10);
	snprintf(spec, len, "%ld:%.*s/%ld", fd, (int)(slash - agent_entry), agent_entry, fd);
	return 1;
}

static int is_sep(char c)
{
	return c == ':' || c == ' ';
}

/* Takes our entry out of LD_PRELOAD, in place; drops the variable if
 * nothing else was in it. */
static void strip_env(void)
{
	size_t alen = strlen(agent_entry);

	if (!alen || !environ)
		return;
	for (char **e = environ; *e; e++) {
		char *v, *w, *r;

		if (strncmp(*e, "LD_PRELOAD=", 11))
			continue;
		v = *e + 11;
		w = v;
		r = v;
		while (*r) {
			char *start;
			size_t len;

			while (is_sep(*r))
				r++;
			start = r;
			while (*r && !is_sep(*r))
				r++;
			len = (size_t)(r - start);
			if (!len || (len == alen && !memcmp(start, agent_entry, len)))
				continue;
			if (w != v)
				*w++ = ':';
			memmove(w, start, len);
			w += len;
		}
		*w = 0;
		if (!*v) {
			char **d = e;

			do
				d[0] = d[1];
			while (*d++);
		}
		return;
	}
}

static size_t env_count(char *const *envp)
{
	size_t n = 0;

	while (envp && envp[n])
		n++;
	return n;
}

static const char *env_preload(char *const *envp)
{
	for (size_t i = 0; envp && envp[i]; i++)
		if (!strncmp(envp[i], "LD_PRELOAD=", 11))
			return envp[i] + 11;
	return NULL;
}

/* `envp` with our entry first in LD_PRELOAD, into `out` (n + 2 slots) and
 * `ld` (room for the new variable). */
static char **augment(char *const *envp, char **out, char *ld)
{
	const char *old = env_preload(envp);
	size_t i = 0, j = 0;

	strcpy(ld, "LD_PRELOAD=");
	strcat(ld, agent_entry);
	if (old && *old) {
		strcat(ld, ":");
		strcat(ld, old);
	}
	for (; envp && envp[i]; i++)
		out[j++] = strncmp(envp[i], "LD_PRELOAD=", 11) ? envp[i] : ld;
	if (!old)
		out[j++] = ld;
	out[j] = NULL;
	return out;
}

/* Declares `name`: `envp` with the agent in it, on this frame's stack,
 * when the process is traced. */
#define AGENT_ENV(name, envp)                                                     \
	char *const *name = (envp);                                               \
	if (on && agent_entry[0] && !H->stop) {                                   \
		const char *old__ = env_preload(envp);                            \
		char **out__ = alloca((env_count(envp) + 2) * sizeof(char *));    \
		char *ld__ = alloca(strlen(agent_entry) + (old__ ? strlen(old__) : 0) + 16); \
		name = augment((envp), out__, ld__);                              \
	}

/* Runs `call` with environ holding the agent (for the calls that read
 * environ themselves). */
#define WITH_AGENT_ENVIRON(type, call)                                  \
	({                                                              \
		char **saved__ = environ;                               \
		AGENT_ENV(e__, saved__);                                \
		environ = (char **)e__;                                 \
		type r__ = call;                                        \
		int errno__ = errno;                                    \
		environ = saved__;                                      \
		errno = errno__;                                        \
		r__;                                                    \
	})

typedef int (*execve_t)(const char *, char *const[], char *const[]);
typedef int (*execvp_t)(const char *, char *const[]);
typedef int (*execvpe_t)(const char *, char *const[], char *const[]);
typedef int (*spawn_t)(pid_t *, const char *, const void *, const void *, char *const[],
		       char *const[]);
typedef int (*system_t)(const char *);
typedef FILE *(*popen_t)(const char *, const char *);

#define NEXT(type, name) ((type)dlsym(RTLD_NEXT, name))

EXPORT int execve(const char *path, char *const argv[], char *const envp[])
{
	AGENT_ENV(e, envp);
	return NEXT(execve_t, "execve")(path, argv, e);
}

EXPORT int execvpe(const char *file, char *const argv[], char *const envp[])
{
	AGENT_ENV(e, envp);
	return NEXT(execvpe_t, "execvpe")(file, argv, e);
}

EXPORT int execv(const char *path, char *const argv[])
{
	return execve(path, argv, environ);
}

EXPORT int execvp(const char *file, char *const argv[])
{
	return execvpe(file, argv, environ);
}

/* The execl family: the arguments into an array on the stack. */
#define VARARGS(argv, arg0, last)                                      \
	size_t n__ = 1;                                                \
	va_list ap__;                                                  \
	va_start(ap__, arg0);                                          \
	while (va_arg(ap__, char *))                                   \
		n__++;                                                 \
	va_end(ap__);                                                  \
	char **argv = alloca((n__ + 1) * sizeof(char *));              \
	argv[0] = (char *)arg0;                                        \
	va_start(ap__, arg0);                                          \
	for (size_t i__ = 1; i__ <= n__; i__++)                        \
		argv[i__] = va_arg(ap__, char *);                      \
	last;                                                          \
	va_end(ap__)

EXPORT int execl(const char *path, const char *arg0, ...)
{
	VARARGS(argv, arg0, (void)0);
	return execve(path, argv, environ);
}

EXPORT int execlp(const char *file, const char *arg0, ...)
{
	VARARGS(argv, arg0, (void)0);
	return execvpe(file, argv, environ);
}

EXPORT int execle(const char *path, const char *arg0, ...)
{
	char *const *envp;

	VARARGS(argv, arg0, envp = va_arg(ap__, char *const *));
	return execve(path, argv, envp);
}

EXPORT int posix_spawn(pid_t *pid, const char *path, const void *fa, const void *attr,
		       char *const argv[], char *const envp[])
{
	AGENT_ENV(e, envp);
	return NEXT(spawn_t, "posix_spawn")(pid, path, fa, attr, argv, e);
}

EXPORT int posix_spawnp(pid_t *pid, const char *file, const void *fa, const void *attr,
			char *const argv[], char *const envp[])
{
	AGENT_ENV(e, envp);
	return NEXT(spawn_t, "posix_spawnp")(pid, file, fa, attr, argv, e);
}

EXPORT int system(const char *cmd)
{
	return WITH_AGENT_ENVIRON(int, NEXT(system_t, "system")(cmd));
}

EXPORT FILE *popen(const char *cmd, const char *mode)
{
	return WITH_AGENT_ENVIRON(FILE *, NEXT(popen_t, "popen")(cmd, mode));
}

/* ---- stops for the recorder ----
 *
 * The recorder keeps the unwind tables and the maps in step with the
 * process at its ptrace stops. The agent asks for one where they change:
 * at its start (every initial object is mapped by then) and around dlopen
 * and dlclose (after the one, before the other unmaps). It is a SIGSTOP to
 * itself with the agent's value, which the tracing recorder takes and
 * suppresses; never sent once the recording is over. */
static void stop_for_recorder(void)
{
	siginfo_t si;

	if (!on || !H || injected || __atomic_load_n(&sandboxed, __ATOMIC_RELAXED) ||
	    __atomic_load_n(&H->stop, __ATOMIC_RELAXED))
		return;
	memset(&si, 0, sizeof(si));
	si.si_signo = SIGSTOP;
	si.si_code = SI_QUEUE;
	si.si_pid = (pid_t)my_pid;
	si.si_uid = (uid_t)sys_getuid();
	si.si_value.sival_int = MLA_STOP_VALUE;
	sys_rt_tgsigqueueinfo((pid_t)my_pid, (pid_t)sys_gettid(), SIGSTOP, &si);
}

typedef void *(*dlopen_t)(const char *, int);
typedef int (*dlclose_t)(void *);

static void patch_new_objects(void);

static u32 count_objects(void);
static void patch_deepbound(u32 skip);

EXPORT void *dlopen(const char *file, int flags)
{
	dlopen_t next = (dlopen_t)dlsym(next_handle, "dlopen");
	u32 before = 0;
	void *h;

	/* RTLD_DEEPBIND: the library binds malloc and free to libc's, ahead
	 * of the agent in the global scope. Its call sites are patched as
	 * inject patches a process's, or a block it frees that the program
	 * allocated would be reported lost, and what it allocates missed. */
	if (!injected && (flags & RTLD_DEEPBIND) && on && !__atomic_load_n(&sandboxed, __ATOMIC_RELAXED))
		before = count_objects();
	h = next(file, flags);
	if (h && before)
		patch_deepbound(before);
	if (h && injected)
		patch_new_objects();
	else if (h)
		stop_for_recorder();
	return h;
}

EXPORT int dlclose(void *h)
{
	stop_for_recorder();
	return ((dlclose_t)dlsym(next_handle, "dlclose"))(h);
}

/* ---- seccomp ----
 *
 * A program may forbid system calls with a seccomp filter, and be killed
 * (SIGSYS) for making one: the futex the agent wakes the recorder with, or
 * waits for room on, was enough. So the agent watches for a filter (one
 * in force at its start, in /proc/self/status; one the program installs,
 * through prctl() or syscall(), both taken here) and from then on makes
 * no system call of its own: the recorder is not woken (it drains every
 * millisecond instead), a writer that finds the ring full spins without
 * sleeping, for 1 s at most, and then drops its event (counted), a thread whose
 * stack is not known yet is recorded with its first frame only, a thread
 * first seen then is named by its process, no stop is asked for at
 * dlopen. A filter installed by a raw system call (inline assembly) is
 * not seen. */

static inline void cpu_relax(void)
{
#if defined(__x86_64__)
	__builtin_ia32_pause();
#endif
}

static void enter_sandbox(void)
{
	if (!__atomic_exchange_n(&sandboxed, 1, __ATOMIC_ACQ_REL) && H && on)
		__atomic_fetch_add(&H->sandboxed, 1, __ATOMIC_RELAXED);
}

/* The number after `key` in `buf`, or 0. */
static u64 status_number(const char *buf, const char *key)
{
	const char *at = strstr(buf, key);
	u64 v = 0;

	if (!at)
		return 0;
	at += strlen(key);
	while (*at == ' ' || *at == '\t')
		at++;
	for (; *at >= '0' && *at <= '9'; at++)
		v = v * 10 + (u64)(*at - '0');
	return v;
}

/* Whether a seccomp filter (or strict mode) is in force, and the pid, from
 * /proc/self/status: read at start, when the loader has just opened and
 * read files itself. */
static int seccomp_in_force(u32 *pid)
{
	char buf[4096];
	long n, fd = sys_openat(AT_FDCWD, "/proc/self/status", O_RDONLY | O_CLOEXEC);

	if (fd < 0)
		return 0;
	n = sys_read((int)fd, buf, sizeof(buf) - 1);
	sys_close((int)fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	*pid = (u32)status_number(buf, "\nPid:");
	return *pid && status_number(buf, "\nSeccomp:") != 0;
}

typedef int (*prctl_t)(int, unsigned long, unsigned long, unsigned long, unsigned long);
typedef long (*syscall_t)(long, long, long, long, long, long, long);

/* PR_SET_SECCOMP and SECCOMP_SET_MODE_*, without linux/seccomp.h. */
#define ML_PR_SET_SECCOMP 22
#define ML_SECCOMP_SET_MODE_STRICT 0
#define ML_SECCOMP_SET_MODE_FILTER 1

EXPORT int prctl(int option, ...)
{
	static prctl_t next;
	unsigned long a[4];
	va_list ap;

	va_start(ap, option);
	for (int i = 0; i < 4; i++)
		a[i] = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == ML_PR_SET_SECCOMP)
		enter_sandbox();
	if (!next)
		next = (prctl_t)dlsym(next_handle, "prctl");
	return next(option, a[0], a[1], a[2], a[3]);
}

/* glibc's syscall(), which libseccomp calls seccomp(2) through. */
EXPORT long syscall(long nr, ...)
{
	static syscall_t next;
	long a[6];
	va_list ap;

	va_start(ap, nr);
	for (int i = 0; i < 6; i++)
		a[i] = va_arg(ap, long);
	va_end(ap);
	if ((nr == SYS_seccomp &&
	     (a[0] == ML_SECCOMP_SET_MODE_FILTER || a[0] == ML_SECCOMP_SET_MODE_STRICT)) ||
	    (nr == SYS_prctl && a[0] == ML_PR_SET_SECCOMP))
		enter_sandbox();
	if (!next)
		next = (syscall_t)dlsym(next_handle, "syscall");
	return next(nr, a[0], a[1], a[2], a[3], a[4], a[5]);
}

/* ---- init ---- */

static void count_lost(u32 reason)
{
	if (H && reason < 8)
		__atomic_fetch_add(&H->lost[reason], 1, __ATOMIC_RELAXED);
}

/* ---- sampling (record --sample, docs/design.md) ----
 *
 * Byte-weighted Poisson sampling, as tcmalloc and jemalloc do it: sample
 * points fall on the bytes a thread allocates at exponentially
 * distributed distances of mean `sample_mean`, and an allocation is
 * recorded when one falls in it: with probability 1 - exp(-size/mean),
 * which the analyzer undoes. Each thread counts down the bytes to its
 * next point; an allocation that does not reach it costs a subtraction
 * and a branch.
 *
 * The addresses of the recorded blocks are kept in a set, so that their
 * release is recorded and no other: open addressing in buckets of 8
 * addresses (a cache line), found by a hash of the address, claimed by a
 * compare-and-swap of an empty (0) entry, emptied again at the release.
 * Every lookup reads one bucket whole, so an emptied entry needs no
 * tombstone. A sampled allocation whose bucket is full is not recorded
 * and is counted (MLA_LOST_SAMPLE_SET): recorded untracked, its release
 * would go unseen and it would be reported as a leak. SET_SLOTS
 * addresses take 8 MiB of address space, touched a page at a time. */

#define SET_BUCKET_BITS 17
#define SET_WAYS 8
static u64 sample_mean;          /* 0: every call is recorded */
static double sample_mean_f;
static u64 *sampled_set;         /* (1 << SET_BUCKET_BITS) buckets of SET_WAYS */

static void sampling_start(u64 mean)
{
	void *p;

	if (!mean)
		return;
	p = sys_mmap(NULL, (size_t)(SET_WAYS * 8) << SET_BUCKET_BITS, PROT_READ | PROT_WRITE,
		     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (sys_failed((long)p)) {
		/* No set: nothing can be sampled safely; record nothing. */
		H = NULL;
		return;
	}
	sampled_set = p;
	sample_mean_f = (double)mean;
	sample_mean = mean;
}

static inline u64 *bucket_of(u64 addr)
{
	u64 h = (addr >> 4) * 0x9E3779B97F4A7C15ULL;

	return sampled_set + (h >> (64 - SET_BUCKET_BITS)) * SET_WAYS;
}

/* The set's entry holding `addr`, or NULL: one bucket read. */
static inline u64 *set_find(u64 addr)
{
	u64 *b = bucket_of(addr);

	for (int i = 0; i < SET_WAYS; i++)
		if (__atomic_load_n(&b[i], __ATOMIC_ACQUIRE) == addr)
			return &b[i];
	return NULL;
}

static int set_insert(u64 addr)
{
	u64 *b = bucket_of(addr);

	for (int i = 0; i < SET_WAYS; i++) {
		u64 empty = 0;

		if (__atomic_load_n(&b[i], __ATOMIC_RELAXED) == 0 &&
		    __atomic_compare_exchange_n(&b[i], &empty, addr, 0, __ATOMIC_RELEASE,
						__ATOMIC_RELAXED))
			return 1;
	}
	count_lost(MLA_LOST_SAMPLE_SET);
	return 0;
}

static inline void set_drop(u64 *entry)
{
	__atomic_store_n(entry, 0, __ATOMIC_RELEASE);
}

static void set_remove(u64 addr)
{
	u64 *e = set_find(addr);

	if (e)
		set_drop(e);
}

/* ln(x) for x in (0, 1], without libm: x = m * 2^e with m in [0.71,
 * 1.42), ln(m) = 2 atanh((m-1)/(m+1)) by its series (error < 1e-9). */
static double ln01(double x)
{
	union {
		double d;
		u64 u;
	} v = { x };
	int e = (int)((v.u >> 52) & 0x7ff) - 1023;
	double m, t, t2;

	v.u = (v.u & ((1ULL << 52) - 1)) | (1023ULL << 52);
	m = v.d;
	if (m > 1.4142135623730951) {
		m *= 0.5;
		e++;
	}
	t = (m - 1) / (m + 1);
	t2 = t * t;
	return t * (2 + t2 * (2.0 / 3 + t2 * (2.0 / 5 + t2 * (2.0 / 7 + t2 * (2.0 / 9))))) +
	       e * 0.6931471805599453;
}

/* The distance to the next sample point: exponential, of mean
 * sample_mean (xorshift64*, then -mean ln U with U in (0, 1]). */
static int64_t sample_gap(struct thread *self)
{
	u64 x = T.rng;
	double u;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	T.rng = x;
	u = (double)(((x * 0x2545F4914F6CDD1DULL) >> 11) + 1) * (1.0 / 9007199254740992.0);
	return (int64_t)(-sample_mean_f * ln01(u)) + 1;
}

/* A thread's first look (or its first after a fork): the generator
 * seeded from getrandom, else the clock and the thread, and a first
 * sample point. Once per thread: the system call is off the fast path. */
static u32 thread_id(void);

static void sample_seed(struct thread *self)
{
	u64 seed = 0;
	struct timespec ts;

	if (__atomic_load_n(&sandboxed, __ATOMIC_RELAXED) ||
	    sys_getrandom(&seed, sizeof(seed), 1 /* GRND_NONBLOCK */) != sizeof(seed) || !seed) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		seed = ts_of_raw(&ts) ^ ((u64)thread_id() << 32) ^ (u64)self;
	}
	T.rng = seed | 1;
	T.sample_left = sample_gap(self);
}

static __attribute__((noinline)) int sample_crossed(struct thread *self, u64 size)
{
	int64_t left;

	if (!T.rng)
		sample_seed(self);
	left = T.sample_left - (int64_t)size;
	if (left > 0) {
		T.sample_left = left;
		return 0;
	}
	while (left <= 0)
		left += sample_gap(self);
	T.sample_left = left;
	return 1;
}

/* Whether an outermost allocation of `size` bytes is left unrecorded:
 * no sample point falls in it. */
static inline int unsampled(struct thread *self, u64 size)
{
	int64_t left = T.sample_left - (int64_t)size;

	if (likely(left > 0)) {
		T.sample_left = left;
		return 1;
	}
	return !sample_crossed(self, size);
}

/* Per-thread state, reached through a pthread key, not a __thread
 * variable: a module with TLS makes ld.so give every thread's DTV one more
 * entry, and the program's own runtime allocations would no longer be
 * those the probes (and valgrind) see. The first 32 keys need no
 * allocation, and pthread_getspecific() is a few loads. */
static pthread_key_t key;
#define POOL 256
static struct thread pool[POOL];
static u64 pool_used[POOL / 64];
/* A thread that got no state is not traced (counted). */
static struct thread untraced;

static void thread_gone(void *p)
{
	struct thread *t = p;

	if (t >= pool && t < pool + POOL) {
		u64 i = (u64)(t - pool);
		__atomic_fetch_and(&pool_used[i / 64], ~(1ull << (i % 64)), __ATOMIC_RELEASE);
	} else if (t != &untraced) {
		sys_munmap(t, sizeof(*t));
	}
}

static struct thread *new_thread(void)
{
	struct thread *t = NULL;

	for (u32 w = 0; w < POOL / 64 && !t; w++) {
		u64 used = __atomic_load_n(&pool_used[w], __ATOMIC_RELAXED);

		while (~used) {
			u32 b = (u32)__builtin_ctzll(~used);

			if (__atomic_compare_exchange_n(&pool_used[w], &used, used | (1ull << b), 0,
							__ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
				t = &pool[w * 64 + b];
				break;
			}
		}
	}
	if (!t && !__atomic_load_n(&sandboxed, __ATOMIC_RELAXED)) {
		t = sys_mmap(NULL, sizeof(*t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
			     0);
		if (sys_failed((long)t))
			t = NULL;
	}
	if (t) {
		memset(t, 0, sizeof(*t));
		if (pthread_setspecific(key, t) == 0)
			return t;
		thread_gone(t);
	}
	count_lost(ML_INFLIGHT_FULL);
	untraced.off = 1;
	return &untraced;
}

static inline struct thread *me(void)
{
	struct thread *t = pthread_getspecific(key);

	return likely(t != NULL) ? t : new_thread();
}

/* The thread's id; its process's under a seccomp filter. */
static u32 thread_id(void)
{
	if (__atomic_load_n(&sandboxed, __ATOMIC_RELAXED))
		return my_pid;
	return (u32)sys_gettid();
}

static int pid_traced(u32 pid)
{
	u32 n = __atomic_load_n(&H->npids, __ATOMIC_ACQUIRE);

	for (u32 i = 0; i < n && i < MLA_MAX_PIDS; i++)
		if (__atomic_load_n(&H->pids[i], __ATOMIC_RELAXED) == pid)
			return 1;
	return 0;
}

static struct mla_header *map_shared(const char *spec)
{
	char *end;
	long fd = strtol(spec, &end, 10);
	struct mla_header hdr;
	int opened = 0;
	void *p;

	if (*end != ':')
		return NULL;
	/* The inherited descriptor, if the program kept it and it is ours;
	 * else the recorder's, by path. */
	if (sys_pread((int)fd, &hdr, sizeof(hdr.magic), 0) != sizeof(hdr.magic) ||
	    hdr.magic != MLA_MAGIC) {
		fd = sys_openat(AT_FDCWD, end + 1, O_RDWR | O_CLOEXEC);
		if (fd < 0)
			return NULL;
		opened = 1;
	}
	if (sys_pread((int)fd, &hdr, 32, 0) != 32 || hdr.magic != MLA_MAGIC ||
	    hdr.version != MLA_VERSION)
		p = NULL;
	else
		p = sys_mmap(NULL, hdr.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, (int)fd, 0);
	/* A descriptor opened here is not the program's to keep: the mapping
	 * holds the memory. */
	if (opened)
		sys_close((int)fd);
	return sys_failed((long)p) ? NULL : p;
}

/* This process is `pid` from now on: at its start, and in a forked
 * child. */
static void become(u32 pid)
{
	struct thread *t = pthread_getspecific(key);

	my_pid = pid;
	if (t) {
		t->tid = 0;
		t->rng = 0; /* the child draws its own sample points */
	}
	table_idx = ~0u;
	table_gen_seen = ~0ull;
	on = H && pid_traced(my_pid);
	if (on)
		__atomic_fetch_add(&H->agents, 1, __ATOMIC_RELAXED);
}

static void after_fork(void)
{
	if (__atomic_load_n(&sandboxed, __ATOMIC_RELAXED)) {
		/* Its pid would take a system call: the child is not
		 * recorded. */
		on = 0;
		return;
	}
	become((u32)sys_getpid());
}

/* pthread_atfork(NULL, NULL, child), looked up: glibc's headers make it a
 * call of __register_atfork, which musl does not have (the agent failed
 * to load there), and musl's pthread_atfork is glibc's compat symbol. */
extern void *__dso_handle __attribute__((weak, visibility("hidden")));
typedef int (*register_atfork_t)(void (*)(void), void (*)(void), void (*)(void), void *);
typedef int (*pthread_atfork_t)(void (*)(void), void (*)(void), void (*)(void));

static void on_fork_child(void (*child)(void))
{
	register_atfork_t reg = (register_atfork_t)dlsym(RTLD_DEFAULT, "__register_atfork");
	pthread_atfork_t plain;

	if (reg) {
		reg(NULL, NULL, child, &__dso_handle ? __dso_handle : NULL);
		return;
	}
	plain = (pthread_atfork_t)dlsym(RTLD_DEFAULT, "pthread_atfork");
	if (plain)
		plain(NULL, NULL, child);
}

#define RESOLVE(name) real.name = dlsym(next_handle, #name)

static int loaded_for_inject(void);
static void find_own_text(void);

static void init(void)
{
	char spec_buf[300];
	u32 filtered_pid = 0;

	state = ST_INITING;
	find_own_text();
	if (loaded_for_inject()) {
		injected = 1;
		next_handle = RTLD_DEFAULT;
	}
	RESOLVE(malloc);
	RESOLVE(calloc);
	RESOLVE(realloc);
	RESOLVE(reallocarray);
	RESOLVE(free);
	RESOLVE(posix_memalign);
	RESOLVE(memalign);
	RESOLVE(aligned_alloc);
	RESOLVE(valloc);
	RESOLVE(pvalloc);
	RESOLVE(mmap);
	RESOLVE(munmap);
	RESOLVE(mremap);
	RESOLVE(strdup);
	RESOLVE(strndup);
	RESOLVE(vasprintf);
	RESOLVE(getdelim);
	if (pthread_key_create(&key, thread_gone) != 0)
		return; /* never ready: everything passes through the boot path */
	if (injected) {
		/* Idle until memleak_attach(). */
		on_fork_child(after_fork);
		state = ST_READY;
		return;
	}
	H = find_self(spec_buf, sizeof(spec_buf)) ? map_shared(spec_buf) : NULL;
	if (H) {
		slots = (char *)H + H->ring_off;
		slot_mask = H->nslots - 1;
		tables = (struct mla_table *)((char *)H + H->tables_off);
		rows = (struct unwind_row *)((char *)H + H->rows_off);
		sampling_start(H->sample_mean);
		on_fork_child(after_fork);
	}
	state = ST_READY;
	if (H && seccomp_in_force(&filtered_pid)) {
		/* Under a filter from the start: the pid /proc gave (getpid
		 * could be forbidden). */
		become(filtered_pid);
		enter_sandbox();
	} else {
		after_fork();
	}
	strip_env();
	stop_for_recorder();
}

__attribute__((constructor)) static void agent_start(void)
{
	if (state == ST_NONE)
		init();
}

/* Makes `real` usable; 0 while init is running (dlsym's own calls). */
static inline int ready(void)
{
	if (likely(state == ST_READY))
		return 1;
	if (state == ST_NONE)
		init();
	return state == ST_READY;
}

/* ---- time: a CLOCK_MONOTONIC reading reused, like the probe's, for at
 * most 16 events of one tick (a reading costs 40 ns here, the coarse
 * clock 6) ---- */

static u64 ts_of(const struct timespec *t)
{
	return (u64)t->tv_sec * 1000000000ull + (u64)t->tv_nsec;
}

static u64 event_time(struct thread *self)
{
	struct timespec t;
	u64 coarse;

	clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
	coarse = ts_of(&t);
	if (coarse == T.clock_coarse && T.clock_uses < 15) {
		T.clock_uses++;
		return T.clock_ns;
	}
	clock_gettime(CLOCK_MONOTONIC, &t);
	T.clock_coarse = coarse;
	T.clock_uses = 0;
	T.clock_ns = ts_of(&t);
	return T.clock_ns;
}

/* ---- the ring ---- */

static inline struct mla_slot *slot_at(u64 pos)
{
	return (struct mla_slot *)(slots + (pos & slot_mask) * (u64)MLA_SLOT_BYTES);
}

/* Wakes the recorder if it sleeps between drains. The first writer to
 * see it asleep takes the flag, so one system call wakes it: every writer
 * that found the ring full (and every 256th claim past half full) used to
 * make one until the recorder ran again, thousands a second. */
static void wake_recorder(void)
{
	if (__atomic_load_n(&sandboxed, __ATOMIC_RELAXED))
		return;
	if (__atomic_load_n(&H->sleeping, __ATOMIC_RELAXED) &&
	    __atomic_exchange_n(&H->sleeping, 0, __ATOMIC_ACQ_REL)) {
		__atomic_fetch_add(&H->wake_seq, 1, __ATOMIC_RELEASE);
		sys_futex(&H->wake_seq, FUTEX_WAKE, 1, NULL);
	}
}

/* The ring is full at `pos`: wait for the recorder to make room, as a
 * writer to a full pipe waits (heaptrack's way), rather than lose the
 * event. The writer sleeps on room_seq until the recorder has freed a
 * quarter of the ring (or caught up), so it runs again as soon as there is
 * room, for a while, instead of napping blind: a nap of 50 µs took 250 µs
 * under load, and both sides slept at once. Gives up, and stops recording,
 * if the recording ended or the recorder is gone (checked every 16 waits
 * of at most 10 ms). */
static int wait_for_room(u64 pos, u32 waits, u64 *since)
{
	static const struct timespec most = { 0, 10000000 };
	u32 seq;

	if (__atomic_load_n(&sandboxed, __ATOMIC_RELAXED)) {
		/* No futex, and no kill() to see whether the recorder lives:
		 * spin for its next drain (it drains every millisecond while
		 * an agent is sandboxed), up to 1 s of the clock (the vDSO's),
		 * then give this event up. */
		struct timespec t;
		u64 now;

		if (__atomic_load_n(&H->stop, __ATOMIC_RELAXED))
			return 0;
		clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
		now = ts_of_raw(&t);
		if (!*since)
			*since = now;
		if (now - *since > 1000000000ull)
			return 0;
		for (int i = 0; i < 4096; i++) {
			if ((int64_t)(__atomic_load_n(&slot_at(pos)->seq, __ATOMIC_ACQUIRE) - pos) >= 0)
				return 1;
			cpu_relax();
		}
		return 1;
	}
	if (__atomic_load_n(&H->stop, __ATOMIC_RELAXED) ||
	    (waits % 16 == 15 && sys_kill((pid_t)H->recorder_pid, 0) == -ESRCH)) {
		on = 0;
		return 0;
	}
	seq = __atomic_load_n(&H->room_seq, __ATOMIC_ACQUIRE);
	__atomic_store_n(&H->room_waiting, 1, __ATOMIC_RELAXED);
	/* Against the recorder's free-then-look: one of the two sees the
	 * other (the recorder fences between freeing slots and reading
	 * room_waiting). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
	if ((int64_t)(__atomic_load_n(&slot_at(pos)->seq, __ATOMIC_ACQUIRE) - pos) >= 0)
		return 1;
	wake_recorder();
	sys_futex(&H->room_seq, FUTEX_WAIT, seq, &most);
	return 1;
}

/* Claims the next slot; NULL when recording stopped with the ring full
 * (counted). */
static struct mla_slot *claim(u64 *at)
{
	u64 pos = __atomic_load_n(&H->head, __ATOMIC_RELAXED);
	u32 waits = 0, behind = 0;
	u64 since = 0;

	for (;;) {
		struct mla_slot *s = slot_at(pos);
		u64 seq = __atomic_load_n(&s->seq, __ATOMIC_ACQUIRE);
		int64_t d = (int64_t)(seq - pos);

		if (d == 0) {
			if (__atomic_compare_exchange_n(&H->head, &pos, pos + 1, 1, __ATOMIC_RELAXED,
							__ATOMIC_RELAXED)) {
				__atomic_store_n(&s->pid, my_pid, __ATOMIC_RELAXED);
				*at = pos;
				/* Half full: the recorder, asleep until its next
				 * poll, is woken (checked every 256 claims). */
				if (!(pos & 255) &&
				    pos - __atomic_load_n(&H->tail, __ATOMIC_RELAXED) > slot_mask / 2)
					wake_recorder();
				return s;
			}
		} else if (d < 0) {
			/* Full. */
			if (!wait_for_room(pos, waits++, &since)) {
				count_lost(ML_RING_FULL);
				return NULL;
			}
			pos = __atomic_load_n(&H->head, __ATOMIC_RELAXED);
		} else if (++behind > (1u << 20)) {
			/* Another writer took the slot first, a million times in
			 * a row: no writer is that far ahead, so `head` or the
			 * slots were written by something else. Give up. */
			count_lost(ML_RING_FULL);
			return NULL;
		} else {
			pos = __atomic_load_n(&H->head, __ATOMIC_RELAXED);
		}
	}
}

/* Publishes a slot. A plain store: the recorder only ever skips a slot
 * whose writer's process is dead, and a dead writer publishes nothing. */
static inline void publish(struct mla_slot *s, u64 pos)
{
	__atomic_store_n(&s->seq, pos + 1, __ATOMIC_RELEASE);
}

static inline void header(struct thread *self, struct mla_slot *s, u8 kind, u64 addr, u64 size, u64 old,
			  u64 old_size, u64 ts)
{
	struct memleak_event *e = &s->ev;

	if (unlikely(!T.tid))
		T.tid = thread_id();
	e->ts_ns = ts;
	e->addr = addr;
	e->size = size;
	e->old_addr = old;
	e->old_size = old_size;
	e->pid = my_pid;
	e->tid = T.tid;
	e->kind = kind;
	e->flags = 0;
	e->nframes = 0;
	e->stack_err = 0;
	s->len = MEMLEAK_HDR_SIZE;
}

/* The agent's own code, whose frames no stack keeps. */
static u64 own_text_lo, own_text_len;
extern const ElfW(Ehdr) __ehdr_start __attribute__((visibility("hidden")));

static void find_own_text(void)
{
	const ElfW(Ehdr) *eh = &__ehdr_start;
	const ElfW(Phdr) *ph = (const ElfW(Phdr) *)((const char *)eh + eh->e_phoff);
	u64 base = 0, lo = ~0ull, hi = 0;

	for (int i = 0; i < eh->e_phnum; i++)
		if (ph[i].p_type == PT_LOAD && ph[i].p_offset == 0)
			base = (u64)eh - ph[i].p_vaddr;
	for (int i = 0; i < eh->e_phnum; i++) {
		if (ph[i].p_type != PT_LOAD || !(ph[i].p_flags & PF_X))
			continue;
		if (base + ph[i].p_vaddr < lo)
			lo = base + ph[i].p_vaddr;
		if (base + ph[i].p_vaddr + ph[i].p_memsz > hi)
			hi = base + ph[i].p_vaddr + ph[i].p_memsz;
	}
	if (hi > lo) {
		own_text_lo = lo;
		own_text_len = hi - lo;
	}
}

/* ---- stack walks: bpf/memleak.bpf.c's, reading the stack directly,
 * every read checked against the stack it belongs to ---- */

struct walk {
	u64 pc, sp, bp;
	u64 lo, hi;       /* readable: the stack being walked */
	u32 n, max;
	u32 hint;
	u32 exact, interrupted;
	u32 reason;
	struct unwind_proc *proc;
	struct thread *self;
	u64 *frames;
	u8 *flags;
};

/* The readable mapping holding `addr`, from /proc/self/maps, read with
 * system calls only: no lock, no allocation. pthread_getattr_np() would
 * be simpler but takes the thread's lock, which a caller of malloc may
 * hold (Rust's runtime calls it at start, and it allocates inside). */
static int mapping_of(u64 addr, u64 *lo, u64 *hi)
{
	char buf[4096];
	size_t have = 0;
	int fd, found = 0;

	if (__atomic_load_n(&sandboxed, __ATOMIC_RELAXED))
		return 0;
	fd = (int)sys_openat(AT_FDCWD, "/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	for (;;) {
		long n = sys_read(fd, buf + have, sizeof(buf) - 1 - have);
		char *line = buf, *nl;

		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = 0;
		while ((nl = memchr(line, '\n', have - (size_t)(line - buf)))) {
			char *p = line;
			u64 start = 0, end = 0;

			for (; *p != '-'; p++)
				start = start * 16 + (u64)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
			for (p++; *p != ' '; p++)
				end = end * 16 + (u64)(*p <= '9' ? *p - '0' : (*p | 32) - 'a' + 10);
			if (addr >= start && addr < end) {
				found = p[1] == 'r';
				*lo = start;
				*hi = end;
				goto out;
			}
			line = nl + 1;
		}
		have -= (size_t)(line - buf);
		memmove(buf, line, have);
	}
out:
	sys_close(fd);
	return found;
}

/* Sets the readable range to the stack holding sp: the thread's, a
 * signal stack, the main thread's grown further: the mapping holding sp,
 * looked up again whenever sp leaves the one the thread saw last. */
static int enter_stack(struct walk *w, u64 sp)
{
	struct thread *self = w->self;

	if (!(T.stack_known && sp >= T.stack_lo && sp < T.stack_hi)) {
		T.stack_known = mapping_of(sp, &T.stack_lo, &T.stack_hi);
		if (!T.stack_known)
			return 0;
	}
	w->lo = sp;
	w->hi = T.stack_hi;
	return 1;
}

static inline int rd(struct walk *w, u64 addr, u64 *out)
{
	if (addr < w->lo || addr > w->hi - 8)
		return 0;
	*out = *(volatile u64 *)addr;
	return 1;
}

static u32 find_map(struct unwind_proc *proc, u64 at, u32 hint)
{
	u32 n = proc->nmaps, lo = 0, hi, mid;

	if (n > UNWIND_MAX_MAPS)
		return UNWIND_MAX_MAPS;
	if (hint < n && at >= proc->maps[hint].start && at < proc->maps[hint].end)
		return hint;
	if (!n || at < proc->maps[0].start)
		return UNWIND_MAX_MAPS;
	hi = n;
	while (hi - lo > 1) {
		mid = lo + (hi - lo) / 2;
		if (proc->maps[mid].start <= at)
			lo = mid;
		else
			hi = mid;
	}
	return at < proc->maps[lo].end ? lo : UNWIND_MAX_MAPS;
}

static u32 find_row(u32 first, u32 n, u32 rel)
{
	u32 lo = first, hi = first + n, mid, cap = H->row_capacity;

	if (hi > cap || hi < lo || rows[lo].pc > rel)
		return UR_INVALID;
	while (hi - lo > 1) {
		mid = lo + (hi - lo) / 2;
		if (rows[mid].pc <= rel)
			lo = mid;
		else
			hi = mid;
	}
	return rows[lo].info;
}

#define UR_NONE 7
#define UR_NONE_RULE(reason) ((u32)(reason) << 3 | UR_NONE)

/* The probe's rule cache, one per process: entries are checked against
 * the address and the table's generation, so a torn entry reads as a
 * miss. */
#define CACHE_SLOTS 4096
static struct {
	u64 at;
	u64 val;
} rule_cache[CACHE_SLOTS];

static u32 rule_at(struct walk *w, u64 at)
{
	struct unwind_proc *proc = w->proc;
	u64 h = at * 0x9E3779B97F4A7C15ULL;
	u32 key = h >> 52, check = (u32)h ^ proc->gen, idx, rule;
	u64 cat = __atomic_load_n(&rule_cache[key].at, __ATOMIC_RELAXED);
	u64 cval = __atomic_load_n(&rule_cache[key].val, __ATOMIC_RELAXED);
	struct unwind_map *m;

	if (cat == at && (cval >> 32) == check)
		return (u32)cval;
	idx = find_map(proc, at, w->hint);
	if (idx >= UNWIND_MAX_MAPS) {
		rule = UR_NONE_RULE(proc->flags & UPF_MAPS_FULL ? UE_MAPS_FULL : UE_NO_MAPPING);
	} else {
		w->hint = idx;
		m = &proc->maps[idx];
		if (!m->nrows)
			rule = UR_NONE_RULE(m->first_row < UE_NR ? m->first_row : UE_NONE);
		else if (at - m->bias > 0xffffffffULL)
			rule = UR_INVALID;
		else
			rule = find_row(m->first_row, m->nrows, (u32)(at - m->bias));
	}
	__atomic_store_n(&rule_cache[key].val, (u64)check << 32 | rule, __ATOMIC_RELAXED);
	__atomic_store_n(&rule_cache[key].at, at, __ATOMIC_RELAXED);
	return rule;
}

static int end(struct walk *w, u32 reason)
{
	w->reason = reason;
	return 1;
}

static int fp_step(struct walk *w)
{
	u64 bp = w->bp, ra, next;

	if (!bp || bp < w->sp || !rd(w, bp + 8, &ra) || !rd(w, bp, &next))
		return end(w, UE_FP_END);
	if (!ra)
		return end(w, UE_FP_END);
	w->pc = ra;
	w->sp = bp + 16;
	w->bp = next;
	w->exact = 0;
	w->interrupted = 0;
	return 0;
}

/* One frame of a walk with rows: the probe's uw_step(). */
static int row_step(struct walk *w)
{
	u64 pc, cfa, ra, bp, sp, at;
	u32 i, rule, why;
	int64_t slot;

	i = w->n;
	if (i >= w->max || i >= MEMLEAK_MAX_FRAMES) {
		*w->flags |= MEF_STACK_FULL;
		return end(w, UE_MAX_DEPTH);
	}
	pc = w->pc;
	w->frames[i] = w->interrupted ? pc + 1 : pc;
	/* A frame of the agent (its dlopen, around the loader's
	 * allocations) is walked through, not kept. */
	w->n = pc - own_text_lo < own_text_len ? i : i + 1;
	at = w->exact ? pc : pc - 1;
	rule = rule_at(w, at);
	sp = w->sp;
	switch (rule & UR_KIND_MASK) {
	case UR_END:
		return end(w, UE_COMPLETE);
	case UR_NONE:
		why = rule >> 3;
		if (H->unwind_mode == MU_AUTO && (why == UE_NO_UNWIND_INFO || why == UE_ROWS_FULL))
			return fp_step(w);
		return end(w, why);
	case UR_SIGNAL: {
		u64 nsp;

		w->frames[i] = pc + 1;
		if (!rd(w, sp + UR_SIGNAL_RIP, &ra) || !rd(w, sp + UR_SIGNAL_RBP, &bp) ||
		    !rd(w, sp + UR_SIGNAL_RSP, &nsp))
			return end(w, UE_READ_FAILED);
		if (!ra)
			return end(w, UE_NULL_RA);
		/* The interrupted code's stack: the thread's, or a signal
		 * stack. */
		if (!enter_stack(w, nsp))
			return end(w, UE_READ_FAILED);
		w->pc = ra;
		w->bp = bp;
		w->sp = nsp;
		w->exact = 1;
		w->interrupted = 1;
		return 0;
	}
	case UR_CFA_RSP:
		cfa = sp;
		break;
	case UR_CFA_RBP:
		cfa = w->bp;
		break;
	case UR_PLT:
		cfa = sp + ((pc & 15) >= UR_PLT_PUSHED_FROM ? 8 : 0);
		break;
	default:
		return end(w, UE_INVALID_ROW);
	}
	cfa += (int64_t)((int32_t)rule >> UR_CFA_SHIFT);
	slot = (int8_t)(rule >> UR_RBP_SHIFT);
	bp = w->bp;
	if (!rd(w, cfa - 8, &ra))
		return end(w, UE_READ_FAILED);
	if (slot && !rd(w, cfa + slot * 8, &bp))
		return end(w, UE_READ_FAILED);
	if (!ra)
		return end(w, UE_NULL_RA);
	if (cfa <= sp)
		return end(w, UE_NOT_PROGRESSING);
	w->pc = ra;
	w->sp = cfa;
	w->bp = bp;
	w->exact = 0;
	w->interrupted = 0;
	return 0;
}

/* This process's table, or NULL. Found again whenever the recorder wrote
 * any table since the last look. */
static struct mla_table *my_table(void)
{
	u64 gen = __atomic_load_n(&H->tables_gen, __ATOMIC_ACQUIRE);

	if (gen != table_gen_seen || table_idx == ~0u) {
		table_gen_seen = gen;
		table_idx = ~0u;
		for (u32 i = 0; i < H->ntables; i++) {
			if (__atomic_load_n(&tables[i].pid, __ATOMIC_RELAXED) == my_pid) {
				table_idx = i;
				break;
			}
		}
	}
	return table_idx == ~0u ? NULL : &tables[table_idx];
}

/* The walk with this process's table `t` into `e`. */
static void walk_rows(struct memleak_event *e, struct walk *w, struct mla_table *t,
		      const struct regs *r)
{
	/* The recorder may rewrite the table meanwhile (a dlopen): a walk
	 * that saw it change is done again. */
	for (int tries = 0;; tries++) {
		u32 seq = __atomic_load_n(&t->seq, __ATOMIC_ACQUIRE);

		w->pc = r->pc;
		w->sp = r->sp;
		w->bp = r->bp;
		w->n = 0;
		w->hint = 0;
		w->exact = 1;
		w->interrupted = 0;
		w->reason = UE_NONE;
		w->proc = &t->proc;
		e->flags &= ~MEF_STACK_FULL;
		if (!(seq & 1)) {
			if (!enter_stack(w, r->sp)) {
				e->frames[0] = r->pc;
				w->n = 1;
				w->reason = UE_READ_FAILED;
			} else {
				for (int i = 0; i <= MEMLEAK_MAX_FRAMES; i++)
					if (row_step(w))
						break;
			}
		}
		__atomic_thread_fence(__ATOMIC_ACQUIRE);
		if (!(seq & 1) && __atomic_load_n(&t->seq, __ATOMIC_RELAXED) == seq)
			break;
		if (tries == 3) {
			e->frames[0] = r->pc;
			w->n = 1;
			w->reason = UE_NO_TABLE;
			break;
		}
	}
	e->nframes = w->n;
}

/* The table generation the process last stopped for. */
static u64 asked_gen = ~0ull;

/* Walks the caller's stack into the slot's event. */
static void walk_stack(struct thread *self, struct mla_slot *s, const struct regs *r)
{
	struct memleak_event *e = &s->ev;
	struct walk w;
	struct mla_table *t;
	u32 reason = UE_NONE;

	w.self = self;
	w.frames = e->frames;
	w.flags = &e->flags;
	w.max = H->max_frames;
	if (H->unwind_mode == MU_FP) {
		w.n = 1;
		e->frames[0] = r->pc;
		w.sp = r->sp;
		w.bp = r->bp;
		if (!enter_stack(&w, r->sp)) {
			reason = UE_READ_FAILED;
		} else {
			for (;;) {
				u64 bp = w.bp, next, ra;

				if (w.n >= w.max || w.n >= MEMLEAK_MAX_FRAMES) {
					e->flags |= MEF_STACK_FULL;
					break;
				}
				if (!bp || (bp & 7) || !rd(&w, bp, &next) || !rd(&w, bp + 8, &ra) || !ra)
					break;
				if (ra - own_text_lo >= own_text_len)
					e->frames[w.n++] = ra;
				if (next <= bp)
					break;
				w.bp = next;
			}
			reason = e->flags & MEF_STACK_FULL ? UE_MAX_DEPTH : UE_FP_END;
		}
		e->nframes = w.n;
	} else {
		/* A pc the table does not know (a library mapped since: in
		 * dlopen, its constructors run before dlopen returns) makes
		 * the process stop for the recorder to rebuild the table, and
		 * the walk is done again; once per change of the tables, so
		 * that JIT code does not stop it at every call. */
		for (;;) {
			u64 gen = __atomic_load_n(&H->tables_gen, __ATOMIC_ACQUIRE);

			t = my_table();
			if (t) {
				walk_rows(e, &w, t, r);
				reason = w.reason;
			} else {
				e->frames[0] = r->pc;
				e->nframes = 1;
				reason = UE_NO_TABLE;
			}
			if ((reason != UE_NO_MAPPING && reason != UE_NO_TABLE) || gen == asked_gen)
				break;
			asked_gen = gen;
			stop_for_recorder();
		}
	}
	if (reason >= UE_NR)
		reason = UE_NONE;
	e->flags |= reason << MEF_END_SHIFT;
	s->len = MEMLEAK_HDR_SIZE + e->nframes * 8;
}

/* ---- recording ---- */

#define SIZE_MASK ((1ULL << 48) - 1)

/* The state an outermost call replaces, restored when it ends (by a
 * cleanup: also when an exception leaves operator new). */
struct outer {
	struct thread *self;
	u32 depth, wrapper;
	u64 frame, ret;
};

/* Whether a call whose frame is `fa` is nested in the thread's outermost
 * call: that call is still in progress, below on the same stack, with its
 * return address where it left it. A call abandoned by longjmp (out of a
 * printf handler inside asprintf, say) fails the test, as does a signal
 * handler's call on a signal stack above, and each is outermost: the
 * probe's return_pending() in another form. */
static inline int nested(struct thread *self, u64 *fa)
{
	return T.depth && (u64)fa < T.outer_frame &&
	       *(volatile u64 *)(T.outer_frame + 8) == T.outer_ret;
}

static inline struct outer enter(struct thread *self, u64 *fa, u32 wrapper)
{
	struct outer s = { self, T.depth, T.wrapper, T.outer_frame, T.outer_ret };

	T.depth = 1;
	T.wrapper = wrapper;
	T.n_inner = 0;
	T.outer_frame = (u64)fa;
	T.outer_ret = fa[1];
	return s;
}

static void leave(struct outer *s)
{
	struct thread *self = s->self;

	T.depth = s->depth;
	T.wrapper = s->wrapper;
	T.outer_frame = s->frame;
	T.outer_ret = s->ret;
}

/* Starts an outermost call in the calling entry point, or says it is
 * nested (or the process is not traced). */
#define OUTER(wrapper)                                                        \
	u64 *fa__ = __builtin_frame_address(0);                               \
	struct thread *self = me();                                           \
	if (!on || self->off || nested(self, fa__))                           \
		goto pass;                                                    \
	struct regs r __attribute__((unused)) = { (u64)__builtin_return_address(0), (u64)fa__ + 16, fa__[0] }; \
	struct outer saved__ __attribute__((cleanup(leave), unused)) = enter(self, fa__, wrapper)

/* OUTER for an allocation of `size` bytes, which with --sample is passed
 * through unless a sample point falls in it. A nested call is passed
 * through first: its bytes are its outermost call's, counted once. */
#define OUTER_S(size)                                                         \
	u64 *fa__ = __builtin_frame_address(0);                               \
	struct thread *self = me();                                           \
	if (!on || self->off || nested(self, fa__))                           \
		goto pass;                                                    \
	if (sample_mean && unsampled(self, size))                             \
		goto pass;                                                    \
	struct regs r __attribute__((unused)) = { (u64)__builtin_return_address(0), (u64)fa__ + 16, fa__[0] }; \
	struct outer saved__ __attribute__((cleanup(leave), unused)) = enter(self, fa__, 0)

/* An allocation that returned `addr`, with the stack at `r`. */
static void record_alloc(struct thread *self, u8 kind, u64 addr, u64 size, const struct regs *r)
{
	struct mla_slot *s;
	u64 pos;

	if (!addr) {
		count_lost(ML_FAILED_ALLOC);
		return;
	}
	if (size < H->min_size || size > H->max_size)
		return;
	/* Sampled: tracked before it is recorded, or not recorded at all.
	 * Mappings are never sampled (docs/design.md). */
	if (sample_mean && kind != MK_MMAP && !set_insert(addr))
		return;
	s = claim(&pos);
	if (!s) {
		if (sample_mean && kind != MK_MMAP)
			set_remove(addr);
		return;
	}
	header(self, s, kind, addr, size, 0, 0, event_time(self));
	walk_stack(self, s, r);
	publish(s, pos);
}

/* A libc wrapper's block, its size known once the call returned: with
 * --sample, recorded if a sample point falls in it. */
static void record_wrapped(struct thread *self, u8 kind, u64 addr, u64 size, const struct regs *r)
{
	if (sample_mean && addr && unsampled(self, size == ~0ULL ? 0 : size))
		return;
	record_alloc(self, kind, addr, size, r);
}

/* A release, recorded before the block is released: another thread can
 * get the address from the allocator only after that. */
static void record_free(struct thread *self, u8 kind, u64 addr, u64 size)
{
	struct mla_slot *s;
	u64 pos;

	s = claim(&pos);
	if (!s)
		return;
	header(self, s, kind, addr, size, 0, 0, event_time(self));
	publish(s, pos);
}

/* A call that releases one block and returns another (realloc, mremap),
 * claimed before the call for the same reason; done_move(self, ) fills it. */
static struct mla_slot *claim_move(struct thread *self, u64 *pos)
{
	struct mla_slot *s = claim(pos);

	if (s)
		header(self, s, 0, 0, 0, 0, 0, event_time(self));
	return s;
}

static void done_move(struct thread *self, struct mla_slot *s, u64 pos, u8 kind, u64 addr, u64 size, u64 old,
		      u64 old_size, const struct regs *r)
{
	struct memleak_event *e;

	if (!s)
		return;
	e = &s->ev;
	if (!addr && !((kind == MK_REALLOC || kind == MK_REALLOCARRAY) && old && size == 0)) {
		/* A failed call changes nothing. */
		count_lost(ML_FAILED_ALLOC);
		s->len = 0;
	} else if (!old && (size < H->min_size || size > H->max_size)) {
		s->len = 0;
	} else {
		e->kind = kind;
		e->addr = addr;
		e->size = size;
		e->old_addr = old;
		e->old_size = old_size;
		if (addr)
			walk_stack(self, s, r);
	}
	publish(s, pos);
}

/* Nested malloc, calloc and realloc directly inside a libc wrapper: the
 * wrapper's block is one of theirs, and its size is theirs. What they
 * call in turn is not directly inside. */
#define INNER(call, size)                                                  \
	do {                                                               \
		struct thread *self = me();                                \
		if (T.depth == 1 && T.wrapper) {                           \
			u32 i__;                                           \
			T.depth = 2;                                       \
			p = call;                                          \
			T.depth = 1;                                       \
			i__ = T.n_inner++ & 3;                             \
			T.inner_addr[i__] = (u64)p;                        \
			T.inner_size[i__] = (size);                        \
		} else {                                                   \
			p = call;                                          \
		}                                                          \
	} while (0)

static u64 inner_size_of(struct thread *self, u64 addr)
{
	u64 size = ~0ULL;

	for (u32 i = 0; i < 4; i++)
		if (i < T.n_inner && T.inner_addr[i] == addr)
			size = T.inner_size[i];
	return size;
}

/* The block's size, once the wrapper returned; the addresses are
 * forgotten (a leak scan must not find them here). */
static u64 wrapper_size(struct thread *self, u64 addr)
{
	u64 size = inner_size_of(self, addr);

	memset(T.inner_addr, 0, sizeof(T.inner_addr));
	T.n_inner = 0;
	return size;
}

static inline u64 clamp(u64 size)
{
	return size > SIZE_MASK ? SIZE_MASK : size;
}

/* realloc and reallocarray (n, m) with --sample. The new block is
 * sampled afresh on its size, as an allocation; the old one, if it was
 * sampled, ends here: a move to the new block when that is sampled too, a
 * release (a realloc to nothing) when not. An unsampled old block behind a
 * sampled new one is not named: the new one is recorded as allocated. */
static void *sampled_realloc(struct thread *self, u8 kind, void *old, size_t n, size_t m,
			     const struct regs *r)
{
	u64 size = kind == MK_REALLOC ? (u64)n : (m && n > SIZE_MASK / m ? SIZE_MASK : (u64)n * m);
	u64 *was = old ? set_find((u64)old) : NULL;
	int take = size && !unsampled(self, clamp(size));
	struct mla_slot *s;
	void *p;
	u64 pos;

#define CALL() (kind == MK_REALLOC ? real.realloc(old, n) : real.reallocarray(old, n, m))
	if (!was) {
		p = CALL();
		if (take)
			record_alloc(self, kind, (u64)p, clamp(size), r);
		return p;
	}
	/* Claimed before the call, which may release the old block. */
	s = claim_move(self, &pos);
	set_drop(was);
	p = CALL();
#undef CALL
	if (!p && size) {
		/* Failed: the old block stays, and stays sampled (or, with no
		 * room to track it, its sample ends here). */
		if (set_insert((u64)old))
			done_move(self, s, pos, kind, 0, size, (u64)old, 0, r);
		else
			done_move(self, s, pos, kind, 0, 0, (u64)old, 0, r);
	} else if (take && p && set_insert((u64)p)) {
		if (!s)
			set_remove((u64)p);
		done_move(self, s, pos, kind, (u64)p, clamp(size), (u64)old, 0, r);
	} else {
		done_move(self, s, pos, kind, 0, 0, (u64)old, 0, r);
	}
	return p;
}

/* ---- the malloc family ---- */

EXPORT void *malloc(size_t n)
{
	void *p;

	if (unlikely(!ready()))
		return boot_alloc(n);
	{
		OUTER_S(n);
		p = real.malloc(n);
		record_alloc(self, MK_MALLOC, (u64)p, clamp(n), &r);
		return p;
	}
pass:
	INNER(real.malloc(n), n);
	return p;
}

EXPORT void free(void *p)
{
	u64 *sampled = NULL;

	if (unlikely(is_boot(p)) || !p)
		return;
	if (unlikely(!ready()))
		return;
	/* --sample: a block not in the set was not recorded; its release is
	 * not either (one bucket read, no thread state). */
	if (sample_mean && likely(!(sampled = set_find((u64)p)))) {
		real.free(p);
		return;
	}
	{
		OUTER(0);
		if (sampled)
			set_drop(sampled);
		record_free(self, MK_FREE, (u64)p, 0);
		real.free(p);
		return;
	}
pass:
	real.free(p);
}

EXPORT void *calloc(size_t n, size_t m)
{
	u64 size = n && m > SIZE_MASK / n ? SIZE_MASK : (u64)n * m;
	void *p;

	if (unlikely(!ready())) {
		p = boot_alloc(n * m);
		if (p)
			memset(p, 0, n * m);
		return p;
	}
	{
		OUTER_S(size);
		p = real.calloc(n, m);
		record_alloc(self, MK_CALLOC, (u64)p, size, &r);
		return p;
	}
pass:
	INNER(real.calloc(n, m), size);
	return p;
}

EXPORT void *realloc(void *old, size_t size)
{
	struct mla_slot *s;
	void *p;
	u64 pos;

	if (unlikely(is_boot(old) || !ready())) {
		p = ready() ? malloc(size) : boot_alloc(size);
		if (p && old) {
			size_t have = boot_size(old);
			memcpy(p, old, have < size ? have : size);
		}
		return p;
	}
	{
		OUTER(0);
		if (sample_mean)
			return sampled_realloc(self, MK_REALLOC, old, size, 1, &r);
		s = claim_move(self, &pos);
		p = real.realloc(old, size);
		done_move(self, s, pos, MK_REALLOC, (u64)p, size, (u64)old, 0, &r);
		return p;
	}
pass:
	INNER(real.realloc(old, size), size);
	return p;
}

EXPORT void *reallocarray(void *old, size_t n, size_t m)
{
	struct mla_slot *s;
	void *p;
	u64 pos;

	if (unlikely(!ready()))
		return NULL;
	{
		OUTER(0);
		if (sample_mean)
			return sampled_realloc(self, MK_REALLOCARRAY, old, n, m, &r);
		s = claim_move(self, &pos);
		p = real.reallocarray(old, n, m);
		done_move(self, s, pos, MK_REALLOCARRAY, (u64)p, (u64)n * m, (u64)old, 0, &r);
		return p;
	}
pass:
	return real.reallocarray(old, n, m);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size)
{
	int ret;

	if (unlikely(!ready()))
		return ENOMEM;
	{
		OUTER_S(size);
		ret = real.posix_memalign(out, align, size);
		record_alloc(self, MK_POSIX_MEMALIGN, ret == 0 ? (u64)*out : 0, size, &r);
		return ret;
	}
pass:
	return real.posix_memalign(out, align, size);
}

#define ALIGNED(name, kind)                                          \
	EXPORT void *name(size_t align, size_t size)                 \
	{                                                            \
		void *p;                                             \
		if (unlikely(!ready()))                              \
			return NULL;                                 \
		{                                                    \
			OUTER_S(size);                               \
			p = real.name(align, size);                  \
			record_alloc(self, kind, (u64)p, clamp(size), &r); \
			return p;                                    \
		}                                                    \
	pass:                                                        \
		return real.name(align, size);                       \
	}
ALIGNED(memalign, MK_MEMALIGN)
ALIGNED(aligned_alloc, MK_ALIGNED_ALLOC)

#define PAGED(name, kind)                                            \
	EXPORT void *name(size_t size)                               \
	{                                                            \
		void *p;                                             \
		if (unlikely(!ready()))                              \
			return NULL;                                 \
		{                                                    \
			OUTER_S(size);                               \
			p = real.name(size);                         \
			record_alloc(self, kind, (u64)p, clamp(size), &r); \
			return p;                                    \
		}                                                    \
	pass:                                                        \
		return real.name(size);                              \
	}
PAGED(valloc, MK_VALLOC)
PAGED(pvalloc, MK_PVALLOC)

/* ---- mappings ---- */

/* A raw result as libc gives it: -1 (MAP_FAILED) and errno on failure.
 * Only for the calls the program made itself. */
static long libc_result(long r)
{
	if (sys_failed(r)) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

static void *libc_result_p(void *p)
{
	return (void *)libc_result((long)p);
}

#define MMAP(name)                                                                      \
	EXPORT void *name(void *addr, size_t len, int prot, int flags, int fd, off_t off) \
	{                                                                               \
		void *p;                                                                \
		if (unlikely(!ready()))                                                 \
			return libc_result_p(sys_mmap(addr, len, prot, flags, fd, off)); \
		{                                                                       \
			OUTER(0);                                                       \
			p = real.mmap(addr, len, prot, flags, fd, off);                 \
			record_alloc(self, MK_MMAP, p == MAP_FAILED ? 0 : (u64)p, clamp(len), &r); \
			return p;                                                       \
		}                                                                       \
	pass:                                                                           \
		return real.mmap(addr, len, prot, flags, fd, off);                      \
	}
MMAP(mmap)
MMAP(mmap64)

EXPORT int munmap(void *addr, size_t len)
{
	if (unlikely(!ready()))
		return (int)libc_result(sys_munmap(addr, len));
	if (!addr)
		goto pass;
	{
		OUTER(0);
		record_free(self, MK_MUNMAP, (u64)addr, len);
		return real.munmap(addr, len);
	}
pass:
	return real.munmap(addr, len);
}

EXPORT void *mremap(void *old, size_t old_size, size_t size, int flags, ...)
{
	struct mla_slot *s;
	void *fixed, *p;
	va_list ap;
	u64 pos;

	va_start(ap, flags);
	fixed = (flags & MREMAP_FIXED) ? va_arg(ap, void *) : NULL;
	va_end(ap);
	if (unlikely(!ready()))
		return libc_result_p(sys_mremap(old, old_size, size, flags, fixed));
	{
		OUTER(0);
		s = claim_move(self, &pos);
		p = real.mremap(old, old_size, size, flags, fixed);
		done_move(self, s, pos, MK_MREMAP, p == MAP_FAILED ? 0 : (u64)p, size, (u64)old, old_size,
			  &r);
		return p;
	}
pass:
	return real.mremap(old, old_size, size, flags, fixed);
}

/* ---- libc's allocating wrappers: the outermost call, so that the stack
 * starts at their caller, and the block's size is the nested call's ---- */

EXPORT char *strdup(const char *str)
{
	char *p;

	if (unlikely(!ready())) {
		size_t n = strlen(str) + 1;
		p = boot_alloc(n);
		if (p)
			memcpy(p, str, n);
		return p;
	}
	{
		OUTER(1);
		p = real.strdup(str);
		record_wrapped(self, MK_MALLOC, (u64)p, wrapper_size(self, (u64)p), &r);
		return p;
	}
pass:
	return real.strdup(str);
}

EXPORT char *strndup(const char *str, size_t n)
{
	char *p;

	if (unlikely(!ready()))
		return NULL;
	{
		OUTER(1);
		p = real.strndup(str, n);
		record_wrapped(self, MK_MALLOC, (u64)p, wrapper_size(self, (u64)p), &r);
		return p;
	}
pass:
	return real.strndup(str, n);
}

static int do_vasprintf(struct thread *self, char **out, const char *fmt, va_list ap, const struct regs *r)
{
	int ret = real.vasprintf(out, fmt, ap);
	u64 addr = ret >= 0 ? (u64)*out : 0;

	record_wrapped(self, MK_MALLOC, addr, wrapper_size(self, addr), r);
	return ret;
}

EXPORT int vasprintf(char **out, const char *fmt, va_list ap)
{
	if (unlikely(!ready()))
		return -1;
	{
		OUTER(1);
		return do_vasprintf(self, out, fmt, ap, &r);
	}
pass:
	return real.vasprintf(out, fmt, ap);
}

EXPORT int asprintf(char **out, const char *fmt, ...)
{
	va_list ap;
	int ret;

	va_start(ap, fmt);
	if (unlikely(!ready())) {
		ret = -1;
		goto done;
	}
	{
		OUTER(1);
		ret = do_vasprintf(self, out, fmt, ap, &r);
		goto done;
	}
pass:
	ret = real.vasprintf(out, fmt, ap);
done:
	va_end(ap);
	return ret;
}

static ssize_t do_getdelim(struct thread *self, char **line, size_t *n, int delim, FILE *f, const struct regs *r)
{
	u64 entry = line ? (u64)*line : 0, addr = 0, size;
	ssize_t ret = real.getdelim(line, n, delim, f);

	if (line)
		addr = (u64)*line;
	size = wrapper_size(self, addr);
	if (size == ~0ULL)
		return ret; /* the caller's buffer, reused as it was */
	if (sample_mean) {
		/* The old buffer is gone already: its sample (if it was one)
		 * ends, and the new one is sampled afresh. */
		u64 *old = entry ? set_find(entry) : NULL;
		int take = addr && !unsampled(self, size);

		if (old) {
			struct mla_slot *s;
			u64 pos;

			set_drop(old);
			take = take && set_insert(addr);
			s = claim_move(self, &pos);
			if (take)
				done_move(self, s, pos, MK_REALLOC, addr, size, entry, 0, r);
			else
				done_move(self, s, pos, MK_REALLOC, 0, 0, entry, 0, r);
			if (!s && take)
				set_remove(addr);
		} else if (take) {
			record_alloc(self, MK_MALLOC, addr, size, r);
		}
	} else if (entry) {
		struct mla_slot *s;
		u64 pos;

		s = claim_move(self, &pos);
		done_move(self, s, pos, MK_REALLOC, addr, size, entry, 0, r);
	} else {
		record_alloc(self, MK_MALLOC, addr, size, r);
	}
	return ret;
}

EXPORT ssize_t getdelim(char **line, size_t *n, int delim, FILE *f)
{
	if (unlikely(!ready()))
		return -1;
	{
		OUTER(1);
		return do_getdelim(self, line, n, delim, f, &r);
	}
pass:
	return real.getdelim(line, n, delim, f);
}

/* Named by an asm label: stdio.h defines getline inline when optimizing. */
EXPORT ssize_t agent_getline(char **line, size_t *n, FILE *f) __asm__("getline");
EXPORT ssize_t agent_getline(char **line, size_t *n, FILE *f)
{
	if (unlikely(!ready()))
		return -1;
	{
		OUTER(1);
		return do_getdelim(self, line, n, '\n', f, &r);
	}
pass:
	return real.getdelim(line, n, '\n', f);
}

/* ---- C++ operators (Itanium ABI). The next definitions are looked up
 * at the first call: libstdc++ may be loaded after the agent started. ---- */

static void *next_of(void **cache, const char *name)
{
	void *f = __atomic_load_n(cache, __ATOMIC_ACQUIRE);

	if (!f) {
		f = dlsym(next_handle, name);
		if (!f) {
			static const char msg[] = "memleak agent: no next definition of a C++ operator\n";
			write(2, msg, sizeof(msg) - 1);
			abort();
		}
		__atomic_store_n(cache, f, __ATOMIC_RELEASE);
	}
	return f;
}

typedef void *(*new1_t)(size_t);
typedef void *(*new2_t)(size_t, u64);
typedef void *(*new3_t)(size_t, u64, u64);
typedef void (*del1_t)(void *);
typedef void (*del2_t)(void *, u64);
typedef void (*del3_t)(void *, u64, u64);

/* The lookup is inside the outermost call's window: dlsym allocates. */
#define NEW(sym, kind, ARGS, CALLARGS, TYPE)                               \
	EXPORT void *sym ARGS                                             \
	{                                                                 \
		static void *next;                                        \
		void *p;                                                  \
		if (unlikely(!ready()))                                   \
			return boot_alloc(size);                          \
		{                                                         \
			OUTER_S(size);                                    \
			p = ((TYPE)next_of(&next, #sym))CALLARGS;         \
			record_alloc(self, kind, (u64)p, clamp(size), &r);      \
			return p;                                         \
		}                                                         \
	pass:                                                             \
		return ((TYPE)next_of(&next, #sym))CALLARGS;              \
	}

NEW(_Znwm, MK_NEW, (size_t size), (size), new1_t)
NEW(_ZnwmRKSt9nothrow_t, MK_NEW, (size_t size, u64 b), (size, b), new2_t)
NEW(_ZnwmSt11align_val_t, MK_NEW, (size_t size, u64 b), (size, b), new2_t)
NEW(_ZnwmSt11align_val_tRKSt9nothrow_t, MK_NEW, (size_t size, u64 b, u64 c), (size, b, c), new3_t)
NEW(_Znam, MK_NEW_ARRAY, (size_t size), (size), new1_t)
NEW(_ZnamRKSt9nothrow_t, MK_NEW_ARRAY, (size_t size, u64 b), (size, b), new2_t)
NEW(_ZnamSt11align_val_t, MK_NEW_ARRAY, (size_t size, u64 b), (size, b), new2_t)
NEW(_ZnamSt11align_val_tRKSt9nothrow_t, MK_NEW_ARRAY, (size_t size, u64 b, u64 c), (size, b, c),
    new3_t)

/* operator delete is recorded at its entry, like free(), and the free()
 * inside it is nested. */
#define DELETE(sym, kind, ARGS, CALLARGS, TYPE)                            \
	EXPORT void sym ARGS                                              \
	{                                                                 \
		static void *next;                                        \
		u64 *sampled = NULL;                                      \
		if (unlikely(is_boot(p) || !ready()))                     \
			return;                                           \
		if (!p)                                                   \
			goto pass;                                        \
		if (sample_mean && !(sampled = set_find((u64)p)))         \
			goto pass;                                        \
		{                                                         \
			OUTER(0);                                         \
			if (sampled)                                      \
				set_drop(sampled);                        \
			record_free(self, kind, (u64)p, 0);               \
			((TYPE)next_of(&next, #sym))CALLARGS;             \
			return;                                           \
		}                                                         \
	pass:                                                             \
		((TYPE)next_of(&next, #sym))CALLARGS;                     \
	}

DELETE(_ZdlPv, MK_DELETE, (void *p), (p), del1_t)
DELETE(_ZdlPvm, MK_DELETE, (void *p, u64 b), (p, b), del2_t)
DELETE(_ZdlPvRKSt9nothrow_t, MK_DELETE, (void *p, u64 b), (p, b), del2_t)
DELETE(_ZdlPvSt11align_val_t, MK_DELETE, (void *p, u64 b), (p, b), del2_t)
DELETE(_ZdlPvmSt11align_val_t, MK_DELETE, (void *p, u64 b, u64 c), (p, b, c), del3_t)
DELETE(_ZdlPvSt11align_val_tRKSt9nothrow_t, MK_DELETE, (void *p, u64 b, u64 c), (p, b, c), del3_t)
DELETE(_ZdaPv, MK_DELETE_ARRAY, (void *p), (p), del1_t)
DELETE(_ZdaPvm, MK_DELETE_ARRAY, (void *p, u64 b), (p, b), del2_t)
DELETE(_ZdaPvRKSt9nothrow_t, MK_DELETE_ARRAY, (void *p, u64 b), (p, b), del2_t)
DELETE(_ZdaPvSt11align_val_t, MK_DELETE_ARRAY, (void *p, u64 b), (p, b), del2_t)
DELETE(_ZdaPvmSt11align_val_t, MK_DELETE_ARRAY, (void *p, u64 b, u64 c), (p, b, c), del3_t)
DELETE(_ZdaPvSt11align_val_tRKSt9nothrow_t, MK_DELETE_ARRAY, (void *p, u64 b, u64 c), (p, b, c),
       del3_t)

/* ---- inject: attached to a running process ----
 *
 * `record -p PID --capture inject` stops one thread of a running process
 * with ptrace, at a moment it is outside the allocator and the loader,
 * and makes it call, in turn: memfd_create and dlopen (this library, from
 * a memfd named INJECT_NAME), then memleak_attach(fd of the shared
 * memory) (src/record/inject.rs drives it; crates/recorder/src/inject.rs
 * makes the calls). Loaded that way the agent is in no global scope:
 * nothing binds to its definitions, and it takes the calls by rewriting
 * the process's call sites instead: every GOT entry (PLT jump slots, and
 * GOT slots of code built with -fno-plt) that names a function it
 * defines and still holds the process's own definition. memleak_detach()
 * puts them back; the agent stays loaded, idle, and a later recording
 * attaches it again (200 attach/detach cycles must leave one copy).
 *
 * A patched slot only ever holds one of two values, the process's
 * definition or ours, each written with one aligned store: a thread
 * calling through it at the same moment takes either, and both work. A
 * slot that holds anything else (another object's definition, bound by
 * versioning or DT_SYMBOLIC) is left alone. */

#define INJECT_NAME "memleak-inject.so"

static int loaded_for_inject(void)
{
	char link[256];

	return self_link(link, sizeof(link)) && strstr(link, INJECT_NAME) != NULL;
}

/* The functions whose call sites are patched: the allocator entry
 * points, and dlopen (a library loaded later gets its sites patched).
 * The exec family is not: a program exec'd is no longer recorded. */
static struct hook {
	const char *name;
	void *mine, *theirs;
} hooks[] = {
	{ .name = "malloc" }, { .name = "free" }, { .name = "calloc" }, { .name = "realloc" }, { .name = "reallocarray" },
	{ .name = "posix_memalign" }, { .name = "memalign" }, { .name = "aligned_alloc" }, { .name = "valloc" }, { .name = "pvalloc" },
	{ .name = "mmap" }, { .name = "mmap64" }, { .name = "munmap" }, { .name = "mremap" },
	{ .name = "strdup" }, { .name = "strndup" }, { .name = "vasprintf" }, { .name = "asprintf" }, { .name = "getdelim" }, { .name = "getline" },
	{ .name = "dlopen" }, { .name = "dlclose" }, { .name = "dlsym" },
	{ .name = "prctl" }, { .name = "syscall" },
	{ .name = "_Znwm" }, { .name = "_ZnwmRKSt9nothrow_t" }, { .name = "_ZnwmSt11align_val_t" },
	{ .name = "_ZnwmSt11align_val_tRKSt9nothrow_t" }, { .name = "_Znam" }, { .name = "_ZnamRKSt9nothrow_t" },
	{ .name = "_ZnamSt11align_val_t" }, { .name = "_ZnamSt11align_val_tRKSt9nothrow_t" },
	{ .name = "_ZdlPv" }, { .name = "_ZdlPvm" }, { .name = "_ZdlPvRKSt9nothrow_t" }, { .name = "_ZdlPvSt11align_val_t" },
	{ .name = "_ZdlPvmSt11align_val_t" }, { .name = "_ZdlPvSt11align_val_tRKSt9nothrow_t" }, { .name = "_ZdaPv" },
	{ .name = "_ZdaPvm" }, { .name = "_ZdaPvRKSt9nothrow_t" }, { .name = "_ZdaPvSt11align_val_t" },
	{ .name = "_ZdaPvmSt11align_val_t" }, { .name = "_ZdaPvSt11align_val_tRKSt9nothrow_t" },
};
#define NHOOKS (sizeof(hooks) / sizeof(hooks[0]))

static u64 my_base;    /* this library's load address: never patched */
static void *reused_at; /* the shared memory of the last attach, and its size */
static u64 reused_len;
static int attached;   /* between memleak_attach and memleak_detach */

static struct hook *hook_named(const char *name)
{
	for (u32 i = 0; i < NHOOKS; i++)
		if (!strcmp(hooks[i].name, name))
			return &hooks[i];
	return NULL;
}

typedef void *(*dlsym_t)(void *, const char *);
static dlsym_t real_dlsym;

/* dlsym, for the process while the agent is attached: a lookup of a
 * function the agent takes gets the agent's (ctypes, plugin loaders:
 * calls through a pointer looked up after the attach pass no GOT slot).
 * RTLD_NEXT is answered by the real dlsym, tail-called, so that it sees
 * its caller's return address; a pointer looked up before the attach is
 * not seen (docs/design.md). Not exported: a preloaded agent must not
 * take the program's lookups. */
static void *inject_dlsym(void *h, const char *name)
{
	void *p;

	if (h == RTLD_NEXT) {
		__attribute__((musttail)) return real_dlsym(h, name);
	}
	p = real_dlsym(h, name);
	if (p && __atomic_load_n(&attached, __ATOMIC_ACQUIRE))
		for (u32 i = 0; i < NHOOKS; i++)
			if (hooks[i].theirs == p && hooks[i].mine)
				return hooks[i].mine;
	return p;
}

/* Our definitions (by our own handle: RTLD_DEFAULT would not find them
 * when injected) and the next ones: the process's when injected, libc's
 * (or a preloaded allocator's) when preloaded; libstdc++'s operators once
 * it is loaded. */
static void resolve_hooks(void *me_h)
{
	Dl_info info;

	if (dladdr((void *)resolve_hooks, &info)) {
		my_base = (u64)info.dli_fbase;
		/* Our own handle: the one the injector got from dlopen, or
		 * glibc's by our path (musl's dlopen opens the path again, and
		 * the memfd behind it is closed by then). The next dlopen, not
		 * ours, which would stop the process for the recorder. */
		if (!me_h)
			me_h = ((dlopen_t)dlsym(next_handle, "dlopen"))(info.dli_fname,
									RTLD_NOW | RTLD_NOLOAD);
	}
	if (injected) {
		if (!real_dlsym)
			real_dlsym = (dlsym_t)dlsym(RTLD_DEFAULT, "dlsym");
		hook_named("dlsym")->mine = real_dlsym ? (void *)inject_dlsym : NULL;
	}
	for (u32 i = 0; i < NHOOKS; i++) {
		if (!hooks[i].mine && me_h)
			hooks[i].mine = dlsym(me_h, hooks[i].name);
		if (!hooks[i].theirs)
			hooks[i].theirs = dlsym(next_handle, hooks[i].name);
	}
	/* One reference was taken above; the library is never unloaded. */
}


/* What one pass over the objects does. */
struct patching {
	int attach;   /* 1: theirs -> mine; 0: mine -> theirs */
	long slots;   /* slots written */
	long skipped; /* slots naming a hook that held another definition */
};

static u64 dyn_ptr(u64 v, u64 base)
{
	/* ld.so relocates most objects' dynamic entries in place; not the
	 * vDSO's. */
	return v < base ? v + base : v;
}

static int patch_object(struct dl_phdr_info *info, size_t size, void *data)
{
	struct patching *p = data;
	const ElfW(Dyn) *dyn = NULL;
	const ElfW(Sym) *symtab = NULL;
	const char *strtab = NULL;
	const ElfW(Rela) *rel[2] = { NULL, NULL };
	u64 relsz[2] = { 0, 0 };
	u64 lo = ~0ull, hi = 0, relro_lo = 0, relro_hi = 0, base = info->dlpi_addr;
	int relro_open = 0;

	if (base == my_base || !info->dlpi_phdr)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];

		if (ph->p_type == PT_DYNAMIC)
			dyn = (const ElfW(Dyn) *)(base + ph->p_vaddr);
		else if (ph->p_type == PT_LOAD) {
			if (base + ph->p_vaddr < lo)
				lo = base + ph->p_vaddr;
			if (base + ph->p_vaddr + ph->p_memsz > hi)
				hi = base + ph->p_vaddr + ph->p_memsz;
		} else if (ph->p_type == PT_GNU_RELRO) {
			/* The pages ld.so made read-only: its end rounded down,
			 * as ld.so rounds it (the page it ends in holds writable
			 * data after it, and stays writable). */
			relro_lo = (base + ph->p_vaddr) & ~4095ull;
			relro_hi = (base + ph->p_vaddr + ph->p_memsz) & ~4095ull;
		}
	}
	if (!dyn)
		return 0;
	for (; dyn->d_tag != DT_NULL; dyn++) {
		switch (dyn->d_tag) {
		case DT_SYMTAB: symtab = (const void *)dyn_ptr(dyn->d_un.d_ptr, base); break;
		case DT_STRTAB: strtab = (const void *)dyn_ptr(dyn->d_un.d_ptr, base); break;
		case DT_JMPREL: rel[0] = (const void *)dyn_ptr(dyn->d_un.d_ptr, base); break;
		case DT_PLTRELSZ: relsz[0] = dyn->d_un.d_val; break;
		case DT_RELA: rel[1] = (const void *)dyn_ptr(dyn->d_un.d_ptr, base); break;
		case DT_RELASZ: relsz[1] = dyn->d_un.d_val; break;
		}
	}
	if (!symtab || !strtab)
		return 0;
	for (int t = 0; t < 2; t++) {
		for (u64 i = 0; rel[t] && i < relsz[t] / sizeof(ElfW(Rela)); i++) {
			const ElfW(Rela) *r = &rel[t][i];
			u32 type = ELF64_R_TYPE(r->r_info);
			struct hook *h;
			void **slot, *now, *want;

			if (type != R_X86_64_JUMP_SLOT && type != R_X86_64_GLOB_DAT)
				continue;
			if (!ELF64_R_SYM(r->r_info))
				continue;
			h = hook_named(strtab + symtab[ELF64_R_SYM(r->r_info)].st_name);
			if (!h || !h->mine || !h->theirs)
				continue;
			slot = (void **)(base + r->r_offset);
			now = __atomic_load_n(slot, __ATOMIC_RELAXED);
			if (p->attach) {
				/* Bound to the process's definition, or not yet
				 * bound (a lazy slot points into its own PLT). */
				if (now == h->mine)
					continue;
				if (now != h->theirs && !((u64)now >= lo && (u64)now < hi)) {
					p->skipped++;
					continue;
				}
				want = h->mine;
			} else {
				if (now != h->mine)
					continue;
				want = h->theirs;
			}
			if ((u64)slot >= relro_lo && (u64)slot < relro_hi && !relro_open) {
				if (sys_mprotect((void *)relro_lo, relro_hi - relro_lo,
						 PROT_READ | PROT_WRITE) != 0) {
					p->skipped++;
					continue;
				}
				relro_open = 1;
			}
			__atomic_store_n(slot, want, __ATOMIC_RELEASE);
			p->slots++;
		}
	}
	if (relro_open)
		sys_mprotect((void *)relro_lo, relro_hi - relro_lo, PROT_READ);
	return 0;
}

static long patch_all(int attach, void *self)
{
	struct patching p = { attach, 0, 0 };

	if (attach)
		resolve_hooks(self);
	dl_iterate_phdr(patch_object, &p);
	return p.slots;
}

/* ---- RTLD_DEEPBIND under preload: the objects a dlopen added get their
 * call sites patched, as inject patches every object. Ours are the
 * agent's definitions, theirs the next ones (libc's). ---- */

static int count_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	(*(u32 *)data)++;
	return 0;
}

static u32 count_objects(void)
{
	u32 n = 0;

	dl_iterate_phdr(count_cb, &n);
	return n;
}

struct deepbound {
	u32 seen, skip;
	struct patching p;
};

static int patch_deep_cb(struct dl_phdr_info *info, size_t size, void *data)
{
	struct deepbound *d = data;

	if (d->seen++ < d->skip)
		return 0;
	return patch_object(info, size, &d->p);
}

static void patch_deepbound(u32 skip)
{
	struct deepbound d = { 0, skip, { 1, 0, 0 } };

	resolve_hooks(NULL);
	dl_iterate_phdr(patch_deep_cb, &d);
}

static void patch_new_objects(void)
{
	if (__atomic_load_n(&attached, __ATOMIC_ACQUIRE))
		patch_all(1, NULL);
}

/* Attaches to the shared memory the recorder made (its descriptor `fd`,
 * closed here) and patches the call sites; `self` is this library's
 * handle when the recorder just loaded it, else NULL. Returns the number of slots
 * patched, or a negative errno. Called by the recorder, through ptrace,
 * on a thread it stopped outside the allocator and the loader. */
EXPORT long memleak_attach(int fd, void *self)
{
	struct mla_header hdr;
	struct mla_header *h;
	long n;

	if (!injected || state != ST_READY)
		return -EINVAL;
	/* Another recording is attached, unless its recorder died (killed:
	 * it never detached); then this one takes over. */
	if (__atomic_load_n(&attached, __ATOMIC_ACQUIRE) && H &&
	    sys_kill((pid_t)H->recorder_pid, 0) != -ESRCH)
		return -EBUSY;
	if (sys_pread(fd, &hdr, 32, 0) != 32 || hdr.magic != MLA_MAGIC ||
	    hdr.version != MLA_VERSION) {
		sys_close(fd);
		return -EPROTO;
	}
	/* The previous recording's memory is never unmapped: a call still in
	 * flight may write to it (the recorder freed its pages). This one
	 * takes its place when it fits (MAP_FIXED replaces a mapping with no
	 * moment unmapped): 200 attach/detach cycles leave one mapping, not
	 * 200 of 100 MB of address space each. A late write of the old
	 * recording lands in the new ring, whose recorder rejects it. */
	if (reused_at && hdr.total_bytes <= reused_len)
		h = sys_mmap(reused_at, hdr.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED,
			     fd, 0);
	else
		h = sys_mmap(NULL, hdr.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	sys_close(fd);
	if (sys_failed((long)h))
		return (long)h;
	if ((void *)h != reused_at) {
		reused_at = h;
		reused_len = hdr.total_bytes;
	}
	on = 0;
	/* --sample: this recording's mean, and an empty set of sampled
	 * blocks (an earlier recording's are not this one's). */
	if (h->sample_mean && sampled_set) {
		sys_madvise(sampled_set, (size_t)(SET_WAYS * 8) << SET_BUCKET_BITS, MADV_DONTNEED);
		sample_mean_f = (double)h->sample_mean;
		sample_mean = h->sample_mean;
	} else if (h->sample_mean) {
		sampling_start(h->sample_mean);
		if (!sampled_set)
			return -ENOMEM;
	} else {
		sample_mean = 0;
	}
	slots = (char *)h + h->ring_off;
	slot_mask = h->nslots - 1;
	tables = (struct mla_table *)((char *)h + h->tables_off);
	rows = (struct unwind_row *)((char *)h + h->rows_off);
	table_idx = ~0u;
	table_gen_seen = ~0ull;
	my_pid = (u32)sys_getpid();
	__atomic_store_n(&H, h, __ATOMIC_RELEASE);
	__atomic_store_n(&on, pid_traced(my_pid), __ATOMIC_RELEASE);
	if (on)
		__atomic_fetch_add(&H->agents, 1, __ATOMIC_RELAXED);
	__atomic_store_n(&attached, 1, __ATOMIC_RELEASE);
	n = patch_all(1, self);
	return n;
}

/* Puts the call sites back and records nothing more; the agent stays,
 * idle. Returns the number of slots restored. */
EXPORT long memleak_detach(void)
{
	if (!injected)
		return -EINVAL;
	__atomic_store_n(&attached, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&on, 0, __ATOMIC_RELEASE);
	return patch_all(0, NULL);
}
