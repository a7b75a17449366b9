//! `/proc/kallsyms`: kernel addresses, for the context the tracepoint tier reads from the
//! stack (which function a merge came from, whether blk-throttle's dispatch work runs).
use std::io::BufRead;

use anyhow::{Context, Result};
use mergetrace_common::{path, KernelSymbols, MERGE_CALLERS};

use super::hooks::{HookKind, HOOKS};

/// The kallsyms hooks of [`HOOKS`] as `/proc/kallsyms` gives them: each one's address and
/// where its function ends (the next higher address).
///
/// Only those symbols are kept, and the file is read only until they are all found: the
/// kernel formats its 100,000+ lines on every read, and all of them, kept, took a tenth of a
/// start (more in a small VM).
pub struct Kallsyms {
    /// (name, address, next higher address or 0 until seen), per kallsyms hook.
    symbols: Vec<(&'static str, u64, u64)>,
    /// Whether any address was non-zero (kptr_restrict shows them all as zeros).
    visible: bool,
}

impl Kallsyms {
    pub fn load() -> Result<Kallsyms> {
        let file = std::fs::File::open("/proc/kallsyms").context("cannot open /proc/kallsyms")?;
        Kallsyms::read(std::io::BufReader::with_capacity(1 << 16, file))
            .context("cannot read /proc/kallsyms")
    }

    /// Reads `address type name [module]` lines. The kernel lists its own symbols sorted by
    /// address (modules' come after), so a function ends at the first higher address that
    /// follows it.
    pub fn read(mut src: impl BufRead) -> std::io::Result<Kallsyms> {
        let mut k = Kallsyms {
            symbols: (HOOKS.iter())
                .filter(|h| h.kind == HookKind::Kallsyms)
                .map(|h| (h.name, 0, 0))
                .collect(),
            visible: false,
        };
        let mut line = Vec::with_capacity(256);
        while k.symbols.iter().any(|s| s.2 == 0) {
            line.clear();
            if src.read_until(b'\n', &mut line)? == 0 {
                break;
            }
            let mut it = line.trim_ascii_end().split(|c| c.is_ascii_whitespace());
            let (Some(addr), Some(_ty), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Some(addr) = std::str::from_utf8(addr)
                .ok()
                .and_then(|a| u64::from_str_radix(a, 16).ok())
                .filter(|a| *a != 0)
            else {
                continue;
            };
            k.visible = true;
            for s in &mut k.symbols {
                if s.1 != 0 && s.2 == 0 && addr > s.1 {
                    s.2 = addr;
                }
            }
            // Module symbols carry a "[module]" suffix; the block layer is built in.
            if it.next().is_none() {
                if let Some(s) = k
                    .symbols
                    .iter_mut()
                    .find(|s| s.1 == 0 && s.0.as_bytes() == name)
                {
                    s.1 = addr;
                }
            }
        }
        Ok(k)
    }

    /// `text` as if it were /proc/kallsyms (tests; `check` passes "" where the file cannot be
    /// read).
    pub fn parse(text: &str) -> Kallsyms {
        Kallsyms::read(text.as_bytes()).expect("reading from memory")
    }

    /// The address of a kallsyms hook (`None` for any other name).
    pub fn address(&self, name: &str) -> Option<u64> {
        self.symbols
            .iter()
            .find(|s| s.0 == name && s.1 != 0)
            .map(|s| s.1)
    }

    /// `[start, end)` of a kallsyms hook's function: from its address to the next symbol's.
    pub fn range(&self, name: &str) -> Option<[u64; 2]> {
        let s = self
            .symbols
            .iter()
            .find(|s| s.0 == name && s.1 != 0 && s.2 != 0)?;
        Some([s.1, s.2])
    }

    /// Whether addresses are hidden (kptr_restrict shows them as zeros), or there were none.
    pub fn is_empty(&self) -> bool {
        !self.visible
    }
}

/// Functions whose presence on the stack names a merge path, indexed by `path::* - 1`.
pub const MERGE_CALLER_FUNCTIONS: [(u8, &str); MERGE_CALLERS] = [
    (path::PLUG, "blk_attempt_plug_merge"),
    (path::ELEVATOR, "blk_mq_sched_try_merge"),
    (path::SW_QUEUE, "blk_bio_list_merge"),
];

/// Addresses the tracepoint tier uses for context. Missing symbols leave 0 (the feature that
/// needs them reports "unknown"), and are listed in the returned notes.
pub fn resolve_symbols(kallsyms: &Kallsyms) -> (KernelSymbols, Vec<String>) {
    let mut notes = Vec::new();
    let mut syms = KernelSymbols::default();
    let work = super::hooks::THROTTLE_WORK;
    syms.throtl_dispatch_fn = kallsyms.address(work).unwrap_or_else(|| {
        notes.push(format!("kernel symbol {work} not found in /proc/kallsyms"));
        0
    });
    for (p, name) in MERGE_CALLER_FUNCTIONS {
        match kallsyms.range(name) {
            Some(r) => syms.merge_callers[p as usize - 1] = r,
            None => notes.push(format!(
                "kernel function {name} not found: merges through it show as path \"unknown\""
            )),
        }
    }
    (syms, notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kallsyms_ranges_end_at_the_next_symbol() {
        let k = Kallsyms::parse(
            "ffffffff81b01600 T __pfx_blk_bio_list_merge\n\
             ffffffff81b01610 T blk_bio_list_merge\n\
             ffffffff81b016b0 T __pfx_blk_mq_sched_try_merge\n\
             ffffffff81b016c0 T blk_mq_sched_try_merge\n\
             ffffffff81b01880 T __pfx_blk_attempt_plug_merge\n\
             ffffffff81b01890 T blk_attempt_plug_merge\n\
             ffffffff81b01a00 T next_one\n\
             ffffffffc0000000 t some_mod_fn\t[loop]\n",
        );
        assert_eq!(
            k.range("blk_bio_list_merge"),
            Some([0xffffffff81b01610, 0xffffffff81b016b0])
        );
        assert_eq!(k.range("some_mod_fn"), None);
        let (syms, notes) = resolve_symbols(&k);
        assert_eq!(
            syms.merge_callers[path::PLUG as usize - 1],
            [0xffffffff81b01890, 0xffffffff81b01a00]
        );
        assert_eq!(syms.throtl_dispatch_fn, 0);
        assert!(notes
            .iter()
            .any(|n| n.contains("blk_throtl_dispatch_work_fn")));
    }

    #[test]
    fn the_symbols_read_are_hooks_of_the_table() {
        use super::super::hooks::{HookKind, HOOKS};
        let kallsyms_hook = |name: &str| {
            HOOKS
                .iter()
                .any(|h| h.kind == HookKind::Kallsyms && h.name == name)
        };
        for (_, name) in MERGE_CALLER_FUNCTIONS {
            assert!(
                kallsyms_hook(name),
                "{name} is not a kallsyms hook in HOOKS"
            );
        }
        assert!(kallsyms_hook(super::super::hooks::THROTTLE_WORK));
        // Kallsyms keeps only these: a program's symbol must be one of them.
        for p in HOOKS.iter().flat_map(|h| h.programs) {
            if let Some(name) = p.symbol {
                assert!(
                    kallsyms_hook(name),
                    "{name}: program symbol not a kallsyms hook"
                );
            }
        }
    }

    #[test]
    fn reading_stops_once_every_hook_and_its_end_are_found() {
        let mut text = String::new();
        for (i, name) in [
            "blk_bio_list_merge",
            "blk_mq_sched_try_merge",
            "blk_attempt_plug_merge",
            "blk_throtl_dispatch_work_fn",
            "after",
        ]
        .iter()
        .enumerate()
        {
            text += &format!("ffffffff81b0{i}000 T {name}\n");
        }
        text += "this line would not parse and is never read";
        let mut src = std::io::Cursor::new(text.as_bytes());
        let k = Kallsyms::read(&mut src).unwrap();
        assert_eq!(
            k.range("blk_throtl_dispatch_work_fn"),
            Some([0xffffffff81b03000, 0xffffffff81b04000])
        );
        let rest = &text.as_bytes()[src.position() as usize..];
        assert_eq!(rest, b"this line would not parse and is never read");
    }

    #[test]
    fn hidden_addresses_parse_as_empty() {
        let k = Kallsyms::parse("0000000000000000 T blk_attempt_plug_merge\n");
        assert!(k.is_empty());
    }
}
