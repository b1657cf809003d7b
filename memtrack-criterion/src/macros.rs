//! Memory mode's `criterion_group!` and `criterion_main!`: criterion's own, naming this
//! crate's `Criterion` (criterion's macros name criterion's).

/// Defines a group of benchmarks, as criterion's: `criterion_group!(benches, f, g)` or
/// `criterion_group!{ name = benches; config = Criterion::default(); targets = f, g }`.
#[macro_export]
macro_rules! criterion_group {
    (name = $name:ident; config = $config:expr; targets = $( $target:path ),+ $(,)*) => {
        #[doc = "The function which runs the benchmarks."]
        pub fn $name() {
            let mut criterion: $crate::Criterion<_> = $config.configure_from_args();
            $(
                $target(&mut criterion);
            )+
        }
    };
    ($name:ident, $( $target:path ),+ $(,)*) => {
        $crate::criterion_group! {
            name = $name;
            config = $crate::Criterion::default();
            targets = $( $target ),+
        }
    };
}

/// The benchmark binary's `main`, as criterion's: runs the groups, then prints memory mode's
/// table, and exits with status 1 if a benchmark failed.
#[macro_export]
macro_rules! criterion_main {
    ( $( $group:path ),+ $(,)* ) => {
        fn main() {
            $(
                $group();
            )+
            $crate::Criterion::default()
                .configure_from_args()
                .final_summary();
        }
    };
}
