#![doc = include_str!("../README.md")]

#[cfg(all(feature = "criterion-0_5", feature = "criterion-0_8"))]
compile_error!(
    "memtrack-criterion: features `criterion-0_5` and `criterion-0_8` are both on: for criterion \
     0.5 write `default-features = false, features = [\"criterion-0_5\"]`"
);
#[cfg(not(any(feature = "criterion-0_5", feature = "criterion-0_8")))]
compile_error!(
    "memtrack-criterion: no criterion version: enable feature `criterion-0_8` (the default) or \
     `criterion-0_5`"
);

#[cfg(all(feature = "criterion-0_5", not(feature = "criterion-0_8")))]
use criterion_0_5 as upstream;
#[cfg(feature = "criterion-0_8")]
use criterion_0_8 as upstream;

// Timing mode is criterion itself.
#[cfg(any(feature = "criterion-0_5", feature = "criterion-0_8"))]
pub use upstream::*;
