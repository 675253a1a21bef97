//! The service's module order, checked the way cargo checks the crates'
//! order: every `crate::…` and `super::…` path in `src/` is read, and an
//! import that runs up the stated order fails the test.
//!
//! - Between the crate's top-level modules, the order is the numbered
//!   "Layout" list of `src/lib.rs`, from the top down: a module may use
//!   only modules named after it in that list.
//! - Inside `session/`, `store/` and `settings/`, the order is the
//!   "Files, from the bottom up" list of the folder's `mod.rs`: a file
//!   (with everything under it, e.g. `store/postgres/…`) may use only the
//!   files named before it, directly or through what `mod.rs` re-exports
//!   from them; never an item `mod.rs` defines itself (`mod.rs` declares
//!   and re-exports; in `settings/` it also loads, calling down).
//!
//! Test code (`test.rs`, `#[cfg(test)] mod test { … }`) and `fuzz` (the
//! fuzzing entry points, test-only) may reach anywhere and are skipped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The folders whose files are ordered.
const ORDERED: [&str; 3] = ["session", "store", "settings"];

#[test]
fn no_top_level_module_uses_one_above_it() {
    let order = lib_order();
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut wrong = Vec::new();
    for (file, module) in sources() {
        let Some(top) = module.first() else { continue };
        let Some(own) = rank(top) else { continue };
        for used in imports(&file, &module).into_iter().filter_map(|path| path.first().cloned()) {
            match rank(&used) {
                Some(r) if r < own => {
                    wrong.push(format!("{}: uses `{used}`, which lib.rs lists above `{top}`", rel(&file)))
                }
                _ => {}
            }
        }
    }
    assert!(wrong.is_empty(), "imports running up lib.rs's layout:\n{}", wrong.join("\n"));
}

#[test]
fn no_file_in_an_ordered_folder_uses_one_above_it() {
    let mut wrong = Vec::new();
    for folder in ORDERED {
        let (order, vocabulary) = folder_order(folder);
        let rank = |m: &str| order.iter().position(|o| o == m);
        for (file, module) in sources() {
            if module.first().map(String::as_str) != Some(folder) || module.len() < 2 {
                continue;
            }
            let own = &module[1];
            let own_rank = rank(own).unwrap_or_else(|| {
                panic!("{}: `{own}` is not in {folder}/mod.rs's \"Files, from the bottom up\"", rel(&file))
            });
            for path in imports(&file, &module) {
                if path.first().map(String::as_str) != Some(folder) || path.len() < 2 || &path[1] == own {
                    continue;
                }
                let used = vocabulary.get(&path[1]).unwrap_or(&path[1]);
                match rank(used) {
                    Some(r) if r > own_rank => {
                        wrong.push(format!("{}: uses `{folder}::{used}`, listed above `{own}`", rel(&file)));
                    }
                    Some(_) => {}
                    // Neither a file nor what one re-exports: mod.rs's own
                    // item, above every file (mod.rs declares, re-exports
                    // and, in settings/, loads by calling down).
                    None => wrong.push(format!("{}: uses `{folder}::{used}`, {folder}/mod.rs's own item", rel(&file))),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports running up a folder's order:\n{}", wrong.join("\n"));
}

/// The checker itself: an upward import in a made-up file is caught, in
/// each form a path can take.
#[test]
fn the_reader_finds_every_form_of_path() {
    let src = "use crate::{metrics::{self, Metrics}, net};\n\
               // use crate::start;\n\
               fn f() -> super::super::error::StoreError { crate::store::x() }\n\
               const S: &str = \"crate::server\";\n\
               #[cfg(test)]\nmod test { use crate::start; }\n";
    let found = paths_in(&code_of(src), &["store".into(), "postgres".into(), "step".into()]);
    let found: Vec<String> = found.iter().map(|p| p.join("::")).collect();
    assert_eq!(found, ["metrics", "net", "store::error::StoreError", "store::x"]);
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rel(file: &Path) -> String {
    file.strip_prefix(src()).unwrap_or(file).display().to_string()
}

/// Every non-test source file and its module path (`store/postgres/mod.rs`
/// → `["store", "postgres"]`).
fn sources() -> Vec<(PathBuf, Vec<String>)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("read src/") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|file| {
            let rel = file.strip_prefix(src()).ok()?.with_extension("");
            let mut module: Vec<String> = rel.iter().map(|c| c.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            let test = module.iter().any(|c| c == "test" || c == "fuzz");
            (!test).then_some((file, module))
        })
        .collect()
}

/// The top-level modules in the order `lib.rs`'s numbered "Layout" list
/// names them (the first time each is named as a link).
fn lib_order() -> Vec<String> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).expect("lib.rs");
    let list: String = lib
        .lines()
        .skip_while(|l| !l.starts_with("//! # Layout"))
        .take_while(|l| l.starts_with("//!"))
        .skip_while(|l| !l.trim_start_matches("//!").trim_start().starts_with("1."))
        .take_while(|l| !l.trim_start_matches("//!").trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let order = linked_modules(&list, &src());
    assert!(order.len() >= 5, "lib.rs's Layout list names too few modules: {order:?}");
    order
}

/// `folder/mod.rs`'s "Files, from the bottom up" list, in order, and the
/// names its `use` lines bring up from a file (`SessionError` → `error`).
fn folder_order(folder: &str) -> (Vec<String>, BTreeMap<String, String>) {
    let dir = src().join(folder);
    let text = std::fs::read_to_string(dir.join("mod.rs")).expect("mod.rs");
    let list: String = text
        .lines()
        .skip_while(|l| !l.starts_with("//! # Files, from the bottom up"))
        .skip(1)
        .take_while(|l| l.starts_with("//!") && !l.starts_with("//! #"))
        .collect::<Vec<_>>()
        .join("\n");
    let order = named_modules(&list, &dir);
    assert!(!order.is_empty(), "{folder}/mod.rs has no \"Files, from the bottom up\" list");
    // `pub use file::{A, B};` (a path relative to the folder).
    let mut vocabulary = BTreeMap::new();
    for statement in code_of(&text).split(';') {
        let line = statement.trim();
        let Some(rest) = line.strip_prefix("pub use ").or_else(|| line.strip_prefix("use ")) else { continue };
        let Some((file, names)) = rest.split_once("::") else { continue };
        if order.iter().any(|o| o == file) {
            for name in names.trim_matches(|c: char| "{} \n".contains(c)).split(',') {
                let name = name.trim().rsplit("::").next().unwrap_or_default().to_owned();
                if !name.is_empty() && name != "self" {
                    vocabulary.insert(name, file.to_owned());
                }
            }
        }
    }
    (order, vocabulary)
}

/// Module names in backticks (`` `name` `` or [`name`]) that are files or
/// folders of `dir`, in order of first mention.
fn named_modules(text: &str, dir: &Path) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, piece) in text.split('`').enumerate() {
        let is_module = dir.join(format!("{piece}.rs")).is_file() || dir.join(piece).join("mod.rs").is_file();
        if i % 2 == 1 && is_module && !out.iter().any(|o| o == piece) {
            out.push(piece.to_owned());
        }
    }
    out
}

/// As [`named_modules`], for links only ([`name`]): lib.rs's list also
/// quotes crate names and files in backticks.
fn linked_modules(text: &str, dir: &Path) -> Vec<String> {
    let links: String =
        text.split("[`").skip(1).filter_map(|s| s.split_once("`]")).map(|(n, _)| format!("`{n}`")).collect();
    named_modules(&links, dir)
}

/// The paths `file` (module `module`) uses, from the crate root.
fn imports(file: &Path, module: &[String]) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(file).expect("source file");
    paths_in(&code_of(&text), module)
}

/// `text` without comments, string and char literals, and its
/// `#[cfg(test)] mod test { … }` block.
fn code_of(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        let rest = &text[at..];
        let skip = if rest.starts_with("//") {
            rest.find('\n').unwrap_or(rest.len())
        } else if rest.starts_with("/*") {
            rest.find("*/").map_or(rest.len(), |e| e + 2)
        } else if let Some(raw) = rest.strip_prefix("r#\"") {
            raw.find("\"#").map_or(rest.len(), |e| e + 5)
        } else if let Some(string) = rest.strip_prefix('"') {
            let mut escaped = false;
            let end = string.char_indices().find(|&(_, c)| {
                let closes = c == '"' && !escaped;
                escaped = c == '\\' && !escaped;
                closes
            });
            end.map_or(rest.len(), |(e, _)| e + 2)
        } else if rest.starts_with("'\\") {
            rest[3..].find('\'').map_or(rest.len(), |e| e + 4)
        } else if rest.starts_with('\'') && rest.chars().nth(2) == Some('\'') {
            rest.chars().take(3).map(char::len_utf8).sum()
        } else {
            0
        };
        if skip > 0 {
            out.push(' ');
            at += skip;
        } else {
            let c = rest.chars().next().expect("not at the end");
            out.push(c);
            at += c.len_utf8();
        }
    }
    match out.find("#[cfg(test)]\nmod test {") {
        Some(at) => out[..at].to_owned(),
        None => out,
    }
}

/// Every `crate::…` and `super::…` path in `code` (of module `module`,
/// whose `super` is `module` minus its last part), from the crate root,
/// `{…}` groups expanded one level per name.
fn paths_in(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let word_start =
            at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_' || bytes[at - 1] == b'$');
        let (base, skip) = if word_start && rest.starts_with("crate::") {
            (Vec::new(), "crate::".len())
        } else if word_start && rest.starts_with("super::") {
            let mut base = module.to_vec();
            base.pop();
            let mut skip = "super::".len();
            while code[at + skip..].starts_with("super::") {
                base.pop();
                skip += "super::".len();
            }
            (base, skip)
        } else {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        at += skip;
        for tail in tails(&code[at..]) {
            let mut path = base.clone();
            path.extend(tail);
            out.push(path);
        }
    }
    out
}

/// The paths at the start of `s` (after `crate::`): `a::b::C` → one;
/// `{a::b, c::{self, D}}` → `a::b`, `c::self`… (the group's first level and
/// what follows each, without the nested groups' members).
fn tails(s: &str) -> Vec<Vec<String>> {
    // Segments while each is a whole identifier followed by `::`.
    let path = |s: &str| -> Vec<String> {
        let mut out = Vec::new();
        for segment in s.split("::") {
            let name: String = segment.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if name.is_empty() || name == "self" {
                break;
            }
            let whole = name.len() == segment.len();
            out.push(name);
            if !whole {
                break;
            }
        }
        out
    };
    let Some(group) = s.strip_prefix('{') else {
        return vec![path(s)];
    };
    let mut depth = 0;
    let mut items = vec![String::new()];
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => items.push(String::new()),
            _ if depth == 0 => items.last_mut().expect("one item").push(c),
            _ => {}
        }
    }
    items.iter().map(|i| path(i.trim())).filter(|p| !p.is_empty()).collect()
}
