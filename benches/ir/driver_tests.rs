//! Unit tests of the driver, in a file of their own: the gate hashes `driver.rs`, and a new
//! test must not invalidate the baseline.

use super::*;

#[test]
fn the_operation_table_is_consistent() {
    for (i, o) in OPS.iter().enumerate() {
        assert!(
            OPS[..i].iter().all(|p| p.name != o.name),
            "{} twice",
            o.name
        );
        assert!(o.small % o.unit == 0 && o.large % o.unit == 0, "{}", o.name);
        assert!(o.small > 0 && o.small < o.large, "{}", o.name);
        assert!(matches!(o.scope, "thread" | "process"), "{}", o.name);
        assert!(
            !o.about.contains('\t') && !o.about.contains('\n'),
            "{}",
            o.name
        );
    }
}

#[test]
fn unknown_operations_and_sizes_that_do_not_divide_are_errors() {
    assert!(find("nope").is_err_and(|e| e.contains("encode, decode")));
    let op = find("encode").unwrap();
    assert_eq!(repetitions(op, "131072"), Ok(2));
    for bad in ["0", "1000", "-1", "lots", ""] {
        assert!(repetitions(op, bad).is_err(), "{bad:?}");
    }
    assert!(
        repetitions(op, "1000")
            .unwrap_err()
            .contains("does not divide (try 65536)")
    );
}

/// Every operation, one unit each, in one test: two of them start allocator-backend
/// sessions, and a process runs one session at a time.
#[test]
fn every_operation_runs_one_unit() {
    for o in OPS {
        let mut m = Measure {
            time: true,
            elapsed: Duration::ZERO,
        };
        let sum = (o.run)(1, &mut m);
        assert!(sum > 0, "{}", o.name);
        assert!(m.elapsed > Duration::ZERO, "{}", o.name);
    }
}
