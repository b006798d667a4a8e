//! Imports go one way: http -> resolve -> (cache, upstream, status) -> store
//! -> domain. Every file of `src/` is parsed with syn for the paths it names.
//! - no cycle between top-level modules; a low module imports nothing above it (`LOW`);
//! - inside a folder, files may import each other both ways (one module to the rest);
//! - only `store` names sqlx;
//! - `http::server -> http::api`, never the reverse;
//! - no route path literal appears twice in `src/`;
//! - no file of `src/` is over [`MAX_LINES`] lines.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use proc_macro2::{TokenStream, TokenTree};
use syn::visit::Visit;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// What each low module may import.
const LOW: [(&str, &[&str]); 3] = [
    ("domain", &[]),
    ("config", &["domain"]),
    ("telemetry", &["config", "domain"]),
];

#[test]
fn top_level_modules_form_no_cycle() {
    let graph = module_graph(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")));
    assert!(graph.len() > 8, "read the modules: {graph:?}");
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle between modules: {}", cycle.join(" -> "));
    }
}

#[test]
fn low_modules_import_nothing_above_them() {
    let graph = module_graph(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")));
    for (module, allowed) in LOW {
        let imports = graph.get(module).cloned().unwrap_or_default();
        let above: Vec<_> = imports
            .iter()
            .filter(|m| !allowed.contains(&m.as_str()))
            .collect();
        assert!(above.is_empty(), "{module} imports {above:?}");
    }
}

/// `http::server -> http::api`: the server runs the API; the API does not
/// know how it is served.
#[test]
fn the_api_does_not_import_the_server() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let http = folder_graph(src, &src.join("http"));
    assert!(http["server"].contains("api"), "{http:?}");
    assert!(
        !http["api"].contains("server"),
        "the API imports the server"
    );
}

/// The route table names its handlers, so nothing it reaches names the table
/// (handlers take paths from the leaf `paths`), and no circle runs through
/// the files of `http::api`, nor of `upstream` (the table of endings reads the
/// errors; the errors do not read the table).
#[test]
fn the_files_of_the_api_form_no_cycle() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let api = folder_graph(src, &src.join("http").join("api"));
    assert!(api["routes"].contains("admin"), "{api:?}");
    // The root (`mod.rs`) declares and re-exports its children: a child
    // reading a type of the root is the module tree, not a circle; nor are
    // the unit tests (`tests.rs`), which read everything.
    let mut upstream = folder_graph(src, &src.join("upstream"));
    for node in ["mod", "tests"] {
        upstream.remove(node);
        upstream.values_mut().for_each(|to| {
            to.remove(node);
        });
    }
    assert!(upstream["ending"].contains("error"), "{upstream:?}");
    for (folder, graph) in [("http::api", api), ("upstream", upstream)] {
        if let Some(cycle) = find_cycle(&graph) {
            panic!(
                "import cycle between the files of {folder}: {}",
                cycle.join(" -> ")
            );
        }
    }
}

/// Every route table path is written once in `src/` (`http/api/paths.rs`),
/// and no other route-like literal (`"/v1/...`, `"/admin...`) twice.
#[test]
fn no_route_path_is_written_twice() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let routes: Vec<&str> = phones_gateway::http::api::routes::LABELS
        .into_iter()
        .filter(|label| label.starts_with('/'))
        .collect();
    assert!(routes.len() > 10, "{routes:?}");
    let mut places: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for path in rust_files(src) {
        for literal in &parsed(&path).literals {
            let route_like = literal.starts_with("/v1/")
                || literal.starts_with("/admin")
                || routes.contains(&literal.as_str());
            if route_like {
                let place = path.strip_prefix(src).unwrap().display().to_string();
                places.entry(literal.clone()).or_default().push(place);
            }
        }
    }
    for route in &routes {
        assert!(
            places.contains_key(*route),
            "{route} is written nowhere in src/"
        );
    }
    let twice: Vec<_> = places.iter().filter(|(_, at)| at.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "route paths written more than once: {twice:?}"
    );
}

/// The most lines a file of `src/` may have, unit tests included: past it,
/// split it by concern (or move its tests to a sibling file).
const MAX_LINES: usize = 800;
/// The most lines of a file of `src/upstream/`.
const MAX_UPSTREAM_LINES: usize = 500;

/// The files under `dir` (from the repository root) over `max` lines, with
/// their counts; asserts it read more than `at_least` files.
fn files_over(dir: &str, max: usize, at_least: usize) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = rust_files(&root.join(dir));
    assert!(files.len() > at_least, "read the files: {files:?}");
    let lines = |path: &PathBuf| std::fs::read_to_string(path).unwrap().lines().count();
    files
        .iter()
        .filter(|path| lines(path) > max)
        .map(|path| {
            format!(
                "{}: {} lines",
                path.strip_prefix(root).unwrap().display(),
                lines(path)
            )
        })
        .collect()
}

#[test]
fn no_file_of_src_is_over_the_size_rule() {
    let over = files_over("src", MAX_LINES, 50);
    assert!(
        over.is_empty(),
        "files over {MAX_LINES} lines: {}",
        over.join(", ")
    );
}

/// The upstream call is a stack of small gates, a file each: no file of
/// `src/upstream/` is over [`MAX_UPSTREAM_LINES`].
#[test]
fn no_file_of_the_upstream_call_is_over_its_size_rule() {
    let over = files_over("src/upstream", MAX_UPSTREAM_LINES, 10);
    assert!(
        over.is_empty(),
        "files over {MAX_UPSTREAM_LINES} lines: {}",
        over.join(", ")
    );
}

#[test]
fn the_literal_reader_reads_code_and_macros_not_docs() {
    let code = "/// \"/v1/doc\"\nfn f() { g(\"/v1/a\", b\"/admin\", '\"'); \
                format!(\"say \\\"/v1/b\\\"\"); }";
    assert_eq!(
        names_in(code).literals,
        ["/v1/a", "/admin", r#"say "/v1/b""#]
    );
}

#[test]
fn only_the_store_speaks_sql() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let outside: Vec<String> = rust_files(src)
        .into_iter()
        .filter(|path| top_level(src, path) != "store")
        .filter(|path| crate_in(parsed(path), "sqlx"))
        .map(|path| path.strip_prefix(src).unwrap().display().to_string())
        .collect();
    assert!(
        outside.is_empty(),
        "only src/store may use sqlx; also: {outside:?}"
    );
    assert!(
        rust_files(src)
            .iter()
            .any(|path| crate_in(parsed(path), "sqlx")),
        "read the store"
    );
}

#[test]
fn the_sqlx_check_reads_code_not_comments() {
    assert!(names_sqlx("use sqlx::PgPool;"));
    assert!(names_sqlx("fn f() { let e: ::sqlx::Error = todo!(); }"));
    assert!(names_sqlx("use {sqlx::Row, std::fmt};"));
    assert!(names_sqlx("extern crate sqlx;"));
    assert!(!names_sqlx("//! everything that speaks SQL (sqlx)"));
    assert!(!names_sqlx("fn f() { let n = 1; } // not sqlx::Error"));
    assert!(!names_sqlx("use my_sqlx::Thing;"));
}

/// Whether `text` names the sqlx crate in code, comments skipped.
fn names_sqlx(text: &str) -> bool {
    names_crate(text, "sqlx")
}

/// Whether `text` names crate `name` in code: `name::...` (not
/// `crate::name::`) or `extern crate name`.
fn names_crate(text: &str, name: &str) -> bool {
    crate_in(&names_in(text), name)
}

/// [`names_crate`] of a parsed file.
fn crate_in(names: &Names, name: &str) -> bool {
    names.extern_crates.iter().any(|c| c == name)
        || names
            .paths
            .iter()
            .any(|p| p.segments.len() >= 2 && p.segments[0] == name)
}

/// The selection rules and the fan-out know nothing of HTTP: the trace comes
/// in as `telemetry::trace::RequestTrace`, not as headers.
#[test]
fn resolve_imports_nothing_of_http() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let http_crates = [
        "axum",
        "hyper",
        "http",
        "http_body_util",
        "tower",
        "tower_service",
    ];
    let found: Vec<String> = rust_files(src)
        .into_iter()
        .filter(|path| top_level(src, path) == "resolve")
        .flat_map(|path| {
            http_crates
                .iter()
                .filter(|name| crate_in(parsed(&path), name))
                .map(|name| format!("{} names {name}", path.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(found.is_empty(), "{found:?}");
    assert!(names_crate("use axum::http::HeaderMap;", "axum"));
    assert!(names_crate("fn f(h: Option<&http::HeaderMap>) {}", "http"));
    assert!(!names_crate("use crate::http::api::RequestLimits;", "http"));
}

#[test]
fn the_checker_finds_a_cycle_and_reads_grouped_imports() {
    let graph = graph_of(&[
        (
            "store",
            "use crate::{domain::{Phone, UserId}, status::Applied};",
        ),
        ("status", "use crate::store::Store;"),
        ("domain", ""),
    ]);
    assert_eq!(
        graph["store"],
        BTreeSet::from(["domain".to_owned(), "status".to_owned()])
    );
    let cycle = find_cycle(&graph).expect("a cycle");
    assert!(cycle.contains(&"store".to_owned()) && cycle.contains(&"status".to_owned()));
    let acyclic = graph_of(&[("store", "use crate::domain::X;"), ("domain", "")]);
    assert_eq!(find_cycle(&acyclic), None);
}

fn graph_of(modules: &[(&str, &str)]) -> Graph {
    folder_graph_of(&[], modules)
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let (mut found, mut todo) = (Vec::new(), vec![dir.to_path_buf()]);
    while let Some(path) = todo.pop() {
        if path.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                todo.push(entry.unwrap().path());
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// Top-level module -> the top-level modules its files name (`mod`: lib.rs).
fn module_graph(src: &Path) -> Graph {
    folder_graph(src, src)
}

/// The top-level module `path` belongs to (`lib` and `main` for the roots).
fn top_level(src: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_str().unwrap().trim_end_matches(".rs").to_owned()
}

/// A cycle, as the path of modules around it, if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(graph, next, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(graph, node, &mut Vec::new(), &mut done))
}

#[test]
fn the_path_reader_reads_every_spelling() {
    let module = |m: &[&str]| m.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let read = |text: &str, at: &[&str]| -> Vec<String> {
        paths_of(text, &module(at))
            .into_iter()
            .map(|path| path.join("::"))
            .collect()
    };
    assert_eq!(
        read(
            "use crate::http::{api::RequestLimits, server::serve};",
            &["x"]
        ),
        ["http::api::RequestLimits", "http::server::serve"]
    );
    assert_eq!(
        read(
            "use super::super::server::shed::Shed;",
            &["http", "api", "admin"]
        ),
        ["http::server::shed::Shed"]
    );
    assert_eq!(
        read(
            "use super::{self, routes as r, *};",
            &["http", "api", "admin"]
        ),
        ["http::api", "http::api::routes", "http::api"]
    );
    assert_eq!(
        read(
            "fn f() { let n = routes::LABELS.len(); v.iter().collect::<Vec<_>>(); }",
            &["http", "api"]
        ),
        ["http::api::routes::LABELS"]
    );
    assert_eq!(
        read(
            "impl From<&super::Config> for X { fn f() -> Self::Y { todo!() } }",
            &["a", "b"]
        ),
        ["a::Config", "a::b::Self::Y"]
    );
    assert_eq!(
        read(
            "pub(super) fn f<'a>(c: char) -> bool { c == '\"' || c == '\\'' }",
            &["a"]
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        read(
            "fn f() { let s = r#\"crate::x::y\"#; let b = b'a'; crate::z::w(); }",
            &["a"]
        ),
        ["z::w"]
    );
}

/// A folder's graph from texts (`mod` for its `mod.rs`), the folder at
/// `folder` in the crate.
fn folder_graph_of(folder: &[&str], files: &[(&str, &str)]) -> Graph {
    let folder: Vec<String> = folder.iter().map(|s| s.to_string()).collect();
    let children: BTreeSet<String> = files
        .iter()
        .map(|(node, _)| node.to_string())
        .filter(|node| node != "mod")
        .collect();
    let mut graph = Graph::new();
    for (node, text) in files {
        let mut module = folder.clone();
        if *node != "mod" {
            module.push(node.to_string());
        }
        add_imports(
            &mut graph,
            &folder,
            &children,
            node,
            &module,
            &names_in(text),
        );
    }
    graph
}

/// The nodes of `folder` -> the sibling nodes its files' paths land in.
fn folder_graph(src: &Path, folder: &Path) -> Graph {
    let module_of = |path: &Path| -> Vec<String> {
        let relative = path.strip_prefix(src).unwrap();
        let mut module: Vec<String> = relative
            .components()
            .map(|c| {
                c.as_os_str()
                    .to_str()
                    .unwrap()
                    .trim_end_matches(".rs")
                    .to_owned()
            })
            .collect();
        if is_root(src, path) {
            module.pop();
        }
        module
    };
    let here = module_of(folder);
    let children: BTreeSet<String> = std::fs::read_dir(folder)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir() || path.extension().is_some_and(|e| e == "rs"))
        .filter(|path| !is_root(src, path))
        .map(|path| module_of(&path).last().unwrap().clone())
        .collect();
    let mut graph = Graph::new();
    for path in rust_files(folder) {
        if path == src.join("main.rs") {
            continue; // the binary, a crate of its own
        }
        let module = module_of(&path);
        let node = module.get(here.len()).map_or("mod", String::as_str);
        add_imports(&mut graph, &here, &children, node, &module, parsed(&path));
    }
    graph
}

/// Whether `path` is its folder's root module (`mod.rs`; lib.rs, main.rs).
fn is_root(src: &Path, path: &Path) -> bool {
    path.ends_with("mod.rs") || path == src.join("lib.rs") || path == src.join("main.rs")
}

/// Adds the imports from `node` (its folder's children `children`) that the
/// text of `module` draws.
fn add_imports(
    graph: &mut Graph,
    folder: &[String],
    children: &BTreeSet<String>,
    node: &str,
    module: &[String],
    names: &Names,
) {
    let mut targets = BTreeSet::new();
    for path in paths_in(names, module) {
        let Some(rest) = path.strip_prefix(folder) else {
            continue;
        };
        let target = match rest.first() {
            Some(child) if children.contains(child) => child.as_str(),
            _ => "mod",
        };
        if target != node {
            targets.insert(target.to_owned());
        }
    }
    graph.entry(node.to_owned()).or_default().extend(targets);
}

/// A path as written: its segments, the inline modules around it, whether it
/// starts with `::` and whether it sits in a `#[cfg(test)]` inline module.
struct WrittenPath {
    inline: Vec<String>,
    segments: Vec<String>,
    external: bool,
    in_test: bool,
}

/// What the checks read from one file: the paths it names in code (`use`
/// trees expanded), its string literals and its `extern crate`s. In macro
/// calls and attribute arguments a path is a run of `::`-joined identifiers;
/// doc comments are no code.
#[derive(Default)]
struct Names {
    paths: Vec<WrittenPath>,
    literals: Vec<String>,
    extern_crates: Vec<String>,
}

/// What [`names_in`] reads from `path` under `src/`, each file parsed once
/// for all the tests.
fn parsed(path: &Path) -> &'static Names {
    static FILES: OnceLock<BTreeMap<PathBuf, Names>> = OnceLock::new();
    let files = FILES.get_or_init(|| {
        let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
        rust_files(src)
            .into_iter()
            .map(|file| {
                let names = names_in(&std::fs::read_to_string(&file).unwrap());
                (file, names)
            })
            .collect()
    });
    &files[path]
}

fn names_in(text: &str) -> Names {
    let file = syn::parse_file(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    let mut reader = Reader::default();
    reader.visit_file(&file);
    reader.names
}

/// The syntax-tree walk that fills [`Names`].
#[derive(Default)]
struct Reader {
    names: Names,
    /// The inline modules around, and whether each is a test's.
    inline: Vec<(String, bool)>,
}

impl Reader {
    fn path(&mut self, segments: Vec<String>, external: bool) {
        self.names.paths.push(WrittenPath {
            inline: self.inline.iter().map(|(name, _)| name.clone()).collect(),
            segments,
            external,
            in_test: self.inline.iter().any(|(_, test)| *test),
        });
    }

    /// The paths and literals in `tokens` (a macro call's or an attribute's).
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let colons = |i: usize| {
            matches!((trees.get(i), trees.get(i + 1)),
                (Some(TokenTree::Punct(a)), Some(TokenTree::Punct(b))) if a.as_char() == ':' && b.as_char() == ':')
        };
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(group) => self.tokens(group.stream()),
                TokenTree::Literal(literal) => match syn::Lit::new(literal.clone()) {
                    syn::Lit::Str(s) => self.names.literals.push(s.value()),
                    syn::Lit::ByteStr(b) => self
                        .names
                        .literals
                        .push(String::from_utf8_lossy(&b.value()).into_owned()),
                    _ => {}
                },
                TokenTree::Ident(first) => {
                    let external = i >= 2 && colons(i - 2);
                    let mut segments = vec![first.to_string()];
                    while colons(i + 1) {
                        let Some(TokenTree::Ident(next)) = trees.get(i + 3) else {
                            break;
                        };
                        segments.push(next.to_string());
                        i += 3;
                    }
                    self.path(segments, external);
                }
                TokenTree::Punct(_) => {}
            }
            i += 1;
        }
    }
}

/// `tree` (after `prefix`) as the paths it names.
fn use_paths(tree: &syn::UseTree, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            use_paths(&path.tree, prefix, out);
        }
        syn::UseTree::Name(syn::UseName { ident })
        | syn::UseTree::Rename(syn::UseRename { ident, .. }) => {
            prefix.push(ident.to_string());
            out.push(prefix);
        }
        syn::UseTree::Glob(_) => {
            prefix.push("self".to_owned());
            out.push(prefix);
        }
        syn::UseTree::Group(group) => {
            for item in &group.items {
                use_paths(item, prefix.clone(), out);
            }
        }
    }
}

impl<'ast> Visit<'ast> for Reader {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if item.content.is_none() {
            return;
        }
        let test = item.attrs.iter().any(|attr| {
            attr.path().is_ident("cfg")
                && attr
                    .parse_args::<syn::Ident>()
                    .is_ok_and(|arg| arg == "test")
        });
        self.inline.push((item.ident.to_string(), test));
        syn::visit::visit_item_mod(self, item);
        self.inline.pop();
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let mut paths = Vec::new();
        use_paths(&item.tree, Vec::new(), &mut paths);
        for path in paths {
            self.path(path, item.leading_colon.is_some());
        }
    }

    fn visit_item_extern_crate(&mut self, item: &'ast syn::ItemExternCrate) {
        self.names.extern_crates.push(item.ident.to_string());
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.path(segments, path.leading_colon.is_some());
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        self.tokens(mac.tokens.clone());
    }

    fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
        match &attr.meta {
            syn::Meta::NameValue(doc) if doc.path.is_ident("doc") => {}
            syn::Meta::List(list) => {
                self.visit_path(&list.path);
                self.tokens(list.tokens.clone());
            }
            _ => syn::visit::visit_attribute(self, attr),
        }
    }

    fn visit_lit_str(&mut self, literal: &'ast syn::LitStr) {
        self.names.literals.push(literal.value());
    }

    fn visit_lit_byte_str(&mut self, literal: &'ast syn::LitByteStr) {
        let text = String::from_utf8_lossy(&literal.value()).into_owned();
        self.names.literals.push(text);
    }
}

/// Every path of two segments or more that `text` (module `module`) names,
/// resolved crate-absolute (`crate::`, `super::`, `self::`, bare, inline
/// modules included). A `#[cfg(test)]` inline module's paths are left out:
/// a module's tests may go through the folder's `mod.rs`.
fn paths_of(text: &str, module: &[String]) -> Vec<Vec<String>> {
    paths_in(&names_in(text), module)
}

/// [`paths_of`] of a parsed file.
fn paths_in(names: &Names, module: &[String]) -> Vec<Vec<String>> {
    names
        .paths
        .iter()
        .filter(|path| !path.external && !path.in_test)
        .filter_map(|path| {
            let mut here = module.to_vec();
            here.extend(path.inline.iter().cloned());
            resolve(&here, &path.segments)
        })
        .collect()
}

/// The crate-absolute path of `path` written in module `here`, if of two
/// segments or more and inside the crate.
fn resolve(here: &[String], path: &[String]) -> Option<Vec<String>> {
    if path.len() < 2 {
        return None;
    }
    let mut absolute = match path[0].as_str() {
        "crate" => Vec::new(),
        _ => here.to_vec(),
    };
    let mut rest = match path[0].as_str() {
        "crate" | "self" => &path[1..],
        _ => path,
    };
    while let Some(("super", tail)) = rest.split_first().map(|(s, t)| (s.as_str(), t)) {
        absolute.pop()?;
        rest = tail;
    }
    absolute.extend(rest.iter().filter(|s| *s != "self").cloned());
    Some(absolute)
}
