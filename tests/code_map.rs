//! ARCHITECTURE.md's code map names every file under `src/`, and ARCHITECTURE.md names no
//! file of `src/` that is gone (STYLE.md, "Saying what is true": keep it true as the code
//! moves).
//!
//! The code map is the section `## Code map`, up to the next `## ` heading. A file `src/P` is
//! named there when the map contains `P` as a path from `src/` (`scheduler/queue.rs` or
//! `src/scheduler/queue.rs`; `src/lib.rs` for a file at the top of `src/`), or when the
//! paragraph of its top-level module contains its file name (`queue.rs`), or, for a folder's
//! `mod.rs`, the folder (`shard/`). A module's paragraph is every bullet at the margin whose
//! first bold span names `src/MODULE`, with the lines under it; such a bullet names the
//! folder's own `mod.rs` too. A bare file name counts only within its module's paragraph
//! because many repeat across modules (`mod.rs`, `harness.rs`, `reference.rs`, `tests.rs`).

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

/// Every `.rs` file under `dir`, as paths relative to `root` with `/` separators, sorted.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for entry in fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let relative = path.strip_prefix(root).expect("under the root");
            let parts: Vec<_> = relative.iter().map(|p| p.to_string_lossy()).collect();
            out.push(parts.join("/"));
        }
    }
    out.sort();
}

/// The section `## Code map` of `text`, without its heading.
fn code_map(text: &str) -> &str {
    let start = text.find("\n## Code map\n").expect("ARCHITECTURE.md has a `## Code map`");
    let body = &text[start + "\n## Code map\n".len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    &body[..end]
}

/// The text of each top-level module's paragraphs in `map`, by module name.
fn paragraphs(map: &str) -> BTreeMap<String, String> {
    let mut by_module: BTreeMap<String, String> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in map.lines() {
        if line.starts_with("- ") {
            current = lead_module(line);
        } else if !line.starts_with(' ') {
            current = None; // prose between bullets belongs to no module
        }
        if let Some(module) = &current {
            let text = by_module.entry(module.clone()).or_default();
            text.push_str(line);
            text.push('\n');
        }
    }
    by_module
}

/// The module named by the first bold span of a bullet's first line: `scheduler` for
/// ``- **`src/scheduler`** (`mod.rs`) — …`` or ``- **`src/scheduler/mod.rs`**``.
fn lead_module(line: &str) -> Option<String> {
    let bold = line.split("**").nth(1)?;
    let path = bold.trim_matches('`').strip_prefix("src/")?;
    let module = path.split(['/', '.']).next()?;
    (!module.is_empty()).then(|| module.to_string())
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// What may come right before a name for it to count.
#[derive(Clone, Copy)]
enum Before {
    /// Anything but a character of a name: `queue.rs` in `` `queue.rs` `` or `shard/queue.rs`.
    NotAName,
    /// Not a path either (no `/` or `.`), unless that `/` ends `src/`: a path from `src/`.
    NotAPath,
    /// Exactly `src/`: a file at the top of `src/` (`src/lib.rs`), whose bare name could be
    /// any module's file.
    Src,
}

/// Whether `text` contains `needle` not run on from a longer name: after what `before`
/// allows, and before a character that is not part of a name.
fn mentions(text: &str, needle: &str, before: Before) -> bool {
    let mut from = 0;
    while let Some(offset) = text[from..].find(needle) {
        let at = from + offset;
        from = at + 1;
        let src = text[..at].ends_with("src/") && !text[..at - 4].ends_with(is_path_char);
        let starts = match (before, text[..at].chars().next_back()) {
            (Before::Src, _) => src,
            (_, None) => true,
            (_, Some(c)) if is_path_char(c) => false,
            (Before::NotAPath, Some('/' | '.')) => src,
            (_, Some(_)) => true,
        };
        if starts && !text[at + needle.len()..].starts_with(is_path_char) {
            return true;
        }
    }
    false
}

/// Whether the map names `file` (a path relative to `src/`).
fn named(map: &str, paragraphs: &BTreeMap<String, String>, file: &str) -> bool {
    let before = if file.contains('/') { Before::NotAPath } else { Before::Src };
    if mentions(map, file, before) {
        return true;
    }
    let Some((module, rest)) = file.split_once('/') else {
        return false; // a file at the top of src/ is named by its path only
    };
    let Some(paragraph) = paragraphs.get(module) else {
        return false;
    };
    match rest.rsplit_once('/') {
        None if rest == "mod.rs" => true, // the module's own file: its paragraph names it
        Some((folder, "mod.rs")) => {
            let folder = folder.rsplit('/').next().unwrap_or(folder);
            mentions(paragraph, &format!("{folder}/"), Before::NotAName)
        }
        Some((_, name)) => mentions(paragraph, name, Before::NotAName),
        None => mentions(paragraph, rest, Before::NotAName),
    }
}

/// Every `src/….rs` path written in `text`.
fn written_paths(text: &str) -> Vec<&str> {
    let mut paths = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find("src/") {
        let at = from + offset;
        from = at + "src/".len();
        if text[..at].chars().next_back().is_some_and(|c| is_path_char(c) || c == '/') {
            continue; // `fuzz/src/…`, `mysrc/`
        }
        // File names here are lower case; `src/NAME.rs` is a placeholder, not a path.
        let in_path = |c: char| matches!(c, 'a'..='z' | '0'..='9' | '_' | '/' | '.');
        let len = text[at..].find(|c: char| !in_path(c)).unwrap_or(text.len() - at);
        let path = text[at..at + len].trim_end_matches('.');
        if path.ends_with(".rs") {
            paths.push(path);
        }
    }
    paths
}

#[test]
fn the_code_map_names_every_file_under_src() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let map = code_map(&text);
    let paragraphs = paragraphs(map);
    let src = root.join("src");
    let mut files = Vec::new();
    rust_files(&src, &src, &mut files);
    let missing: Vec<&String> = files.iter().filter(|f| !named(map, &paragraphs, f)).collect();
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map does not name these files of src/ (by their path from src/, \
         or by their file name in their module's paragraph): {missing:?}"
    );
}

#[test]
fn architecture_names_no_file_of_src_that_is_gone() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = fs::read_to_string(root.join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let gone: Vec<&str> =
        written_paths(&text).into_iter().filter(|path| !root.join(path).is_file()).collect();
    assert!(gone.is_empty(), "ARCHITECTURE.md names files that do not exist: {gone:?}");
}

#[test]
fn names_are_found_in_their_own_module_only() {
    let map = "- **`src/a`** — `x.rs` does x; `sub/` holds y (`z.rs`).\n  - **`w.rs`** — w.\n\
               Prose: `v.rs`.\n- **`src/b.rs`** — b; `src/c/deep/q.rs`.\n";
    let paragraphs = paragraphs(map);
    assert_eq!(paragraphs.keys().collect::<Vec<_>>(), ["a", "b"]);
    for file in ["a/mod.rs", "a/x.rs", "a/w.rs", "a/sub/mod.rs", "a/sub/z.rs", "b.rs"] {
        assert!(named(map, &paragraphs, file), "{file} is named");
    }
    assert!(named(map, &paragraphs, "c/deep/q.rs"), "by its whole path, in any paragraph");
    for file in ["a/v.rs", "b/x.rs", "c/mod.rs", "x.rs", "deep/q.rs", "a/sub.rs"] {
        assert!(!named(map, &paragraphs, file), "{file} is not named");
    }
    assert_eq!(
        written_paths("`src/a/x.rs`, src/b.rs. fuzz/src/c.rs `src/d` src/e.rsx src/NAME.rs"),
        ["src/a/x.rs", "src/b.rs"]
    );
}
