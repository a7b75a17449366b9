//! One frame of the terminal UI: what is traced, the table (the span, filter and sort the
//! user chose; columns that do not fit left out whole), the selected row's detail, and the
//! keys.
use std::io::Stdout;

use anyhow::Result;
use ratatui::{
    layout::{Constraint, Layout, Rect},
    prelude::CrosstermBackend,
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState, Wrap},
    Frame, Terminal,
};

use super::{
    detail::detail,
    state::{RowKey, Shown, Span, UiState},
};
use crate::{model::snapshot::Snapshot, view::table};

/// Blanks between table columns.
pub const SPACING: u16 = 2;

pub type Term = Terminal<CrosstermBackend<Stdout>>;

const KEYS: &str = "t interval/run  s sort  r reverse  / filter  ↑↓ select  Esc clear  q quit";

/// Draws `s` as `state` says and returns the rows and columns it showed (for the next keys).
pub fn draw(
    term: &mut Term,
    banner: &[String],
    state: &mut UiState,
    s: &Snapshot,
) -> Result<Shown> {
    let rows = state.arrange(s, table::rows(s));
    let keys: Vec<RowKey> = rows.iter().map(|r| RowKey::of(s, r)).collect();
    let selected = resolve_selection(state, &keys);
    let width = term.size().map(|r| r.width).unwrap_or(80);
    // Columns that do not fit are left out whole (never cut), least needed first.
    let fitted = table::fit(
        &rows,
        width.saturating_sub(2).max(20) as usize,
        SPACING as usize,
    );
    let head = head(banner, state, s);
    let pane = selected.map(|i| detail(s, rows[i].at));
    term.draw(|f| {
        let area = f.area();
        // What is traced takes at most a third of the screen (the banner is on stderr too,
        // left on the normal screen).
        let head_h = wrapped_height(&head, area.width).min((area.height / 3).max(4));
        let pane_lines: Vec<Line> = match &pane {
            Some((_, lines)) => lines.iter().map(|l| Line::from(l.clone())).collect(),
            None => vec![Line::from(
                "↑↓ selects a row: its counts, the meter that binds it, its verdict",
            )],
        };
        // The detail takes at most a third of the screen; the table keeps the rest.
        let pane_h = wrapped_height(&pane_lines, area.width).min((area.height / 3).max(3));
        let [top, body, bottom, foot] = Layout::vertical([
            Constraint::Length(head_h),
            Constraint::Min(3),
            Constraint::Length(pane_h),
            Constraint::Length(2),
        ])
        .areas(area);
        f.render_widget(boxed(head, " mergetrace ".into()), top);
        render_table(f, body, &fitted, &rows, state, selected);
        let title = pane.as_ref().map_or(" detail ".to_string(), |(t, _)| {
            format!(
                " {} ",
                table::shorten_middle(t, area.width.saturating_sub(4) as usize)
            )
        });
        f.render_widget(boxed(pane_lines, title), bottom);
        f.render_widget(Paragraph::new(footer(state)), foot);
    })?;
    Ok(Shown {
        rows: keys,
        columns: fitted.columns,
    })
}

/// The index of the selected row among `keys`: where its row is now, else the nearest place
/// (its row left this span or the filter), which then becomes the selection.
fn resolve_selection(state: &mut UiState, keys: &[RowKey]) -> Option<usize> {
    let (key, at) = state.selected.as_ref()?;
    let i = match keys.iter().position(|k| k == key) {
        Some(i) => i,
        None if keys.is_empty() => {
            state.selected = None;
            return None;
        }
        None => (*at).min(keys.len() - 1),
    };
    state.selected = Some((keys[i].clone(), i));
    Some(i)
}

/// The span shown and lost events, what is traced, notes.
fn head<'a>(banner: &[String], state: &UiState, s: &Snapshot) -> Vec<Line<'a>> {
    let secs = s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
    let span = match state.span {
        Span::Interval => format!("last interval {secs:.1}s"),
        Span::Run => format!("whole run {secs:.1}s"),
    };
    let low = if s.lost_events > 0 {
        " (counts are low!)"
    } else {
        ""
    };
    // The span first: on a short terminal the box is cut at the bottom.
    let mut head = vec![Line::from(format!(
        "{span} · lost events: {}{low}",
        s.lost_events
    ))];
    head.extend(banner.iter().map(|l| Line::from(l.clone())));
    head.extend(table::notes(s).into_iter().map(Line::from));
    head
}

/// A bordered, wrapping paragraph.
fn boxed<'a>(lines: Vec<Line<'a>>, title: String) -> Paragraph<'a> {
    Paragraph::new(lines)
        .wrap(Wrap { trim: false })
        .block(Block::default().borders(Borders::ALL).title(title))
}

/// Rows `lines` take in a box `width` wide, borders included.
fn wrapped_height(lines: &[Line], width: u16) -> u16 {
    let p = Paragraph::new(lines.to_vec()).wrap(Wrap { trim: false });
    (p.line_count(width.saturating_sub(2).max(1)) as u16).saturating_add(2)
}

fn render_table(
    f: &mut Frame,
    area: Rect,
    fitted: &table::Fitted,
    rows: &[table::Row],
    state: &UiState,
    selected: Option<usize>,
) {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let header = Row::new(fitted.columns.iter().map(|&i| {
        let cell = Cell::from(table::HEADER[i]);
        // the sort column, underlined
        if state.sort == Some(i) {
            cell.style(Style::default().add_modifier(Modifier::UNDERLINED))
        } else {
            cell
        }
    }))
    .style(bold.add_modifier(Modifier::REVERSED));
    let body = rows.iter().zip(&fitted.rows).map(|(r, cells)| {
        let cells = fitted.columns.iter().zip(cells).map(|(&i, c)| {
            if table::right_aligned(i) {
                Cell::from(Line::from(c.clone()).right_aligned())
            } else {
                Cell::from(c.clone())
            }
        });
        let row = Row::new(cells);
        if r.is_total {
            row.style(bold)
        } else {
            row
        }
    });
    let widths: Vec<Constraint> = fitted
        .widths
        .iter()
        .map(|w| Constraint::Length(*w as u16))
        .collect();
    let span = match state.span {
        Span::Interval => "last interval",
        Span::Run => "whole run",
    };
    let title = match table::hidden(fitted) {
        Some(h) => format!(" per cgroup, {span} (too narrow for {h}) "),
        None => format!(" per cgroup, {span} "),
    };
    let mut ts = TableState::default().with_selected(selected);
    f.render_stateful_widget(
        Table::new(body, widths)
            .header(header)
            .column_spacing(SPACING)
            .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED))
            .block(Block::default().borders(Borders::ALL).title(title)),
        area,
        &mut ts,
    );
}

/// The span, sort and filter in force, then the keys.
fn footer<'a>(state: &UiState) -> Vec<Line<'a>> {
    let span = match state.span {
        Span::Interval => "last interval",
        Span::Run => "whole run",
    };
    let sort = match state.sort {
        Some(c) => {
            let arrow = if table::right_aligned(c) != state.reverse {
                "↓"
            } else {
                "↑"
            };
            format!("{} {arrow}", table::HEADER[c])
        }
        None => "device, cgroup".into(),
    };
    let status = if state.editing {
        format!("filter: {}▏ (Enter keeps it, Esc clears it)", state.filter)
    } else if state.filter.is_empty() {
        format!("showing {span} · sort: {sort}")
    } else {
        format!("showing {span} · sort: {sort} · filter: {}", state.filter)
    };
    vec![
        Line::from(status),
        Line::from(KEYS).style(Style::default().add_modifier(Modifier::DIM)),
    ]
}
