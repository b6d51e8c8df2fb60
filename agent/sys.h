/* The agent's system calls, each a function with typed arguments.
 *
 * Why not glibc's syscall(): it is variadic. An argument passed as an
 * int (a literal 0, a descriptor) fills only the low half of the 64-bit
 * register or stack slot the kernel reads, and the upper half is whatever
 * was there: `syscall(SYS_mmap, ..., fd, 0)` mapped the shared memory at
 * an offset far past the end of the file, and the first write to it
 * killed the process with SIGBUS (issue 40). And it sets errno, which the
 * program owns: free() must leave it as it was (glibc 2.33 and later
 * promise so), and a futex that timed out inside it would not.
 *
 * So every call here takes `long` arguments, converted from its typed
 * parameters by the compiler, and returns the kernel's result: a negative
 * errno on failure, errno untouched. agent.c makes no other system call
 * than through these (a test in crates/recorder checks that). */
#ifndef __MEMLEAK_AGENT_SYS_H__
#define __MEMLEAK_AGENT_SYS_H__

#include <signal.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>

#if defined(__x86_64__)
static inline long sys6(long nr, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#else
#include <errno.h>
#include <unistd.h>
/* Elsewhere through glibc, every argument a long, errno kept. */
static inline long sys6(long nr, long a, long b, long c, long d, long e, long f)
{
	int saved = errno;
	long ret = syscall(nr, a, b, c, d, e, f);

	if (ret == -1) {
		ret = -errno;
	}
	errno = saved;
	return ret;
}
#endif

/* A result that is a negative errno. */
static inline int sys_failed(long ret)
{
	return ret < 0 && ret > -4096;
}

static inline void *sys_mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return (void *)sys6(SYS_mmap, (long)addr, (long)len, (long)prot, (long)flags, (long)fd,
			    (long)off);
}

static inline long sys_munmap(void *addr, size_t len)
{
	return sys6(SYS_munmap, (long)addr, (long)len, 0, 0, 0, 0);
}

static inline void *sys_mremap(void *old, size_t old_size, size_t size, int flags, void *fixed)
{
	return (void *)sys6(SYS_mremap, (long)old, (long)old_size, (long)size, (long)flags,
			    (long)fixed, 0);
}

static inline long sys_mprotect(void *addr, size_t len, int prot)
{
	return sys6(SYS_mprotect, (long)addr, (long)len, (long)prot, 0, 0, 0);
}

static inline long sys_madvise(void *addr, size_t len, int advice)
{
	return sys6(SYS_madvise, (long)addr, (long)len, (long)advice, 0, 0, 0);
}

static inline long sys_futex(unsigned int *word, int op, unsigned int val,
			     const struct timespec *timeout)
{
	return sys6(SYS_futex, (long)word, (long)op, (long)val, (long)timeout, 0, 0);
}

static inline long sys_openat(int dirfd, const char *path, int flags)
{
	return sys6(SYS_openat, (long)dirfd, (long)path, (long)flags, 0, 0, 0);
}

static inline long sys_read(int fd, void *buf, size_t len)
{
	return sys6(SYS_read, (long)fd, (long)buf, (long)len, 0, 0, 0);
}

static inline long sys_pread(int fd, void *buf, size_t len, off_t off)
{
	return sys6(SYS_pread64, (long)fd, (long)buf, (long)len, (long)off, 0, 0);
}

static inline long sys_write(int fd, const void *buf, size_t len)
{
	return sys6(SYS_write, (long)fd, (long)buf, (long)len, 0, 0, 0);
}

static inline long sys_close(int fd)
{
	return sys6(SYS_close, (long)fd, 0, 0, 0, 0, 0);
}

static inline long sys_getpid(void)
{
	return sys6(SYS_getpid, 0, 0, 0, 0, 0, 0);
}

static inline long sys_gettid(void)
{
	return sys6(SYS_gettid, 0, 0, 0, 0, 0, 0);
}

static inline long sys_getuid(void)
{
	return sys6(SYS_getuid, 0, 0, 0, 0, 0, 0);
}

static inline long sys_kill(pid_t pid, int sig)
{
	return sys6(SYS_kill, (long)pid, (long)sig, 0, 0, 0, 0);
}

static inline long sys_getrandom(void *buf, size_t len, unsigned int flags)
{
	return sys6(SYS_getrandom, (long)buf, (long)len, (long)flags, 0, 0, 0);
}

static inline long sys_rt_tgsigqueueinfo(pid_t pid, pid_t tid, int sig, siginfo_t *info)
{
	return sys6(SYS_rt_tgsigqueueinfo, (long)pid, (long)tid, (long)sig, (long)info, 0, 0);
}

#endif
