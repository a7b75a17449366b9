//! The live terminal UI (ratatui): the latest interval's table, refreshed in place. `q`, Esc
//! or Ctrl-C stop the run; on exit the whole-run table is printed to the normal screen.
use std::{io::Stdout, time::Duration};

use anyhow::Result;
use crossterm::{
    event::{self, Event, KeyCode, KeyModifiers},
    execute,
    terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen},
};
use ratatui::{
    layout::{Constraint, Layout},
    prelude::CrosstermBackend,
    style::{Modifier, Style},
    text::Line,
    widgets::{Block, Borders, Cell, Paragraph, Row, Table, Wrap},
    Terminal,
};

use super::{table, View};
use crate::model::snapshot::Snapshot;

pub struct TuiView {
    terminal: Terminal<CrosstermBackend<Stdout>>,
    /// Lines shown above the table: what is traced, the tier, notes.
    banner: Vec<String>,
}

fn restore_terminal() {
    let _ = disable_raw_mode();
    let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
}

impl TuiView {
    /// Takes over the terminal. `stop` is called (from a key-reading thread) on q/Esc/Ctrl-C.
    pub fn new(banner: Vec<String>, stop: impl Fn() + Send + 'static) -> Result<TuiView> {
        enable_raw_mode()?;
        execute!(std::io::stdout(), EnterAlternateScreen)?;
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        std::thread::spawn(move || loop {
            if let Ok(true) = event::poll(Duration::from_millis(200)) {
                if let Ok(Event::Key(k)) = event::read() {
                    let ctrl_c =
                        k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                    if ctrl_c || k.code == KeyCode::Char('q') || k.code == KeyCode::Esc {
                        stop();
                        return;
                    }
                }
            }
        });
        let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
        Ok(TuiView { terminal, banner })
    }

    fn draw(&mut self, s: &Snapshot) -> Result<()> {
        let rows = table::rows(s);
        let secs = s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
        let mut head: Vec<Line> = self.banner.iter().map(|l| Line::from(l.clone())).collect();
        head.push(Line::from(format!(
            "last {secs:.1}s · lost events: {}{} · q to quit",
            s.lost_events,
            if s.lost_events > 0 {
                " (counts are low!)"
            } else {
                ""
            }
        )));
        for r in table::remarks(s) {
            head.push(Line::from(r));
        }
        // Long lines (the configuration line, verdicts) wrap: size the box for that.
        let text_width = self
            .terminal
            .size()
            .map(|r| r.width.saturating_sub(2))
            .unwrap_or(80)
            .max(20) as usize;
        let head_height = head
            .iter()
            .map(|l| l.width().div_ceil(text_width).max(1) as u16)
            .sum::<u16>()
            + 2;
        let widths: Vec<Constraint> = table::HEADER
            .iter()
            .enumerate()
            .map(|(i, _)| {
                let w = rows
                    .iter()
                    .filter_map(|r| r.cells.get(i))
                    .map(|c| c.chars().count())
                    .chain(std::iter::once(table::HEADER[i].len()))
                    .max()
                    .unwrap_or(4);
                Constraint::Length(w as u16)
            })
            .collect();
        self.terminal.draw(|f| {
            let [top, body] =
                Layout::vertical([Constraint::Length(head_height), Constraint::Min(3)])
                    .areas(f.area());
            f.render_widget(
                Paragraph::new(head)
                    .wrap(Wrap { trim: false })
                    .block(Block::default().borders(Borders::ALL).title(" mergetrace ")),
                top,
            );
            let header = Row::new(table::HEADER.iter().map(|h| Cell::from(*h)))
                .style(Style::default().add_modifier(Modifier::BOLD | Modifier::REVERSED));
            let body_rows = rows.iter().map(|r| {
                let cells = r.cells.iter().enumerate().map(|(i, c)| {
                    if table::right_aligned(i) {
                        Cell::from(Line::from(c.clone()).right_aligned())
                    } else {
                        Cell::from(c.clone())
                    }
                });
                let row = Row::new(cells);
                if r.is_total {
                    row.style(Style::default().add_modifier(Modifier::BOLD))
                } else {
                    row
                }
            });
            f.render_widget(
                Table::new(body_rows, widths.clone())
                    .header(header)
                    .column_spacing(2)
                    .block(
                        Block::default()
                            .borders(Borders::ALL)
                            .title(" per cgroup, this interval "),
                    ),
                body,
            );
        })?;
        Ok(())
    }
}

impl View for TuiView {
    fn interval(&mut self, s: &Snapshot) -> Result<()> {
        self.draw(s)
    }

    fn total(&mut self, s: &Snapshot) -> Result<()> {
        restore_terminal();
        let secs = s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
        println!(
            "mergetrace: whole run, {secs:.1}s, {} tier, lost events: {}",
            s.tier, s.lost_events
        );
        print!("{}", table::render_text(&table::rows(s)));
        for r in table::remarks(s) {
            println!("{r}");
        }
        Ok(())
    }
}

impl Drop for TuiView {
    fn drop(&mut self) {
        restore_terminal();
    }
}
