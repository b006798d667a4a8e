//! The module graph points one way: http -> resolve -> (cache, upstream,
//! status) -> store -> domain. This test reads every `crate::` path in `src/`,
//! builds the graph between top-level modules and fails on a cycle, naming it,
//! and on a low module importing anything above it (`domain` imports nothing of
//! the crate; `config` only the domain; `telemetry` only config and domain).
//! It also fails when a file outside `store` names sqlx: the database is the
//! store's, and the rest of the crate reaches it through the store's handles.
//!
//! Inside `http`, the server imports the API and never the reverse
//! (`http::server -> http::api`). And the route table is the one place a route's
//! path is written: no route path literal appears twice in `src/`.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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

/// `http::server -> http::api`: the server runs the API (its front answers the
/// lookup, speaks `ApiError`, reads the route table); the API does not know how
/// it is served.
#[test]
fn the_api_does_not_import_the_server() {
    let http = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src/http"));
    let rooms = http_rooms(http);
    assert!(rooms["server"].contains("api"), "{rooms:?}");
    assert!(
        !rooms["api"].contains("server"),
        "the API imports the server"
    );
}

#[test]
fn the_room_checker_reads_every_spelling() {
    for text in [
        "use crate::http::server::front::Front;",
        "use crate::http::{api::Limits, server::serve};",
        "use super::super::server::shed::Shed;",
    ] {
        let mut rooms = Graph::new();
        add_room_imports(&mut rooms, "api", Path::new("api/admin.rs"), text);
        assert!(rooms["api"].contains("server"), "{text}");
    }
    let mut rooms = Graph::new();
    add_room_imports(
        &mut rooms,
        "api",
        Path::new("api/mod.rs"),
        "use super::server;",
    );
    assert!(rooms["api"].contains("server"));
}

/// Every path of the route table is written once in `src/` (in
/// `http/api/routes.rs`), and no other literal that looks like one of our
/// routes (`"/v1/...`, `"/admin...`) is written twice: a second copy is a second
/// place to change.
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
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or_default();
            for literal in string_literals(code) {
                let route_like = literal.starts_with("/v1/")
                    || literal.starts_with("/admin")
                    || routes.contains(&literal);
                if route_like {
                    let place = format!("{}:{}", path.strip_prefix(src).unwrap().display(), n + 1);
                    places.entry(literal.to_owned()).or_default().push(place);
                }
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

#[test]
fn the_literal_reader_skips_escapes() {
    let code = r#"f("/v1/a", "say \"/v1/b\"", b"/admin", '"');"#;
    assert_eq!(
        string_literals(code),
        ["/v1/a", r#"say \"/v1/b\""#, "/admin"]
    );
}

#[test]
fn only_the_store_speaks_sql() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let outside: Vec<String> = rust_files(src)
        .into_iter()
        .filter(|path| top_level(src, path) != "store")
        .filter(|path| names_sqlx(&std::fs::read_to_string(path).unwrap()))
        .map(|path| path.strip_prefix(src).unwrap().display().to_string())
        .collect();
    assert!(
        outside.is_empty(),
        "only src/store may use sqlx; also: {outside:?}"
    );
    assert!(
        rust_files(src)
            .iter()
            .any(|path| names_sqlx(&std::fs::read_to_string(path).unwrap())),
        "read the store"
    );
}

#[test]
fn the_sqlx_check_reads_code_not_comments() {
    assert!(names_sqlx("use sqlx::PgPool;"));
    assert!(names_sqlx("    let e: ::sqlx::Error = todo!();"));
    assert!(names_sqlx("use {sqlx::Row, std::fmt};"));
    assert!(names_sqlx("extern crate sqlx;"));
    assert!(!names_sqlx("//! everything that speaks SQL (sqlx)"));
    assert!(!names_sqlx("let n = 1; // not sqlx::Error"));
    assert!(!names_sqlx("use my_sqlx::Thing;"));
}

/// Whether `text` names the sqlx crate in code (a path `sqlx::...`, or
/// `extern crate sqlx`), comments skipped.
fn names_sqlx(text: &str) -> bool {
    names_crate(text, "sqlx")
}

/// Whether `text` names the crate `name` in code: a path `name::...` that is
/// not a segment of another path (`crate::name::` is a module of ours), or
/// `extern crate name`; comments skipped.
fn names_crate(text: &str, name: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    text.lines().any(|line| {
        let code = line.split("//").next().unwrap_or_default();
        code.match_indices(name).any(|(at, _)| {
            let before = &code[..at];
            let after = &code[at + name.len()..];
            let segment = before
                .strip_suffix("::")
                .is_some_and(|b| b.chars().next_back().is_some_and(ident));
            !before.chars().next_back().is_some_and(ident)
                && !segment
                && (after.starts_with("::")
                    || (before.trim_end().ends_with("crate")
                        && after.trim_start().starts_with(';')))
        })
    })
}

/// The selection rules and the fan-out know nothing of HTTP: the request's
/// trace comes in as `telemetry::trace::RequestTrace`, not as headers.
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
            let text = std::fs::read_to_string(&path).unwrap();
            http_crates
                .iter()
                .filter(|name| names_crate(&text, name))
                .map(|name| format!("{} names {name}", path.display()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(found.is_empty(), "{found:?}");
    assert!(names_crate("use axum::http::HeaderMap;", "axum"));
    assert!(names_crate("fn f(h: Option<&http::HeaderMap>) {}", "http"));
    assert!(!names_crate("use crate::http::api::Limits;", "http"));
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
    let mut graph = Graph::new();
    for (module, text) in modules {
        add_imports(&mut graph, module, text);
    }
    graph
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<std::path::PathBuf> {
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

/// The string literals of a line of code (`"..."`, escapes kept as written;
/// character literals skipped).
fn string_literals(code: &str) -> Vec<&str> {
    let mut literals = Vec::new();
    let mut chars = code.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' => {
                // A char literal ('"', '\'') or a lifetime ('a): skip the
                // quoted character either way.
                let _ = chars
                    .next()
                    .filter(|&(_, c)| c == '\\')
                    .map(|_| chars.next());
            }
            '"' => {
                let start = i + 1;
                let mut escaped = false;
                for (j, c) in chars.by_ref() {
                    match c {
                        '\\' if !escaped => escaped = true,
                        '"' if !escaped => {
                            literals.push(&code[start..j]);
                            break;
                        }
                        _ => escaped = false,
                    }
                }
            }
            _ => {}
        }
    }
    literals
}

/// The rooms of `src/http/` (its subdirectories) -> the sibling rooms their
/// files import.
fn http_rooms(http: &Path) -> Graph {
    let mut rooms = Graph::new();
    for path in rust_files(http) {
        let relative = path.strip_prefix(http).unwrap();
        if relative.components().count() < 2 {
            continue; // http/mod.rs: the hall, not a room
        }
        let room = relative.components().next().unwrap().as_os_str();
        let text = std::fs::read_to_string(&path).unwrap();
        add_room_imports(&mut rooms, room.to_str().unwrap(), relative, &text);
    }
    rooms
}

/// Adds the rooms a file of `room` names, as `crate::http::<room>`, in a
/// `crate::http::{...}` group, or relatively (`super::<room>` from a room's
/// `mod.rs`, `super::super::<room>` from its other files).
fn add_room_imports(rooms: &mut Graph, room: &str, file: &Path, text: &str) {
    let up = if file.ends_with("mod.rs") {
        "super::"
    } else {
        "super::super::"
    };
    let imports = rooms.entry(room.to_owned()).or_default();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for prefix in ["crate::http::", up] {
            for (at, _) in code.match_indices(prefix) {
                let rest = &code[at + prefix.len()..];
                if prefix == "super::" && code[..at].ends_with("super::") {
                    continue; // the tail of `super::super::`
                }
                let names = match rest.strip_prefix('{') {
                    Some(group) => group_heads(group),
                    None => vec![head(rest)],
                };
                for name in names {
                    if !name.is_empty() && name != room && name != "self" && name != "super" {
                        imports.insert(name.to_owned());
                    }
                }
            }
        }
    }
}

/// Top-level module -> the top-level modules its files name as `crate::...`.
fn module_graph(src: &Path) -> Graph {
    let mut graph = Graph::new();
    for path in rust_files(src) {
        let module = top_level(src, &path);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        add_imports(&mut graph, &module, &text);
    }
    graph
}

/// The top-level module `path` belongs to (`lib` and `main` for the roots).
fn top_level(src: &Path, path: &Path) -> String {
    let relative = path.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_str().unwrap().trim_end_matches(".rs").to_owned()
}

/// Adds every module named after `crate::` in `text`, alone or in a group
/// (`crate::{a::X, b}`), skipping comments.
fn add_imports(graph: &mut Graph, module: &str, text: &str) {
    let imports = graph.entry(module.to_owned()).or_default();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or_default();
        for (at, _) in code.match_indices("crate::") {
            let rest = &code[at + "crate::".len()..];
            let names = match rest.strip_prefix('{') {
                Some(group) => group_heads(group),
                None => vec![head(rest)],
            };
            for name in names {
                if !name.is_empty() && name != module && name != "self" {
                    imports.insert(name.to_owned());
                }
            }
        }
    }
}

/// The first path segment of `path` (`a` of `a::b::C`).
fn head(path: &str) -> &str {
    let path = path.trim_start();
    let end = path
        .find(|c: char| !c.is_alphanumeric() && c != '_')
        .unwrap_or(path.len());
    &path[..end]
}

/// The first segment of each item of a `{...}` group (its text after `{`),
/// nested groups skipped over.
fn group_heads(group: &str) -> Vec<&str> {
    let mut heads = vec![head(group)];
    let mut depth = 0;
    for (i, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => heads.push(head(&group[i + 1..])),
            _ => {}
        }
    }
    heads
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
