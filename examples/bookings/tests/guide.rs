//! docs/GUIDE.md walks this example by quoting its files: every block marked
//! `<!-- quote: PATH -->` must appear verbatim in PATH, and every Rust block of the guide must be
//! such a quote (the guide has no Rust that nothing compiles).

use std::path::Path;

fn workspace_file(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

#[test]
fn the_guides_quotes_match_the_example() {
    let guide = workspace_file("docs/GUIDE.md");
    let mut lines = guide.lines();
    let (mut quotes, mut previous) = (0, "");
    while let Some(line) = lines.next() {
        if let Some(lang) = line.strip_prefix("```").filter(|l| !l.is_empty()) {
            let mut block = String::new();
            for inner in lines.by_ref() {
                if inner == "```" {
                    break;
                }
                block.push_str(inner);
                block.push('\n');
            }
            let quoted = previous
                .strip_prefix("<!-- quote: ")
                .and_then(|rest| rest.strip_suffix(" -->"));
            match quoted {
                Some(file) => {
                    assert!(
                        workspace_file(file).contains(&block),
                        "docs/GUIDE.md quotes {file}, but the file no longer contains:\n{block}"
                    );
                    quotes += 1;
                }
                None => assert!(
                    !lang.starts_with("rust"),
                    "a Rust block of docs/GUIDE.md quotes no file:\n{block}"
                ),
            }
        }
        previous = line;
    }
    assert!(
        quotes >= 5,
        "expected the guide to quote the example, found {quotes} quotes"
    );
}
