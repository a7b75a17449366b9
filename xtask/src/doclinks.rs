//! The documentation holds together: every relative link in README.md and docs/*.md names a
//! file that exists, every `#anchor` a heading of its target (by GitHub's slug), and the README
//! keeps the limits a newcomer relies on (short; the run command and a sample of the live table
//! near the top). The unit tests below check the repository's own files, so `cargo xtask test`
//! (the host suite) fails on a broken link.
use std::{
    collections::HashMap,
    fs,
    path::{Component, Path, PathBuf},
};

/// The README's limits: at most this many lines…
pub const README_MAX_LINES: usize = 250;
/// …the command that starts the live view within this many…
pub const RUN_COMMAND_BY_LINE: usize = 60;
/// …and a sample of its table (the header line) within this many.
pub const SAMPLE_TABLE_BY_LINE: usize = 120;

/// A link as written: the line it is on (from 1) and its target, `path#anchor`.
#[derive(Debug, PartialEq)]
pub struct Link {
    pub line: usize,
    pub target: String,
}

/// The lines of `markdown` outside fenced code blocks (``` or ~~~), with their numbers.
fn prose_lines(markdown: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut fence: Option<&str> = None;
    markdown.lines().enumerate().filter_map(move |(i, line)| {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => {
                fence = Some(m);
                None
            }
            (Some(open), Some(m)) if open == m => {
                fence = None;
                None
            }
            (Some(_), _) => None,
            (None, None) => Some((i + 1, line)),
        }
    })
}

/// `line` with its inline code spans (`` `…` ``) removed: brackets in code are not links.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let after = &rest[start + ticks..];
        match after.find(&"`".repeat(ticks)) {
            Some(end) => rest = &after[end + ticks..],
            None => {
                out.push_str(&rest[start..]);
                return out;
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every link target in `markdown`: inline links and images (`[text](target "title")`) and
/// reference definitions (`[name]: target`), outside code.
pub fn links(markdown: &str) -> Vec<Link> {
    let mut found = Vec::new();
    for (line_no, line) in prose_lines(markdown) {
        let line = without_code_spans(line);
        let trimmed = line.trim_start();
        if trimmed.starts_with('[') {
            if let Some(close) = trimmed.find("]:") {
                let target = trimmed[close + 2..].split_whitespace().next();
                if let Some(target) = target {
                    found.push(Link {
                        line: line_no,
                        target: target.trim_matches(['<', '>']).to_string(),
                    });
                }
                continue;
            }
        }
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            found.push(Link {
                line: line_no,
                target: target.trim_matches(['<', '>']).to_string(),
            });
            rest = &after[end..];
        }
    }
    found
}

/// The anchor GitHub gives a heading: its text as rendered (code and links reduced to their
/// text, emphasis marks dropped), lower case, every character but letters, digits, `-`, `_`
/// and spaces removed, each space a `-`.
pub fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    // A link's text stays, its target goes.
    while let Some(at) = rest.find("](") {
        text.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        rest = after.find(')').map_or("", |end| &after[end + 1..]);
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            '-' | '_' => Some(c),
            c if c.is_alphanumeric() => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `markdown`'s ATX headings (`#` … `######`), in order; a repeated heading's
/// anchor takes `-1`, `-2`, … as on GitHub.
pub fn anchors(markdown: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    for (_, line) in prose_lines(markdown) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(line[hashes..].trim().trim_end_matches('#'));
        let n = seen.entry(base.clone()).or_insert(0);
        out.push(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// `path` relative to `dir` without `.` and `..`, or None if it climbs out of `root`.
fn resolve(root: &Path, dir: &Path, path: &str) -> Option<PathBuf> {
    let mut parts: Vec<Component> = dir.strip_prefix(root).ok()?.components().collect();
    for c in Path::new(path).components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::Normal(_) => parts.push(c),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(root.join(parts.iter().collect::<PathBuf>()))
}

/// What is wrong with the links of `file` (a Markdown file under `root`), one line each:
/// `FILE:LINE: TARGET: WHY`. Links with a scheme (`https:`, `mailto:`) are not followed.
pub fn broken_links(root: &Path, file: &Path) -> Vec<String> {
    let name = file
        .strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string();
    let text = match fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => return vec![format!("{name}: cannot read: {e}")],
    };
    let mut problems = Vec::new();
    for link in links(&text) {
        let target = link.target.as_str();
        let at = format!("{name}:{}: {target}", link.line);
        if target.is_empty() {
            problems.push(format!("{at}: an empty link"));
            continue;
        }
        if target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '+')
        }) {
            continue;
        }
        let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
        let dest = if path.is_empty() {
            file.to_path_buf()
        } else {
            let dir = file.parent().unwrap_or(root);
            match resolve(root, dir, path) {
                Some(dest) => dest,
                None => {
                    problems.push(format!("{at}: leads out of the repository"));
                    continue;
                }
            }
        };
        if !dest.exists() {
            problems.push(format!("{at}: no such file"));
            continue;
        }
        let is_markdown = dest.extension().is_some_and(|e| e == "md");
        if anchor.is_empty() || !is_markdown {
            continue;
        }
        let headings = anchors(&fs::read_to_string(&dest).unwrap_or_default());
        if !headings.iter().any(|h| h == anchor) {
            problems.push(format!("{at}: no heading with the anchor #{anchor}"));
        }
    }
    problems
}

/// The files whose links are checked: README.md and docs/*.md.
pub fn documents(root: &Path) -> Vec<PathBuf> {
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .map(|dir| {
            dir.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "md"))
                .collect()
        })
        .unwrap_or_default();
    docs.sort();
    files.extend(docs);
    files
}

/// What the README misses of its limits, one line each.
pub fn readme_limits(readme: &str) -> Vec<String> {
    let lines: Vec<&str> = readme.lines().collect();
    let mut problems = Vec::new();
    if lines.len() > README_MAX_LINES {
        problems.push(format!(
            "README.md has {} lines; at most {README_MAX_LINES}: move detail to docs/",
            lines.len()
        ));
    }
    let runs = |l: &&str| l.contains("./mt run -d") || l.contains("mergetrace -d");
    if !lines.iter().take(RUN_COMMAND_BY_LINE).any(runs) {
        problems.push(format!(
            "README.md: no `./mt run -d` or `mergetrace -d` in its first {RUN_COMMAND_BY_LINE} lines"
        ));
    }
    if !lines
        .iter()
        .take(SAMPLE_TABLE_BY_LINE)
        .any(|l| is_table_header(l))
    {
        problems.push(format!(
            "README.md: no sample of the live table (its DEVICE … BIOS … REQS header) in its \
             first {SAMPLE_TABLE_BY_LINE} lines"
        ));
    }
    problems
}

/// The live table's header line: DEVICE first, then CGROUP, BIOS and REQS among its columns.
fn is_table_header(line: &str) -> bool {
    let words: Vec<&str> = line.split_whitespace().collect();
    words.first() == Some(&"DEVICE") && ["CGROUP", "BIOS", "REQS"].iter().all(|w| words.contains(w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workspace_root;

    #[test]
    fn every_link_in_the_readme_and_docs_leads_somewhere() {
        let root = workspace_root();
        let files = documents(&root);
        assert!(files.len() > 5, "found only {files:?}");
        let problems: Vec<String> = files.iter().flat_map(|f| broken_links(&root, f)).collect();
        assert!(
            problems.is_empty(),
            "broken links:\n{}",
            problems.join("\n")
        );
    }

    #[test]
    fn the_readme_keeps_its_limits() {
        let readme = fs::read_to_string(workspace_root().join("README.md")).unwrap();
        let problems = readme_limits(&readme);
        assert!(problems.is_empty(), "{}", problems.join("\n"));
    }

    /// A scratch tree under the target directory: README.md and docs/, written by the test.
    fn scratch(name: &str, readme: &str, doc: &str) -> PathBuf {
        let root = workspace_root().join("target/doclinks-test").join(name);
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("docs")).unwrap();
        fs::write(root.join("README.md"), readme).unwrap();
        fs::write(root.join("docs/usage.md"), doc).unwrap();
        root
    }

    #[test]
    fn a_missing_file_a_wrong_anchor_and_a_way_out_are_each_reported() {
        let doc = "# Usage\n\n## The `--json` flag: NDJSON\n\n## Usage\n\nBack to [the top](../README.md#top).\n";
        let readme = "# Top\n\nSee [usage](docs/usage.md#the---json-flag-ndjson), \
                      [again](docs/usage.md#usage-1), [gone](docs/gone.md), \
                      [wrong](docs/usage.md#nosuch), [out](../x.md), [here](#top), \
                      [web](https://example.com/a(b)).\n\n```\n[not](a/link.md)\n```\n\
                      `[nor](this.md)`\n\n[ref]: docs/missing.md\n";
        let root = scratch("broken", readme, doc);
        let problems = broken_links(&root, &root.join("README.md"));
        assert_eq!(
            problems,
            [
                "README.md:3: docs/gone.md: no such file",
                "README.md:3: docs/usage.md#nosuch: no heading with the anchor #nosuch",
                "README.md:3: ../x.md: leads out of the repository",
                "README.md:10: docs/missing.md: no such file",
            ]
        );
        assert!(broken_links(&root, &root.join("docs/usage.md")).is_empty());
    }

    #[test]
    fn slugs_are_githubs() {
        assert_eq!(slug("Fleet view: Prometheus"), "fleet-view-prometheus");
        assert_eq!(slug("`--html`: one page"), "--html-one-page");
        assert_eq!(slug("Events (`E`)"), "events-e");
        assert_eq!(slug("What is left, and why"), "what-is-left-and-why");
        assert_eq!(slug("kernel_check → check"), "kernel_check--check");
        assert_eq!(slug("See [json](json.md) here"), "see-json-here");
        assert_eq!(
            anchors("# A\n## A\n```\n# not\n```\n#nope\n## A\n"),
            ["a", "a-1", "a-2"]
        );
    }

    #[test]
    fn the_limits_name_what_is_missing() {
        let long = "line\n".repeat(README_MAX_LINES + 1);
        let problems = readme_limits(&long);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains(&format!("{} lines", README_MAX_LINES + 1)));
        let mut ok = String::from("# x\n```sh\n./mt run -d vda\n```\n");
        ok.push_str(&"line\n".repeat(SAMPLE_TABLE_BY_LINE - 10));
        ok.push_str("DEVICE  CGROUP  NAME  DIR  BIOS  MiB  REQS\n");
        assert!(readme_limits(&ok).is_empty());
        ok.insert_str(0, &"line\n".repeat(20));
        assert_eq!(
            readme_limits(&ok).len(),
            1,
            "the header is now past line 120"
        );
    }
}
