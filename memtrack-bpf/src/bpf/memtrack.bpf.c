// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * memtrack's allocation tracker: uprobes on allocator entry points (entry + return where the
 * result is needed) and on libc's mmap/munmap/mremap/brk wrappers, for ONE process
 * (config.target_tgid); a tp_btf/sys_exit program records those syscalls instead when raw
 * syscalls are asked for. Every event goes into the `events` ring buffer as a
 * `struct memtrack_event` (memtrack.h).
 *
 * Nesting: allocator entry points call each other (operator new -> malloc, delete -> free,
 * realloc(NULL, n) -> malloc, reallocarray -> realloc). Only the outermost call of a thread
 * produces an event. Each thread has a `call_state` holding the depth of the outermost probed
 * call in progress and the stack pointer at its entry. An entry with a lower stack pointer is
 * nested inside it; one with the same or a higher stack pointer replaces it (a tail call -- the
 * outer frame is gone -- or an outer call whose return was never seen, e.g. an exception thrown
 * out of operator new).
 *
 * Stacks: every allocation and mapping event is emitted at its call's return (mt_ret), where
 * the user stack walk is whole: ip is the caller's return site and rbp is restored, so a
 * frame-pointer walk gives the call site first and then each caller. (At an entry probe it
 * would skip the caller, whose return address is at the stack pointer, not above a saved rbp:
 * glibc's allocators begin with `push %r12`, not the `push %rbp`/`endbr64` for which the
 * kernel adds it.) Raw syscalls (mt_sys_exit) are walked from the user registers at the
 * syscall's exit: ip is in libc's frameless wrapper, so the wrapper's caller is missing.
 * Each distinct stack is sent once, as its own `struct memtrack_stack` record before the first
 * event naming its id; see `stack_id`.
 *
 * Cost: events are submitted with BPF_RB_NO_WAKEUP (a wakeup per event would cost more than
 * the event: see WAKEUP_WINDOW) and a wakeup is forced only when unconsumed data crosses
 * `wakeup_bytes`; user space also drains on a timer.
 */
#include "bpf_min.h"
#include "memtrack.h"

char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Load-time settings: the only thing in .rodata (user space checks its size). */
const volatile struct memtrack_config config = {
	.target_tgid = 0,
	.wakeup_bytes = 65536,
	.page_size = 4096,
	.stack_depth = 64,
};

/*
 * Runtime switch written by user space (the only thing in .bss). `enabled` has MT_SWITCH_*
 * bits: STREAM records events into the ring buffer, COUNT only keeps the counters (a criterion
 * measurement reads them without the cost of the event stream); 0 = off. `scope` says which
 * threads are recorded; `generation` numbers the recordings so that a thread's marks from an
 * earlier one (its scope, a call whose return was never seen because the probes were detached
 * in between) are stale.
 */
volatile struct memtrack_switch sw;

/*
 * Keeps `struct memtrack_event` in the object's BTF (a ring buffer's records have no declared
 * type) so that a test can check the Rust mirror against it. Never read or written.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct memtrack_event);
} event_abi SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024 * 1024); /* default; user space sets the size at load */
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct memtrack_stats);
} stats SEC(".maps");

/*
 * Stacks already sent, by hash (see `stack_id`): key the first 64-bit hash of (frames, flags,
 * process, address space), value the second, independent hash and the id it was sent under.
 * Never a BPF_MAP_TYPE_STACK_TRACE: on a collision it returns -EEXIST, or with
 * BPF_F_REUSE_STACKID overwrites the slot so that an old id names a new stack. Sized by user
 * space at load; when full, new stacks are sent every time (`stack_map_full`).
 */
struct stack_seen {
	__u64 hash2;
	__u32 id;
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536);
	__type(key, __u64);
	__type(value, struct stack_seen);
} stack_ids SEC(".maps");

/* The last stack id handed out (ids start at 1; 0 means no stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} stack_next SEC(".maps");

/* A stack record being built: one more frame than the deepest stack, to tell a stack of
 * exactly `stack_depth` frames from one cut there, and the window of user stack the walk reads
 * frames from. Per CPU (too big for the BPF stack).
 *
 * Two of them, because a program using one can be preempted on a preemptible kernel: uprobe
 * programs run with migration, not preemption, disabled (and so may tp_btf/sys_exit, a
 * faultable tracepoint on recent kernels). The thread's own switch-out then runs mt_switch on
 * the same CPU mid-walk: mt_switch has `switch_scratch` to itself (it runs with preemption off
 * and never nests). Another thread's program on that CPU finds `stack_scratch` claimed
 * (`busy`) and sends its event without a stack, counted in `stacks_lost` and `drops`. */
/* Bytes of user stack read at once by the walk (a power of two). */
#define STACK_CHUNK 1024
struct stack_buf {
	struct memtrack_stack hdr;
	__u64 frames[MT_STACK_MAX + 1];
	__u8 chunk[STACK_CHUNK];
	__u64 h1, h2; /* the stack's two hashes (see stack_id) */
	__u32 busy;   /* stack_scratch only: a program is building a stack in it */
	__u32 reserved;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_buf);
} stack_scratch SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct stack_buf);
} switch_scratch SEC(".maps");

/* Keeps `struct memtrack_stack` in the object's BTF for the ABI test (never used). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct memtrack_stack);
} stack_abi SEC(".maps");

/*
 * Per-thread state (task-local storage: no size limit, freed when the thread exits, and a
 * cheaper lookup than a hash map): memtrack's exclusion flag and the outermost probed
 * allocator call in progress. User space writes `excluded` (the first u32) for memtrack's own
 * threads, keyed by a thread pidfd (by tid in `calls_tid`, with MT_FALLBACK_TID_STATE).
 */
struct call_state {
	__u32 excluded; /* 1: a memtrack thread, never recorded */
	__u32 depth;    /* 0: no call in progress (or call_gen is stale) */
	__u32 scope_gen; /* in the scope of recording `scope_gen` (MT_SCOPE_THREADS) */
	__u32 call_gen;  /* the generation in which `depth` was set */
	__u64 sp;       /* stack pointer at the outer call's entry */
	__u64 addr;     /* old block (realloc, free-like), memptr (posix_memalign) */
	__u64 size;
	__u64 align;
	__u32 kind;     /* MT_KIND_* of the outer call */
	__u32 flags;    /* CS_* */
	/* The syscall wrapper call in progress (they nest inside allocator calls, never in each
	 * other: malloc -> sbrk -> brk is probed at brk only). */
	__u32 sys_entry; /* MT_ENTRY_MMAP..MT_ENTRY_BRK; 0: none (or sys_gen is stale) */
	__u32 sys_gen;   /* the generation in which sys_entry was set */
	__u64 sys_addr;  /* mmap/munmap/mremap/brk's first argument */
	__u64 sys_len;   /* mmap/munmap's length, mremap's new length */
	/* Lock waits: the thread's last recorded switch, in recording `switch_gen` (see mt_switch). */
	__u32 switch_gen;
	__u32 off_cpu;   /* 1: it was a switch-out (no switch-in recorded since) */
	__u64 off_ts;    /* its time */
	/* The code mapping its last blocked switch-out left in (see stack_send); 0, 0: none. */
	__u64 code_lo, code_hi;
};
#define CS_MEMPTR 1 /* posix_memalign: the block is in *addr, the return value is an errno */

struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct call_state);
} calls SEC(".maps");

/*
 * The same state keyed by tid, where the kernel has no thread pidfds for user space to
 * address task storage with, or no task storage in uprobe programs (MT_FALLBACK_TID_STATE;
 * user space creates only one of the two maps). mt_thread_exit deletes a thread's entry when
 * it exits, so a thread that later gets its tid starts afresh. Sized by user space at load;
 * a thread that finds it full records nothing and is counted in `drops`.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct call_state);
} calls_tid SEC(".maps");

/* The value a new `calls_tid` entry starts from (never written; too big for the BPF stack of
 * the programs that create one). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct call_state);
} calls_zero SEC(".maps");

/* The state of `task` (thread `tid`); created if `create`, else NULL when it has none. A
 * state that cannot be created loses the thread's events: counted in `drops`. */
static __always_inline struct call_state *task_state(struct task_struct *task, __u32 tid,
						     int create)
{
	struct call_state *cs, *zero_cs;
	struct memtrack_stats *st;
	__u32 zero = 0;

	if (config.fallbacks & MT_FALLBACK_TID_STATE) {
		cs = bpf_map_lookup_elem(&calls_tid, &tid);
		if (cs || !create)
			return cs;
		zero_cs = bpf_map_lookup_elem(&calls_zero, &zero);
		if (zero_cs)
			bpf_map_update_elem(&calls_tid, &tid, zero_cs, BPF_NOEXIST);
		cs = bpf_map_lookup_elem(&calls_tid, &tid);
	} else {
		cs = bpf_task_storage_get(&calls, task, 0,
					  create ? BPF_LOCAL_STORAGE_GET_F_CREATE : 0);
	}
	if (!cs && create && (st = bpf_map_lookup_elem(&stats, &zero)))
		st->drops++;
	return cs;
}

/* This thread's state; created if `create`, else NULL when it has none. */
static __always_inline struct call_state *thread_state(int create)
{
	return task_state(bpf_get_current_task_btf(), (__u32)bpf_get_current_pid_tgid(), create);
}

/*
 * The processes `record` follows (config.follow): the first one and its descendants, each added
 * by the tracer before it runs an instruction and removed when it exits or execs a program it
 * must not observe (a setuid one). Every process in it has pid-scoped probes of its own.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u32);
} followed SEC(".maps");

/* Whether process `tgid` is recorded: the one target, or (following) one of the followed set. */
static __always_inline int tracked(__u32 tgid)
{
	if (config.follow == MT_FOLLOW_TREE)
		return bpf_map_lookup_elem(&followed, &tgid) != 0;
	return tgid == config.target_tgid;
}

/* The target process, recording on (memtrack's own threads are checked on their state). */
static __always_inline int should_record(__u64 pid_tgid)
{
	return sw.enabled && tracked((__u32)(pid_tgid >> 32));
}

/*
 * Whether a thread of the target (not memtrack's: checked before) is in the recording's scope.
 * A thread outside it is counted in `out_of_scope` when `count` (allocation and free calls),
 * so that a report can say how much of the process it left out.
 */
static __always_inline int in_scope(struct call_state *cs, int count)
{
	__u32 zero = 0;
	struct memtrack_stats *st;

	if (sw.scope == MT_SCOPE_PROCESS || (cs && cs->scope_gen == sw.generation) ||
	    (sw.caller && sw.caller == (__u32)bpf_get_current_pid_tgid()))
		return 1;
	if (count) {
		st = bpf_map_lookup_elem(&stats, &zero);
		if (st)
			st->out_of_scope++;
	}
	return 0;
}

/*
 * Wake the consumer only when unconsumed data crosses the watermark, not for every event
 * above it: a wakeup costs about a microsecond, and at a million events per second the consumer
 * is always behind by more than 64 KiB between its 10 ms drains. The window is a few records
 * wide so that concurrent producers on other CPUs rarely all step over it; if they do, the
 * consumer's timer drain still comes.
 */
#define WAKEUP_WINDOW (8 * (sizeof(struct memtrack_event) + 8))

static __always_inline __u64 wakeup_flag(__u64 avail)
{
	if (avail >= config.wakeup_bytes && avail < config.wakeup_bytes + WAKEUP_WINDOW)
		return BPF_RB_FORCE_WAKEUP;
	return BPF_RB_NO_WAKEUP;
}

static __always_inline __u64 rotl(__u64 x, int r)
{
	return (x << r) | (x >> (64 - r));
}

/* The state of a frame-pointer walk between steps (see stack_walk). */
struct walk {
	struct stack_buf *b;
	__u64 fp;    /* the frame the next step reads */
	__u64 base;  /* the user address `b->chunk` was read from */
	__u32 depth; /* frames to keep */
	__u32 n;     /* frames found so far */
	__u32 have;  /* `b->chunk` holds STACK_CHUNK bytes (else only the 16 at `base`) */
	__u32 first; /* frames before the chain's: ip, then those found at and above sp */
};

/* Step `idx` of the walk: reads frame idx + 1 (bpf_loop callback; 1 stops the loop). */
static int walk_step(__u32 idx, struct walk *w)
{
	struct stack_buf *b = w->b;
	__u64 fp = w->fp, off, next;
	__u32 i = idx + w->first;

	if (!b || i > w->depth || i > MT_STACK_MAX || fp == 0 || (fp & 7))
		return 1;
	off = fp - w->base;
	if (!w->have || fp < w->base || off > STACK_CHUNK - 16) {
		w->base = fp;
		off = 0;
		w->have = 1;
		if (bpf_probe_read_user(b->chunk, STACK_CHUNK, (void *)fp)) {
			/* Near the top of the stack mapping: one frame only. */
			w->have = 0;
			if (bpf_probe_read_user(b->chunk, 16, (void *)fp))
				return 1;
		}
	}
	off &= STACK_CHUNK - 1;
	if (off > STACK_CHUNK - 16)
		return 1;
	next = *(__u64 *)(b->chunk + off);
	b->frames[i & MT_STACK_MAX] = *(__u64 *)(b->chunk + off + 8);
	w->n = i + 1;
	/* The chain must grow towards the stack's base: a broken one stops here. */
	if (next <= fp)
		return 1;
	w->fp = next;
	return 0;
}

/*
 * The walk's steps without bpf_loop (MT_FALLBACK_NO_LOOP): the same steps, at most as many, in
 * a bounded loop, in a global function so that the verifier walks the loop once, not once per
 * stack_walk. Returns how many frames.
 */
__attribute__((noinline)) int walk_chain(struct stack_buf *b, __u64 fp, __u32 first, __u32 depth)
{
	struct walk w = { .b = b, .fp = fp, .depth = depth, .n = first, .first = first };
	__u32 idx;

	if (!b)
		return first;
	for (idx = 0; idx < MT_STACK_MAX; idx++)
		if (walk_step(idx, &w))
			break;
	return w.n;
}

/*
 * Fills `b->frames` with `ip`, then `sp_ret` if it is not 0 (or `b->hdr.scanned` is), then the
 * `scan` words of `b->hdr.scanned`, then the return addresses of the frame-pointer chain from
 * `fp`, at most `depth` of them, and sets `b->hdr.flags` (MT_STACK_TRUNCATED if the chain went
 * on); returns how many frames. The steps run under bpf_loop: the verifier checks a step once,
 * where an unrolled loop of 127 made mt_ret exceed its limit of 1M instructions.
 */
static __always_inline __u32 stack_walk(struct stack_buf *b, __u64 ip, __u64 sp_ret,
					__u64 *scan, __u32 nscan, __u64 fp, __u32 depth)
{
	struct walk w = { .b = b, .fp = fp, .depth = depth, .n = 1, .first = 1 };
	__u32 n, i;

	b->frames[0] = ip;
	if ((sp_ret || b->hdr.scanned) && depth > w.n)
		b->frames[w.n++] = sp_ret;
	for (i = 0; i < MT_STACK_SCAN_WORDS - 1; i++) {
		if (i >= nscan || w.n >= depth)
			break;
		b->frames[w.n++ & MT_STACK_MAX] = scan[i];
	}
	if (w.n < 2 + nscan)
		/* Not all of them fit: none is said to be there. */
		b->hdr.scanned = 0;
	w.first = w.n;
	if (config.fallbacks & MT_FALLBACK_NO_LOOP)
		w.n = walk_chain(b, fp, w.first, depth);
	else
		bpf_loop(MT_STACK_MAX, walk_step, &w, 0);
	n = w.n;
	b->hdr.flags = 0;
	if (n > depth) {
		n = depth;
		b->hdr.flags = MT_STACK_TRUNCATED;
	}
	return n;
}

/*
 * Replaces `b->h1` (the process's tgid on entry) and `b->h2` (its address space's ctx_id) with
 * the two hashes of the stack of `n` frames in `b`. A global function of its own: inlined after
 * the walk, it was verified once per walk length.
 */
__attribute__((noinline)) int stack_hash(struct stack_buf *b, __u32 n)
{
	__u64 h1, h2, f, tgid, ctx_id;
	int i;

	if (!b)
		return 0;
	tgid = b->h1;
	ctx_id = b->h2;
	h1 = 0x9e3779b97f4a7c15ULL ^ tgid ^ ((__u64)b->hdr.flags << 40) ^ ((__u64)b->hdr.scanned << 44);
	h2 = 0xc2b2ae3d27d4eb4fULL + tgid + n;
	h1 ^= ctx_id * 0xff51afd7ed558ccdULL;
	h2 = rotl(h2 ^ ctx_id, 29) * 0xc4ceb9fe1a85ec53ULL;
	for (i = 0; i < MT_STACK_MAX; i++) {
		if (i >= n)
			break;
		f = b->frames[i];
		h1 = (h1 ^ f) * 0x100000001b3ULL;
		h1 ^= h1 >> 29;
		h2 = rotl(h2 + f * 0x9fb21c651e98df25ULL, 31) * 0x87c37b91114253d5ULL;
	}
	b->h1 = h1;
	b->h2 = h2;
	return 0;
}

/*
 * The id of the user stack of `regs` (the user registers; 0: none, or it could not be sent),
 * sending it first if it is new. Called at returns (mt_ret) and at syscall exit (mt_sys_exit):
 * see the file's comment for why the walk is whole at a return.
 *
 * The walk follows the frame-pointer chain itself: `regs->ip` first, then the return address
 * above each saved rbp, while the frame pointer is 8-aligned and grows (a broken chain stops
 * the walk, it never loops). It reads the user stack STACK_CHUNK bytes at a time and finds the
 * frames in that window, reading again only when the chain leaves it: a read per frame, or
 * bpf_get_stack(BPF_F_USER_STACK), costs about as much as the malloc+free pair itself (the
 * `overhead` example of memtrack-bpf measures the walk).
 *
 * No loss, no aliasing: two independent 64-bit hashes over (frames, flags, tgid, the address
 * space's never-reused `ctx_id`: after an exec the same addresses are other code); the first
 * keys `stack_ids`, the second is checked on a hit. A mismatch is a collision: the stack is
 * sent again under a fresh id and counted. The record is sent BEFORE the map learns the id,
 * so an event of another CPU that finds the id in the map is reserved after the record in the
 * ring buffer; two CPUs meeting the same new stack both send it (user space interns frames).
 */
/* bpf_find_vma's callback: the bounds of the mapping found. */
static long code_bounds(struct task_struct *task, struct vm_area_struct *vma, __u64 *bounds)
{
	bounds[0] = vma->vm_start;
	bounds[1] = vma->vm_end;
	return 0;
}

/*
 * Keeps in `scan` (returns how many, and sets their bits in `b->hdr.scanned`) the words above
 * `sp` (read into `b->chunk`) that point into the code mapping holding `ip`: candidates for the
 * return address into the same library. A blocked thread's innermost function in glibc may
 * have pushed registers and made room for locals before its futex syscall
 * (`__futex_abstimed_wait_common`: 56 bytes), so its caller (`pthread_cond_wait`,
 * `pthread_rwlock_rdlock`: what names the wait) is neither at sp nor on a frame-pointer chain,
 * which glibc does not keep; user space picks the slot the function's unwind info names (the
 * others are stale words of earlier calls). The mapping is looked up once per thread and
 * library (bpf_find_vma takes the mmap lock), kept in the thread's state.
 */
static __always_inline __u32 scan_words(struct stack_buf *b, __u64 ip, __u32 words, __u64 *scan)
{
	struct call_state *cs = thread_state(0);
	__u64 bounds[2] = { 0, 0 }, w;
	__u32 i, n = 0;

	b->hdr.scanned = 0;
	if (!cs)
		return 0;
	if (config.fallbacks & MT_FALLBACK_NO_FIND_VMA)
		/* Without the mapping's bounds no word can be told to be code. */
		return 0;
	if (ip < cs->code_lo || ip >= cs->code_hi) {
		if (bpf_find_vma(bpf_get_current_task_btf(), ip, code_bounds, bounds, 0) || !bounds[1])
			return 0;
		cs->code_lo = bounds[0];
		cs->code_hi = bounds[1];
	}
	for (i = 1; i < MT_STACK_SCAN_WORDS; i++) {
		if (i >= words)
			break;
		w = ((__u64 *)b->chunk)[i];
		if (w >= cs->code_lo && w < cs->code_hi) {
			scan[n++ & (MT_STACK_SCAN_WORDS - 1)] = w;
			b->hdr.scanned |= 1u << i;
		}
	}
	return n;
}

static __always_inline __u32 stack_send(struct stack_buf *b, struct pt_regs *regs,
					__u64 pid_tgid, struct memtrack_stats *st, int ret_at_sp)
{
	__u32 zero = 0, depth = config.stack_depth, n, id, words = MT_STACK_SCAN_WORDS, nscan = 0;
	struct stack_seen *seen, fresh = {};
	struct task_struct *task;
	__u64 h1, h2, *next, size, sp_ret = 0, scan[MT_STACK_SCAN_WORDS];

	if (depth > MT_STACK_MAX)
		depth = MT_STACK_MAX;
	task = bpf_get_current_task_btf();
	b->h1 = pid_tgid >> 32;
	b->h2 = task->mm->context.ctx_id;
	/* A thread blocked in a frameless syscall wrapper (glibc's `syscall()`, which std's
	 * futex_wait calls) has its caller's return address at the stack pointer, above no saved
	 * rbp: the chain from rbp starts one frame further out. */
	b->hdr.scanned = 0;
	if (ret_at_sp) {
		/* Near the top of the stack mapping fewer words may be readable: one is enough. */
		if (bpf_probe_read_user(b->chunk, MT_STACK_SCAN_WORDS * 8, (void *)regs->sp)) {
			words = 1;
			if (bpf_probe_read_user(b->chunk, 8, (void *)regs->sp))
				words = 0;
		}
		if (words) {
			sp_ret = *(__u64 *)b->chunk;
			nscan = scan_words(b, regs->ip, words, scan);
		}
	}
	n = stack_walk(b, regs->ip, sp_ret, scan, nscan, regs->bp, depth);
	stack_hash(b, n);
	h1 = b->h1;
	h2 = b->h2;
	seen = bpf_map_lookup_elem(&stack_ids, &h1);
	if (seen && seen->hash2 == h2)
		return seen->id;
	next = bpf_map_lookup_elem(&stack_next, &zero);
	if (!next)
		return 0;
	id = (__u32)__sync_fetch_and_add(next, 1) + 1;
	b->hdr.ts = bpf_ktime_get_ns();
	b->hdr.pid = pid_tgid >> 32;
	b->hdr.id = id;
	b->hdr.record = MT_RECORD_STACK;
	b->hdr.nframes = n;
	/* n <= MT_STACK_MAX (127): the mask only shows the verifier the bound. */
	size = sizeof(b->hdr) + (n & MT_STACK_MAX) * sizeof(__u64);
	if (bpf_ringbuf_output(&events, b, size, BPF_RB_NO_WAKEUP)) {
		if (st) {
			st->stacks_lost++;
			st->drops++;
		}
		return 0;
	}
	if (st) {
		st->stacks++;
		if (b->hdr.flags & MT_STACK_TRUNCATED)
			st->stacks_truncated++;
	}
	if (seen) {
		/* Same first hash, another stack: this id is never remembered. */
		if (st)
			st->stack_collisions++;
		return id;
	}
	fresh.hash2 = h2;
	fresh.id = id;
	/* Another CPU may have remembered the same stack meanwhile (both sent it: harmless). */
	if (bpf_map_update_elem(&stack_ids, &h1, &fresh, BPF_NOEXIST) == -E2BIG && st)
		st->stack_map_full++;
	return id;
}

/* stack_send in this CPU's scratch record: mt_switch's own, or the shared one once claimed
 * (see `stack_scratch`). */
static __always_inline __u32 stack_id(struct pt_regs *regs, __u64 pid_tgid,
				      struct memtrack_stats *st, int ret_at_sp, int from_switch)
{
	__u32 zero = 0, id;
	struct stack_buf *b;

	if (config.stack_depth == 0)
		return 0;
	if (from_switch) {
		b = bpf_map_lookup_elem(&switch_scratch, &zero);
		return b ? stack_send(b, regs, pid_tgid, st, ret_at_sp) : 0;
	}
	b = bpf_map_lookup_elem(&stack_scratch, &zero);
	if (!b)
		return 0;
	if (__sync_lock_test_and_set(&b->busy, 1)) {
		/* A preempted program of another thread is building a stack in it. */
		if (st) {
			st->stacks_lost++;
			st->drops++;
		}
		return 0;
	}
	id = stack_send(b, regs, pid_tgid, st, ret_at_sp);
	b->busy = 0;
	return id;
}

/* Whether events of this kind carry a stack: allocations, new mappings, switch-outs. */
static __always_inline int has_stack(__u32 kind)
{
	return kind <= MT_KIND_ALIGNED_ALLOC || kind == MT_KIND_MMAP || kind == MT_KIND_MREMAP ||
	       kind == MT_KIND_SWITCH_OUT;
}

/* Sends an event stamped `ts` (0: now). */
static __always_inline void emit_at(struct pt_regs *regs, __u64 pid_tgid, __u32 kind,
				    __u64 addr, __u64 old_addr, __u64 size, __u64 align, __u64 ts)
{
	__u32 zero = 0, stack = 0;
	struct memtrack_stats *st = bpf_map_lookup_elem(&stats, &zero);
	struct memtrack_event *e;

	if (st) {
		if (kind == MT_KIND_FREE) {
			st->frees++;
		} else if (kind <= MT_KIND_ALIGNED_ALLOC) {
			st->allocs++;
			st->alloc_bytes += size;
		}
	}
	if (!(sw.enabled & MT_SWITCH_STREAM))
		return;
	if (regs && has_stack(kind))
		/* A thread that blocked (not preempted) is in a syscall: see stack_id. */
		stack = stack_id(regs, pid_tgid, st, kind == MT_KIND_SWITCH_OUT && size == 0,
				 kind == MT_KIND_SWITCH_OUT);
	e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		if (st)
			st->drops++;
		return;
	}
	e->ts = ts ? ts : bpf_ktime_get_ns();
	e->pid = pid_tgid >> 32;
	e->tid = (__u32)pid_tgid;
	e->kind = kind;
	e->stack = stack;
	e->addr = addr;
	e->old_addr = old_addr;
	e->size = size;
	e->align = align;
	bpf_ringbuf_submit(e, wakeup_flag(bpf_ringbuf_query(&events, BPF_RB_AVAIL_DATA)));
}

static __always_inline void emit(struct pt_regs *regs, __u64 pid_tgid, __u32 kind, __u64 addr,
				 __u64 old_addr, __u64 size, __u64 align)
{
	emit_at(regs, pid_tgid, kind, addr, old_addr, size, align, 0);
}

/*
 * A thread's switch-in the kernel did not report (see mt_switch) is recovered from
 * `sched_info.last_arrival`, the runqueue clock when the thread last got a CPU, converted to
 * the events' clock by the runqueue clock's distance from now. In mt_switch the scheduler has
 * just updated that clock; elsewhere it may be a tick old, so each recorded switch keeps its
 * CPU's distance between the two clocks, `rq_offsets`, and a probe in the thread's own code
 * estimates the runqueue clock from it.
 */
struct rq_offset {
	__u64 offset; /* CLOCK_MONOTONIC less the runqueue clock (wrapping) */
	__u64 valid;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rq_offset);
} rq_offsets SEC(".maps");

/* The runqueue clock of `task`'s CPU as the scheduler last updated it; 0: unknown (a kernel
 * without the fields: no CONFIG_SCHED_INFO or CONFIG_FAIR_GROUP_SCHED). */
static __always_inline __u64 rq_clock(struct task_struct *task)
{
	struct cfs_rq *cfs;
	struct rq *rq;

	if (!core_field_exists(task->se.cfs_rq) || !core_field_exists(task->sched_info.last_arrival))
		return 0;
	cfs = task->se.cfs_rq;
	if (!cfs)
		return 0;
	rq = cfs->rq;
	if (!rq)
		return 0;
	return rq->clock;
}

/* When `task` (current) last got a CPU, on the events' clock, `clock` being the runqueue
 * clock at `now`; 0: unknown. */
static __always_inline __u64 last_arrival(struct task_struct *task, __u64 clock, __u64 now)
{
	__u64 arrival;

	if (!clock || !core_field_exists(task->sched_info.last_arrival))
		return 0;
	arrival = task->sched_info.last_arrival;
	if (arrival == 0 || arrival > clock || clock - arrival >= now)
		return 0;
	return now - (clock - arrival);
}

/* Sends the switch-in of a thread whose last recorded switch was a switch-out, recovered (see
 * above), stamped after that switch-out; else counts it as lost: the recording is refused,
 * never paired wrongly. */
static __always_inline void recover_switch_in(struct task_struct *task, struct call_state *cs,
					      __u64 pid_tgid, __u64 clock, __u64 now)
{
	__u64 arrival = last_arrival(task, clock, now);
	struct memtrack_stats *st;
	__u32 zero = 0;

	if (arrival > cs->off_ts)
		emit_at(0, pid_tgid, MT_KIND_SWITCH_IN, 0, 0, 0, 0, arrival);
	else if ((st = bpf_map_lookup_elem(&stats, &zero)))
		st->drops++;
}

/*
 * The thread (current) is running: it is in an allocator call or a syscall of its own. If its
 * last recorded switch was a switch-out, the kernel did not report its switch-in: it is
 * recovered here, before the thread's memory event. Waiting for the thread's next switch-out
 * would not do: the recording may end first (a session's thread that stops it).
 */
static __always_inline void running(struct call_state *cs, __u64 pid_tgid)
{
	struct rq_offset *o;
	__u32 zero = 0;
	__u64 now;

	if (!cs || !cs->off_cpu || cs->switch_gen != sw.generation)
		return;
	cs->off_cpu = 0;
	o = bpf_map_lookup_elem(&rq_offsets, &zero);
	now = bpf_ktime_get_ns();
	recover_switch_in(bpf_get_current_task_btf(), cs, pid_tgid,
			  o && o->valid ? now - o->offset : 0, now);
}

/* Entry of an allocator call whose result comes at return (paired with mt_ret). */
static __always_inline int enter(struct pt_regs *ctx, __u32 kind, __u64 addr, __u64 size,
				 __u64 align, __u32 flags)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 sp = ctx->sp;
	struct call_state *cs;

	if (!should_record(pid_tgid))
		return 0;
	cs = thread_state(1);
	if (!cs || cs->excluded || !in_scope(cs, 1))
		return 0;
	if (cs->call_gen != sw.generation)
		cs->depth = 0;
	if (cs->depth > 0 && sp < cs->sp) {
		cs->depth++;
		return 0;
	}
	cs->sp = sp;
	cs->depth = 1;
	cs->call_gen = sw.generation;
	cs->kind = kind;
	cs->flags = flags;
	cs->addr = addr;
	cs->size = size;
	cs->align = align;
	return 0;
}

/* A free-like entry is nested if an outer call is in progress deeper in the stack, or if it is
 * the tail call of an outer free-like of the same block (delete(p) -> jmp free(p)). */
static __always_inline int nested_free(struct call_state *cs, __u64 sp, __u64 addr)
{
	if (!cs || cs->depth == 0 || cs->call_gen != sw.generation)
		return 0;
	return sp < cs->sp || (sp == cs->sp && cs->kind == MT_KIND_FREE && cs->addr == addr);
}

/* The registers an argument can be in at a probed offset. Loaded all at once: a switch over
 * `ctx` fields would be compiled into one load at a computed offset, which the verifier
 * refuses (a modified ctx pointer). */
struct regs {
	__u64 di, si, dx, cx, r8, r9, ax;
};

/* Argument `i` (0-2) of the call: in the register the site's cookie names (MT_COOKIE_ARG),
 * else in its own. */
static __always_inline __u64 arg(const struct regs *r, __u64 cookie, int i)
{
	switch (MT_COOKIE_ARG(cookie, i)) {
	case MT_REG_DI:
		return r->di;
	case MT_REG_SI:
		return r->si;
	case MT_REG_DX:
		return r->dx;
	case MT_REG_CX:
		return r->cx;
	case MT_REG_R8:
		return r->r8;
	case MT_REG_R9:
		return r->r9;
	case MT_REG_AX:
		return r->ax;
	case MT_REG_ONE:
		return 1;
	}
	return i == 0 ? r->di : i == 1 ? r->si : r->dx;
}

/* The first three arguments of the probed call, wherever its prologue put them. */
struct args {
	__u64 a0, a1, a2;
};

static __always_inline int mt_malloc(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_MALLOC, 0, a.a0, 0, 0);
}

static __always_inline int mt_calloc(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_CALLOC, 0, a.a0 * a.a1, 0, 0);
}

/* mi_zalloc(size) and friends: zeroed, one size argument. */
static __always_inline int mt_zalloc(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_CALLOC, 0, a.a0, 0, 0);
}

/* mi_mallocn(count, size). */
static __always_inline int mt_mallocn(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_MALLOC, 0, a.a0 * a.a1, 0, 0);
}

static __always_inline int mt_realloc(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_REALLOC, a.a0, a.a1, 0, 0);
}

/* reallocarray(p, nmemb, size), mi_reallocn(p, count, size). */
static __always_inline int mt_reallocarray(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_REALLOC, a.a0, a.a1 * a.a2, 0, 0);
}

/* memalign(align, size), aligned_alloc(align, size). */
static __always_inline int mt_memalign(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_ALIGNED_ALLOC, 0, a.a1, a.a0, 0);
}

/* operator new(size, align_val_t), mi_malloc_aligned(size, align), mi_zalloc_aligned. */
static __always_inline int mt_aligned_size_first(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_ALIGNED_ALLOC, 0, a.a0, a.a1, 0);
}

/* posix_memalign(void **memptr, align, size): the block is *memptr when it returns 0. */
static __always_inline int mt_posix_memalign(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_ALIGNED_ALLOC, a.a0, a.a2, a.a1, CS_MEMPTR);
}

/* valloc(size), pvalloc(size): page-aligned. */
static __always_inline int mt_valloc(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_ALIGNED_ALLOC, 0, a.a0, config.page_size, 0);
}

/* jemalloc flags: low 6 bits = log2(alignment) (0: none), 0x40 = MALLOCX_ZERO. */
static __always_inline __u64 mallocx_align(__u64 flags)
{
	__u64 lg = flags & 0x3f;

	return lg ? 1ULL << lg : 0;
}

/* mallocx(size, flags). */
static __always_inline int mt_mallocx(struct pt_regs *ctx, struct args a)
{
	__u64 align = mallocx_align(a.a1);
	__u32 kind = align ? MT_KIND_ALIGNED_ALLOC
			   : (a.a1 & 0x40) ? MT_KIND_CALLOC : MT_KIND_MALLOC;

	return enter(ctx, kind, 0, a.a0, align, 0);
}

/* rallocx(p, size, flags). */
static __always_inline int mt_rallocx(struct pt_regs *ctx, struct args a)
{
	return enter(ctx, MT_KIND_REALLOC, a.a0, a.a1, 0, 0);
}

/*
 * libc's mmap/munmap/mremap/brk wrappers (entry + return): the same functions malloc calls
 * internally (`__mmap` is `mmap`), probed for the target's pid only, so other processes pay
 * nothing (the tp_btf/sys_exit program below slows every syscall on the machine). Raw
 * syscalls that bypass libc (the dynamic loader's own mappings, syscall(2), static or
 * non-glibc programs) are not seen; mt_sys_exit records those when asked for.
 */
static __always_inline int sys_enter(struct pt_regs *ctx, __u32 entry, __u64 addr, __u64 len)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct call_state *cs;

	if (!should_record(pid_tgid))
		return 0;
	cs = thread_state(1);
	if (!cs || cs->excluded || !in_scope(cs, 0))
		return 0;
	cs->sys_entry = entry;
	cs->sys_gen = sw.generation;
	cs->sys_addr = addr;
	cs->sys_len = len;
	return 0;
}

/* The wrapper's return: -1 (MAP_FAILED) is an error for all four; munmap and brk return 0. */
static __always_inline int sys_ret(struct pt_regs *ctx, __u64 pid_tgid, __u64 ret)
{
	struct call_state *cs = thread_state(0);
	__u32 entry;

	if (!cs || cs->sys_entry == 0 || cs->sys_gen != sw.generation)
		return 0;
	entry = cs->sys_entry;
	cs->sys_entry = 0;
	if (!sw.enabled || ret == (__u64)-1)
		return 0;
	running(cs, pid_tgid);
	switch (entry) {
	case MT_ENTRY_MMAP:
		emit(ctx, pid_tgid, MT_KIND_MMAP, ret, 0, cs->sys_len, 0);
		break;
	case MT_ENTRY_MUNMAP:
		if (ret == 0)
			emit(ctx, pid_tgid, MT_KIND_MUNMAP, cs->sys_addr, 0, cs->sys_len, 0);
		break;
	case MT_ENTRY_MREMAP:
		emit(ctx, pid_tgid, MT_KIND_MREMAP, ret, cs->sys_addr, cs->sys_len, 0);
		break;
	case MT_ENTRY_BRK:
		/* brk(0) only asks for the break. */
		if (ret == 0 && cs->sys_addr)
			emit(ctx, pid_tgid, MT_KIND_BRK, cs->sys_addr, 0, 0, 0);
		break;
	}
	return 0;
}

/* The return of every probed allocation call (only the outermost emits) and syscall wrapper
 * (its cookie says which). */
SEC("uretprobe.multi")
int mt_ret(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 ret = ctx->ax;
	struct call_state *cs;

	if (!tracked((__u32)(pid_tgid >> 32)))
		return 0;
	if (MT_COOKIE_ENTRY(bpf_get_attach_cookie(ctx)) >= MT_ENTRY_MMAP)
		return sys_ret(ctx, pid_tgid, ret);
	cs = thread_state(0);
	if (!cs || cs->depth == 0 || cs->call_gen != sw.generation)
		return 0;
	if (--cs->depth > 0)
		return 0;
	/* The outer call was entered while recording; drop it if recording stopped since. */
	if (!sw.enabled)
		return 0;
	running(cs, pid_tgid);
	switch (cs->kind) {
	case MT_KIND_FREE:
		/* operator delete: emitted at entry. */
		return 0;
	case MT_KIND_REALLOC:
		if (ret) {
			if (cs->addr)
				emit(ctx, pid_tgid, MT_KIND_REALLOC, ret, cs->addr, cs->size, 0);
			else
				emit(ctx, pid_tgid, MT_KIND_MALLOC, ret, 0, cs->size, 0);
		} else if (cs->size == 0 && cs->addr) {
			/* glibc's realloc(p, 0) frees p and returns NULL. */
			emit(0, pid_tgid, MT_KIND_FREE, cs->addr, 0, 0, 0);
		}
		return 0;
	default:
		if (cs->flags & CS_MEMPTR) {
			__u64 block = 0;

			if ((__u32)ret != 0)
				return 0;
			if (bpf_probe_read_user(&block, sizeof(block), (void *)cs->addr) || !block)
				return 0;
			ret = block;
		}
		if (ret)
			emit(ctx, pid_tgid, cs->kind, ret, 0, cs->size, cs->align);
		return 0;
	}
}

/* free(p), dallocx(p, flags), sdallocx(p, size, flags), mi_free*: entry only. */
static __always_inline int mt_free(struct pt_regs *ctx, struct args a)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 addr = a.a0;
	struct call_state *cs;

	if (!addr || !should_record(pid_tgid))
		return 0;
	cs = thread_state(0);
	if (cs && (cs->excluded || nested_free(cs, ctx->sp, addr)))
		return 0;
	if (!in_scope(cs, 1))
		return 0;
	running(cs, pid_tgid);
	emit(0, pid_tgid, MT_KIND_FREE, addr, 0, 0, 0);
	return 0;
}

/* operator delete and friends: they call free, so they bracket it (paired with mt_ret). The
 * event is emitted at entry, before another thread can be handed the same block. */
static __always_inline int mt_free_outer(struct pt_regs *ctx, struct args a)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	__u64 addr = a.a0;
	__u64 sp = ctx->sp;
	struct call_state *cs;

	if (!should_record(pid_tgid))
		return 0;
	cs = thread_state(1);
	if (!cs || cs->excluded || !in_scope(cs, 1))
		return 0;
	if (nested_free(cs, sp, addr)) {
		cs->depth++;
		return 0;
	}
	cs->sp = sp;
	cs->depth = 1;
	cs->call_gen = sw.generation;
	cs->kind = MT_KIND_FREE;
	cs->flags = 0;
	cs->addr = addr;
	cs->size = 0;
	cs->align = 0;
	running(cs, pid_tgid);
	if (addr)
		emit(0, pid_tgid, MT_KIND_FREE, addr, 0, 0, 0);
	return 0;
}

/*
 * Every entry probe: one program for all sites of a file (one uprobe_multi link: detaching a
 * link waits tens of ms for the kernel to synchronise, so a link per site would make `record`
 * of a C++ program take seconds). The site's cookie says which entry point it is.
 */
SEC("uprobe.multi")
int mt_entry(struct pt_regs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct regs r = {
		.di = ctx->di,
		.si = ctx->si,
		.dx = ctx->dx,
		.cx = ctx->cx,
		.r8 = ctx->r8,
		.r9 = ctx->r9,
		.ax = ctx->ax,
	};
	struct args a = {
		.a0 = arg(&r, cookie, 0),
		.a1 = arg(&r, cookie, 1),
		.a2 = arg(&r, cookie, 2),
	};

	switch (MT_COOKIE_ENTRY(cookie)) {
	case MT_ENTRY_MALLOC:
		return mt_malloc(ctx, a);
	case MT_ENTRY_CALLOC:
		return mt_calloc(ctx, a);
	case MT_ENTRY_ZALLOC:
		return mt_zalloc(ctx, a);
	case MT_ENTRY_MALLOCN:
		return mt_mallocn(ctx, a);
	case MT_ENTRY_REALLOC:
		return mt_realloc(ctx, a);
	case MT_ENTRY_REALLOCARRAY:
		return mt_reallocarray(ctx, a);
	case MT_ENTRY_MEMALIGN:
		return mt_memalign(ctx, a);
	case MT_ENTRY_ALIGNED_SIZE_FIRST:
		return mt_aligned_size_first(ctx, a);
	case MT_ENTRY_POSIX_MEMALIGN:
		return mt_posix_memalign(ctx, a);
	case MT_ENTRY_VALLOC:
		return mt_valloc(ctx, a);
	case MT_ENTRY_MALLOCX:
		return mt_mallocx(ctx, a);
	case MT_ENTRY_RALLOCX:
		return mt_rallocx(ctx, a);
	case MT_ENTRY_FREE:
		return mt_free(ctx, a);
	case MT_ENTRY_FREE_OUTER:
		return mt_free_outer(ctx, a);
	case MT_ENTRY_MMAP:
	case MT_ENTRY_MUNMAP:
		return sys_enter(ctx, MT_COOKIE_ENTRY(cookie), a.a0, a.a1);
	case MT_ENTRY_MREMAP:
		return sys_enter(ctx, MT_ENTRY_MREMAP, a.a0, a.a2);
	case MT_ENTRY_BRK:
		return sys_enter(ctx, MT_ENTRY_BRK, a.a0, 0);
	}
	return 0;
}

/*
 * Raw syscalls (only when asked for: the default is the wrapper probes above):
 * tp_btf/sys_exit(struct pt_regs *regs, long ret) only. At exit the saved user
 * registers still hold the number (orig_ax) and the arguments of these four syscalls, so no
 * sys_enter program and no per-thread state are needed. Any syscall tracepoint puts every
 * syscall of every process on the slow path (the guide's performance page gives the cost);
 * one program instead of sys_enter + sys_exit halves the BPF part. (fexit on the syscalls
 * themselves would cost nothing elsewhere but needs ftrace direct calls, which kernels without
 * them refuse with -EPERM.)
 */
#define NR_MMAP 9
#define NR_MUNMAP 11
#define NR_BRK 12
#define NR_MREMAP 25

SEC("tp_btf/sys_exit")
int mt_sys_exit(__u64 *ctx)
{
	struct pt_regs *regs = (struct pt_regs *)ctx[0];
	__s64 ret = (__s64)ctx[1];
	__u64 pid_tgid = bpf_get_current_pid_tgid();
	struct call_state *cs;
	__u64 nr;

	if (!tracked((__u32)(pid_tgid >> 32)))
		return 0;
	nr = regs->orig_ax;
	if (nr != NR_MMAP && nr != NR_MUNMAP && nr != NR_MREMAP && nr != NR_BRK)
		return 0;
	/* -4095..-1 are errnos. */
	if ((ret < 0 && ret >= -4095) || !sw.enabled)
		return 0;
	cs = thread_state(0);
	if ((cs && cs->excluded) || !in_scope(cs, 0))
		return 0;
	running(cs, pid_tgid);
	switch (nr) {
	case NR_MMAP: /* mmap(addr, len, ...) -> the mapping */
		emit(regs, pid_tgid, MT_KIND_MMAP, ret, 0, regs->si, 0);
		break;
	case NR_MUNMAP: /* munmap(addr, len) -> 0 */
		emit(regs, pid_tgid, MT_KIND_MUNMAP, regs->di, 0, regs->si, 0);
		break;
	case NR_MREMAP: /* mremap(old, old_len, new_len, ...) -> the new address */
		emit(regs, pid_tgid, MT_KIND_MREMAP, ret, regs->di, regs->dx, 0);
		break;
	case NR_BRK:
		/* brk(0) only asks for the break; brk(x) returning the old break failed. */
		if (regs->di && (__u64)ret == regs->di)
			emit(regs, pid_tgid, MT_KIND_BRK, ret, 0, 0, 0);
		break;
	}
	return 0;
}

/*
 * A thread of the target spawned by a thread in the recording's scope joins the scope
 * (MT_SCOPE_THREADS: a session covers the thread that started it and every thread it spawns,
 * so that parallel tests of one process are told apart); a process the target starts is
 * counted as not followed (MT_FOLLOW_COUNT: `record --no-follow`). Attached only while
 * recording with that scope or mode: it runs for every fork and thread creation on the machine.
 */
SEC("tp_btf/sched_process_fork")
int mt_fork(__u64 *ctx)
{
	struct task_struct *child = (struct task_struct *)ctx[1];
	struct call_state *parent_cs, *child_cs;
	struct memtrack_stats *st;
	__u32 zero = 0;

	if ((__u32)(bpf_get_current_pid_tgid() >> 32) != config.target_tgid || !sw.enabled)
		return 0;
	/* fork() makes another process: only new threads of the target join. */
	if ((__u32)child->tgid != config.target_tgid) {
		if (config.follow == MT_FOLLOW_COUNT) {
			st = bpf_map_lookup_elem(&stats, &zero);
			if (st)
				st->unfollowed++;
		}
		return 0;
	}
	if (sw.scope != MT_SCOPE_THREADS)
		return 0;
	parent_cs = thread_state(0);
	if (parent_cs && parent_cs->excluded)
		return 0;
	if (!(sw.caller && sw.caller == (__u32)bpf_get_current_pid_tgid()) &&
	    (!parent_cs || parent_cs->scope_gen != sw.generation))
		return 0;
	child_cs = task_state(child, (__u32)child->pid, 1);
	if (child_cs)
		child_cs->scope_gen = sw.generation;
	return 0;
}

/*
 * The target replaced its image (execve succeeded): the old image's heap is gone, so its live
 * blocks must not be carried into the new one. Runs in the exec'ing task after the new image
 * is set up, before it runs. Attached only while recording (it runs for every exec on the
 * machine, which is rare: one comparison each).
 */
SEC("tp_btf/sched_process_exec")
int mt_exec(__u64 *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();

	if (!(sw.enabled & MT_SWITCH_STREAM) || !tracked((__u32)(pid_tgid >> 32)))
		return 0;
	emit(0, pid_tgid, MT_KIND_EXEC, 0, 0, 0, 0);
	return 0;
}

/*
 * Lock waits: every context switch of a recorded thread, as a SwitchOut (with the leaving
 * thread's user stack and whether it was preempted) and a SwitchIn; user space pairs them into
 * exact off-CPU intervals. A thread's first switch-in comes after a ThreadStart stamped when it
 * was created, its last switch-out is a ThreadExit: its row covers its life, not the whole
 * recording. tp_btf/sched_switch(bool preempt, prev, next, prev_state) runs in
 * `prev` (current) before the switch. Attached only while a recording asks for lock waits: it
 * runs for every context switch on the machine, and rejects other processes on their tgids
 * before anything else.
 *
 * Switches the kernel does not report: some kernels switch tasks without firing sched_switch
 * (on some machines no switch out of the idle task or of one other process's threads reaches
 * the tracepoint, for tracefs as for BPF). A recorded thread switched in that way has no
 * SwitchIn. Each thread's state keeps whether its last recorded switch was a switch-out; the
 * next time the thread is seen running, its switch-in is recovered from the kernel's own
 * account (recover_switch_in: a few microseconds late, the runqueue clock having been read at
 * the start of a switch): when it leaves the CPU again (it is `prev` then), or before its next
 * memory event (running), whichever comes first. If that cannot be done (no state, an arrival
 * not after the last switch-out), the switch-in is counted as lost (`drops`): the recording
 * is refused, never paired wrongly. A thread never seen running again before the recording
 * ends stays off the CPU to the end.
 */
static __always_inline int switch_recorded(struct task_struct *task, struct call_state *cs)
{
	if (cs && cs->excluded)
		return 0;
	return sw.scope == MT_SCOPE_PROCESS || (cs && cs->scope_gen == sw.generation) ||
	       (sw.caller && sw.caller == (__u32)task->pid);
}

/* prev_state of a thread's last switch (include/linux/sched.h). */
#define TASK_DEAD 0x80

SEC("tp_btf/sched_switch")
int mt_switch(__u64 *ctx)
{
	struct task_struct *prev = (struct task_struct *)ctx[1];
	struct task_struct *next = (struct task_struct *)ctx[2];
	__u32 prev_state = (__u32)ctx[3];
	__u32 ptgid = prev->tgid, ntgid = next->tgid, zero = 0;
	struct call_state *cs;
	struct rq_offset *o;
	__u64 now, clock;
	int out, in;

	if (config.follow == MT_FOLLOW_TREE) {
		out = bpf_map_lookup_elem(&followed, &ptgid) != 0;
		in = bpf_map_lookup_elem(&followed, &ntgid) != 0;
	} else {
		out = ptgid == config.target_tgid;
		in = ntgid == config.target_tgid;
	}
	if (!(out | in) || !(sw.enabled & MT_SWITCH_STREAM))
		return 0;
	if (out) {
		cs = task_state(prev, (__u32)prev->pid, 1);
		if (switch_recorded(prev, cs)) {
			now = bpf_ktime_get_ns();
			clock = rq_clock(prev);
			o = bpf_map_lookup_elem(&rq_offsets, &zero);
			if (o && clock) {
				o->offset = now - clock;
				o->valid = 1;
			}
			if (cs && cs->switch_gen == sw.generation && cs->off_cpu)
				/* Its switch-in was not reported (see above). */
				recover_switch_in(prev, cs, ((__u64)ptgid << 32) | (__u32)prev->pid,
						  clock, now);
			if (prev_state & TASK_DEAD)
				/* Its last switch: the thread's life ends here, not an off-CPU wait. */
				emit_at(0, ((__u64)ptgid << 32) | (__u32)prev->pid,
					MT_KIND_THREAD_EXIT, 0, 0, 0, 0, now);
			else
				/* prev_state 0 (TASK_RUNNING): preempted, still runnable; else it
				 * blocked. */
				emit_at(bpf_task_pt_regs(prev),
					((__u64)ptgid << 32) | (__u32)prev->pid, MT_KIND_SWITCH_OUT,
					0, 0, prev_state == 0, 0, now);
			if (cs) {
				cs->switch_gen = sw.generation;
				cs->off_cpu = 1;
				cs->off_ts = now;
			}
		}
	}
	if (in) {
		cs = task_state(next, (__u32)next->pid, 0);
		if (switch_recorded(next, cs)) {
			/* Its first time on a CPU (it never left one): it was created at
			 * `start_time`, runnable since. Not `se.sum_exec_runtime == 0`: on a VM that was
			 * seen still 0 at a thread's second switch-in, after 50 us on a CPU. */
			if (next->nvcsw + next->nivcsw == 0 && next->start_time)
				emit_at(0, ((__u64)ntgid << 32) | (__u32)next->pid,
					MT_KIND_THREAD_START, 0, 0, 0, 0, next->start_time);
			emit(0, ((__u64)ntgid << 32) | (__u32)next->pid, MT_KIND_SWITCH_IN, 0, 0, 0,
			     0);
			if (cs)
				cs->off_cpu = 0;
		}
	}
	return 0;
}

/*
 * A thread exits (MT_FALLBACK_TID_STATE only, attached while the object is loaded): its
 * tid-keyed state goes, so that a thread given the same tid later starts afresh. Runs for
 * every thread exit on the machine: a hash delete, mostly of a key that is not there.
 */
SEC("tp_btf/sched_process_exit")
int mt_thread_exit(__u64 *ctx)
{
	__u32 tid = (__u32)bpf_get_current_pid_tgid();

	if (config.fallbacks & MT_FALLBACK_TID_STATE)
		bpf_map_delete_elem(&calls_tid, &tid);
	return 0;
}

/*
 * ld.so's `_dl_debug_state`, the hook it calls after each change of its list of loaded objects
 * (r_brk of `_r_debug`: at start-up and for every dlopen/dlclose, once the objects are mapped
 * and before their code runs). Attached (pid-scoped) only when `record` follows processes: it
 * stops the calling thread with a SIGSTOP from the kernel (si_code SI_KERNEL, which no kill(2)
 * can forge), which the tracer takes as "new objects may be mapped": it probes them, suppresses
 * the signal and resumes the thread, so an allocator a program dlopens is probed before its
 * first call.
 */
SEC("uprobe.multi")
int mt_dl_state(struct pt_regs *ctx)
{
	__u64 pid_tgid = bpf_get_current_pid_tgid();

	if (config.follow == MT_FOLLOW_TREE && tracked((__u32)(pid_tgid >> 32)))
		bpf_send_signal_thread(MT_SIGSTOP);
	return 0;
}

/* Does nothing: attached at the same sites as the real programs, it measures the kernel's
 * uprobe floor (trap + dispatch) that every configuration pays. Not used for recording. */
SEC("uprobe.multi")
int mt_nop(struct pt_regs *ctx)
{
	return 0;
}
