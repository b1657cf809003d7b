//! The parallel suite (`parallel_suite/suite.rs`) on the allocator recorder (no privileges
//! needed), under libtest's default parallel runner; spawned threads join their session
//! through `memtrack::in_session`.

use memtrack::BackendChoice;

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

const BACKEND: BackendChoice = BackendChoice::Alloc;

fn skip() -> bool {
    false
}

include!("parallel_suite/suite.rs");

suite!("alloc");
