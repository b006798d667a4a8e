//! The documentation checked against the repository, by file reads (reason
//! codes from the crate itself): config keys and reason codes documented, no
//! links outside the repository, and the docs, module map and comments under
//! src/ name only what exists (rules above `PATH_ROOTS`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

#[path = "it/support/alerts.rs"]
mod alerts;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Every key `config/default.toml` sets, as a dotted path with its value
/// written as the docs write it (`300`, `"info"`); keys only commented out
/// are no keys here.
fn default_keys(toml: &str) -> BTreeMap<String, String> {
    fn walk(prefix: &str, table: &toml::Table, keys: &mut BTreeMap<String, String>) {
        for (name, value) in table {
            let key = if prefix.is_empty() {
                name.clone()
            } else {
                format!("{prefix}.{name}")
            };
            match value {
                toml::Value::Table(inner) => walk(&key, inner, keys),
                value => {
                    keys.insert(key, written(value));
                }
            }
        }
    }
    fn written(value: &toml::Value) -> String {
        match value {
            toml::Value::String(s) => format!("{s:?}"),
            toml::Value::Array(items) => {
                let items: Vec<String> = items.iter().map(written).collect();
                format!("[{}]", items.join(", "))
            }
            toml::Value::Integer(n) => n.to_string(),
            // `2.0` as written, not `2`.
            toml::Value::Float(x) => format!("{x:?}"),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Datetime(d) => d.to_string(),
            toml::Value::Table(_) => unreachable!("tables are walked"),
        }
    }
    let table: toml::Table = toml.parse().expect("config/default.toml parses");
    let mut keys = BTreeMap::new();
    walk("", &table, &mut keys);
    keys
}

/// The keys docs/configuration.md documents, each with its default (`None`:
/// unset), from table rows `| keys | default | meaning |`: backticked dotted
/// keys, comma-separated; a backticked default (values ` / `-separated for
/// several keys), or a cell starting `unset` (commented out in default.toml).
fn documented_keys(doc: &str) -> Vec<(String, Option<String>)> {
    let mut found = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let [_, keys, default, ..] = cells[..] else {
            continue;
        };
        let keys: Vec<&str> = keys
            .split(", ")
            .filter_map(|k| k.strip_prefix('`')?.strip_suffix('`'))
            .filter(|k| k.contains('.') && !k.contains(' '))
            .collect();
        if keys.is_empty() {
            continue;
        }
        let defaults: Vec<Option<String>> = if default.starts_with("unset") {
            vec![None; keys.len()]
        } else if keys.len() == 1 {
            vec![default.split('`').nth(1).map(str::to_string)]
        } else {
            default
                .split(" / ")
                .map(|v| Some(v.trim().trim_matches('`').to_string()))
                .collect()
        };
        assert_eq!(defaults.len(), keys.len(), "one default per key: {line}");
        found.extend(keys.iter().map(|k| k.to_string()).zip(defaults));
    }
    found
}

/// Whether `toml` holds `key` commented out (`# leaf = value` in its section).
fn commented_out(toml: &str, key: &str) -> bool {
    let (section, leaf) = key.rsplit_once('.').expect("a dotted key");
    let mut current = "";
    toml.lines().any(|line| {
        // A commented-out `# [[admin.tokens]]` opens a section of examples too.
        let header = line.strip_prefix('[').or_else(|| {
            line.strip_prefix("# [[")
                .map(|rest| rest.trim_start_matches('['))
        });
        if let Some(header) = header {
            current = header.trim_start_matches('[').trim_end_matches(']');
        }
        current == section && line.starts_with(&format!("# {leaf} = "))
    })
}

/// README.md and every file under docs/.
fn documentation() -> Vec<PathBuf> {
    let mut files = vec![root().join("README.md")];
    let mut dirs = vec![root().join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

#[test]
fn the_key_readers_read_tables_rows_and_comments() {
    let toml = "[server]\nport = 1\n# deadline_ms = 600\n[a.b]\nlist = [\"x\", \"y\"]\n\
                # [[a.tokens]]\n# name = \"t\"\n";
    let keys: Vec<(String, String)> = default_keys(toml).into_iter().collect();
    assert_eq!(
        keys,
        [
            ("a.b.list".to_string(), r#"["x", "y"]"#.to_string()),
            ("server.port".to_string(), "1".to_string())
        ]
    );
    assert!(commented_out(toml, "server.deadline_ms"));
    assert!(!commented_out(toml, "a.b.deadline_ms"));
    let doc = "| key | default | meaning |\n|---|---|---|\n\
               | `server.port` | `1` (one) | the `x.y` port |\n\
               | `c.a.ttl_s`, `c.b.ttl_s` | 9 / 3 | ttl |\n\
               | `server.deadline_ms` | unset (`# deadline_ms = 600`) | |\n";
    let some = |v: &str| Some(v.to_string());
    assert_eq!(
        documented_keys(doc),
        [
            ("server.port".to_string(), some("1")),
            ("c.a.ttl_s".to_string(), some("9")),
            ("c.b.ttl_s".to_string(), some("3")),
            ("server.deadline_ms".to_string(), None),
        ]
    );
}

/// Every key of the compiled-in defaults is documented with the same
/// default, and every documented key is a default or commented out there.
#[test]
fn the_documented_keys_are_the_defaults() {
    let toml = read(&root().join("config/default.toml"));
    let defaults = default_keys(&toml);
    assert!(
        defaults.len() > 40,
        "only {} keys in config/default.toml: {defaults:?}",
        defaults.len()
    );
    let documented = documented_keys(&read(&root().join("docs/configuration.md")));
    let mut wrong = Vec::new();
    for (key, value) in &defaults {
        match documented.iter().find(|(k, _)| k == key) {
            None => wrong.push(format!("{key} is not documented")),
            Some((_, documented)) if documented.as_ref() != Some(value) => {
                wrong.push(format!("{key}: default {value}, documented {documented:?}"))
            }
            Some(_) => {}
        }
    }
    for (key, default) in &documented {
        let known = match default {
            Some(_) => defaults.contains_key(key),
            None => !defaults.contains_key(key) && commented_out(&toml, key),
        };
        if !known {
            wrong.push(format!(
                "{key} (documented {default:?}) is not a key of config/default.toml"
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/configuration.md against config/default.toml:\n{}",
        wrong.join("\n")
    );
}

/// The words of each table of the `## section` of `doc`, by the table's first
/// header cell: the backticked word opening each row.
fn listed_words(doc: &str, section: &str) -> BTreeMap<String, Vec<String>> {
    let heading = format!("## {section}");
    let body = doc
        .split("\n## ")
        .find_map(|part| part.strip_prefix(heading.trim_start_matches("## ")))
        .unwrap_or_else(|| panic!("no section {heading:?}"));
    let lines: Vec<&str> = body.lines().collect();
    let mut tables: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for (i, line) in lines.iter().enumerate() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if !line.starts_with('|') || cells.len() < 3 {
            current = None;
            continue;
        }
        if lines
            .get(i + 1)
            .is_some_and(|next| next.starts_with("|---"))
        {
            current = Some(cells[1].to_owned());
            tables.entry(cells[1].to_owned()).or_default();
            continue;
        }
        let (Some(table), Some(word)) = (
            &current,
            cells[1].strip_prefix('`').and_then(|w| w.strip_suffix('`')),
        ) else {
            continue;
        };
        tables
            .get_mut(table)
            .expect("opened above")
            .push(word.to_owned());
    }
    tables
}

/// A reason's words from the code: failures ([`Failure::ALL`]), skips,
/// origins and metric codes ([`Code::ALL`]); a new skip or origin fails to
/// compile here until listed.
fn reason_words() -> BTreeMap<String, BTreeSet<String>> {
    use phones_gateway::domain::reason::{Code, Failure, Origin, Skip};
    let skip = |skip: Skip| match skip {
        Skip::NotApplicable | Skip::NoNumber => Some(skip.as_str()),
        Skip::Failed(_) => None,
    };
    let origin = |origin: Origin| match origin {
        Origin::Cache | Origin::Upstream | Origin::Stale(_) | Origin::Phone => origin.as_str(),
    };
    let set = |words: Vec<&str>| {
        words
            .into_iter()
            .map(str::to_owned)
            .collect::<BTreeSet<_>>()
    };
    BTreeMap::from([
        (
            "failure".to_owned(),
            set(Failure::ALL.map(Failure::as_str).to_vec()),
        ),
        (
            "skip".to_owned(),
            set([
                Skip::NotApplicable,
                Skip::NoNumber,
                Skip::Failed(Failure::Timeout),
            ]
            .into_iter()
            .filter_map(skip)
            .collect()),
        ),
        (
            "origin".to_owned(),
            set([
                Origin::Cache,
                Origin::Upstream,
                Origin::Stale(Failure::Timeout),
                Origin::Phone,
            ]
            .map(origin)
            .to_vec()),
        ),
        ("code".to_owned(), set(Code::ALL.to_vec())),
    ])
}

/// docs/rules.md, "Why this number", lists every code a reason is written
/// with, once, and nothing else.
#[test]
fn every_reason_code_is_documented_and_every_documented_one_is_a_code() {
    let doc = read(&root().join("docs/rules.md"));
    let listed = listed_words(&doc, "Why this number");
    let expected = reason_words();
    assert_eq!(
        listed.keys().collect::<Vec<_>>(),
        expected.keys().collect::<Vec<_>>(),
        "docs/rules.md, \"Why this number\": one table for each list"
    );
    let mut wrong = Vec::new();
    for (table, words) in &listed {
        let code = &expected[table];
        let documented: BTreeSet<String> = words.iter().cloned().collect();
        if documented.len() != words.len() {
            wrong.push(format!("{table}: a word listed twice in {words:?}"));
        }
        for missing in code.difference(&documented) {
            wrong.push(format!("{table} `{missing}` is not documented"));
        }
        for extra in documented.difference(code) {
            wrong.push(format!("{table} `{extra}` is documented but is no code"));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/rules.md, \"Why this number\", against src/domain/reason.rs:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_reason_list_reader_reads_each_table_by_its_header() {
    let doc = "# T\n\n## Other\n\n| failure | x |\n|---|---|\n| `no` | x |\n\n\
               ## Why this number\n\ntext `word`\n\n| failure | meaning |\n|---|---|\n\
               | `timeout` | a `deadline` |\n| `connect` | b |\n\n| code | meaning |\n\
               |---|---|\n| `cache` | c |\nprose\n| `stray` | d |\n\n## After\n\n| code | x |\n\
               |---|---|\n| `late` | y |\n";
    let listed = listed_words(doc, "Why this number");
    assert_eq!(
        listed,
        BTreeMap::from([
            ("code".to_owned(), vec!["cache".to_owned()]),
            (
                "failure".to_owned(),
                vec!["timeout".to_owned(), "connect".to_owned()]
            ),
        ])
    );
}

#[test]
fn the_documentation_points_at_nothing_outside_the_repository() {
    for file in documentation() {
        let text = read(&file);
        // Spelled in pieces so that this file does not hold what it forbids.
        let shared = ["..", "/shared"].concat();
        for outside in [shared.as_str(), "SPEC.md", "/work/"] {
            assert!(
                !text.contains(outside),
                "{} mentions {outside}",
                file.display()
            );
        }
    }
}

/// No comment under src/, tests/ or benches/ cites "SPEC" with a section
/// number, however spelled.
#[test]
fn the_code_cites_nothing_outside_the_repository() {
    let mut dirs = vec![
        root().join("src"),
        root().join("tests"),
        root().join("benches"),
    ];
    let mut cited = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = read(&path);
                if cites_a_spec_section(&text) || text.contains(&["..", "/shared"].concat()) {
                    cited.push(path.display().to_string());
                }
            }
        }
    }
    assert!(cited.is_empty(), "cite docs/ instead: {cited:?}");
}

/// Whether `text` names "SPEC" followed by a section number, however spelled.
fn cites_a_spec_section(text: &str) -> bool {
    text.match_indices("SPEC").any(|(at, word)| {
        let rest = text[at + word.len()..].trim_start();
        let rest = ["sections", "section", "\u{a7}"]
            .iter()
            .find_map(|spelling| rest.strip_prefix(spelling))
            .unwrap_or(rest)
            .trim_start();
        rest.starts_with(|c: char| c.is_ascii_digit())
    })
}

#[test]
fn a_spec_section_is_caught_however_spelled() {
    // Spelled in pieces so that this file does not hold what it forbids.
    let spec = "SP".to_owned() + "EC";
    for cited in [" 4", " section 7", " sections 4", " \u{a7}4", " \u{a7} 4"] {
        assert!(
            cites_a_spec_section(&format!("as the {spec}{cited} says")),
            "{cited:?}"
        );
    }
    for not_cited in ["", ".md", " says", "IFIC 4"] {
        assert!(
            !cites_a_spec_section(&format!("the {spec}{not_cited}")),
            "{not_cited:?}"
        );
    }
}

#[test]
fn relative_links_in_the_documentation_resolve() {
    for file in documentation()
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "md"))
    {
        let text = read(&file);
        let dir = file.parent().expect("a file has a directory");
        for (at, _) in text.match_indices("](") {
            let rest = &text[at + 2..];
            let Some(end) = rest.find(')') else { continue };
            let target = &rest[..end];
            if target.contains("://") || target.starts_with('#') || target.contains(' ') {
                continue;
            }
            let path = target.split('#').next().unwrap_or_default();
            let resolved = dir.join(path);
            assert!(
                resolved.starts_with(root()) && resolved.exists(),
                "{}: the link {target} leads nowhere",
                file.display()
            );
            let canonical = resolved.canonicalize().expect("an existing path");
            assert!(
                canonical.starts_with(root().canonicalize().expect("the root")),
                "{}: the link {target} leaves the repository",
                file.display()
            );
        }
    }
}

// ---------------------------------------------------------------------------
// The docs name only what exists (README.md, docs/, the module map; fences skipped):
// - a path under `PATH_ROOTS` exists; `--bench`/`--test`/`--example NAME` a target;
// - a backticked type name is defined or imported by the code, or in `NOT_TYPES`;
// - in the map, a module path resolves to a module file or a `pub` item of it;
// - in Markdown, a bare file name is under the folder its paragraph last named;
// - in `//!` docs under src/, paths exist and bare names lie near the file;
// - in every comment under src/, a Rust path into this crate resolves.
// `PENDING` lists known stale names.
// ---------------------------------------------------------------------------

/// Where a repository path starts.
const PATH_ROOTS: [&str; 11] = [
    "src/",
    "tests/",
    "benches/",
    "scripts/",
    "migrations/",
    "helm/",
    "examples/",
    "config/",
    "docs/",
    "fuzz/",
    ".ci/",
];

/// Capitalised words the docs use that are no Rust type.
const NOT_TYPES: &[&str] = &[
    "ConfigMap",
    "Deployment",
    "DestinationRule",
    "Ingress",
    "Lease",
    "NetworkPolicy",
    "PodDisruptionBudget",
    "PrometheusRule",
    "ServiceMonitor",
    "Allow",
    "Dockerfile",
];

/// Names known stale in a comment pending its rewrite, as (file, name).
const PENDING: &[(&str, &str)] = &[];

/// Types of std or a dependency the docs name and the code uses unimported.
const ELSEWHERE: &[&str] = &["Debug", "JoinHandle", "Option", "Shared", "Uri", "Vec"];

/// `text` without its fenced code blocks.
fn without_fences(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The spans between backticks (a span does not cross a blank line).
fn backticked(text: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find('`') {
        let after = &rest[open + 1..];
        let Some(close) = after.find('`') else { break };
        let span = &after[..close];
        if span.contains("\n\n") {
            rest = after;
            continue;
        }
        spans.push(span);
        rest = &after[close + 1..];
    }
    spans
}

/// The targets of `[text](target)` links.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

/// The leading `//!` block of a Rust file, markers removed.
fn module_doc(rust: &str) -> String {
    rust.lines()
        .take_while(|l| l.starts_with("//!") || l.trim().is_empty())
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A word as a repository path, trimmed of anchor, line number and
/// punctuation; None if no path or a placeholder.
fn as_path(word: &str) -> Option<&str> {
    let word = word.trim_matches(|c: char| "\"'(),;".contains(c));
    let word = word.split('#').next().unwrap_or_default();
    let word = word.trim_end_matches(['.', ':']);
    let word = match word.split_once(':') {
        Some((path, line)) if line.chars().all(|c| c.is_ascii_digit()) => path,
        _ => word,
    };
    let placeholder = ["*", "<", "{", "$", "...", "://", "="]
        .iter()
        .any(|p| word.contains(p));
    (!placeholder && PATH_ROOTS.iter().any(|root| word.starts_with(root))).then_some(word)
}

/// The repository paths a backticked span or a link target names that do not
/// exist, and the cargo targets (`--bench NAME`) that do not.
fn missing_paths(span: &str, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    let mut missing = Vec::new();
    let words: Vec<&str> = span.split_whitespace().collect();
    for word in &words {
        if let Some(path) = as_path(word) {
            if !exists(path) {
                missing.push(path.to_string());
            }
        }
    }
    // A cargo target; a bench binary's own `--bench` (criterion's) is no target.
    let cargo = words.first() == Some(&"cargo");
    for pair in words.windows(2).filter(|_| cargo) {
        let candidates: Vec<String> = match pair[0] {
            "--bench" => vec![format!("benches/{}.rs", pair[1])],
            "--example" => vec![format!("examples/{}.rs", pair[1])],
            "--test" => vec![
                format!("tests/{}.rs", pair[1]),
                format!("tests/{}/main.rs", pair[1]),
            ],
            _ => continue,
        };
        let placeholder = pair[1].chars().all(|c| c.is_ascii_uppercase() || c == '_');
        if !placeholder && !candidates.iter().any(|c| exists(c)) {
            missing.push(format!("{} {}", pair[0], pair[1]));
        }
    }
    missing
}

/// The type name a backticked span stands for (`Phone` of `Sources<T>`,
/// `Phone::parse`, `crate::store::BudgetStore`); None for no type name.
fn type_name(span: &str) -> Option<&str> {
    let head = span.split('<').next().unwrap_or_default();
    let segments: Vec<&str> = head.split("::").collect();
    let name = segments
        .iter()
        .copied()
        .find(|s| s.starts_with(|c: char| c.is_ascii_uppercase()))?;
    let module_path = segments.iter().take_while(|s| **s != name).all(|s| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    });
    let word = name.chars().all(|c| c.is_ascii_alphanumeric());
    let has_lower = name.chars().any(|c| c.is_ascii_lowercase());
    let tail_ok = span.len() == head.len() && !span.contains(' ') || span.ends_with('>');
    (module_path && word && has_lower && tail_ok && span.len() > 1).then_some(name)
}

/// Whether a type name is known: defined or imported by the code, or listed.
fn unknown_type<'a>(span: &'a str, known: &std::collections::HashSet<String>) -> Option<&'a str> {
    let name = type_name(span)?;
    let listed = NOT_TYPES.contains(&name) || ELSEWHERE.contains(&name);
    // Alert names are checked against the chart's rules by scripts/check-chart.
    (!known.contains(name) && !listed && !name.starts_with("PhonesGateway")).then_some(name)
}

/// The capitalised identifiers `code` defines or imports.
fn type_names_of(code: &str, names: &mut std::collections::HashSet<String>) {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    for keyword in ["struct ", "enum ", "trait ", "type ", "union "] {
        for (at, _) in code.match_indices(keyword) {
            let before = code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name = ident(&code[at + keyword.len()..]);
            if name.starts_with(|c: char| c.is_ascii_uppercase()) {
                names.insert(name);
            }
        }
    }
    for (at, _) in code.match_indices("use ") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| !c.is_whitespace() && c != '{' && c != ';') {
            continue;
        }
        let tree = &code[at + 4..];
        let tree = &tree[..tree.find(';').unwrap_or(tree.len())];
        for word in tree.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with(|c: char| c.is_ascii_uppercase()) {
                names.insert(word.to_string());
            }
        }
    }
}

/// The text of the module at `path` (`[]`: the crate root), if it has a file.
fn module_text(path: &[&str], read: &dyn Fn(&str) -> Option<String>) -> Option<String> {
    if path.is_empty() {
        return read("src/lib.rs");
    }
    let dir = format!("src/{}", path.join("/"));
    read(&format!("{dir}.rs")).or_else(|| read(&format!("{dir}/mod.rs")))
}

/// Whether module source `text` declares `item` (only `pub` ones when
/// `public_only`), or brings it in with `use`.
fn declares(text: &str, item: &str, public_only: bool) -> bool {
    let named = |r: &str| {
        r.starts_with(item)
            && !r[item.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    };
    text.lines().any(|line| {
        let line = line.trim_start();
        let (public, rest) = match line.strip_prefix("pub") {
            Some(rest) if rest.starts_with(' ') => (true, rest),
            Some(rest) if rest.starts_with('(') => {
                (true, rest.split_once(')').map_or("", |(_, r)| r))
            }
            _ => (false, line),
        };
        if public_only && !public {
            return false;
        }
        let rest = rest.trim_start();
        let keywords = [
            "struct ",
            "enum ",
            "trait ",
            "type ",
            "fn ",
            "async fn ",
            "const ",
            "static ",
            "mod ",
            "union ",
            "macro_rules! ",
        ];
        keywords
            .iter()
            .any(|k| rest.strip_prefix(k).is_some_and(named))
            || rest.starts_with("use ") && mentions_word(rest, item)
    })
}

/// Whether the Rust path `segments` (no `crate::`), read from module `base`,
/// names a module with a file or an item declared in one (a trailing method
/// or variant is not checked).
fn resolves(
    base: &[&str],
    segments: &[&str],
    read: &dyn Fn(&str) -> Option<String>,
    public_only: bool,
) -> bool {
    let mut module: Vec<&str> = base.to_vec();
    let mut rest = segments;
    while let Some((first, tail)) = rest.split_first() {
        let mut deeper = module.clone();
        deeper.push(first);
        if module_text(&deeper, read).is_none() {
            break;
        }
        module = deeper;
        rest = tail;
    }
    match rest {
        [] => true,
        // After an item, only a type's method or variant.
        [item, _, ..] if !item.starts_with(|c: char| c.is_ascii_uppercase()) => false,
        [item, ..] => {
            module_text(&module, read).is_some_and(|text| declares(&text, item, public_only))
        }
    }
}

/// Whether `text` holds `word` as a whole identifier.
fn mentions_word(text: &str, word: &str) -> bool {
    let part = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        !text[..at].chars().next_back().is_some_and(part)
            && !text[at + word.len()..].chars().next().is_some_and(part)
    })
}

/// The backticked Rust paths of `doc` into this crate, read from the module
/// `file` is or any around it, that resolve to nothing. A dependency's path
/// sharing a module's name (`http::Uri`) is left alone when it names a type.
/// The map (`public_only`) names only `pub` items and may name a module alone.
fn unresolved_rust_paths(
    doc: &str,
    file: &str,
    dependencies: &[String],
    read: &dyn Fn(&str) -> Option<String>,
    public_only: bool,
) -> Vec<String> {
    let module: Vec<&str> = file
        .strip_prefix("src/")
        .unwrap_or(file)
        .trim_end_matches(".rs")
        .trim_end_matches("/mod")
        .split('/')
        .filter(|s| *s != "lib" && *s != "main")
        .collect();
    let bases: Vec<&[&str]> = (0..=module.len()).map(|n| &module[..n]).collect();
    let mut unresolved = Vec::new();
    let text = without_fences(doc);
    for span in backticked(&text) {
        let at = span.as_ptr() as usize - text.as_ptr() as usize;
        let linked = text[..at].ends_with("[`") && text[at + span.len()..].starts_with("`]");
        let from_crate = span.starts_with("crate::");
        let path = span.strip_prefix("crate::").unwrap_or(span);
        let segments: Vec<&str> = path.split("::").collect();
        let rusty = segments.iter().all(|s| {
            s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        });
        // A word alone is a path only as an intra-doc link of the map.
        let alone = segments.len() == 1 && !(public_only && linked);
        if !rusty || alone || !segments[0].starts_with(|c: char| c.is_ascii_lowercase()) {
            continue;
        }
        let bases: &[&[&str]] = if from_crate { &bases[..1] } else { &bases };
        // Ours: `crate::`, a module here or around the file, or a map link.
        let ours = from_crate
            || segments.len() == 1
            || bases.iter().any(|b| {
                let mut first = b.to_vec();
                first.push(segments[0]);
                module_text(&first, read).is_some()
            });
        if !ours
            || bases
                .iter()
                .any(|b| resolves(b, &segments, read, public_only))
        {
            continue;
        }
        let dependency_type = dependencies.iter().any(|d| d == segments[0])
            && segments
                .get(1)
                .is_some_and(|s| s.starts_with(|c: char| c.is_ascii_uppercase()));
        if !dependency_type {
            unresolved.push(span.to_string());
        }
    }
    unresolved
}

/// The bare file names of a module doc that exist neither beside `file`, nor
/// in its module folder, nor at the top of src/.
fn missing_siblings(doc: &str, file: &str, exists: &dyn Fn(&str) -> bool) -> Vec<String> {
    let dir = file.rsplit_once('/').map_or("", |(d, _)| d);
    let own = file
        .strip_suffix("/mod.rs")
        .or_else(|| file.strip_suffix(".rs"))
        .unwrap_or(file);
    let mut missing = Vec::new();
    for span in backticked(&without_fences(doc)) {
        let name = span.trim_end_matches('/');
        let plain = !name.is_empty()
            && !name.contains('/')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        let is_file = name.ends_with(".rs") || span.ends_with('/');
        if plain
            && as_path(span).is_none()
            && is_file
            && ![dir, own, "src"]
                .iter()
                .any(|d| exists(&format!("{d}/{name}")))
        {
            missing.push(span.to_string());
        }
    }
    missing
}

/// The bare file names of a Markdown text not under the folder of the last
/// repository path named before them in their paragraph (else anywhere).
/// `found(dir, name)`: whether `dir` or a folder below it holds `name`.
fn misplaced_names(text: &str, found: &dyn Fn(&str, &str) -> bool) -> Vec<String> {
    let mut misplaced = Vec::new();
    for paragraph in without_fences(text).split("\n\n") {
        let mut dir = String::new();
        for span in backticked(paragraph) {
            if let Some(path) = as_path(span.split_whitespace().next().unwrap_or_default()) {
                dir = match path.strip_suffix('/') {
                    Some(folder) => folder.to_string(),
                    None => path.rsplit_once('/').map_or("", |(d, _)| d).to_string(),
                };
                continue;
            }
            let name = span.trim_end_matches('/');
            // A dot first is state a tool makes (`.cluster/`), not a source file.
            let plain = name.starts_with(|c: char| c.is_ascii_alphanumeric())
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
            let is_file = name.ends_with(".rs") || span.ends_with('/') && name != span;
            if plain && is_file && !found(&dir, name) {
                misplaced.push(if dir.is_empty() {
                    span.to_string()
                } else {
                    format!("{span} (under {dir}/)")
                });
            }
        }
    }
    misplaced
}

/// Whether `dir` (the repository when empty) or below holds `name`; build
/// output and version control are not searched.
fn found_under(dir: &str, name: &str) -> bool {
    let mut dirs = vec![root().join(dir)];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.file_name().is_some_and(|n| n == name) {
                return true;
            }
            let skipped = path
                .file_name()
                .is_some_and(|n| n == "target" || n == ".git" || n == "node_modules");
            if path.is_dir() && !skipped {
                dirs.push(path);
            }
        }
    }
    false
}

fn rust_files(dirs: &[&str]) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = dirs.iter().map(|d| root().join(d)).collect();
    let mut files = Vec::new();
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn exists_in_repo(path: &str) -> bool {
    root().join(path).exists()
}

fn read_in_repo(path: &str) -> Option<String> {
    fs::read_to_string(root().join(path)).ok()
}

/// README.md, docs/ and the module map, each with the text checked.
fn named_places() -> Vec<(String, String)> {
    let mut places: Vec<(String, String)> = documentation()
        .into_iter()
        .filter(|f| f.extension().is_some_and(|e| e == "md"))
        .map(|f| (relative(&f), read(&f)))
        .collect();
    places.push((
        "src/lib.rs".to_string(),
        module_doc(&read(&root().join("src/lib.rs"))),
    ));
    places
}

#[test]
fn the_docs_name_only_paths_that_exist() {
    let mut missing = Vec::new();
    for (file, text) in named_places() {
        let text = without_fences(&text);
        let targets = link_targets(&text).into_iter().filter(|t| !t.contains(' '));
        for span in backticked(&text).into_iter().chain(targets) {
            for path in missing_paths(span, &exists_in_repo) {
                missing.push(format!("{file}: {path}"));
            }
        }
        if file.ends_with(".md") {
            for name in misplaced_names(&text, &found_under) {
                missing.push(format!("{file}: {name}"));
            }
        }
    }
    for file in rust_files(&["src"]) {
        let name = relative(&file);
        let doc = module_doc(&read(&file));
        for span in backticked(&without_fences(&doc)) {
            for path in missing_paths(span, &exists_in_repo) {
                missing.push(format!("{name}: {path}"));
            }
        }
        for bare in missing_siblings(&doc, &name, &exists_in_repo) {
            if !PENDING.contains(&(name.as_str(), bare.as_str())) {
                missing.push(format!("{name}: {bare}"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "named but not in the repository: {missing:#?}"
    );
}

#[test]
fn the_docs_name_only_types_that_exist() {
    let mut known = std::collections::HashSet::new();
    for file in rust_files(&["src", "tests", "benches", "examples"]) {
        type_names_of(&read(&file), &mut known);
    }
    assert!(known.contains("Resolver") && known.contains("CancellationToken"));
    let mut unknown = Vec::new();
    for (file, text) in named_places() {
        for span in backticked(&without_fences(&text)) {
            if let Some(name) = unknown_type(span, &known) {
                unknown.push(format!("{file}: {name}"));
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "types named but defined nowhere: {unknown:#?}"
    );
}

#[test]
fn the_module_map_names_only_modules_that_exist() {
    let lib = read(&root().join("src/lib.rs"));
    let modules: Vec<String> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';').to_string())
        .collect();
    assert!(modules.len() > 10, "top-level modules: {modules:?}");
    let doc = module_doc(&lib);
    let unresolved =
        unresolved_rust_paths(&doc, "src/lib.rs", &dependencies(), &read_in_repo, true);
    assert!(
        unresolved.is_empty(),
        "src/lib.rs names what is not there: {unresolved:?}"
    );
    let absent: Vec<&String> = modules
        .iter()
        .filter(|m| !doc.contains(&format!("[`{m}`]")))
        .collect();
    assert!(
        absent.is_empty(),
        "top-level modules not on the map: {absent:?}"
    );
}

/// The crates of Cargo.lock: what the code may name through a dependency.
fn dependencies() -> Vec<String> {
    read(&root().join("Cargo.lock"))
        .lines()
        .filter_map(|l| l.strip_prefix("name = \""))
        .map(|name| name.trim_end_matches('"').replace('-', "_"))
        .collect()
}

/// Every comment under src/ that names a path into this crate names one that
/// exists.
#[test]
fn the_comments_name_only_modules_and_items_that_exist() {
    let dependencies = dependencies();
    assert!(dependencies.iter().any(|d| d == "http"), "{dependencies:?}");
    let mut unresolved = Vec::new();
    for file in rust_files(&["src"]) {
        let name = relative(&file);
        let comments: String = read(&file)
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("//"))
            .map(|l| l.trim_start_matches(['/', '!']))
            .collect::<Vec<_>>()
            .join("\n");
        for path in unresolved_rust_paths(&comments, &name, &dependencies, &read_in_repo, false) {
            if !PENDING.contains(&(name.as_str(), path.as_str())) {
                unresolved.push(format!("{name}: {path}"));
            }
        }
    }
    assert!(
        unresolved.is_empty(),
        "comments name what is not there: {unresolved:#?}"
    );
}

/// The text of `path` among `texts`, as (path, text) pairs.
fn reader(texts: &[(&str, &str)], path: &str) -> Option<String> {
    texts
        .iter()
        .find(|(f, _)| *f == path)
        .map(|(_, t)| t.to_string())
}

/// The checker itself, on small texts and a made-up repository.
#[test]
fn the_name_checker_catches_stale_names_and_leaves_the_rest() {
    let files = [
        "src/lib.rs",
        "src/store/mod.rs",
        "src/store/reveals/mod.rs",
        "src/http/mod.rs",
        "src/http/api/mod.rs",
        "src/http/api/extract.rs",
        "benches/cache_memory.rs",
        "benches/load/harness.py",
        "tests/it/main.rs",
    ];
    // A path exists as one of `files` or a folder above one.
    let exists = |p: &str| {
        let p = p.trim_end_matches('/');
        files
            .iter()
            .any(|f| *f == p || f.starts_with(&format!("{p}/")))
    };

    // Paths: backticked, as a command's words, as link targets; placeholders,
    // URLs, keys and prose are left alone.
    for (span, missing) in [
        ("src/http/extract.rs", Some("src/http/extract.rs")),
        ("src/http/api/extract.rs", None),
        ("src/store/reveals/", None),
        ("src/store/reveals.rs", Some("src/store/reveals.rs")),
        ("GO_SEED_BIN=... benches/load/harness.py --cold", None),
        (
            "benches/load/fleet.py --quick",
            Some("benches/load/fleet.py"),
        ),
        ("cargo bench --bench cache_memory", None),
        ("<bench binary> --bench router/h", None),
        ("cargo bench --bench NAME", None),
        ("cargo bench --bench cache_mem", Some("--bench cache_mem")),
        ("cargo test --test it rules::", None),
        ("cargo test --test its", Some("--test its")),
        ("src/http/api/extract.rs:12", None),
        ("tests/it/main.rs#L3", None),
        ("src/*/mod.rs", None),
        ("helm/<chart>/values.yaml", None),
        ("https://example.invalid/src/x.rs", None),
        ("server.max_in_flight", None),
        ("phones_gateway_shed_total", None),
        ("a sentence with src in it", None),
    ] {
        assert_eq!(
            missing_paths(span, &exists),
            Vec::from_iter(missing),
            "{span}"
        );
    }

    // Types: defined or imported by the code, or listed.
    let mut known = std::collections::HashSet::new();
    type_names_of(
        "pub struct BudgetStore;\nenum Source { A }\nuse tokio_util::sync::{\n    CancellationToken, TaskTracker};\n\
         pub(crate) trait SellerCaches {}\nlet x: Vec<u8> = Vec::new(); // a struct of sorts\n",
        &mut known,
    );
    for name in [
        "BudgetStore",
        "Source",
        "CancellationToken",
        "TaskTracker",
        "SellerCaches",
    ] {
        assert!(known.contains(name), "{name}: {known:?}");
    }
    for (span, unknown) in [
        ("PublicState", Some("PublicState")),
        ("crate::store::BudgetStores", Some("BudgetStores")),
        ("Sources<T>", Some("Sources")),
        ("Source::parse", None),
        ("BudgetStore", None),
        ("server.max_in_flight", None),
        ("phones_gateway_budget_refused_total", None),
        ("PHONES_GATEWAY__ADMIN__TOKEN", None),
        ("COPY", None),
        ("Retry-After", None),
        ("X-Viewer-Id", None),
        ("Authorization: Bearer <admin.token>", None),
        ("PhonesGatewayTargetDown", None),
        ("ConfigMap", None),
        ("GET /v1/public-phone", None),
        ("+*********67", None),
    ] {
        assert_eq!(unknown_type(span, &known), unknown, "{span}");
    }

    // Module paths in the map.
    let texts = [
        ("src/lib.rs", "pub mod store;\npub mod http;\n"),
        (
            "src/store/mod.rs",
            "mod reveals;\npub use reveals::{RevealStore, RevealStoreError};\n",
        ),
        ("src/http/mod.rs", "pub mod api;\n"),
        (
            "src/http/api/mod.rs",
            "pub mod extract;\npub struct RequestLimits;\n",
        ),
    ];
    let read = |p: &str| reader(&texts, p);
    let deps = ["http".to_string(), "tower".to_string()];
    let doc = "- [`store`]: `RevealStore` of `crate::store::RevealStore::write`; [`http::api`] \
               with `http::api::RequestLimits` and `http::api::extract`, and \
               [`http::snapshot`], `store::BudgetStore`, `crate::http::api::Keys`, [`cache`]. \
               Not ours: `tower::ServiceExt`, `http::Uri`, `config.toml`; not links: `serve`.";
    assert_eq!(
        unresolved_rust_paths(doc, "src/lib.rs", &deps, &read, true),
        [
            "http::snapshot",
            "store::BudgetStore",
            "crate::http::api::Keys",
            "cache"
        ]
    );
    // Elsewhere, from the module a comment is in, private items included.
    let texts = [
        ("src/lib.rs", "pub mod store;\npub mod http;\n"),
        ("src/store/mod.rs", "mod status;\nmod database;\n"),
        ("src/store/status/mod.rs", "mod sqlite;\n"),
        (
            "src/store/status/sqlite.rs",
            "const BEGIN_WRITE: &str = \"\";\n",
        ),
        ("src/store/database.rs", "struct Pg;\n"),
        ("src/http/mod.rs", "pub mod api;\nuse axum::http;\n"),
        (
            "src/http/api/mod.rs",
            "pub mod durations;\nuse axum::http::HeaderMap;\n",
        ),
        ("src/http/api/durations.rs", ""),
    ];
    let read = |p: &str| reader(&texts, p);
    let doc = "`status::sqlite::BEGIN_WRITE`, `store::database::Pg`, `database::Pg::new`, \
               `http::durations`, `api::durations`, `crate::status::sqlite`, `status`";
    assert_eq!(
        unresolved_rust_paths(doc, "src/store/mod.rs", &deps, &read, false),
        ["http::durations", "crate::status::sqlite"]
    );
    // Not fooled by a module that imports a crate of the same name.
    assert_eq!(
        unresolved_rust_paths(
            "`http::snapshot`, `http::api`",
            "src/http/api/durations.rs",
            &deps,
            &read,
            false
        ),
        ["http::snapshot"]
    );

    // Bare file names in a module doc, beside it or in its own folder.
    let doc =
        "`database.rs` (opening), `status/`, `reveals/`, `reveals.rs`, `mod.rs`, `migrations/`";
    let doc_exists = |p: &str| {
        [
            "src/store/database.rs",
            "src/store/status",
            "src/store/reveals",
            "src/store/mod.rs",
        ]
        .contains(&p.trim_end_matches('/'))
    };
    assert_eq!(
        missing_siblings(doc, "src/store/mod.rs", &doc_exists),
        ["reveals.rs"]
    );

    // Bare names in Markdown, under the folder their paragraph points at.
    let tree = [
        "src/store/database.rs",
        "src/store/status",
        "src/store/reveals",
        "src/telemetry/trace",
        "src/telemetry/trace/context.rs",
        "src/http/api/openapi.rs",
        "src/http/api/reveals.rs",
    ];
    let found = |dir: &str, name: &str| {
        tree.iter()
            .any(|p| p.starts_with(dir) && p.rsplit('/').next() == Some(name))
    };
    let readme = "- `src/store/`: `database.rs` (opening), `status/`, `reveals.rs`, `budgets.rs`.\n\
                  - `src/telemetry/`: `trace/`: `context.rs`.\n\n\
                  A row of `src/http/api/routes.rs`; `openapi.rs` lists it. `reveals.rs`, `gone.rs`.";
    assert_eq!(
        misplaced_names(readme, &found),
        [
            "reveals.rs (under src/store/)",
            "budgets.rs (under src/store/)",
            "gone.rs (under src/http/api/)"
        ]
    );
    assert!(
        misplaced_names(
            "`reveals.rs` and `mod.rs`? `x/y.rs`, `.cluster/`",
            &|_: &str, n: &str| n == "reveals.rs" || n == "mod.rs"
        )
        .is_empty()
    );

    // Fences and module docs.
    assert_eq!(without_fences("a\n```sh\n`src/x.rs`\n```\nb\n"), "a\nb\n");
    assert_eq!(
        module_doc("//! One.\n//!\n//! Two `x`.\n\nuse a;\n//! not this"),
        "One.\n\nTwo `x`."
    );
    assert_eq!(backticked("`a` and `b::C`, ``"), ["a", "b::C", ""]);
}

/// docs/rules.md, "Verdict or undecided": its table of how a call ends is
/// `upstream::ending`'s, row by row.
#[test]
fn the_table_of_how_a_call_ends_is_the_codes() {
    let doc = read(&root().join("docs/rules.md"));
    let start = doc
        .find("| kind | what happened | code | class | breaker | bound learns | outcome |")
        .expect("docs/rules.md: the table of how a call ends");
    let rows: Vec<[String; 6]> = doc[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|cell| cell.trim().trim_matches('`').to_owned())
                .collect();
            [2, 3, 4, 5, 6].iter().fold(
                [
                    cells[0].clone(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                    String::new(),
                ],
                |mut row, &i| {
                    row[i - 1] = cells.get(i).cloned().unwrap_or_default();
                    row
                },
            )
        })
        .collect();
    let code: Vec<[String; 6]> = phones_gateway::upstream::table()
        .iter()
        .map(|line| line.map(str::to_owned))
        .collect();
    assert_eq!(rows, code, "docs/rules.md against upstream::ending's table");
}

/// docs/runbook.md gives each alert the expression, duration and values the
/// chart renders by default (`tests/it/support/alerts.rs`).
#[test]
fn the_runbook_shows_each_alerts_expression_and_threshold() {
    let runbook = read(&root().join("docs/runbook.md"));
    for alert in alerts::chart_alerts(root()) {
        let heading = format!("\n## {}\n", alert.name);
        let start = runbook
            .find(&heading)
            .unwrap_or_else(|| panic!("no section {} in docs/runbook.md", alert.name));
        let section = &runbook[start + heading.len()..];
        let section = &section[..section.find("\n## ").unwrap_or(section.len())];
        let flat = section.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains(&alert.expr),
            "{}: the runbook does not show the expression {}",
            alert.name,
            alert.expr
        );
        assert!(
            flat.contains(&format!("holds for {}", alert.hold)),
            "{}: the runbook does not say it holds for {}",
            alert.name,
            alert.hold
        );
        for key in &alert.keys {
            assert!(
                flat.contains(key.as_str()),
                "{}: {key} not named",
                alert.name
            );
        }
    }
}

/// Every migration of either dialect is named in CHANGELOG.md (`NNNN
/// description`, as `migrate --status` lists it), and docs/operations.md has
/// the upgrade procedure, starting from `migrate --status`.
#[test]
fn the_changelog_names_every_migration_and_the_upgrade_is_documented() {
    let changelog = read(&root().join("CHANGELOG.md"));
    let flat = changelog.split_whitespace().collect::<Vec<_>>().join(" ");
    let mut missing = Vec::new();
    for dialect in ["sqlite", "postgres"] {
        for entry in fs::read_dir(root().join("migrations").join(dialect)).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".sql") else {
                continue;
            };
            let (number, words) = stem.split_once('_').unwrap_or((stem, ""));
            let listed = format!("{number} {}", words.replace('_', " "));
            let number: u32 = number.parse().unwrap();
            // Named alone, or within a range of the release that brought it.
            let in_a_range = flat.match_indices(" to ").any(|(at, _)| {
                let before = flat[..at].rsplit(' ').next().unwrap_or("");
                let after = flat[at + 4..].split(' ').next().unwrap_or("");
                let (Ok(low), Ok(high)) = (before.parse::<u32>(), after.parse::<u32>()) else {
                    return false;
                };
                (low..=high).contains(&number)
            });
            if !flat.contains(&listed) && !in_a_range {
                missing.push(format!("{dialect}/{name}"));
            }
        }
    }
    assert!(missing.is_empty(), "CHANGELOG.md does not name {missing:?}");
    let operations = read(&root().join("docs/operations.md"));
    let upgrading = operations
        .split("\n## Upgrading\n")
        .nth(1)
        .expect("docs/operations.md has an \"Upgrading\" section");
    let upgrading = &upgrading[..upgrading.find("\n## ").unwrap_or(upgrading.len())];
    for step in [
        "CHANGELOG.md",
        "migrate --status",
        "phones-gateway migrate --config",
    ] {
        assert!(upgrading.contains(step), "Upgrading does not say {step}");
    }
}

/// `config/simulator.toml` loads and points every upstream at the address
/// `phones-gateway simulate` listens on by default (read through its flags).
#[test]
fn the_simulator_example_points_every_upstream_at_the_simulator() {
    use clap::Parser;
    #[derive(Parser)]
    struct Simulate {
        #[command(flatten)]
        sim: phones_gateway::sim::SimConfig,
    }
    let listens = Simulate::parse_from(["simulate"]).sim.addr;
    let url = format!("http://{listens}");
    let path = root().join("config/simulator.toml");
    let config = phones_gateway::config::Config::load(Some(&path))
        .unwrap_or_else(|e| panic!("config/simulator.toml: {e}"));
    let upstreams = &config.upstreams;
    for (name, base_url) in [
        ("real_phone", &upstreams.real_phone.base_url),
        ("anonymous", &upstreams.anonymous.base_url),
        ("calltracking", &upstreams.calltracking.upstream.base_url),
    ] {
        assert_eq!(*base_url, url, "upstreams.{name}.base_url");
    }
    for doc in ["README.md", "docs/configuration.md"] {
        let text = read(&root().join(doc));
        assert!(
            text.contains("config/simulator.toml") && text.contains(&listens.to_string()),
            "{doc} does not name config/simulator.toml and {listens}"
        );
    }
}

/// A comment under src/ that points to a rule's section (`docs/rules.md,
/// "Whose time"`) names a heading of that page: the rule is told there once.
#[test]
fn the_comments_point_to_sections_that_exist() {
    let mut missing = Vec::new();
    for file in rust_files(&["src"]) {
        let code = read(&file);
        let text: Vec<&str> = code
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("//"))
            .map(|l| l.trim_start_matches(['/', '!']).trim())
            .collect();
        let text = text.join(" ");
        for (at, _) in text.match_indices(".md, \"") {
            let start = text[..at].rfind([' ', '(', '`']).map_or(0, |i| i + 1);
            let page = &text[start..at + 3];
            let rest = &text[at + 6..];
            let section = &rest[..rest.find('"').unwrap_or(rest.len())];
            let path = if page.contains('/') || exists_in_repo(page) {
                page.to_string()
            } else {
                format!("docs/{page}")
            };
            let found = read_in_repo(&path).is_some_and(|doc| {
                doc.lines()
                    .filter(|l| l.starts_with('#'))
                    .any(|l| l.trim_start_matches('#').trim().contains(section))
            });
            if !found {
                missing.push(format!("{}: {path}, \"{section}\"", relative(&file)));
            }
        }
    }
    assert!(missing.is_empty(), "no such section: {missing:#?}");
}
