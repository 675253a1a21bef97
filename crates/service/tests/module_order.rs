//! The workspace's order, checked the way cargo checks the crates' order:
//! every `crate::…` and `super::…` path is read, and an import that runs up
//! the stated order fails the test.
//!
//! - Between crates, the order is `docs/architecture.md`'s "may depend on"
//!   table: each crate's `Cargo.toml` may name only the workspace crates
//!   its row lists, and every crate has a row.
//! - Between the service's top-level modules, the order is the numbered
//!   "Layout" list of its `src/lib.rs`, from the top down: a module may use
//!   only modules named after it in that list.
//! - Inside the service's `session/` and `settings/`, and the store
//!   crate's `src/`, the order is the "Files, from the bottom up" list of
//!   the folder's `mod.rs` (the store's `lib.rs`): a file (with everything
//!   under it, e.g. `postgres/…`) may use only the files named before it,
//!   directly or through what `mod.rs` re-exports from them, or a crate
//!   below that `mod.rs` re-exports (the store's `record`); never an item
//!   `mod.rs` defines itself (`mod.rs` declares and re-exports; in
//!   `settings/` it also loads, calling down).
//!
//! Test code (`test.rs`, `#[cfg(test)] mod test { … }`) and `fuzz` (the
//! fuzzing entry points, test-only) may reach anywhere and are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The folders whose files are ordered: a crate (its folder under
/// `crates/`), the folder in its `src/` (`""`: `src/` itself), and the
/// file there that lists the order.
const ORDERED: [(&str, &str, &str); 3] =
    [("service", "session", "mod.rs"), ("service", "settings", "mod.rs"), ("store", "", "lib.rs")];

#[test]
fn no_crate_depends_on_one_above_it() {
    let table = crate_table();
    let (mut wrong, mut unlisted) = (Vec::new(), Vec::new());
    for manifest in manifests() {
        let name = package_name(&manifest);
        if name == "pacpriv-workspace-hack" {
            continue;
        }
        let Some(allowed) = table.get(&name) else {
            unlisted.push(name);
            continue;
        };
        for used in workspace_dependencies(&manifest) {
            if !allowed.contains(&used) && used != "pacpriv-workspace-hack" {
                wrong.push(format!("{name} depends on {used}, which its row does not list"));
            }
        }
    }
    assert!(unlisted.is_empty(), "crates without a row in docs/architecture.md's table: {unlisted:?}");
    assert!(wrong.is_empty(), "dependencies docs/architecture.md's table does not allow:\n{}", wrong.join("\n"));
    let below = |a: &str, b: &str| table.get(a).is_some_and(|row| row.contains(b));
    assert!(below("pacpriv-service", "pacpriv-store") && !below("pacpriv-store", "pacpriv-service"));
}

#[test]
fn no_top_level_module_uses_one_above_it() {
    let src = crate_src("service");
    let order = lib_order(&src);
    let rank = |m: &str| order.iter().position(|o| o == m);
    let mut wrong = Vec::new();
    for (file, module) in sources(&src) {
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
    for (krate, folder, index) in ORDERED {
        let src = crate_src(krate);
        let prefix: Vec<String> = Some(folder).filter(|f| !f.is_empty()).map(str::to_owned).into_iter().collect();
        let at = prefix.len();
        let list = rel(&src.join(folder).join(index));
        let Order { files, vocabulary, below } = folder_order(&src.join(folder), index);
        let rank = |m: &str| files.iter().position(|o| o == m);
        let named = |m: &str| prefix.iter().map(|p| format!("{p}::")).collect::<String>() + m;
        for (file, module) in sources(&src) {
            if !module.starts_with(&prefix) || module.len() <= at {
                continue;
            }
            let own = &module[at];
            let own_rank = rank(own)
                .unwrap_or_else(|| panic!("{}: `{own}` is not in {list}'s \"Files, from the bottom up\"", rel(&file)));
            for path in imports(&file, &module) {
                if !path.starts_with(&prefix) || path.len() <= at || &path[at] == own || below.contains(&path[at]) {
                    continue;
                }
                let used = vocabulary.get(&path[at]).unwrap_or(&path[at]);
                match rank(used) {
                    Some(r) if r > own_rank => {
                        wrong.push(format!("{}: uses `{}`, listed above `{own}`", rel(&file), named(used)));
                    }
                    Some(_) => {}
                    // Neither a file nor what one re-exports: mod.rs's own
                    // item, above every file (mod.rs declares, re-exports
                    // and, in settings/, loads by calling down).
                    None => wrong.push(format!("{}: uses `{}`, {list}'s own item", rel(&file), named(used))),
                }
            }
        }
    }
    assert!(wrong.is_empty(), "imports running up a folder's order:\n{}", wrong.join("\n"));
}

/// The dependency reader finds a workspace crate however a manifest
/// names it.
#[test]
fn the_reader_finds_every_form_of_dependency() {
    let dir = tempfile::tempdir().expect("temp dir");
    let manifest = dir.path().join("Cargo.toml");
    let text = "[package]\nname = \"x\"\n[workspace.dependencies]\npacpriv-tools = { path = \"t\" }\n\
                [dependencies]\npacpriv-privacy.workspace = true\nserver = { package = \"pacpriv-service\" }\n\
                [dev-dependencies.pacpriv-store]\nworkspace = true\n\
                [target.'cfg(unix)'.build-dependencies]\npacpriv-demo = { path = \"d\" }\n";
    std::fs::write(&manifest, text).expect("written");
    let found: Vec<String> = workspace_dependencies(&manifest).into_iter().collect();
    assert_eq!(found, ["pacpriv-demo", "pacpriv-privacy", "pacpriv-service", "pacpriv-store"]);
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

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn crate_src(folder: &str) -> PathBuf {
    workspace().join("crates").join(folder).join("src")
}

fn rel(file: &Path) -> String {
    file.strip_prefix(workspace()).unwrap_or(file).display().to_string()
}

/// `docs/architecture.md`'s "may depend on" table: each crate and the
/// workspace crates it may name.
fn crate_table() -> BTreeMap<String, BTreeSet<String>> {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture.md")).expect("docs/architecture.md");
    let rows = doc.lines().skip_while(|l| !l.starts_with("| crate | may depend on |")).skip(2);
    let quoted = |cell: &str| -> Vec<String> {
        cell.split('`').skip(1).step_by(2).filter(|n| n.starts_with("pacpriv")).map(str::to_owned).collect()
    };
    let table: BTreeMap<String, BTreeSet<String>> = rows
        .take_while(|l| l.starts_with('|'))
        .filter_map(|row| {
            let mut cells = row.split('|').skip(1);
            let name = quoted(cells.next()?).into_iter().next()?;
            Some((name, quoted(cells.next()?).into_iter().collect()))
        })
        .collect();
    assert!(table.len() >= 5, "docs/architecture.md's table lists too few crates: {table:?}");
    table
}

/// Every crate's `Cargo.toml`: `crates/*/` and the root package.
fn manifests() -> Vec<PathBuf> {
    let crates = std::fs::read_dir(workspace().join("crates")).expect("crates/");
    let mut out: Vec<PathBuf> = crates.map(|e| e.expect("dir entry").path().join("Cargo.toml")).collect();
    out.push(workspace().join("Cargo.toml"));
    out.into_iter().filter(|m| m.is_file()).collect()
}

fn package_name(manifest: &Path) -> String {
    let text = std::fs::read_to_string(manifest).expect("Cargo.toml");
    let package = text.split("[package]").nth(1).expect("a [package] section");
    let line = package.lines().find(|l| l.starts_with("name = ")).expect("a package name");
    line.trim_start_matches("name = ").trim_matches('"').to_owned()
}

/// The workspace crates (`pacpriv…`) a manifest's dependency sections
/// name, build and dev dependencies included: by key, by `package = …`
/// (a renamed dependency), or as a `[dependencies.NAME]` table.
fn workspace_dependencies(manifest: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(manifest).expect("Cargo.toml");
    let name = |s: &str| s.split(['.', ' ', '=', '"', ']']).find(|n| !n.is_empty()).unwrap_or_default().to_owned();
    let (mut section, mut out) = ("", BTreeSet::new());
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        }
        if section.starts_with("[workspace") || !section.contains("dependencies") {
            continue;
        }
        if let Some((_, table)) = line.split_once("dependencies.") {
            out.insert(name(table));
        } else if let Some((_, package)) = line.split_once("package = ") {
            out.insert(name(package));
        } else if !line.starts_with('[') {
            out.insert(name(line));
        }
    }
    out.retain(|n| n.starts_with("pacpriv"));
    out
}

/// Every non-test source file under `src` and its module path
/// (`session/cache/mod.rs` → `["session", "cache"]`).
fn sources(src: &Path) -> Vec<(PathBuf, Vec<String>)> {
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
    walk(src, &mut files);
    files.sort();
    files
        .into_iter()
        .filter_map(|file| {
            let rel = file.strip_prefix(src).ok()?.with_extension("");
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
fn lib_order(src: &Path) -> Vec<String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let list: String = lib
        .lines()
        .skip_while(|l| !l.starts_with("//! # Layout"))
        .take_while(|l| l.starts_with("//!"))
        .skip_while(|l| !l.trim_start_matches("//!").trim_start().starts_with("1."))
        .take_while(|l| !l.trim_start_matches("//!").trim().is_empty())
        .collect::<Vec<_>>()
        .join("\n");
    let order = linked_modules(&list, src);
    assert!(order.len() >= 5, "lib.rs's Layout list names too few modules: {order:?}");
    order
}

/// A folder's order, from its `mod.rs` (or `lib.rs`).
struct Order {
    /// The "Files, from the bottom up" list, in order.
    files: Vec<String>,
    /// The names its `use` lines bring up from a file (`SessionError` →
    /// `error`).
    vocabulary: BTreeMap<String, String>,
    /// What it re-exports from a workspace crate below
    /// (`pub use pacpriv_records as record;` → `record`).
    below: BTreeSet<String>,
}

fn folder_order(dir: &Path, index: &str) -> Order {
    let text = std::fs::read_to_string(dir.join(index)).expect("the folder's index file");
    let list: String = text
        .lines()
        .skip_while(|l| !l.starts_with("//! # Files, from the bottom up"))
        .skip(1)
        .take_while(|l| l.starts_with("//!") && !l.starts_with("//! #"))
        .collect::<Vec<_>>()
        .join("\n");
    let files = named_modules(&list, dir);
    assert!(!files.is_empty(), "{} has no \"Files, from the bottom up\" list", rel(&dir.join(index)));
    // `pub use file::{A, B};` (a path relative to the folder).
    let (mut vocabulary, mut below) = (BTreeMap::new(), BTreeSet::new());
    for statement in code_of(&text).split(';') {
        let line = statement.trim();
        let Some(rest) = line.strip_prefix("pub use ").or_else(|| line.strip_prefix("use ")) else { continue };
        if rest.starts_with("pacpriv_") {
            below.insert(rest.rsplit([' ', ':']).next().unwrap_or_default().to_owned());
            continue;
        }
        let Some((file, names)) = rest.split_once("::") else { continue };
        if files.iter().any(|o| o == file) {
            for name in names.trim_matches(|c: char| "{} \n".contains(c)).split(',') {
                let name = name.trim().rsplit("::").next().unwrap_or_default().to_owned();
                if !name.is_empty() && name != "self" {
                    vocabulary.insert(name, file.to_owned());
                }
            }
        }
    }
    Order { files, vocabulary, below }
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
