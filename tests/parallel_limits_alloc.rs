//! The parallel suite (`parallel_suite/suite.rs`) on the allocator recorder (no privileges
//! needed), run in parallel as libtest runs tests; spawned threads join their session
//! through `memtrack::in_session`.

use memtrack::BackendChoice;

#[global_allocator]
static ALLOC: memtrack::Allocator = memtrack::Allocator::system();

const BACKEND: BackendChoice = BackendChoice::Alloc;

include!("parallel_suite/suite.rs");

suite!("alloc");

fn main() {
    let tests = TESTS
        .iter()
        .map(|&(name, test)| memtrack_test_support::test(name, test));
    memtrack_test_support::run(tests.collect());
}
