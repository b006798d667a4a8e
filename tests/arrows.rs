//! The module graph points one way: http -> resolve -> (cache, upstream,
//! status) -> store -> domain. This test reads every path in `src/`
//! (`crate::`, `super::`, `self::` and relative ones, `use` groups expanded,
//! comments and strings skipped), builds the graph between top-level modules
//! and fails on a cycle, naming it, and on a low module importing anything
//! above it (`domain` imports nothing of the crate; `config` only the domain;
//! `telemetry` only config and domain).
//!
//! Every folder below `src/` is checked the same way, with its direct
//! children as rooms and its `mod.rs` as a room of its own
//! (`no_folder_has_a_circle` says how arrows are drawn): no circle in any
//! folder.
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
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let rooms = folder_graph(src, &src.join("http"));
    assert!(rooms["server"].contains("api"), "{rooms:?}");
    assert!(
        !rooms["api"].contains("server"),
        "the API imports the server"
    );
}

/// Every path of the route table is written once in `src/` (in
/// `http/api/paths.rs`), and no other literal that looks like one of our
/// routes (`"/v1/...`, `"/admin...`) is written twice: a second copy is a second
/// place to change.
#[test]
fn no_route_path_is_written_twice() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let routes: Vec<&str> = phones_gateway::http::api::paths::LABELS
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
    rooms_of(&[], modules)
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

/// Top-level module -> the top-level modules its files name (`mod` is
/// `lib.rs`, the crate root).
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

/// Every folder below `src/` is a house of its own: its rooms are its direct
/// children (a file `x.rs` or a folder `x/` is the room `x`), and its `mod.rs`
/// is the room `mod`, a room like the others. An arrow goes from the room of the
/// file that names a path to the room the path lands in: `crate::a::f::x::...`,
/// `super::x::...` or (in `mod.rs`) `x::...` land in `x`; a path to an item of
/// the folder itself (`super::Item`, `crate::a::f::Item`, `use super::*`) lands
/// in `mod`, since `mod.rs` defines or re-exports it. A `mod x;` declaration is
/// no arrow. So a child may import what `mod.rs` defines only if `mod.rs`
/// imports nothing from it (directly or round about), and the other way round.
/// This test fails on a circle in any folder, naming the folder and the circle.
#[test]
fn no_folder_has_a_circle() {
    let src = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src"));
    let folders = folders(src);
    assert!(folders.len() > 10, "read the folders: {folders:?}");
    let circles: Vec<String> = folders
        .iter()
        .filter_map(|folder| {
            let graph = folder_graph(src, folder);
            find_cycle(&graph).map(|cycle| {
                let name = folder.strip_prefix(src).unwrap().display();
                format!("src/{name}: {}", cycle.join(" -> "))
            })
        })
        .collect();
    assert!(
        circles.is_empty(),
        "circles inside folders:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_folder_checker_finds_a_circle_through_mod_rs() {
    // A child importing what `mod.rs` defines, while `mod.rs` imports the child.
    let circle = rooms_of(
        &["a", "f"],
        &[
            (
                "mod",
                "mod x;\nmod y;\npub use x::Thing;\npub struct RequestLimits;",
            ),
            ("x", "use super::RequestLimits;\npub struct Thing;"),
            ("y", ""),
        ],
    );
    assert_eq!(circle["mod"], BTreeSet::from(["x".to_owned()]));
    assert_eq!(circle["x"], BTreeSet::from(["mod".to_owned()]));
    assert!(find_cycle(&circle).is_some());
    // Two siblings through absolute and grouped paths, across lines.
    let circle = rooms_of(
        &["a", "f"],
        &[
            ("mod", "mod x;\nmod y;"),
            ("x", "use crate::a::f::{\n    y::Route,\n};"),
            ("y", "fn f() { let _ = crate::a::{f::x::Handler}; }"),
        ],
    );
    assert_eq!(
        find_cycle(&circle).unwrap(),
        ["x", "y", "x"].map(str::to_owned)
    );
    // One way only: no circle. The test module's `super` is its own file, a
    // `mod x;` declaration is no arrow, nor a path in a comment or a string,
    // nor one in a `#[cfg(test)]` module.
    let one_way = rooms_of(
        &["a", "f"],
        &[
            (
                "mod",
                "pub mod x;\npub mod y;\n//! see [`x::Thing`]\npub use y::Route;",
            ),
            (
                "x",
                "use super::y::Route;\nmod tests { use super::*; use super::super::y; }",
            ),
            (
                "y",
                "const P: &str = \"super::x::no\"; // super::x::neither\n\
                 #[cfg(test)]\nmod tests {\n    use crate::a::f::x::Thing;\n}",
            ),
        ],
    );
    assert_eq!(one_way["mod"], BTreeSet::from(["y".to_owned()]));
    assert_eq!(one_way["x"], BTreeSet::from(["y".to_owned()]));
    assert!(one_way["y"].is_empty(), "{one_way:?}");
    assert_eq!(find_cycle(&one_way), None);
    // An inline module that is not a test's draws arrows from its file.
    let inline = rooms_of(
        &["a", "f"],
        &[
            ("x", ""),
            ("y", "mod inner {\n    use super::super::x::T;\n}"),
        ],
    );
    assert_eq!(inline["y"], BTreeSet::from(["x".to_owned()]));
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
            "let n = routes::LABELS.len(); v.iter().collect::<Vec<_>>();",
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
            "let s = r#\"crate::x::y\"#; let b = b'a'; crate::z::w();",
            &["a"]
        ),
        ["z::w"]
    );
}

/// A folder's rooms from texts (`mod` for its `mod.rs`), the folder at
/// `folder` in the crate.
fn rooms_of(folder: &[&str], files: &[(&str, &str)]) -> Graph {
    let folder: Vec<String> = folder.iter().map(|s| s.to_string()).collect();
    let children: BTreeSet<String> = files
        .iter()
        .map(|(room, _)| room.to_string())
        .filter(|room| room != "mod")
        .collect();
    let mut graph = Graph::new();
    for (room, text) in files {
        let mut module = folder.clone();
        if *room != "mod" {
            module.push(room.to_string());
        }
        add_arrows(&mut graph, &folder, &children, room, &module, text);
    }
    graph
}

/// Every folder below `src/` (not `src/` itself: its rooms are the top-level
/// modules, checked above).
fn folders(src: &Path) -> Vec<std::path::PathBuf> {
    let (mut found, mut todo) = (Vec::new(), vec![src.to_path_buf()]);
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                found.push(path.clone());
                todo.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The rooms of `folder` -> the sibling rooms its files' paths land in.
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
        let room = module.get(here.len()).map_or("mod", String::as_str);
        let text = std::fs::read_to_string(&path).unwrap();
        add_arrows(&mut graph, &here, &children, room, &module, &text);
    }
    graph
}

/// Whether `path` is the root module of its folder (`mod.rs`; `lib.rs` and
/// `main.rs` in `src/`).
fn is_root(src: &Path, path: &Path) -> bool {
    path.ends_with("mod.rs") || path == src.join("lib.rs") || path == src.join("main.rs")
}

/// Adds the arrows from `room` (of the folder at `folder`, whose child rooms
/// are `children`) that the text of the module `module` draws.
fn add_arrows(
    graph: &mut Graph,
    folder: &[String],
    children: &BTreeSet<String>,
    room: &str,
    module: &[String],
    text: &str,
) {
    let mut targets = BTreeSet::new();
    for path in paths_of(text, module) {
        let Some(rest) = path.strip_prefix(folder) else {
            continue;
        };
        let target = match rest.first() {
            Some(child) if children.contains(child) => child.as_str(),
            _ => "mod",
        };
        if target != room {
            targets.insert(target.to_owned());
        }
    }
    graph.entry(room.to_owned()).or_default().extend(targets);
}

/// What a word of code is to the path reader.
#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Sep,
    Open,
    Close,
    Comma,
    Star,
    Other(char),
}

/// The tokens of `text` that paths are made of, comments, strings and
/// character literals left out.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    let word = |c: char| c.is_alphanumeric() || c == '_';
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match c {
            '/' if next == Some('/') => {
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if next == Some('*') => {
                let mut depth = 0;
                while i < chars.len() {
                    if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                        depth += 1;
                        i += 2;
                    } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        i += 1;
                    }
                }
            }
            '"' => i = skip_string(&chars, i + 1, 0, false),
            '\'' => {
                // A character literal ('"', '\'') or a lifetime ('a, skipped
                // as a quote and a word).
                if next == Some('\\') || chars.get(i + 2) == Some(&'\'') {
                    i = skip_char(&chars, i);
                } else {
                    i += 1;
                }
            }
            ':' if next == Some(':') => {
                tokens.push(Token::Sep);
                i += 2;
            }
            '{' | '}' | ',' | '*' => {
                tokens.push(match c {
                    '{' => Token::Open,
                    '}' => Token::Close,
                    ',' => Token::Comma,
                    _ => Token::Star,
                });
                i += 1;
            }
            c if word(c) => {
                let start = i;
                while i < chars.len() && word(chars[i]) {
                    i += 1;
                }
                let text: String = chars[start..i].iter().collect();
                let raw = matches!(text.as_str(), "r" | "br" | "b" | "c" | "cr");
                match chars.get(i) {
                    Some('"') if raw => {
                        i = skip_string(&chars, i + 1, 0, text.contains('r'));
                    }
                    Some('#') if text.contains('r') && raw_string(&chars, i) => {
                        let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
                        i = skip_string(&chars, i + hashes + 1, hashes, true);
                    }
                    Some('\'') if text == "b" => i = skip_char(&chars, i),
                    _ if c.is_ascii_digit() => tokens.push(Token::Other('0')),
                    _ => tokens.push(Token::Word(text)),
                }
            }
            c if c.is_whitespace() => i += 1,
            _ => {
                tokens.push(Token::Other(c));
                i += 1;
            }
        }
    }
    tokens
}

/// Whether the `#` at `i` (after `r`) opens a raw string (`r#"`), not a raw
/// identifier (`r#type`).
fn raw_string(chars: &[char], i: usize) -> bool {
    chars[i..].iter().find(|&&c| c != '#') == Some(&'"')
}

/// The index just past the character literal whose opening quote is at `i`.
fn skip_char(chars: &[char], mut i: usize) -> usize {
    i += 1;
    if chars.get(i) == Some(&'\\') {
        i += 1;
    }
    i += 1; // the character, or the escaped one
    while i < chars.len() && chars[i] != '\'' {
        i += 1;
    }
    i + 1
}

/// The index just past the string whose text starts at `i` (after its quote)
/// and ends with a quote and `hashes` hashes; a raw string has no escapes.
fn skip_string(chars: &[char], mut i: usize, hashes: usize, raw: bool) -> usize {
    while i < chars.len() {
        match chars[i] {
            '\\' if !raw => i += 2,
            '"' if chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes =>
            {
                return i + 1 + hashes;
            }
            _ => i += 1,
        }
    }
    i
}

/// Every path of two segments or more that `text` (the module `module`,
/// segments after `crate`) names, as the crate-absolute path it resolves to:
/// `crate::`, `super::`, `self::` and bare paths (relative to the module they
/// are written in, inline `mod x { ... }` modules included), `use` groups
/// expanded (`a::{b, c::D}` is `a::b` and `a::c::D`; `a::{self, *}` is `a`).
/// The paths of a `#[cfg(test)]` inline module are left out: a room's tests
/// may drive it through the folder's front door (`mod.rs`) without making the
/// shipped code go round in a circle.
fn paths_of(text: &str, module: &[String]) -> Vec<Vec<String>> {
    let tokens = tokens(text);
    let mut found = Vec::new();
    // The inline modules open here: (brace depth inside, name, whether it is
    // a `#[cfg(test)]` module).
    let mut inline: Vec<(usize, String, bool)> = Vec::new();
    let mut depth = 0;
    // Whether the item being read follows `#[cfg(test)]`.
    let mut after_cfg_test = false;
    let mut i = 0;
    while i < tokens.len() {
        let word = |j: usize| match tokens.get(j) {
            Some(Token::Word(word)) => word.as_str(),
            _ => "",
        };
        match &tokens[i] {
            Token::Word(cfg) if cfg == "cfg" && word(i + 2) == "test" => {
                after_cfg_test = true;
            }
            Token::Other(';') => after_cfg_test = false,
            Token::Open => {
                depth += 1;
                if i >= 2 && word(i - 2) == "mod" {
                    inline.push((depth, word(i - 1).to_owned(), after_cfg_test));
                }
                after_cfg_test = false;
            }
            Token::Close => {
                if inline.last().is_some_and(|(d, ..)| *d == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Token::Word(_) if inline.iter().any(|(.., test)| *test) => {}
            Token::Word(_) if tokens.get(i + 1) == Some(&Token::Sep) => {
                let mut here = module.to_vec();
                here.extend(inline.iter().map(|(_, name, _)| name.clone()));
                let mut paths = Vec::new();
                i = use_tree(&tokens, i, Vec::new(), &mut paths);
                found.extend(paths.into_iter().filter_map(|path| resolve(&here, &path)));
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    found
}

/// Reads the path (or `use` tree) starting at `i` after `prefix`, adds each
/// path it names to `out`, and returns the index past it.
fn use_tree(
    tokens: &[Token],
    mut i: usize,
    mut path: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match tokens.get(i) {
            Some(Token::Word(word)) => {
                path.push(word.clone());
                i += 1;
            }
            Some(Token::Open) => {
                i += 1;
                loop {
                    match tokens.get(i) {
                        None => return i,
                        Some(Token::Close) => return i + 1,
                        Some(Token::Word(word)) if word == "as" => i += 2,
                        Some(Token::Word(_) | Token::Open | Token::Star) => {
                            i = use_tree(tokens, i, path.clone(), out);
                        }
                        Some(_) => i += 1,
                    }
                }
            }
            Some(Token::Star) => {
                path.push("self".to_owned());
                out.push(path);
                return i + 1;
            }
            _ => {
                out.push(path);
                return i;
            }
        }
        if tokens.get(i) != Some(&Token::Sep) {
            out.push(path);
            return i;
        }
        i += 1;
    }
}

/// The crate-absolute path of `path` written in the module `here`, if it has
/// two segments or more and stays inside the crate.
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
