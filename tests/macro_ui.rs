//! `#[distributed_lock]` at compile time: every accepted form compiles (tests/ui/pass), and every
//! misuse is a compile error pointing at the offending token (tests/ui/fail, with the compiler's
//! output in the `.stderr` beside each file). Regenerate the snapshots with
//! `TRYBUILD=overwrite cargo test --test macro_ui`, then read them.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
