//! Layers point one way (STYLE.md; ARCHITECTURE.md, "Layers"): the graph of which top-level
//! module of `src/` names which has no cycle.
//!
//! A top-level module is `src/NAME.rs` or the folder `src/NAME/` (every `.rs` file under it);
//! `lib.rs` and `main.rs` are not modules. An edge `A -> B` is a path `crate::B` anywhere in a
//! file of `A`: `use crate::B::…`, `crate::B::f(…)`, `$crate::B` in a macro, and each item of a
//! group `use crate::{B, C::…}`. Every reference in a file counts, test code and comments
//! included: a test of `A` that needs `B` ties `A` to `B` as much as its code does, and a doc
//! link upwards is a sign of a dependency upwards. `../shared/tools/layers.py` reads the same
//! paths but drops a `#[cfg(test)] mod … { … }` at the end of a file and does not expand
//! `crate::{…}` groups, so where a test module names a module its code does not, it prints
//! one edge fewer than this test.
//!
//! The test prints the edges in `layers.py`'s format (`A -> B, C`; run with `--nocapture` to
//! see them) and, on a cycle, names it with the file and line of each of its edges.

use std::collections::{BTreeMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

/// Where an edge was first seen: a file and a line number (1-based).
type Site = (PathBuf, usize);

/// The graph: for each top-level module, the modules it names, each with its first site.
type Graph = BTreeMap<String, BTreeMap<String, Site>>;

/// The top-level modules of `src` and their files, sorted.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(src).expect("src/ is readable") {
        let path = entry.expect("a directory entry").path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            let mut files = Vec::new();
            rust_files(&path, &mut files);
            files.sort();
            modules.insert(name, files);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                modules.insert(stem.to_string(), vec![path]);
            }
        }
    }
    modules
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("a readable folder") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier at the start of `s` (after whitespace), if any.
fn leading_ident(s: &[u8]) -> Option<String> {
    let start = s.iter().position(|c| !c.is_ascii_whitespace())?;
    let len = s[start..].iter().take_while(|&&c| is_ident(c)).count();
    (len > 0).then(|| String::from_utf8_lossy(&s[start..start + len]).into_owned())
}

/// The first segment of every `crate::` path in `text`, with its line number (1-based): `a`
/// for `crate::a::b`, `a` and `b` for `crate::{a::x, b}`.
fn crate_paths(text: &str) -> Vec<(String, usize)> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find("crate") {
        let at = from + offset;
        from = at + "crate".len();
        if at > 0 && is_ident(bytes[at - 1]) {
            continue; // `my_crate::`, `subcrate`
        }
        let rest = text[from..].trim_start();
        let Some(rest) = rest.strip_prefix("::") else {
            continue; // `pub(crate)`, the word in prose
        };
        let line = 1 + bytes[..at].iter().filter(|&&c| c == b'\n').count();
        let rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            for item in group_items(group) {
                if let Some(name) = leading_ident(item.as_bytes()) {
                    found.push((name, line));
                }
            }
        } else if let Some(name) = leading_ident(rest.as_bytes()) {
            found.push((name, line));
        }
    }
    found
}

/// The top-level items of a `{…}` group whose opening brace precedes `group`.
fn group_items(group: &str) -> Vec<&str> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => {
                items.push(&group[start..i]);
                return items;
            }
            '}' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&group[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items // an unclosed group: what there is
}

/// The graph of the top-level modules of `src`.
fn graph(src: &Path) -> Graph {
    let modules = modules(src);
    let mut graph = Graph::new();
    for (module, files) in &modules {
        let edges = graph.entry(module.clone()).or_default();
        for file in files {
            let text = fs::read_to_string(file).expect("a readable source file");
            for (name, line) in crate_paths(&text) {
                if &name != module && modules.contains_key(&name) {
                    edges.entry(name).or_insert_with(|| (file.clone(), line));
                }
            }
        }
    }
    graph
}

/// The strongly connected components of more than one module (Tarjan 1972), each sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g Graph,
        index: BTreeMap<&'g str, usize>,
        low: BTreeMap<&'g str, usize>,
        stack: Vec<&'g str>,
        components: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for w in self.graph[v].keys() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&u| u == v).unwrap();
                let mut component: Vec<String> =
                    self.stack.drain(at..).map(str::to_string).collect();
                if component.len() > 1 {
                    component.sort();
                    self.components.push(component);
                }
            }
        }
    }
    let mut tarjan = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for v in graph.keys() {
        if !tarjan.index.contains_key(v.as_str()) {
            tarjan.visit(v);
        }
    }
    tarjan.components.sort();
    tarjan.components
}

/// A shortest cycle through `start` within `component` (breadth first), as a closed path.
fn cycle_through(graph: &Graph, component: &[String], start: &str) -> Vec<String> {
    let mut parent: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for w in graph[v].keys().filter(|w| component.contains(w)) {
            if w == start {
                let mut path = vec![start.to_string()];
                let mut u = v;
                while u != start {
                    path.push(u.to_string());
                    u = parent[u];
                }
                path.push(start.to_string());
                path.reverse();
                return path;
            }
            if !parent.contains_key(w.as_str()) {
                parent.insert(w, v);
                queue.push_back(w);
            }
        }
    }
    unreachable!("{start} is in a strongly connected component, so on a cycle")
}

/// The edges in `layers.py`'s format, one module a line.
fn render(graph: &Graph) -> String {
    let mut out = String::new();
    for (module, edges) in graph {
        let names: Vec<&str> = edges.keys().map(String::as_str).collect();
        let names = if names.is_empty() { "-".to_string() } else { names.join(", ") };
        out.push_str(&format!("{module} -> {names}\n"));
    }
    out
}

/// Each cycle of `graph` named with the site of each of its edges; empty if there is none.
fn explain_cycles(graph: &Graph, root: &Path) -> String {
    let mut out = String::new();
    for component in cycles(graph) {
        let path = cycle_through(graph, &component, &component[0]);
        out.push_str(&format!("cycle among {}: {}\n", component.join(", "), path.join(" -> ")));
        for pair in path.windows(2) {
            let (file, line) = &graph[&pair[0]][&pair[1]];
            let file = file.strip_prefix(root).unwrap_or(file).display();
            out.push_str(&format!("  {} -> {}: {file}:{line}\n", pair[0], pair[1]));
        }
    }
    out
}

#[test]
fn top_level_modules_form_no_cycle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let graph = graph(&root.join("src"));
    println!("{}", render(&graph));
    let cycles = explain_cycles(&graph, root);
    assert!(cycles.is_empty(), "layers point one way, but:\n{cycles}");
}

#[test]
fn the_command_line_is_on_top_and_configuration_below_the_tools() {
    let graph = graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    for (module, edges) in &graph {
        assert!(!edges.contains_key("cli"), "{module} uses the command line: {:?}", edges["cli"]);
    }
    for tool in ["cli", "server", "sim", "bench", "demo"] {
        let site = graph["config"].get(tool);
        assert!(site.is_none(), "config uses the subcommand module {tool}: {site:?}");
    }
}

#[test]
fn paths_are_read_in_every_form() {
    let text = "use crate::a::b;\n\
                use crate::{\n    c::{d, e},\n    f,\n};\n\
                pub(crate) fn g() { crate :: h::i(); my_crate::j(); }\n\
                // see [`crate::k`]\n\
                macro_rules! m { () => { $crate::l::n() }; }\n";
    let found = crate_paths(text);
    let expected = [("a", 1), ("c", 2), ("f", 2), ("h", 6), ("k", 7), ("l", 8)];
    let expected: Vec<(String, usize)> =
        expected.iter().map(|&(name, line)| (name.to_string(), line)).collect();
    assert_eq!(found, expected);
}

#[test]
fn a_cycle_is_found_and_named_with_its_sites() {
    let site = |line| (PathBuf::from("/r/src/x.rs"), line);
    let mut graph = Graph::new();
    graph.insert("a".into(), BTreeMap::from([("b".into(), site(1))]));
    graph.insert("b".into(), BTreeMap::from([("c".into(), site(2)), ("d".into(), site(3))]));
    graph.insert("c".into(), BTreeMap::from([("a".into(), site(4))]));
    graph.insert("d".into(), BTreeMap::new());
    graph.insert("e".into(), BTreeMap::from([("d".into(), site(5))]));
    assert_eq!(cycles(&graph), vec![vec!["a".to_string(), "b".into(), "c".into()]]);
    assert_eq!(
        explain_cycles(&graph, Path::new("/r")),
        "cycle among a, b, c: a -> b -> c -> a\n  a -> b: src/x.rs:1\n  b -> c: src/x.rs:2\n  \
         c -> a: src/x.rs:4\n"
    );
    graph.get_mut("c").unwrap().clear();
    assert!(cycles(&graph).is_empty());
    assert_eq!(render(&graph), "a -> b\nb -> c, d\nc -> -\nd -> -\ne -> d\n");
}
