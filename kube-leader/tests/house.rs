//! The house has no import circles: no module of the library or of the sidecar imports,
//! directly or through others, a module that imports it.
//!
//! Each source file is a module (`lib.rs`/`main.rs` the root, `a.rs` and `a/mod.rs` module `a`,
//! `a/b.rs` module `a::b`). A file imports module M when it names a path `crate::...` or
//! `super::...` (in a `use` tree or in code) that resolves into M; the longest module prefix of
//! the path is the module named. A module and its ancestors are one piece (a child is tied in
//! through its parent, and a parent re-exports its children), so imports between them are not
//! arrows. Test files (`tests.rs`, `tests/`) are left out, as test code may look anywhere.
//! A circle fails the test with the modules in it and the arrows that tie it.
//!
//! `KUBE_LEADER_HOUSE=1 cargo test -p kube-leader --test house -- --nocapture` prints every
//! module's arrows (docs/development.md draws them).

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

/// Module path (`a::b`, `` for the root) → the file's text.
fn modules(src: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path.file_name().is_some_and(|n| n != "tests") {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") || path.file_name().is_some_and(|n| n == "tests.rs")
            {
                continue;
            }
            let rel: PathBuf = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                parts.pop();
            }
            if parts.first().is_some_and(|p| p == "bin") {
                continue;
            }
            out.insert(parts.join("::"), std::fs::read_to_string(&path).unwrap());
        }
    }
    out
}

/// The text without comments, strings of one line, and `#[cfg(test)]` modules inline.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let line = line.split("//").next().unwrap_or("");
        if line.trim_start().starts_with("#[cfg(test)]") {
            // An inline test module follows: the rest of the file is tests by this house's style.
            break;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Every path the code names from `crate::` or `super::`, use trees expanded.
fn paths(code: &str) -> Vec<String> {
    let bytes: Vec<char> = code.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let starts = |w: &str| code_at(&bytes, i, w) && (i == 0 || !is_ident(bytes[i - 1]));
        if starts("crate::") || starts("super::") {
            let (tree, end) = take_tree(&bytes, i);
            expand(&tree, "", &mut out);
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn code_at(s: &[char], i: usize, w: &str) -> bool {
    w.chars().enumerate().all(|(k, c)| s.get(i + k) == Some(&c))
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The use tree (or path) starting at `i`: identifiers, `::`, and balanced `{...}`.
fn take_tree(s: &[char], mut i: usize) -> (String, usize) {
    let mut tree = String::new();
    let mut depth = 0;
    while i < s.len() {
        let c = s[i];
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            c if is_ident(c) || c == ':' || (depth > 0 && (c == ',' || c.is_whitespace())) => {}
            _ if depth > 0 => {}
            _ => break,
        }
        if !c.is_whitespace() {
            tree.push(c);
        }
        i += 1;
    }
    (tree, i)
}

/// `a::{b, c::{d}}` → `a::b`, `a::c::d`.
fn expand(tree: &str, prefix: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = format!("{prefix}{tree}");
        out.push(path.trim_end_matches("::").to_string());
        return;
    };
    let head = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut depth = 0;
    let mut start = 0;
    for (k, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&inner[start..k], &format!("{prefix}{head}"), out);
                start = k + 1;
            }
            _ => {}
        }
    }
    if start < inner.len() {
        expand(&inner[start..], &format!("{prefix}{head}"), out);
    }
}

/// The module `path` (named from `module`) resolves into.
fn resolve(path: &str, module: &str, known: &BTreeSet<String>) -> Option<String> {
    let mut base: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
    let mut rest = path.split("::").peekable();
    match rest.next()? {
        "crate" => base.clear(),
        "super" => {
            // `super` of `a::b` (file a/b.rs) is `a`; of a mod.rs file likewise its parent.
            base.pop()?;
            while rest.peek() == Some(&"super") {
                rest.next();
                base.pop()?;
            }
        }
        _ => return None,
    }
    let mut best = base.join("::");
    let mut cur = base.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    for seg in rest {
        cur.push(seg.to_string());
        let name = cur.join("::");
        if known.contains(&name) {
            best = name;
        } else {
            break;
        }
    }
    Some(best)
}

fn related(a: &str, b: &str) -> bool {
    let under = |x: &str, y: &str| y.is_empty() || x == y || x.starts_with(&format!("{y}::"));
    under(a, b) || under(b, a)
}

/// The arrows between modules of the crate whose sources are in `src`.
fn arrows(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(src);
    let known: BTreeSet<String> = mods.keys().cloned().collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, text) in &mods {
        let to = graph.entry(module.clone()).or_default();
        for p in paths(&code(text)) {
            if let Some(target) = resolve(&p, module, &known) {
                if !related(module, &target) {
                    to.insert(target);
                }
            }
        }
    }
    graph
}

/// The strongly connected components with more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on: BTreeSet<&'g str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'g>(t: &mut T<'g>, v: &'g str) {
        let i = t.index.len();
        t.index.insert(v, i);
        t.low.insert(v, i);
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let l = t.low[w].min(t.low[v]);
                t.low.insert(v, l);
            } else if t.on.contains(w) {
                let l = t.index[w].min(t.low[v]);
                t.low.insert(v, l);
            }
        }
        if t.low[v] == t.index[v] {
            let mut scc = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                scc.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if scc.len() > 1 {
                scc.sort();
                t.out.push(scc);
            }
        }
    }
    let mut t = T {
        g: graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn check(krate: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(krate)
        .join("src");
    let graph = arrows(&src);
    assert!(
        graph.len() > 10,
        "read only {} modules of {}",
        graph.len(),
        src.display()
    );
    if std::env::var_os("KUBE_LEADER_HOUSE").is_some() {
        // The house in words: every module and the modules it imports.
        println!("{krate}/src:");
        for (module, to) in &graph {
            let name = if module.is_empty() { "(root)" } else { module };
            let to: Vec<&str> = to
                .iter()
                .map(|t| if t.is_empty() { "(root)" } else { t })
                .collect();
            println!("  {name} -> {}", to.join(", "));
        }
    }
    let found = circles(&graph);
    let described: Vec<String> = found
        .iter()
        .map(|scc| {
            let ties: Vec<String> = scc
                .iter()
                .flat_map(|a| {
                    graph[a]
                        .iter()
                        .filter(|b| scc.contains(b))
                        .map(move |b| format!("{a} -> {b}"))
                })
                .collect();
            format!("circle of {:?}: {}", scc, ties.join(", "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "{krate}/src has import circles:\n{}",
        described.join("\n")
    );
}

#[test]
fn the_library_has_no_import_circles() {
    check("kube-leader");
}

#[test]
fn the_sidecar_has_no_import_circles() {
    check("kube-leader-cli");
}

#[test]
fn the_check_finds_a_circle() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), ["b".to_string()].into()),
        ("b".to_string(), ["c".to_string()].into()),
        ("c".to_string(), ["a".to_string()].into()),
        ("d".to_string(), ["a".to_string()].into()),
    ]
    .into();
    assert_eq!(
        circles(&g),
        vec![vec!["a".to_string(), "b".to_string(), "c".to_string()]]
    );
    let mut out = Vec::new();
    expand("crate::{a::{b, c}, d}", "", &mut out);
    assert_eq!(out, ["crate::a::b", "crate::a::c", "crate::d"]);
    let known: BTreeSet<String> = ["x".to_string(), "x::y".to_string(), "z".to_string()].into();
    assert_eq!(resolve("super::z::Item", "x", &known).as_deref(), Some("z"));
    assert_eq!(resolve("crate::x::y::f", "z", &known).as_deref(), Some("x::y"));
    assert_eq!(resolve("super::Item", "x::y", &known).as_deref(), Some("x"));
}
