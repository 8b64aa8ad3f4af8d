//! docs/flags.md shows what `troupe --help` (and its subcommands' help) prints:
//! regenerate it with `scripts/flags-doc` when this fails.

#[test]
fn flags_doc_matches_help() {
    troupe_tests::flags_doc::check(std::path::Path::new(env!("CARGO_BIN_EXE_troupe")), "troupe");
}
