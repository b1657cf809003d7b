//! The parallel suite (`parallel_suite/suite.rs`) on the eBPF tracker, run in parallel as
//! libtest runs tests. Needs CAP_BPF + CAP_PERFMON; without them each test is reported as
//! ignored, with why.

use memtrack::BackendChoice;

const BACKEND: BackendChoice = BackendChoice::Ebpf;

include!("parallel_suite/suite.rs");

suite!("ebpf");

fn main() {
    use memtrack_test_support::{TRACKER, requires};
    let tests = TESTS
        .iter()
        .map(|&(name, test)| requires(name, &[TRACKER], test));
    memtrack_test_support::run(tests.collect());
}
