//! Rooms a reader can hold in mind: no source file of the library or of the sidecar is over
//! 550 lines, and no function outside tests over 70 (docs/development.md, "The house").
//!
//! Test files (`tests.rs`, `tests/`) and the inline `#[cfg(test)] mod tests` at the end of a
//! file are left out, as in the import check (`house.rs`). A function's lines run from its
//! `fn` line to the closing brace at the same indentation, signature and comments inside
//! included (the code is `rustfmt`-formatted, so the indentation is the nesting).

use std::path::{Path, PathBuf};

const MAX_FILE_LINES: usize = 550;
const MAX_FN_LINES: usize = 70;

/// Every non-test `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            // Test code is not a room of the house: `tests/` and `tests.rs`, and the model
            // checker (`model.rs` and `model/`, compiled only under `cfg(test)`).
            if path.file_name().is_some_and(|n| n != "tests" && n != "model") {
                sources(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs")
            && path.file_name().is_some_and(|n| n != "tests.rs")
            && !(path.file_name().is_some_and(|n| n == "model.rs")
                && path.parent().is_some_and(|p| p.join("model").is_dir()))
        {
            out.push(path);
        }
    }
}

/// The lines before the file's inline test module.
fn code_lines(text: &str) -> Vec<&str> {
    let lines: Vec<&str> = text.lines().collect();
    let end = (0..lines.len())
        .find(|&i| {
            lines[i].trim_start().starts_with("#[cfg(test)]")
                && lines
                    .get(i + 1)
                    .is_some_and(|l| l.trim_start().starts_with("mod "))
        })
        .unwrap_or(lines.len());
    lines[..end].to_vec()
}

/// Whether `line` starts a function (`fn`, with any of its qualifiers), and its indentation.
fn fn_start(line: &str) -> Option<usize> {
    let indent = line.len() - line.trim_start().len();
    let mut words = line.split_whitespace().peekable();
    while let Some(w) = words.peek() {
        let qualifier =
            w.starts_with("pub") || matches!(*w, "const" | "async" | "unsafe" | "extern" | "\"C\"");
        if !qualifier {
            break;
        }
        words.next();
    }
    (words.next() == Some("fn")).then_some(indent)
}

/// The functions of `lines` longer than the limit: (first line, length).
fn long_functions(lines: &[&str]) -> Vec<(usize, usize)> {
    let mut long = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(indent) = fn_start(lines[i]) else {
            i += 1;
            continue;
        };
        // The signature ends with `{` (a body) or `;` (a declaration in a trait).
        let mut j = i;
        while j < lines.len() && !lines[j].trim_end().ends_with('{') && !lines[j].trim_end().ends_with(';') {
            j += 1;
        }
        if j >= lines.len() || lines[j].trim_end().ends_with(';') {
            i = j + 1;
            continue;
        }
        let close = format!("{}}}", " ".repeat(indent));
        let end = (j..lines.len())
            .find(|&k| lines[k].starts_with(&close) && lines[k].len() - lines[k].trim_start().len() == indent)
            .unwrap_or(lines.len() - 1);
        if end - i + 1 > MAX_FN_LINES {
            long.push((i + 1, end - i + 1));
        }
        i += 1;
    }
    long
}

#[test]
fn no_file_is_over_550_lines_and_no_function_over_70() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for krate in ["kube-leader", "kube-leader-cli"] {
        sources(&root.join(krate).join("src"), &mut files);
    }
    assert!(files.len() > 50, "read only {} files", files.len());
    let mut over = Vec::new();
    for path in &files {
        let text = std::fs::read_to_string(path).unwrap();
        let name = path.strip_prefix(&root).unwrap_or(path).display().to_string();
        let total = text.lines().count();
        if total > MAX_FILE_LINES {
            over.push(format!("{name}: {total} lines (at most {MAX_FILE_LINES})"));
        }
        for (line, len) in long_functions(&code_lines(&text)) {
            over.push(format!(
                "{name}:{line}: a function of {len} lines (at most {MAX_FN_LINES})"
            ));
        }
    }
    assert!(over.is_empty(), "rooms too big:\n{}", over.join("\n"));
}

#[test]
fn the_check_finds_a_long_function() {
    let mut text = String::from("impl X {\n    pub(crate) async fn long(\n        a: u8,\n    ) -> u8 {\n");
    text.push_str(&"        a;\n".repeat(70));
    text.push_str("    }\n\n    fn short() {}\n}\n");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(long_functions(&lines), vec![(2, 74)]);
    let tests = "fn a() {}\n#[cfg(test)]\nmod tests {\n}\n";
    assert_eq!(code_lines(tests), vec!["fn a() {}"]);
}
