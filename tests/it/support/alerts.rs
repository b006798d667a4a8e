//! The chart's alerts (`helm/phones-gateway/templates/prometheusrule.yaml`)
//! rendered with the default values, release selector left out: for
//! docs/runbook.md (tests/docs.rs) and the series a fresh replica must have
//! (tests/it). Read by string matching; an unknown template form fails.

// tests/docs.rs includes this file too (`#[path]`), each reading a part.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

/// One alert of the chart.
#[derive(Debug)]
pub(crate) struct Alert {
    pub(crate) name: String,
    /// The expression, whitespace collapsed to single spaces.
    pub(crate) expr: String,
    pub(crate) hold: String,
    /// The `prometheusRule.*` keys its expression and `for` read.
    pub(crate) keys: Vec<String>,
}

/// The public routes' selector, `$public` in the template.
const PUBLIC: &str = r#"route=~"/v1/public-phone|/v1/public-phones/batch""#;

/// `prometheusRule.*` of `values.yaml`: each leaf by its dotted key under it.
fn values(root: &Path) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(root.join("helm/phones-gateway/values.yaml"))
        .expect("helm/phones-gateway/values.yaml");
    let mut found = BTreeMap::new();
    let mut path: Vec<String> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("prometheusRule:") {
            inside = true;
            continue;
        }
        let trimmed = line.trim();
        if !inside || trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if !line.starts_with(' ') {
            break;
        }
        let depth = (line.len() - line.trim_start().len()) / 2;
        let (key, value) = trimmed.split_once(':').expect("a `key: value` line");
        path.truncate(depth - 1);
        path.push(key.to_owned());
        let value = value.trim().trim_matches('"');
        if !value.is_empty() {
            found.insert(path.join("."), value.to_owned());
        }
    }
    found
}

/// `template` with the values put in and the selectors left out; the keys read.
fn render(template: &str, values: &BTreeMap<String, String>, keys: &mut Vec<String>) -> String {
    let mut text = template.to_owned();
    for (from, to) in [
        ("{ {{- $sel -}} }", ""),
        ("{ {{- $up -}} }", ""),
        ("{ {{- $sel -}}, ", "{"),
        ("{ {{- $sel }}, ", "{"),
        ("{{ $public -}} }", "{{ $public }}}"),
        ("{{ $public }}", PUBLIC),
    ] {
        text = text.replace(from, to);
    }
    while let Some(start) = text.find("{{ $r.") {
        let end = start + text[start..].find(" }}").expect("a closed `{{ $r.… }}`");
        let key = text[start + "{{ $r.".len()..end].to_owned();
        let value = values
            .get(&key)
            .unwrap_or_else(|| panic!("prometheusRule.{key} is not in values.yaml"));
        text.replace_range(start..end + " }}".len(), value);
        keys.push(format!("prometheusRule.{key}"));
    }
    assert!(
        !text.contains("{{"),
        "a template form the reader does not know: {text}"
    );
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Every alert of the chart, in its order.
pub(crate) fn chart_alerts(root: &Path) -> Vec<Alert> {
    let values = values(root);
    let text =
        std::fs::read_to_string(root.join("helm/phones-gateway/templates/prometheusrule.yaml"))
            .expect("helm/phones-gateway/templates/prometheusrule.yaml");
    let lines: Vec<&str> = text.lines().collect();
    let mut alerts = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(name) = lines[i].trim().strip_prefix("- alert: ") else {
            i += 1;
            continue;
        };
        let (mut expr, mut hold) = (String::new(), String::new());
        i += 1;
        while i < lines.len() && !lines[i].trim().starts_with("- alert: ") {
            let line = lines[i].trim();
            if let Some(rest) = line.strip_prefix("expr: ") {
                if rest == "|-" {
                    let indent = lines[i].len() - lines[i].trim_start().len();
                    while i + 1 < lines.len()
                        && lines[i + 1].len() - lines[i + 1].trim_start().len() > indent
                    {
                        i += 1;
                        expr.push(' ');
                        expr.push_str(lines[i].trim());
                    }
                } else {
                    expr = rest.to_owned();
                }
            } else if let Some(rest) = line.strip_prefix("for: ") {
                hold = rest.to_owned();
            }
            i += 1;
        }
        let mut keys = Vec::new();
        alerts.push(Alert {
            name: name.to_owned(),
            expr: render(&expr, &values, &mut keys),
            hold: render(&hold, &values, &mut keys),
            keys,
        });
    }
    assert!(alerts.len() >= 10, "{alerts:?}");
    alerts
}

/// The series an expression reads: each `phones_gateway_*` name as written,
/// with the labels its selector matches exactly, in order.
pub(crate) fn series_read(expr: &str) -> Vec<(String, Vec<String>)> {
    let mut found = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find("phones_gateway_") {
        let tail = &rest[start..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        let name = tail[..end].to_owned();
        let mut labels = Vec::new();
        if let Some(selector) = tail[end..].strip_prefix('{') {
            let selector = &selector[..selector.find('}').expect("a closed selector")];
            for matcher in selector.split(", ") {
                if let Some((label, value)) = matcher.split_once("=\"") {
                    if label.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                        labels.push(format!("{label}=\"{value}"));
                    }
                }
            }
        }
        if !found.iter().any(|(n, l)| *n == name && *l == labels) {
            found.push((name, labels));
        }
        rest = &tail[end..];
    }
    found
}
