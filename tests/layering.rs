//! The core's modules import one another in one direction only: no import circle between
//! sibling modules, at any depth of `shared/core/src` (a folder counts as one module beside its
//! siblings, so `a.rs → b/x.rs → a.rs` is a circle of `a` and `b`). The imports are read from
//! the source as text: every `crate::…`, `super::…` and `self::…` path in code (comments,
//! strings and `#[cfg(test)]` items left out), `use` groups expanded, each mapped to the
//! deepest module file it names.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CORE_SRC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../core/src");

/// A module's path from the crate root (`[]` is `lib.rs`, `["store", "jobs"]` is
/// `store/jobs/mod.rs` or `store/jobs.rs`).
type Module = Vec<String>;

/// One import: from a file's module to the module a path of it names, and the path as written.
struct Import {
    from: Module,
    to: Module,
    path: String,
}

fn module_of(src: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(src).expect("under src").with_extension("");
    let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if parts.last().is_some_and(|l| l == "mod" || l == "lib") {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let p = entry.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file with comments, string and char literals blanked (newlines kept).
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c[i] == 'r'
            && (at(i + 1) == '"' || (at(i + 1) == '#' && (at(i + 2) == '"' || at(i + 2) == '#')))
            && !c.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"…", r#"…"#, …
            let mut hashes = 0;
            i += 1;
            while at(i) == '#' {
                hashes += 1;
                i += 1;
            }
            i += 1;
            let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
            let close: Vec<char> = close.chars().collect();
            while i < c.len() && !c[i..].starts_with(&close) {
                if c[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c[i] == '"' {
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    i += 1;
                } else if c[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c[i] == '\'' && (at(i + 1) == '\\' || at(i + 2) == '\'') {
            // A char literal ('x', '\n', '\u{..}'); a lifetime ('a) has no closing quote.
            i += 1;
            while i < c.len() && c[i] != '\'' {
                if c[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// The code without the items marked `#[cfg(test)]` (a test module, a test-only import).
fn without_tests(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at..];
        let (semi, brace) = (item.find(';'), item.find('{'));
        let end = match (semi, brace) {
            (Some(s), Some(b)) if s < b => s + 1,
            (_, Some(b)) => {
                let mut depth = 0;
                let mut end = item.len();
                for (k, ch) in item[b..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = b + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(s), None) => s + 1,
            (None, None) => item.len(),
        };
        out.extend(item[..end].chars().filter(|c| *c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// The paths a `use` tree or an expression path starting at `s` names: `a::b::{c, d::e}` gives
/// `a::b::c` and `a::b::d::e`. Segments are read up to the first that is not a plain name.
fn paths_at(s: &str) -> Vec<Vec<String>> {
    let mut segs = Vec::new();
    let mut i = 0;
    let b = s.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            // A group: split at top-level commas, each a path of its own.
            let mut depth = 0;
            let mut start = i + 1;
            let mut found = Vec::new();
            for (k, ch) in s[i..].char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        found.extend(paths_at(&s[start..i + k]).into_iter().map(|tail| [segs.clone(), tail].concat()));
                        start = i + k + 1;
                        if ch == '}' {
                            break;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return if found.is_empty() { vec![segs] } else { found };
        }
        let start = i;
        while i < b.len() && is_ident(b[i] as char) {
            i += 1;
        }
        if i == start {
            break;
        }
        segs.push(s[start..i].to_owned());
        if s[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    vec![segs]
}

/// Every import of one file, resolved against the modules that exist.
fn imports_of(from: &Module, code: &str, modules: &BTreeSet<Module>) -> Vec<Import> {
    let mut found = Vec::new();
    for root in ["crate::", "super::", "self::"] {
        for (at, _) in code.match_indices(root) {
            if code[..at].chars().next_back().is_some_and(|c| is_ident(c) || c == ':') {
                continue; // `super::` inside `super::super::`, or a longer name
            }
            for segs in paths_at(&code[at..]) {
                let mut base: Module = Vec::new();
                let mut rest = segs.as_slice();
                match rest.first().map(String::as_str) {
                    Some("crate") => rest = &rest[1..],
                    Some("self") => {
                        base = from.clone();
                        rest = &rest[1..];
                    }
                    Some("super") => {
                        base = from.clone();
                        while rest.first().is_some_and(|s| s == "super") {
                            base.pop();
                            rest = &rest[1..];
                        }
                    }
                    _ => continue,
                }
                let mut to = base.clone();
                for seg in rest {
                    let mut longer = to.clone();
                    longer.push(seg.clone());
                    if !modules.contains(&longer) {
                        break;
                    }
                    to = longer;
                }
                if &to != from {
                    found.push(Import { from: from.clone(), to, path: segs.join("::") });
                }
            }
        }
    }
    found
}

/// Every import of the crate under `src`.
fn imports(src: &Path) -> Vec<Import> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Module> = files.iter().map(|f| module_of(src, f)).collect();
    let mut all = Vec::new();
    for f in &files {
        let code = without_tests(&code_only(&std::fs::read_to_string(f).expect("read")));
        all.extend(imports_of(&module_of(src, f), &code, &modules));
    }
    all
}

/// The circles among siblings: for each module, its children (each with what lies under it)
/// and the imports between them; each circle named by its members and the imports that close it.
fn circles(imports: &[Import]) -> Vec<String> {
    let mut parents: BTreeSet<Module> = BTreeSet::new();
    for i in imports {
        for m in [&i.from, &i.to] {
            for n in 0..m.len() {
                parents.insert(m[..n].to_vec());
            }
        }
    }
    let mut found = Vec::new();
    for parent in parents {
        let child = |m: &Module| (m.len() > parent.len() && m.starts_with(&parent)).then(|| m[parent.len()].clone());
        // Sibling → sibling, with the imports behind each arrow.
        let mut edges: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
        for i in imports {
            if let (Some(a), Some(b)) = (child(&i.from), child(&i.to))
                && a != b
            {
                edges.entry((a, b)).or_default().push(format!("{} uses {}", i.from.join("/"), i.path));
            }
        }
        for scc in strongly_connected(&edges) {
            let inside: Vec<String> = edges
                .iter()
                .filter(|((a, b), _)| scc.contains(a) && scc.contains(b))
                .flat_map(|((a, b), why)| why.iter().map(move |w| format!("    {a} → {b}: {w}")))
                .collect();
            let place = if parent.is_empty() { "crate".to_owned() } else { parent.join("::") };
            let members: Vec<&str> = scc.iter().map(String::as_str).collect();
            found.push(format!("in {place}: {}\n{}", members.join(" ⇄ "), inside.join("\n")));
        }
    }
    found
}

/// The groups of two or more nodes that reach one another (Tarjan's algorithm).
fn strongly_connected(edges: &BTreeMap<(String, String), Vec<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'e> {
        next: BTreeMap<&'e str, Vec<&'e str>>,
        index: BTreeMap<&'e str, usize>,
        low: BTreeMap<&'e str, usize>,
        stack: Vec<&'e str>,
        found: Vec<BTreeSet<String>>,
    }
    fn visit<'e>(w: &mut Walk<'e>, v: &'e str) {
        let n = w.index.len();
        w.index.insert(v, n);
        w.low.insert(v, n);
        w.stack.push(v);
        for u in w.next.get(v).cloned().unwrap_or_default() {
            if !w.index.contains_key(u) {
                visit(w, u);
                let l = w.low[v].min(w.low[u]);
                w.low.insert(v, l);
            } else if w.stack.contains(&u) {
                let l = w.low[v].min(w.index[u]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let mut group = BTreeSet::new();
            while let Some(u) = w.stack.pop() {
                group.insert(u.to_owned());
                if u == v {
                    break;
                }
            }
            if group.len() > 1 {
                w.found.push(group);
            }
        }
    }
    let mut w =
        Walk { next: BTreeMap::new(), index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], found: vec![] };
    for (a, b) in edges.keys() {
        w.next.entry(a.as_str()).or_default().push(b.as_str());
    }
    let nodes: Vec<&str> = w.next.keys().copied().collect();
    for v in nodes {
        if !w.index.contains_key(v) {
            visit(&mut w, v);
        }
    }
    w.found
}

#[test]
fn the_core_has_no_import_circle() {
    let imports = imports(Path::new(CORE_SRC));
    assert!(imports.len() > 300, "the scan reads the core's imports: {} found", imports.len());
    assert!(
        imports.iter().any(|i| i.from == ["api", "jobs"] && i.to == ["store", "jobs"]),
        "the scan resolves a `use crate::…` (api/jobs.rs uses crate::store::jobs)"
    );
    let found = circles(&imports);
    assert!(
        found.is_empty(),
        "modules of the core import each other (lib.rs: each layer imports only the layers below it):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_names_a_circle_between_siblings_and_between_folders() {
    let dir = tempfile_dir("layering");
    let write = |path: &str, text: &str| {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    write("lib.rs", "pub mod a; pub mod b; pub mod c; pub mod d;");
    // a ⇄ b through a use group and an expression path; c's mention of a is in a comment, a
    // string and a test module, so it draws no arrow.
    write("a.rs", "use crate::{b::{self, Thing}, c};\nfn f() { b::go() }");
    write("b.rs", "pub fn go() { crate::a::f() }");
    write(
        "c.rs",
        "// crate::d::x\nconst S: &str = \"crate::d::x\";\n#[cfg(test)]\nmod tests { use crate::d::x; }\npub fn c() {}",
    );
    // A circle between folders: d/x.rs → e → d/y.rs.
    write("d/mod.rs", "pub mod x; pub mod y;");
    write("d/x.rs", "use crate::e::run;");
    write("d/y.rs", "pub fn y() {}");
    write("e.rs", "pub fn run() { super::d::y::y() }");
    let found = circles(&imports(&dir));
    let all = found.join("\n");
    assert_eq!(found.len(), 2, "{all}");
    assert!(all.contains("in crate: a ⇄ b") && all.contains("a → b: a uses crate::b::Thing"), "{all}");
    assert!(all.contains("b → a: b uses crate::a::f"), "{all}");
    assert!(all.contains("d ⇄ e") && all.contains("d → e: d/x uses crate::e::run"), "{all}");
    assert!(all.contains("e → d: e uses super::d::y::y"), "{all}");
    assert!(!all.contains("c →"), "comments, strings and test modules are not imports: {all}");
    std::fs::remove_dir_all(&dir).unwrap();
}

fn tempfile_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
