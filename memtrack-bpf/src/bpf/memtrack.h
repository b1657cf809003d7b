/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The one definition of the event ABI between memtrack's BPF program and user space.
 *
 * The Rust mirror is `memtrack_bpf::RawEvent` / `memtrack_bpf::RawStats`, whose size and
 * alignment are asserted at compile time; change both together. The kind numbers are
 * `memtrack::KindTag`'s.
 */
#ifndef MEMTRACK_H
#define MEMTRACK_H

#define MT_KIND_MALLOC 1
#define MT_KIND_CALLOC 2
#define MT_KIND_REALLOC 3
#define MT_KIND_ALIGNED_ALLOC 4
#define MT_KIND_FREE 5
#define MT_KIND_MMAP 6
#define MT_KIND_MUNMAP 7
#define MT_KIND_MREMAP 8
#define MT_KIND_BRK 9
#define MT_KIND_EXEC 10 /* the process replaced its image (execve): its heap ends here */
#define MT_KIND_SWITCH_OUT 11 /* the thread left the CPU (lock waits): `size` 1 if preempted */
#define MT_KIND_SWITCH_IN 12  /* the thread got a CPU again (lock waits) */
#define MT_KIND_THREAD_START 13 /* the thread was created, at `ts`: before its first SwitchIn */
#define MT_KIND_THREAD_EXIT 14  /* the thread left the CPU for the last time: it ended */
#define MT_KIND_ITERATION_START 15 /* written by user space, never by this program */
#define MT_KIND_ITERATION_END 16   /* written by user space, never by this program */

/* Bits of the runtime switch (`sw.enabled` in .bss). Mirrored by `memtrack_bpf::SWITCH_*`. */
#define MT_SWITCH_STREAM 1 /* record events into the ring buffer (and count them) */
#define MT_SWITCH_COUNT 2  /* only count allocations, frees and bytes */

/* `sw.scope`: which threads of the target are recorded. Mirrored by `memtrack_bpf::SCOPE_*`. */
#define MT_SCOPE_PROCESS 0 /* every thread (but memtrack's own) */
#define MT_SCOPE_THREADS 1 /* threads marked with the current generation, and those they spawn */

/*
 * The runtime switch: the whole `.bss` (user space writes all of it at once). Mirrored by
 * `memtrack_bpf::RawSwitch`.
 */
struct memtrack_switch {
	unsigned int enabled;    /* MT_SWITCH_* bits; 0 = off */
	unsigned int scope;      /* MT_SCOPE_* */
	unsigned int generation; /* the current recording's number: marks older than it are stale */
	unsigned int caller;     /* MT_SCOPE_THREADS: the thread of the session's running call, in
				    its scope with the threads marked (0: none) */
};

/*
 * Entry shapes: the BPF cookie of each entry-probe site (one uprobe_multi link per file carries
 * all of them), telling `mt_entry` where the arguments are. Mirrored by
 * `memtrack_bpf::Entry`.
 */
#define MT_ENTRY_MALLOC 1             /* (size) -> Malloc */
#define MT_ENTRY_CALLOC 2             /* (n, size) -> Calloc n*size */
#define MT_ENTRY_ZALLOC 3             /* (size) -> Calloc */
#define MT_ENTRY_MALLOCN 4            /* (n, size) -> Malloc n*size */
#define MT_ENTRY_REALLOC 5            /* (p, size) -> Realloc */
#define MT_ENTRY_REALLOCARRAY 6       /* (p, n, size) -> Realloc n*size */
#define MT_ENTRY_MEMALIGN 7           /* (align, size) -> AlignedAlloc */
#define MT_ENTRY_ALIGNED_SIZE_FIRST 8 /* (size, align) -> AlignedAlloc */
#define MT_ENTRY_POSIX_MEMALIGN 9     /* (void **p, align, size) -> AlignedAlloc *p */
#define MT_ENTRY_VALLOC 10            /* (size) -> AlignedAlloc, page aligned */
#define MT_ENTRY_MALLOCX 11           /* jemalloc (size, flags) */
#define MT_ENTRY_RALLOCX 12           /* jemalloc (p, size, flags) -> Realloc */
#define MT_ENTRY_FREE 13              /* (p) -> Free; no return probe */
#define MT_ENTRY_FREE_OUTER 14        /* (p) -> Free; brackets a nested free (operator delete) */
/* libc's syscall wrappers (entry + return; the return probe carries the same cookie). */
#define MT_ENTRY_MMAP 15              /* (addr, len, ...) -> Mmap of the result */
#define MT_ENTRY_MUNMAP 16            /* (addr, len) -> Munmap when it returns 0 */
#define MT_ENTRY_MREMAP 17            /* (old, old_len, new_len, ...) -> Mremap of the result */
#define MT_ENTRY_BRK 18               /* (addr) -> Brk when it returns 0 */

/*
 * A site's cookie is its MT_ENTRY_* in the low byte and, above it, where each of the first
 * three arguments is at the probed offset: 4 bits per argument (bits 8-11 the first, 12-15
 * the second, 16-19 the third), an MT_REG_* or 0 for its own register (rdi, rsi, rdx). A probe
 * placed past a prologue that moved an argument (mimalloc's `malloc` copies its size to rsi
 * and loads its heap into rdi) reads it where it went; two arguments the program only
 * multiplies may be one register holding their product and MT_REG_ONE (glibc's reallocarray
 * multiplies n * size before its first branch). Mirrored by `memtrack_bpf::ArgReg`.
 */
#define MT_COOKIE_ENTRY(c) ((c) & 0xff)
#define MT_COOKIE_ARG(c, i) (((c) >> (8 + 4 * (i))) & 0xf)
#define MT_REG_DI 1
#define MT_REG_SI 2
#define MT_REG_DX 3
#define MT_REG_CX 4
#define MT_REG_R8 5
#define MT_REG_R9 6
#define MT_REG_AX 7
#define MT_REG_ONE 8 /* not a register: the constant 1 (a factor already multiplied in) */

/*
 * The ring buffer carries two records, told apart by the u32 at offset 16: an event
 * (`struct memtrack_event`, its `kind` an MT_KIND_*) and a stack (`struct memtrack_stack`, its
 * `record` MT_RECORD_STACK, a number no MT_KIND_* takes).
 */
#define MT_RECORD_STACK 0x100

/* The deepest stack a program can be asked for (`config.stack_depth`): the kernel caps a walk
 * at `kernel.perf_event_max_stack`, 127 by default. */
#define MT_STACK_MAX 127

/*
 * A distinct call stack of one process, sent once, before the first event that names it by its
 * `id`: this 32-byte header, then `nframes` absolute user addresses of process `pid` (u64
 * each), innermost first: the first is the return address into the code that called the
 * allocator. `ts`, `pid` and `record` sit where an event has `ts`, `pid` and `kind`.
 */
struct memtrack_stack {
	unsigned long long ts;   /* bpf_ktime_get_ns() when sent: which image of `pid` it is in */
	unsigned int pid;        /* tgid: the addresses are this process's */
	unsigned int id;         /* >= 1, unique in the loaded program's life */
	unsigned int record;     /* MT_RECORD_STACK */
	unsigned int nframes;    /* 0..MT_STACK_MAX */
	unsigned int flags;      /* MT_STACK_* */
	/* Bit k (1..15) set: the word 8k bytes above sp is one of the frames after frame 1, in
	 * the order of k, and frame 1 is the word at sp (a blocked thread's switch-out). The
	 * words are those pointing into the code mapping of frame 0: which one is the return
	 * address, if any, the caller of frame 0's function, only its unwind info says. */
	unsigned int scanned;
};
#define MT_STACK_TRUNCATED 1 /* the walk went on past `config.stack_depth` frames: cut there */
#define MT_STACK_SCAN_WORDS 16 /* words read at sp for `scanned` */

/*
 * One ring-buffer event: 56 bytes, 8-aligned (64 with the ring buffer's 8-byte header).
 *
 * Allocations (Malloc, Calloc, Realloc, AlignedAlloc), mappings (Mmap, Mremap) and switch-outs
 * (SwitchOut) carry a stack when stacks are on; frees and the rest never do.
 *
 * Field use per kind (unused fields are 0):
 *   Malloc, Calloc, Mmap, Munmap: addr, size
 *   Realloc, Mremap:              addr (new), old_addr, size (new)
 *   AlignedAlloc:                 addr, size, align
 *   Free:                         addr
 *   Brk:                          addr (the new break)
 *   SwitchOut:                    size (1: preempted, still runnable; 0: it blocked), stack
 *   SwitchIn:                     nothing
 */
struct memtrack_event {
	unsigned long long ts;       /* bpf_ktime_get_ns(): CLOCK_MONOTONIC nanoseconds */
	unsigned int pid;            /* tgid */
	unsigned int tid;            /* kernel pid of the thread */
	unsigned int kind;           /* MT_KIND_* */
	unsigned int stack;          /* the `memtrack_stack` id of its call stack; 0: none */
	unsigned long long addr;
	unsigned long long old_addr;
	unsigned long long size;     /* bytes */
	unsigned long long align;    /* bytes */
};

/* Per-CPU counters (one slot of the `stats` PERCPU_ARRAY); user space sums the CPUs. */
struct memtrack_stats {
	unsigned long long allocs;      /* Malloc + Calloc + Realloc + AlignedAlloc events */
	unsigned long long alloc_bytes; /* their sizes, bytes */
	unsigned long long frees;       /* Free events (incl. realloc(p, 0)) */
	unsigned long long drops;       /* events lost: ring buffer reservation failed */
	unsigned long long out_of_scope; /* allocator calls of the target's threads outside the
					    scope (MT_SCOPE_THREADS), not recorded */
	unsigned long long unfollowed;  /* processes the target started, not followed
					   (MT_FOLLOW_COUNT) */
	unsigned long long stacks;      /* stack records sent */
	unsigned long long stacks_truncated; /* of them, cut at config.stack_depth */
	unsigned long long stack_collisions; /* first hash matched, second did not: sent again
						 under a new id */
	unsigned long long stack_map_full;   /* new stacks sent without being remembered (the
						 `stack_ids` map was full): sent again when seen again */
	unsigned long long stacks_lost;      /* stacks not sent (ring buffer full, or the scratch
						 record in use by a preempted program): their
						 event carries none; counted in `drops` too */
};

/*
 * Load-time settings: the whole `.rodata` section (`const volatile` in the program), written by
 * user space before load. Nothing else may live in `.rodata` (user space checks the size).
 */
struct memtrack_config {
	unsigned int target_tgid;             /* the only process recorded (follow == 0) */
	unsigned int follow;                  /* MT_FOLLOW_*: what the target's children are */
	unsigned long long wakeup_bytes;      /* force a wakeup once this much data is unconsumed */
	unsigned long long page_size;         /* alignment reported for valloc/pvalloc, bytes */
	unsigned int stack_depth;             /* frames per stack, 0..MT_STACK_MAX; 0: no stacks */
	unsigned int fallbacks;               /* MT_FALLBACK_*: what the running kernel lacks */
};

/*
 * `config.fallbacks`: the older way taken where the running kernel lacks a feature (user space
 * probes them). Mirrored by `memtrack_bpf::FALLBACK_*`.
 */
#define MT_FALLBACK_TID_STATE 1 /* per-thread state in `calls_tid`, keyed by tid, not in task
				   storage (no thread pidfds, or no task storage in uprobes) */
#define MT_FALLBACK_NO_FIND_VMA 2 /* no bpf_find_vma: a blocked switch-out's stack has no
				     `scanned` words */
#define MT_FALLBACK_NO_LOOP 4 /* no bpf_loop: the stack walk's steps in a bounded loop */

/* `config.follow`. Mirrored by `memtrack_bpf::FOLLOW_*`. */
#define MT_FOLLOW_NONE 0  /* the target alone (an in-process session) */
#define MT_FOLLOW_TREE 1  /* the processes in the `followed` map (a tracer adds them) */
#define MT_FOLLOW_COUNT 2 /* the target alone; the processes it starts are counted */

/* The signal `mt_dl_state` stops a thread with (Linux's SIGSTOP on every architecture). */
#define MT_SIGSTOP 19

#endif
