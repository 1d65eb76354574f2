//! `#[distributed_lock]` at compile time: every accepted form compiles (tests/macros/ui/pass),
//! and every misuse is a compile error pointing at the offending token (tests/macros/ui/fail,
//! with the compiler's output in the `.stderr` beside each file). Regenerate the snapshots with
//! `TRYBUILD=overwrite cargo test -p zklock-macros --test macro_ui`, then read them. (In this
//! package, not the root one: trybuild builds the cases against the package's dev-dependencies,
//! and here that is zklock without every backend's client.)

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/macros/ui/pass/*.rs");
    t.compile_fail("tests/macros/ui/fail/*.rs");
}
