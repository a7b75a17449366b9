//! deploy/grafana-dashboard.json as Grafana reads it: its template variables (in order, each
//! query interpolated with the ones before) and every panel's targets, with Grafana's rules
//! for putting a variable's value into PromQL:
//! - a variable with "All" selected and an `allValue` becomes that value, unescaped (`.*`);
//! - a multi-value or include-all variable's values are regex-escaped as Grafana's Prometheus
//!   data source does (`prometheusSpecialRegexEscape`: `\` → `\\\\`, each of `$^*{}[]'+?.()|`
//!   after `\\`), and several become `(a|b)`;
//! - `$__rate_interval`, `$__interval` and `$__range` become a range the caller chooses.
//!
//! A variable the dashboard does not define is an error: Grafana would leave `$name` in the
//! query, which Prometheus refuses or matches nothing with.
use std::collections::BTreeMap;

use serde_json::Value;

/// The dashboard file of the repository.
pub fn load() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/grafana-dashboard.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path} is not JSON: {e}"))
}

/// A query template variable: `label_values(SELECTOR, LABEL)`.
pub struct Variable {
    pub name: String,
    /// The series selector, still with `$var` references.
    pub selector: String,
    pub label: String,
    pub multi: bool,
    pub include_all: bool,
    pub all_value: Option<String>,
}

/// The dashboard's template variables, in order. Panics on any kind Grafana would not run as
/// a label-values query.
pub fn variables(dashboard: &Value) -> Vec<Variable> {
    let list = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list");
    list.iter()
        .map(|v| {
            let name = v["name"].as_str().expect("a variable's name").to_string();
            assert_eq!(v["type"], "query", "variable {name}: not a query variable");
            // Grafana 10 stores the query as an object; older dashboards as a string.
            let query = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .unwrap_or_else(|| panic!("variable {name}: no query"));
            let (selector, label) = query
                .trim()
                .strip_prefix("label_values(")
                .and_then(|q| q.strip_suffix(')'))
                .and_then(|q| q.rsplit_once(','))
                .unwrap_or_else(|| {
                    panic!("variable {name}: {query:?} is not label_values(SELECTOR, LABEL)")
                });
            Variable {
                name,
                selector: selector.trim().to_string(),
                label: label.trim().to_string(),
                multi: v["multi"] == true,
                include_all: v["includeAll"] == true,
                all_value: v["allValue"].as_str().map(str::to_string),
            }
        })
        .collect()
}

/// One target of one panel (run as an instant query: the last point of its graph).
pub struct Target {
    pub panel_id: u64,
    pub panel: String,
    pub ref_id: String,
    pub expr: String,
    pub legend: String,
}

/// Every panel's targets, in panel order.
pub fn targets(dashboard: &Value) -> Vec<Target> {
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut out = Vec::new();
    for p in panels {
        let panel = p["title"].as_str().expect("a panel's title").to_string();
        let targets = p["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("panel {panel:?} has no targets"));
        for t in targets {
            out.push(Target {
                panel_id: p["id"].as_u64().expect("a panel's id"),
                panel: panel.clone(),
                ref_id: t["refId"].as_str().expect("a target's refId").to_string(),
                expr: t["expr"].as_str().expect("a target's expr").to_string(),
                legend: t["legendFormat"].as_str().unwrap_or_default().to_string(),
            });
        }
    }
    out
}

/// What a variable is set to.
#[derive(Clone, Debug)]
pub enum Selection {
    /// "All": the variable's `allValue`.
    All,
    /// These values.
    Values(Vec<String>),
}

/// The value Grafana puts in a query for `var` set to `sel`.
pub fn render(var: &Variable, sel: &Selection) -> String {
    match sel {
        Selection::All => {
            assert!(var.include_all, "variable {} has no All", var.name);
            var.all_value
                .clone()
                .unwrap_or_else(|| panic!("variable {}: All without an allValue", var.name))
        }
        Selection::Values(values) if !var.multi && !var.include_all => {
            assert_eq!(values.len(), 1, "variable {} takes one value", var.name);
            values[0].replace('\\', "\\\\").replace('\'', "\\\\'")
        }
        Selection::Values(values) => {
            let escaped: Vec<String> = values.iter().map(|v| regex_escape(v)).collect();
            if escaped.len() == 1 {
                escaped[0].clone()
            } else {
                format!("({})", escaped.join("|"))
            }
        }
    }
}

/// Grafana's `prometheusSpecialRegexEscape`.
fn regex_escape(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\\\\\"),
            '$' | '^' | '*' | '{' | '}' | '[' | ']' | '\'' | '+' | '?' | '.' | '(' | ')' | '|' => {
                out.push_str("\\\\");
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// `text` with every `$name` and `${name}` replaced from `values`; panics on a name it lacks.
pub fn interpolate(text: &str, values: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, tail) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced
                .find('}')
                .unwrap_or_else(|| panic!("an unclosed ${{ in {text:?}"));
            (&braced[..end], &braced[end + 1..])
        } else {
            let end = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            (&after[..end], &after[end..])
        };
        let value = values.get(name).unwrap_or_else(|| {
            panic!("{text:?} uses ${name}, which the dashboard does not define")
        });
        out.push_str(value);
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// The labels a legend format names (`{{cgroup}} {{direction}}` → cgroup, direction).
pub fn legend_labels(legend: &str) -> Vec<String> {
    legend
        .split("{{")
        .skip(1)
        .filter_map(|s| s.split_once("}}").map(|(l, _)| l.trim().to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_as_grafana_does() {
        let var = Variable {
            name: "cgroup".into(),
            selector: String::new(),
            label: "cgroup".into(),
            multi: true,
            include_all: true,
            all_value: Some(".*".into()),
        };
        assert_eq!(render(&var, &Selection::All), ".*");
        let one = Selection::Values(vec!["/system.slice/a-b.service".into()]);
        assert_eq!(render(&var, &one), "/system\\\\.slice/a-b\\\\.service");
        let two = Selection::Values(vec!["/a".into(), "(other)".into()]);
        assert_eq!(render(&var, &two), "(/a|\\\\(other\\\\))");
        let values = BTreeMap::from([("x".to_string(), "1".to_string())]);
        assert_eq!(interpolate("a{b=~\"$x\"}[${x}]", &values), "a{b=~\"1\"}[1]");
        assert_eq!(
            legend_labels("{{cgroup}} {{ direction }} x"),
            ["cgroup", "direction"]
        );
    }
}
