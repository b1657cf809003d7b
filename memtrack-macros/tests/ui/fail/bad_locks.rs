#[memtrack::memtrack(locks = true)]
fn locks_with_value() {}

#[memtrack::memtrack(locks, locks)]
fn locks_twice() {}

#[memtrack::memtrack(backend = "alloc", locks)]
fn locks_with_the_allocator_recorder() {}

#[memtrack::memtrack(locks, in_memory, backend = "alloc")]
fn allocator_recorder_after_locks() {}

#[memtrack::memtrack(lock)]
fn misspelt() {}

fn main() {}
