//! What the user chose in the terminal UI — the last interval or the whole run, the sort
//! column and order, the cgroup filter, the selected row — how keys change it, and which
//! rows it leaves on screen in what order. No terminal here, so all of it is unit-tested.
use std::cmp::Ordering;

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use crate::{
    model::aggregate::Dir,
    model::snapshot::Snapshot,
    view::table::{self, Row},
};

/// Which numbers the table shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Span {
    #[default]
    Interval,
    Run,
}

/// A row's identity from one snapshot to the next (indices into a snapshot are not: a cgroup
/// idle in an interval has no row in it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowKey {
    device: String,
    /// `None`: the disk's total.
    cgroup_id: Option<u64>,
    dir: Option<Dir>,
}

impl RowKey {
    pub fn of(s: &Snapshot, r: &Row) -> RowKey {
        let d = &s.devices[r.at.device];
        RowKey {
            device: d.device.clone(),
            cgroup_id: r.at.cgroup.map(|c| d.cgroups[c].cgroup_id),
            dir: r.at.dir,
        }
    }
}

/// What a key did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Quit,
    /// The state changed: draw again.
    Redraw,
    Ignored,
}

#[derive(Debug, Default)]
pub struct UiState {
    pub span: Span,
    /// The column sorted by (an index into [`table::HEADER`]); `None`: the snapshot's order
    /// (by device, then cgroup path).
    pub sort: Option<usize>,
    /// Reversed: numbers smallest first, text Z to A.
    pub reverse: bool,
    /// Rows whose cgroup path or name contains this (any case) are shown; empty: all.
    pub filter: String,
    /// Keys go to the filter while it is typed.
    pub editing: bool,
    /// The selected row (the detail pane shows it), and where it was, for when it goes away.
    pub selected: Option<(RowKey, usize)>,
}

/// The rows on screen, as the last draw left them: what keys move over.
#[derive(Debug, Default)]
pub struct Shown {
    pub rows: Vec<RowKey>,
    /// The table's columns that fit, in order: what `s` cycles through.
    pub columns: Vec<usize>,
}

impl UiState {
    pub fn key(&mut self, k: KeyEvent, shown: &Shown) -> Outcome {
        let ctrl = k.modifiers.contains(KeyModifiers::CONTROL);
        if ctrl && k.code == KeyCode::Char('c') {
            return Outcome::Quit;
        }
        if self.editing {
            return self.filter_key(k.code, ctrl);
        }
        match k.code {
            KeyCode::Char('q') => return Outcome::Quit,
            // Esc first takes back a filter, then quits.
            KeyCode::Esc if self.filter.is_empty() => return Outcome::Quit,
            KeyCode::Esc => self.filter.clear(),
            KeyCode::Char('t') | KeyCode::Tab => {
                self.span = match self.span {
                    Span::Interval => Span::Run,
                    Span::Run => Span::Interval,
                }
            }
            KeyCode::Char('s') => self.next_sort(&shown.columns),
            KeyCode::Char('r') => self.reverse = !self.reverse,
            KeyCode::Char('/') => self.editing = true,
            KeyCode::Up => self.move_by(-1, shown),
            KeyCode::Down => self.move_by(1, shown),
            KeyCode::PageUp => self.move_by(-10, shown),
            KeyCode::PageDown => self.move_by(10, shown),
            KeyCode::Home => self.move_by(isize::MIN / 2, shown),
            KeyCode::End => self.move_by(isize::MAX / 2, shown),
            _ => return Outcome::Ignored,
        }
        Outcome::Redraw
    }

    fn filter_key(&mut self, code: KeyCode, ctrl: bool) -> Outcome {
        match code {
            KeyCode::Esc => {
                self.filter.clear();
                self.editing = false;
            }
            KeyCode::Enter => self.editing = false,
            KeyCode::Backspace => {
                self.filter.pop();
            }
            KeyCode::Char(c) if !ctrl => self.filter.push(c),
            _ => return Outcome::Ignored,
        }
        Outcome::Redraw
    }

    /// The next column of the table to sort by, after the last the snapshot's own order.
    fn next_sort(&mut self, columns: &[usize]) {
        let at = self.sort.and_then(|c| columns.iter().position(|&x| x == c));
        self.sort = match at {
            None if self.sort.is_none() => columns.first().copied(),
            None => None,
            Some(i) => columns.get(i + 1).copied(),
        };
    }

    /// Moves the selection by `by` rows, within the rows shown (the first key selects the
    /// first row).
    fn move_by(&mut self, by: isize, shown: &Shown) {
        if shown.rows.is_empty() {
            return;
        }
        let last = shown.rows.len() as isize - 1;
        let at = match &self.selected {
            Some((key, i)) => shown
                .rows
                .iter()
                .position(|k| k == key)
                .map_or((*i as isize).min(last), |p| p as isize + by),
            None => 0,
        };
        let at = at.clamp(0, last) as usize;
        self.selected = Some((shown.rows[at].clone(), at));
    }

    /// Whether a cgroup path and name pass the filter.
    pub fn passes(&self, path: &str, name: Option<&str>) -> bool {
        let f = self.filter.to_lowercase();
        f.is_empty()
            || path.to_lowercase().contains(&f)
            || name.is_some_and(|n| n.to_lowercase().contains(&f))
    }

    /// The rows to show from `rows` of `s`: the filter's cgroups, sorted within each disk,
    /// each disk's totals after its cgroups (they are the disk's, whatever the filter).
    pub fn arrange(&self, s: &Snapshot, rows: Vec<Row>) -> Vec<Row> {
        let mut rows: Vec<Row> = rows
            .into_iter()
            .filter(|r| match r.at.cgroup {
                None => true,
                Some(c) => {
                    let cg = &s.devices[r.at.device].cgroups[c];
                    self.passes(&cg.cgroup, cg.name.as_ref().map(|n| n.short.as_str()))
                }
            })
            .collect();
        // Stable: ties keep the snapshot's order.
        rows.sort_by(|a, b| {
            a.at.device
                .cmp(&b.at.device)
                .then(a.is_total.cmp(&b.is_total))
                .then_with(|| match (a.is_total, self.sort) {
                    (false, Some(col)) => self.compare(s, col, a, b),
                    _ => Ordering::Equal,
                })
        });
        rows
    }

    /// Numbers largest first, text A to Z (or the other way round, reversed); a ratio without
    /// requests last.
    fn compare(&self, s: &Snapshot, col: usize, a: &Row, b: &Row) -> Ordering {
        let value = |r: &Row| r.at.stats(s).and_then(|st| table::sort_value(col, st));
        let order = if table::right_aligned(col) {
            match (value(a), value(b)) {
                (Some(x), Some(y)) => y.total_cmp(&x),
                (x, y) => y.is_none().cmp(&x.is_none()).reverse(),
            }
        } else {
            text(s, col, a).cmp(&text(s, col, b))
        };
        if self.reverse {
            order.reverse()
        } else {
            order
        }
    }
}

/// A text column's value: the whole cgroup path (the cell may be shortened), else the cell.
fn text(s: &Snapshot, col: usize, r: &Row) -> String {
    match (col, r.at.cgroup) {
        (table::col::CGROUP, Some(c)) => s.devices[r.at.device].cgroups[c].cgroup.clone(),
        _ => r.cells.get(col).cloned().unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::prometheus::tests::{snapshot, write_stats};
    use crossterm::event::KeyEvent;

    fn press(st: &mut UiState, code: KeyCode, shown: &Shown) -> Outcome {
        st.key(KeyEvent::new(code, KeyModifiers::NONE), shown)
    }

    fn sample() -> Snapshot {
        snapshot(&[
            ("/mt-app-a", write_stats(2048, 64)),
            ("/mt-app-b", write_stats(512, 512)),
            ("/other", write_stats(100, 100)),
        ])
    }

    fn paths(rows: &[Row]) -> Vec<String> {
        rows.iter()
            .map(|r| r.cells[table::col::CGROUP].clone())
            .collect()
    }

    #[test]
    fn sort_cycles_through_the_columns_shown_and_reverses() {
        let s = sample();
        let shown = Shown {
            rows: vec![],
            columns: vec![table::col::CGROUP, table::col::BIOS, table::col::REQS],
        };
        let mut st = UiState::default();
        assert_eq!(
            paths(&st.arrange(&s, table::rows(&s))),
            ["/mt-app-a", "/mt-app-b", "/other", "(total)"]
        );
        press(&mut st, KeyCode::Char('s'), &shown);
        assert_eq!(st.sort, Some(table::col::CGROUP));
        press(&mut st, KeyCode::Char('s'), &shown);
        assert_eq!(st.sort, Some(table::col::BIOS));
        assert_eq!(
            paths(&st.arrange(&s, table::rows(&s))),
            ["/mt-app-a", "/mt-app-b", "/other", "(total)"]
        );
        press(&mut st, KeyCode::Char('s'), &shown);
        assert_eq!(st.sort, Some(table::col::REQS));
        assert_eq!(
            paths(&st.arrange(&s, table::rows(&s))),
            ["/mt-app-b", "/other", "/mt-app-a", "(total)"]
        );
        press(&mut st, KeyCode::Char('r'), &shown);
        assert_eq!(
            paths(&st.arrange(&s, table::rows(&s))),
            ["/mt-app-a", "/other", "/mt-app-b", "(total)"]
        );
        press(&mut st, KeyCode::Char('s'), &shown);
        assert_eq!(st.sort, None, "after the last column: the snapshot's order");
    }

    #[test]
    fn filter_is_typed_kept_and_cleared_and_esc_quits_only_without_one() {
        let s = sample();
        let shown = Shown::default();
        let mut st = UiState::default();
        press(&mut st, KeyCode::Char('/'), &shown);
        for c in "APP-b".chars() {
            press(&mut st, KeyCode::Char(c), &shown);
        }
        // q is typed into the filter, not a quit
        assert_eq!(press(&mut st, KeyCode::Char('q'), &shown), Outcome::Redraw);
        press(&mut st, KeyCode::Backspace, &shown);
        press(&mut st, KeyCode::Enter, &shown);
        assert_eq!(
            paths(&st.arrange(&s, table::rows(&s))),
            ["/mt-app-b", "(total)"]
        );
        assert_eq!(press(&mut st, KeyCode::Esc, &shown), Outcome::Redraw);
        assert_eq!(st.arrange(&s, table::rows(&s)).len(), 4);
        assert_eq!(press(&mut st, KeyCode::Esc, &shown), Outcome::Quit);
        assert_eq!(press(&mut st, KeyCode::Char('q'), &shown), Outcome::Quit);
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        st.editing = true;
        assert_eq!(st.key(ctrl_c, &shown), Outcome::Quit);
    }

    #[test]
    fn selection_follows_its_row_and_stays_in_bounds() {
        let s = sample();
        let mut st = UiState::default();
        let rows = st.arrange(&s, table::rows(&s));
        let shown = Shown {
            rows: rows.iter().map(|r| RowKey::of(&s, r)).collect(),
            columns: vec![],
        };
        press(&mut st, KeyCode::Down, &shown);
        assert_eq!(st.selected.as_ref().unwrap().1, 0);
        press(&mut st, KeyCode::Down, &shown);
        press(&mut st, KeyCode::End, &shown);
        assert_eq!(st.selected.as_ref().unwrap().1, 3);
        press(&mut st, KeyCode::Down, &shown);
        assert_eq!(st.selected.as_ref().unwrap().1, 3);
        press(&mut st, KeyCode::Home, &shown);
        press(&mut st, KeyCode::Down, &shown);
        let key = st.selected.clone().unwrap().0;
        assert_eq!(key, shown.rows[1]);
        // the same row is found again after sorting moves it
        st.sort = Some(table::col::REQS);
        let moved: Vec<RowKey> = st
            .arrange(&s, table::rows(&s))
            .iter()
            .map(|r| RowKey::of(&s, r))
            .collect();
        assert_eq!(moved.iter().position(|k| *k == key), Some(0));
        assert_eq!(press(&mut st, KeyCode::Char('x'), &shown), Outcome::Ignored);
        press(&mut st, KeyCode::Char('t'), &shown);
        assert_eq!(st.span, Span::Run);
    }
}
