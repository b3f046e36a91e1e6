//! `cargo xtask cycles`: no module imports a module that imports it back,
//! in any crate of the workspace.
//!
//! A module *imports* another when its code names an item defined there:
//! a `use` (not a `pub use`, which only re-exports) or a path in the code
//! (`crate::a::b`, `super::x`, a child's `child::x`). A path through a
//! re-export counts for the module that defines the item, so a folder's
//! `mod.rs` that re-exports its files (as tokio's `sync` does) is no
//! import of theirs, and a file that names `crate::driver::Validity` imports
//! `driver::validity`. A module that only declares another (`mod x;`) does
//! not import it. Comments, string literals and `#[cfg(test)]` modules are
//! not read (tests may name anything).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path inside its crate (`[]` is the crate root).
type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    /// Child modules declared in it.
    children: BTreeSet<String>,
    /// What it re-exports: name → the path it names.
    exports: BTreeMap<String, Vec<String>>,
    /// Every path it names (absolute or relative, as written), with the
    /// line it is on.
    names: Vec<(Vec<String>, usize)>,
}

/// `cargo xtask cycles [WORKSPACE]` (this workspace by default).
pub fn run(rest: &[String]) -> Result<(), String> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let root = rest.first().map_or(here, PathBuf::from);
    let root = root
        .canonicalize()
        .map_err(|e| format!("cannot read {}: {e}", root.display()))?;
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("cannot list crates/: {e}"))?
        .filter_map(|e| e.ok().map(|e| e.path().join("src")))
        .filter(|p| p.is_dir())
        .collect();
    dirs.push(root.join("xtask/src"));
    dirs.sort();
    let (mut modules, mut found) = (0, Vec::new());
    for dir in &dirs {
        let crate_name = dir
            .parent()
            .and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tree = read_crate(dir)?;
        modules += tree.len();
        for cycle in cycles(&tree) {
            found.push(format!("{crate_name}: {cycle}"));
        }
    }
    if found.is_empty() {
        println!(
            "cycles: none: no module imports a module that imports it back ({} crates, {modules} modules)",
            dirs.len()
        );
        Ok(())
    } else {
        Err(format!(
            "modules that import each other (each arrow: the first place it imports):\n  {}",
            found.join("\n  ")
        ))
    }
}

/// `file` as from the workspace root (`crates/…`).
fn shown(file: &Path) -> String {
    let text = file.display().to_string();
    match text.find("/crates/").or_else(|| text.find("/xtask/")) {
        Some(at) => text[at + 1..].to_owned(),
        None => text,
    }
}

/// Every module of the crate whose sources are in `src`.
fn read_crate(src: &Path) -> Result<BTreeMap<ModPath, Module>, String> {
    let mut tree = BTreeMap::new();
    for root in ["lib.rs", "main.rs"] {
        if src.join(root).is_file() {
            read_module(&src.join(root), src, Vec::new(), &mut tree)?;
        }
    }
    Ok(tree)
}

fn read_module(
    file: &Path,
    dir: &Path,
    path: ModPath,
    tree: &mut BTreeMap<ModPath, Module>,
) -> Result<(), String> {
    let text = std::fs::read_to_string(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let code = strip(&text);
    let mut module = Module {
        file: file.to_owned(),
        children: BTreeSet::new(),
        exports: BTreeMap::new(),
        names: Vec::new(),
    };
    for item in statements(&code) {
        let (line, stmt) = (item.0, without_attributes(item.1.trim()));
        let words: Vec<&str> = stmt.split_whitespace().collect();
        let visible = words.first().is_some_and(|w| w.starts_with("pub"));
        let rest = if visible { &words[1..] } else { &words[..] };
        match rest {
            ["mod", name, ..] if name.ends_with(';') || rest.len() == 2 => {
                module.children.insert(name.trim_end_matches(';').to_owned());
            }
            ["use", ..] => {
                let tree_text = stmt[stmt.find("use").unwrap_or(0) + 3..]
                    .trim()
                    .trim_end_matches(';');
                for (target, alias) in expand(tree_text) {
                    if visible {
                        module.exports.insert(alias, target);
                    } else {
                        module.names.push((target, line));
                    }
                }
            }
            _ => {
                for p in inline_paths(stmt) {
                    module.names.push((p, line));
                }
            }
        }
    }
    // Child files: `dir/name.rs` or `dir/name/mod.rs` (a root's children
    // are beside it; a `x.rs` or `x/mod.rs` module's are in `x/`).
    let children: Vec<String> = module.children.iter().cloned().collect();
    let own_dir = if path.is_empty() || file.ends_with("mod.rs") {
        dir.to_owned()
    } else {
        dir.join(path.last().cloned().unwrap_or_default())
    };
    tree.insert(path.clone(), module);
    for child in children {
        let mut child_path = path.clone();
        child_path.push(child.clone());
        let flat = own_dir.join(format!("{child}.rs"));
        let nested = own_dir.join(&child).join("mod.rs");
        if flat.is_file() {
            read_module(&flat, &own_dir, child_path, tree)?;
        } else if nested.is_file() {
            read_module(&nested, &own_dir.join(&child), child_path, tree)?;
        }
    }
    Ok(())
}

/// The text without comments and string or char literals (they may hold
/// anything), and without `#[cfg(test)] mod ... { }` blocks.
fn strip(text: &str) -> String {
    let bytes: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let next = bytes.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < bytes.len() && bytes[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < bytes.len() && !(bytes[i] == '*' && bytes[i + 1] == '/') {
                if bytes[i] == '\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 2;
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&bytes, i) {
            // A raw string: r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while bytes.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if bytes.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= bytes.len() {
                    break;
                }
                if bytes[j] == '"' && (0..hashes).all(|h| bytes.get(j + 1 + h) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                if bytes[j] == '\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != '"' {
                if bytes[i] == '\\' {
                    i += 1;
                }
                if bytes.get(i) == Some(&'\n') {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && next.is_some() && bytes.get(i + 2) == Some(&'\'') {
            i += 3;
        } else if c == '\'' && next == Some('\\') {
            i += 2;
            while i < bytes.len() && bytes[i] != '\'' {
                i += 1;
            }
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    drop_test_modules(&out)
}

/// `stmt` without the attributes in front of it.
fn without_attributes(mut stmt: &str) -> &str {
    while stmt.starts_with("#[") || stmt.starts_with("#![") {
        let mut depth = 0;
        let mut end = stmt.len();
        for (k, ch) in stmt.char_indices() {
            match ch {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        stmt = stmt[end..].trim_start();
    }
    stmt
}

fn ident_before(bytes: &[char], i: usize) -> bool {
    i > 0 && (bytes[i - 1].is_alphanumeric() || bytes[i - 1] == '_')
}

/// Blanks `#[cfg(test)]` followed by `mod name { ... }` (newlines kept).
fn drop_test_modules(code: &str) -> String {
    let mut out = code.to_owned();
    while let Some(at) = out.find("#[cfg(test)]") {
        let after = &out[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let start_of_item = out.len() - trimmed.len();
        let is_mod = trimmed.starts_with("mod ")
            || trimmed.starts_with("pub mod ")
            || trimmed.starts_with("pub(crate) mod ");
        let end = match (is_mod, trimmed.find(['{', ';'])) {
            (true, Some(open)) if trimmed.as_bytes()[open] == b'{' => {
                let mut depth = 0;
                let mut end = out.len();
                for (k, ch) in out[start_of_item + open..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = start_of_item + open + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            // Not a test module: only the attribute goes.
            _ => at + "#[cfg(test)]".len(),
        };
        let blank: String = out[at..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(at..end, &blank);
    }
    out
}

/// The code's statements, roughly: split at `;`, `{` and `}`, each with the
/// line it starts on (enough to find `use` and `mod` items and paths).
fn statements(code: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let (mut line, mut start_line, mut cur) = (1, 1, String::new());
    let mut in_use = false;
    let mut braces = 0;
    for ch in code.chars() {
        if cur.trim().is_empty() {
            start_line = line;
        }
        if ch == '\n' {
            line += 1;
        }
        cur.push(ch);
        let t = cur.trim_start();
        if !in_use
            && (t.starts_with("use ")
                || t.starts_with("pub use ")
                || (t.starts_with("pub(") && t.contains(") use ")))
        {
            in_use = true;
        }
        if in_use {
            match ch {
                '{' => braces += 1,
                '}' => braces -= 1,
                ';' if braces == 0 => {
                    out.push((start_line, std::mem::take(&mut cur)));
                    in_use = false;
                }
                _ => {}
            }
            continue;
        }
        if matches!(ch, ';' | '{' | '}') {
            out.push((start_line, std::mem::take(&mut cur)));
        }
    }
    out.push((start_line, cur));
    out
}

/// A `use` tree expanded: each leaf's path (its `self` folded) and the
/// name it is known by.
fn expand(tree: &str) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    expand_into(&mut Vec::new(), tree.trim(), &mut out);
    out
}

fn expand_into(prefix: &mut Vec<String>, tree: &str, out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim().trim_start_matches("::");
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = segments(&tree[..open]);
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let depth = prefix.len();
        prefix.extend(head);
        for part in split_top(inner) {
            expand_into(prefix, part, out);
        }
        prefix.truncate(depth);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim().to_owned())),
        None => (tree, None),
    };
    let mut full = prefix.clone();
    for s in segments(path) {
        if s != "self" || full.is_empty() {
            full.push(s);
        }
    }
    if let Some(last) = full.last().cloned()
        && last != "*"
    {
        out.push((full, alias.unwrap_or(last)));
    }
}

fn segments(path: &str) -> Vec<String> {
    path.split("::")
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `a, b::{c, d}, e` split at the top-level commas.
fn split_top(s: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0, 0);
    for (i, ch) in s.char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out.into_iter().filter(|p| !p.trim().is_empty()).collect()
}

/// The `crate::…`, `super::…` and `self::…` paths written in code.
fn inline_paths(stmt: &str) -> Vec<Vec<String>> {
    let chars: Vec<char> = stmt.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let word_start =
            i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        if word_start {
            for head in ["crate::", "super::", "self::"] {
                let n = head.chars().count();
                if chars[i..].iter().take(n).copied().eq(head.chars()) {
                    let mut j = i;
                    while j < chars.len()
                        && (chars[j].is_alphanumeric() || chars[j] == '_' || chars[j] == ':')
                    {
                        j += 1;
                    }
                    let text: String = chars[i..j].iter().collect();
                    out.push(segments(&text));
                    i = j;
                    break;
                }
            }
        }
        i += 1;
    }
    out
}

/// The module that defines what `path`, named in module `from`, names
/// (`None`: outside the crate).
fn resolve(
    tree: &BTreeMap<ModPath, Module>,
    from: &ModPath,
    path: &[String],
    depth: usize,
) -> Option<ModPath> {
    if depth > 16 {
        return None;
    }
    let (mut at, rest): (ModPath, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (from.clone(), &path[1..]),
        Some("super") => {
            let mut at = from.clone();
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                at.pop();
                rest = &rest[1..];
            }
            (at, rest)
        }
        // A child of `from` named relatively (2018 paths).
        Some(first) if tree.get(from).is_some_and(|m| m.children.contains(first)) => (from.clone(), path),
        _ => return None,
    };
    for (k, seg) in rest.iter().enumerate() {
        let module = tree.get(&at)?;
        if module.children.contains(seg) {
            at.push(seg.clone());
        } else if let Some(target) = module.exports.get(seg) {
            let mut through = target.clone();
            through.extend(rest[k + 1..].iter().cloned());
            return resolve(tree, &at, &through, depth + 1).or(Some(at));
        } else {
            return Some(at);
        }
    }
    Some(at)
}

/// Every set of modules that import each other, each shown as a loop.
fn cycles(tree: &BTreeMap<ModPath, Module>) -> Vec<String> {
    // Edges, with the first place each is made.
    let mut edges: BTreeMap<ModPath, BTreeMap<ModPath, String>> = BTreeMap::new();
    for (from, module) in tree {
        let out = edges.entry(from.clone()).or_default();
        for (path, line) in &module.names {
            if let Some(to) = resolve(tree, from, path, 0)
                && &to != from
                && tree.contains_key(&to)
            {
                out.entry(to)
                    .or_insert_with(|| format!("{}:{line}", shown(&module.file)));
            }
        }
    }
    // Tarjan's strongly connected components.
    struct Walk<'a> {
        edges: &'a BTreeMap<ModPath, BTreeMap<ModPath, String>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on: BTreeSet<ModPath>,
        next: usize,
        found: Vec<Vec<ModPath>>,
    }
    fn visit(w: &mut Walk<'_>, v: &ModPath) {
        w.index.insert(v.clone(), w.next);
        w.low.insert(v.clone(), w.next);
        w.next += 1;
        w.stack.push(v.clone());
        w.on.insert(v.clone());
        let targets: Vec<ModPath> = w
            .edges
            .get(v)
            .map(|e| e.keys().cloned().collect())
            .unwrap_or_default();
        for t in targets {
            if !w.index.contains_key(&t) {
                visit(w, &t);
                let low = w.low[v].min(w.low[&t]);
                w.low.insert(v.clone(), low);
            } else if w.on.contains(&t) {
                let low = w.low[v].min(w.index[&t]);
                w.low.insert(v.clone(), low);
            }
        }
        if w.low[v] == w.index[v] {
            let mut component = Vec::new();
            while let Some(t) = w.stack.pop() {
                w.on.remove(&t);
                let done = &t == v;
                component.push(t);
                if done {
                    break;
                }
            }
            if component.len() > 1 {
                w.found.push(component);
            }
        }
    }
    let mut walk = Walk {
        edges: &edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        found: Vec::new(),
    };
    for v in tree.keys() {
        if !walk.index.contains_key(v) {
            visit(&mut walk, v);
        }
    }
    let name = |p: &ModPath| {
        if p.is_empty() {
            "crate".to_owned()
        } else {
            p.join("::")
        }
    };
    walk.found
        .iter()
        .map(|component| {
            let set: BTreeSet<&ModPath> = component.iter().collect();
            component
                .iter()
                .map(|from| {
                    let to: Vec<String> = edges[from]
                        .iter()
                        .filter(|(to, _)| set.contains(to))
                        .map(|(to, at)| format!("{} ({at})", name(to)))
                        .collect();
                    format!("{} -> {}", name(from), to.join(", "))
                })
                .collect::<Vec<_>>()
                .join("; ")
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn use_trees_expand() {
        let got = expand("crate::{a::{B, c::D as E}, f, g::self}");
        let paths: Vec<String> = got.iter().map(|(p, a)| format!("{}={a}", p.join("::"))).collect();
        assert_eq!(
            paths,
            ["crate::a::B=B", "crate::a::c::D=E", "crate::f=f", "crate::g=g"]
        );
    }

    #[test]
    fn comments_strings_and_tests_are_not_read() {
        let code = strip(
            "// crate::a\nlet s = \"crate::b\"; /* crate::c */ crate::d::x();\n#[cfg(test)]\nmod tests { use crate::e; }\n",
        );
        let paths: Vec<Vec<String>> = statements(&code)
            .iter()
            .flat_map(|(_, s)| inline_paths(s))
            .collect();
        assert_eq!(paths, [segments("crate::d::x")]);
        assert!(!code.contains("crate::e"));
    }

    /// Two modules that import each other are found; a parent that only
    /// re-exports its child is not an import, and a path through a
    /// re-export counts for the module that defines the item.
    #[test]
    fn a_loop_is_found_and_a_re_export_is_not_one() {
        let dir = std::env::temp_dir().join(format!("xtask-cycles-{}", std::process::id()));
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("lib.rs", "mod a;\nmod b;\npub mod d;\npub use a::A;\n");
        write("a.rs", "use crate::d::V;\npub struct A;\n");
        write("b.rs", "pub fn f() -> crate::A { crate::A }\n");
        write("d/mod.rs", "mod v;\npub use v::V;\n");
        write("d/v.rs", "pub struct V;\n");
        let tree = read_crate(&dir).unwrap();
        assert!(cycles(&tree).is_empty(), "{:?}", cycles(&tree));
        // b imports a (through the root's re-export); now a imports b.
        write(
            "a.rs",
            "use crate::d::V;\npub struct A;\nfn g() { crate::b::f(); }\n",
        );
        let tree = read_crate(&dir).unwrap();
        let found = cycles(&tree);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].contains("a -> b") && found[0].contains("b -> a"),
            "{found:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
