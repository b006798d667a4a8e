//! The documentation checked against the repository, with file reads only:
//! every key of `config/default.toml` is documented in `docs/configuration.md`,
//! the docs point at nothing outside the repository, and their relative links
//! resolve.
//!
//! `config/default.toml` is read with a small line parser rather than a TOML
//! crate: `toml` is not a direct dependency, and the commented-out keys
//! (`# request_deadline_ms = 600`), which a TOML parser drops, must be found too.

use std::fs;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `key` of a `key = value` line (or `# key = value` when `commented`).
fn key_of(line: &str, commented: bool) -> Option<&str> {
    let line = line.trim();
    let line = if commented {
        line.strip_prefix('#')?.trim_start()
    } else {
        line
    };
    let (key, _) = line.split_once(" = ")?;
    let is_key = !key.is_empty()
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    is_key.then_some(key)
}

/// Every key of a TOML file as a dotted path (`upstreams.real_phone.timeout_ms`),
/// commented-out `# key = value` lines included.
fn dotted_keys(toml: &str) -> Vec<String> {
    let mut section = String::new();
    let mut keys = Vec::new();
    for line in toml.lines() {
        let trimmed = line.trim();
        if let Some(header) = trimmed.strip_prefix('[') {
            section = header
                .split_once(']')
                .map(|(name, _)| name.trim().to_string())
                .expect("a section header ends with ]");
            continue;
        }
        let key = key_of(trimmed, false).or_else(|| key_of(trimmed, true));
        if let Some(key) = key {
            keys.push(if section.is_empty() {
                key.to_string()
            } else {
                format!("{section}.{key}")
            });
        }
    }
    keys
}

/// Whether `text` holds `word` not as part of a longer dotted name.
fn mentions(text: &str, word: &str) -> bool {
    let part_of_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '.';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(part_of_name) && !after.is_some_and(|c| part_of_name(c) && c != '.')
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
fn the_key_parser_reads_sections_and_commented_keys() {
    let keys = dotted_keys(
        "# A comment = prose\n[server]\nport = 1\n# deadline_ms = 600\n\
         # PREFIX__KEY=x\n[a.b]\nlist = [1, 2]\n",
    );
    assert_eq!(keys, ["server.port", "server.deadline_ms", "a.b.list"]);
    assert!(mentions("| `cache.a.ttl_s` |", "cache.a.ttl_s"));
    assert!(!mentions("`cache.a.negative_ttl_s`", "a.negative"));
    assert!(!mentions("`x.cache.a.ttl_s`", "cache.a.ttl_s"));
    assert!(mentions("see server.port.", "server.port"));
}

#[test]
fn every_default_key_is_documented() {
    let defaults = read(&root().join("config/default.toml"));
    let keys = dotted_keys(&defaults);
    assert!(
        keys.len() > 40,
        "the parser found only {} keys: {keys:?}",
        keys.len()
    );
    assert!(keys.iter().any(|k| k == "upstreams.real_phone.timeout_ms"));
    let docs = read(&root().join("docs/configuration.md"));
    let missing: Vec<&String> = keys.iter().filter(|k| !mentions(&docs, k)).collect();
    assert!(
        missing.is_empty(),
        "keys of config/default.toml not in docs/configuration.md: {missing:?}"
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

/// The code cites the project's docs, not a contract kept elsewhere: no "SPEC"
/// and a section number in a comment under src/, tests/ or benches/.
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
                let spec_section = text
                    .match_indices("SPEC ")
                    .any(|(at, _)| text[at + 5..].starts_with(|c: char| c.is_ascii_digit()));
                if spec_section || text.contains(&["..", "/shared"].concat()) {
                    cited.push(path.display().to_string());
                }
            }
        }
    }
    assert!(cited.is_empty(), "cite docs/ instead: {cited:?}");
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
