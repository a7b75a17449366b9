//! The live terminal UI (ratatui), refreshed in place: the last interval or the whole run so
//! far (`t`), sorted by a column (`s`, `r`), filtered by cgroup (`/`), a row selected (↑↓)
//! with its counts, binding meter and verdict below the table. `q`, Esc (without a filter)
//! or Ctrl-C stop the run; on exit the whole-run table is printed to the normal screen.
mod detail;
mod draw;
mod state;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex, MutexGuard,
    },
    time::Duration,
};

use anyhow::Result;
use crossterm::{
    event::{self, Event, KeyEventKind},
    execute,
    terminal::{disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen},
};
use ratatui::{prelude::CrosstermBackend, Terminal};

use super::{table, View};
use crate::model::snapshot::Snapshot;
use draw::{Term, SPACING};
use state::{Outcome, Shown, Span, UiState};

pub struct TuiView {
    screen: Arc<Mutex<Screen>>,
}

/// What both the run (new numbers) and the key thread (new choices) draw from.
struct Screen {
    terminal: Term,
    /// Lines shown above the table: what is traced, the tier, notes.
    banner: Vec<String>,
    state: UiState,
    interval: Option<Snapshot>,
    run: Option<Snapshot>,
    /// What the last frame showed: what keys move over.
    shown: Shown,
    /// The normal screen is back: nothing more is drawn.
    done: bool,
}

impl Screen {
    fn redraw(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        let s = match self.state.span {
            Span::Run => self.run.as_ref().or(self.interval.as_ref()),
            Span::Interval => self.interval.as_ref(),
        };
        if let Some(s) = s {
            self.shown = draw::draw(&mut self.terminal, &self.banner, &mut self.state, s)?;
        }
        Ok(())
    }
}

/// Set while the alternate screen is up: leaving it twice would move the cursor back over
/// what was printed after the first leave (the whole-run table), and the shell would write
/// over it.
static ON_ALTERNATE_SCREEN: AtomicBool = AtomicBool::new(false);

/// Back to the normal screen, once (from the end of the run, a drop or a panic).
fn restore_terminal() {
    if ON_ALTERNATE_SCREEN.swap(false, Ordering::SeqCst) {
        let _ = disable_raw_mode();
        let _ = execute!(std::io::stdout(), LeaveAlternateScreen);
    }
}

/// The screen, even if a panicking draw left the lock poisoned.
fn lock(screen: &Mutex<Screen>) -> MutexGuard<'_, Screen> {
    screen.lock().unwrap_or_else(|e| e.into_inner())
}

impl TuiView {
    /// Takes over the terminal. `stop` is called (from the key-reading thread) on q, Esc or
    /// Ctrl-C.
    pub fn new(banner: Vec<String>, stop: impl Fn() + Send + 'static) -> Result<TuiView> {
        enable_raw_mode()?;
        execute!(std::io::stdout(), EnterAlternateScreen)?;
        ON_ALTERNATE_SCREEN.store(true, Ordering::SeqCst);
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore_terminal();
            previous(info);
        }));
        let screen = Arc::new(Mutex::new(Screen {
            terminal: Terminal::new(CrosstermBackend::new(std::io::stdout()))?,
            banner,
            state: UiState::default(),
            interval: None,
            run: None,
            shown: Shown::default(),
            done: false,
        }));
        let keys = screen.clone();
        std::thread::spawn(move || read_keys(&keys, stop));
        Ok(TuiView { screen })
    }
}

/// Reads keys until a quit key or the end of the run; each key that changes what is shown
/// draws again at once (not at the next interval).
fn read_keys(screen: &Mutex<Screen>, stop: impl Fn()) {
    loop {
        if lock(screen).done {
            return;
        }
        if !event::poll(Duration::from_millis(200)).unwrap_or(false) {
            continue;
        }
        let mut sc = lock(screen);
        let outcome = match event::read() {
            Ok(Event::Key(k)) if k.kind != KeyEventKind::Release => {
                let Screen { state, shown, .. } = &mut *sc;
                state.key(k, shown)
            }
            Ok(Event::Resize(..)) => Outcome::Redraw,
            _ => Outcome::Ignored,
        };
        match outcome {
            Outcome::Quit => {
                drop(sc);
                stop();
                return;
            }
            Outcome::Redraw => {
                let _ = sc.redraw();
            }
            Outcome::Ignored => {}
        }
    }
}

impl View for TuiView {
    fn wants_run_so_far(&self) -> bool {
        true
    }

    fn run_so_far(&mut self, s: &Snapshot) -> Result<()> {
        lock(&self.screen).run = Some(s.clone());
        Ok(())
    }

    fn changed(&mut self, lines: &[String]) -> Result<()> {
        // A change to the disks' settings stays in the banner for the rest of the run.
        let mut sc = lock(&self.screen);
        sc.banner
            .extend(lines.iter().map(|c| format!("changed: {c}")));
        Ok(())
    }

    fn interval(&mut self, s: &Snapshot) -> Result<()> {
        let mut sc = lock(&self.screen);
        sc.interval = Some(s.clone());
        sc.redraw()
    }

    fn total(&mut self, s: &Snapshot) -> Result<()> {
        lock(&self.screen).done = true;
        restore_terminal();
        let secs = s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9;
        println!(
            "mergetrace: whole run, {secs:.1}s, {} tier, lost events: {}",
            s.tier, s.lost_events
        );
        // The normal screen at the terminal's width: the same columns rule as the live table.
        let width = crossterm::terminal::size().map_or(usize::MAX, |(w, _)| w as usize);
        let fitted = table::fit(&table::rows(s), width, SPACING as usize);
        print!("{}", table::render_fitted(&fitted));
        if let Some(h) = table::hidden(&fitted) {
            println!("(hidden at this width: {h}; --json has all)");
        }
        for r in table::remarks(s) {
            println!("{r}");
        }
        Ok(())
    }
}

impl Drop for TuiView {
    fn drop(&mut self) {
        lock(&self.screen).done = true;
        restore_terminal();
    }
}
