//! docs/flags.md against the binaries: each section `` ## `cmd args` `` holds
//! what `cmd args --help` prints, in the environment `scripts/flags-doc` gives
//! it (empty but `HOME=/home/user` and `COLUMNS=100`, so neither the machine's
//! home, nor variables a flag reads, nor the terminal's width show).

use std::{path::Path, process::Command};

/// The generated reference, relative to the workspace's root.
pub const DOC: &str = "docs/flags.md";

/// Panics, naming `scripts/flags-doc`, unless every section of docs/flags.md
/// for the binary `name` (at `binary`) is what it prints now, and every
/// subcommand its helps list has a section.
pub fn check(binary: &Path, name: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DOC);
    let doc = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{DOC}: {e}"));
    let sections = sections(&doc);
    let mut wanted = vec![vec![]];
    while let Some(args) = wanted.pop() {
        let title = std::iter::once(name.to_string())
            .chain(args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" ");
        let printed = help(binary, &args);
        let Some((_, documented)) = sections.iter().find(|(t, _)| *t == title) else {
            panic!("{DOC} has no section for `{title} --help`: run scripts/flags-doc");
        };
        if *documented != printed {
            let line = documented
                .lines()
                .zip(printed.lines())
                .position(|(a, b)| a != b);
            panic!(
                "{DOC} differs from `{title} --help` (first at line {} of its block): run scripts/flags-doc\n\
                 --- documented\n{documented}\n--- printed\n{printed}",
                line.map_or_else(|| "end".to_string(), |l| (l + 1).to_string()),
            );
        }
        for sub in subcommands(&printed) {
            let mut next = args.clone();
            next.push(sub);
            wanted.push(next);
        }
    }
}

/// `(title, text)` of each `` ## `title` `` section's ```` ```text ```` block.
fn sections(doc: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut lines = doc.lines();
    while let Some(line) = lines.next() {
        let Some(title) = line.strip_prefix("## `").and_then(|t| t.strip_suffix('`')) else {
            continue;
        };
        let block: Vec<&str> = lines
            .by_ref()
            .skip_while(|l| *l != "```text")
            .skip(1)
            .take_while(|l| *l != "```")
            .collect();
        out.push((title.to_string(), block.join("\n")));
    }
    out
}

/// What `binary args --help` prints, each line's trailing blanks removed.
fn help(binary: &Path, args: &[String]) -> String {
    let output = Command::new(binary)
        .args(args)
        .arg("--help")
        .env_clear()
        .env("HOME", "/home/user")
        .env("COLUMNS", "100")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", binary.display()));
    assert!(
        output.status.success(),
        "{} {args:?} --help failed: {output:?}",
        binary.display()
    );
    let text = String::from_utf8(output.stdout).expect("help is UTF-8");
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
        .trim_end()
        .to_string()
}

/// The subcommands listed under `Commands:`, but `help`.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| *l != "Commands:")
        .skip(1)
        .take_while(|l| !l.is_empty())
        .filter(|l| l.starts_with("  ") && l.as_bytes().get(2).is_some_and(u8::is_ascii_lowercase))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}
