/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The little of the kernel's and libbpf's headers memtrack.bpf.c needs, written by hand so that
 * building the object needs nothing but clang (no vmlinux.h, no libbpf-dev). Struct layouts
 * are relocated at load time against the running kernel's BTF (CO-RE, preserve_access_index).
 */
#ifndef MEMTRACK_BPF_MIN_H
#define MEMTRACK_BPF_MIN_H

typedef unsigned char __u8;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef long long __s64;

/* x86-64 user/kernel register frame; only the fields read here are declared (CO-RE). */
struct pt_regs {
	unsigned long r9;
	unsigned long r8;
	unsigned long ax;
	unsigned long orig_ax;
	unsigned long cx;
	unsigned long dx;
	unsigned long si;
	unsigned long di;
	unsigned long bp;
	unsigned long ip;
	unsigned long sp;
} __attribute__((preserve_access_index));

/* uapi/linux/bpf.h */
enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_PERCPU_ARRAY = 6,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_RINGBUF = 27,
	BPF_MAP_TYPE_TASK_STORAGE = 29,
};
#define BPF_ANY 0
#define BPF_F_NO_PREALLOC 1
#define BPF_LOCAL_STORAGE_GET_F_CREATE 1
#define BPF_NOEXIST 1
#define BPF_RB_NO_WAKEUP 1
#define BPF_RB_FORCE_WAKEUP 2
#define BPF_RB_AVAIL_DATA 0
#define BPF_F_USER_STACK (1ULL << 8)
#define E2BIG 7

/* libbpf's BTF-defined map and section conventions. */
#define SEC(name) __attribute__((section(name), used))
#define __uint(name, val) int (*name)[val]
#define __type(name, val) typeof(val) *name
#define __always_inline inline __attribute__((always_inline))

/* Helper ids from uapi/linux/bpf.h's __BPF_FUNC_MAPPER. */
static void *(*const bpf_map_lookup_elem)(void *map, const void *key) = (void *)1;
static long (*const bpf_map_update_elem)(void *map, const void *key, const void *value,
					 __u64 flags) = (void *)2;
static long (*const bpf_map_delete_elem)(void *map, const void *key) = (void *)3;
static __u64 (*const bpf_ktime_get_ns)(void) = (void *)5;
static __u64 (*const bpf_get_current_pid_tgid)(void) = (void *)14;
static long (*const bpf_send_signal_thread)(__u32 sig) = (void *)117;
static long (*const bpf_probe_read_user)(void *dst, __u32 size, const void *src) = (void *)112;
static void *(*const bpf_ringbuf_reserve)(void *ringbuf, __u64 size, __u64 flags) = (void *)131;
static void (*const bpf_ringbuf_submit)(void *data, __u64 flags) = (void *)132;
static __u64 (*const bpf_ringbuf_query)(void *ringbuf, __u64 flags) = (void *)134;
static __u64 (*const bpf_get_attach_cookie)(void *ctx) = (void *)174;
static long (*const bpf_get_stack)(void *ctx, void *buf, __u32 size, __u64 flags) = (void *)67;
static long (*const bpf_loop)(__u32 nr_loops, void *callback_fn, void *callback_ctx,
			      __u64 flags) = (void *)181;
static long (*const bpf_ringbuf_output)(void *ringbuf, void *data, __u64 size,
					__u64 flags) = (void *)130;
/* Only the fields read here (CO-RE). x86's mm_context_t: `ctx_id` numbers address spaces,
 * never reused (arch/x86/include/asm/mmu.h). */
struct mm_struct {
	struct {
		__u64 ctx_id;
	} context;
} __attribute__((preserve_access_index));
/* CONFIG_SCHED_INFO: `last_arrival` is the runqueue clock (`struct rq`'s `clock`, sched_clock
 * ns) when the task last got a CPU, set at every context switch into it. */
struct sched_info {
	unsigned long long last_arrival;
} __attribute__((preserve_access_index));
/* A CPU's runqueue: `clock` was updated at the start of the switch being traced. */
struct rq {
	__u64 clock;
} __attribute__((preserve_access_index));
/* CONFIG_FAIR_GROUP_SCHED: a task's fair-class runqueue points to its CPU's runqueue (the
 * per-CPU `runqueues` is not a symbol BPF can resolve without CONFIG_KALLSYMS_ALL). */
struct cfs_rq {
	struct rq *rq;
} __attribute__((preserve_access_index));
struct sched_entity {
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));
/* `start_time`: when it was created, CLOCK_MONOTONIC ns (bpf_ktime_get_ns's clock).
 * `nvcsw`, `nivcsw`: how many times it left a CPU, blocked or preempted; zeroed at creation
 * (copy_mm), counted by __schedule before it fires sched_switch. */
struct task_struct {
	int pid;
	int tgid;
	struct mm_struct *mm;
	struct sched_info sched_info;
	struct sched_entity se;
	__u64 start_time;
	unsigned long nvcsw;
	unsigned long nivcsw;
} __attribute__((preserve_access_index));
/* bpf_core_field_exists() of libbpf's bpf_core_read.h. */
#define BPF_FIELD_EXISTS 2
#define core_field_exists(field) __builtin_preserve_field_info(field, BPF_FIELD_EXISTS)
static void *(*const bpf_task_storage_get)(void *map, struct task_struct *task, void *value,
					   __u64 flags) = (void *)156;
static struct task_struct *(*const bpf_get_current_task_btf)(void) = (void *)158;
static struct pt_regs *(*const bpf_task_pt_regs)(struct task_struct *task) = (void *)175;
/* A mapping of an address space: only its bounds are read (CO-RE). */
struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
} __attribute__((preserve_access_index));
static long (*const bpf_find_vma)(struct task_struct *task, __u64 addr, void *callback_fn,
				  void *callback_ctx, __u64 flags) = (void *)180;

#endif
