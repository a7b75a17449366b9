//! `/proc/kallsyms`: kernel addresses, for the context the tracepoint tier reads from the
//! stack (which function a merge came from, whether blk-throttle's dispatch work runs).
use std::collections::BTreeMap;

use anyhow::{Context, Result};
use mergetrace_common::{path, KernelSymbols, MERGE_CALLERS};

/// `/proc/kallsyms`: text and data symbols with their addresses, sorted.
pub struct Kallsyms {
    /// address → name, for symbols with a non-zero address.
    by_addr: BTreeMap<u64, String>,
}

impl Kallsyms {
    pub fn load() -> Result<Kallsyms> {
        let text =
            std::fs::read_to_string("/proc/kallsyms").context("cannot read /proc/kallsyms")?;
        Ok(Kallsyms::parse(&text))
    }

    pub fn parse(text: &str) -> Kallsyms {
        let mut by_addr = BTreeMap::new();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(addr), Some(_ty), Some(name)) = (it.next(), it.next(), it.next()) else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            if addr != 0 && it.next().is_none() {
                // Module symbols carry a "[module]" suffix; the block layer is built in.
                by_addr.entry(addr).or_insert_with(|| name.to_string());
            }
        }
        Kallsyms { by_addr }
    }

    pub fn address(&self, name: &str) -> Option<u64> {
        self.by_addr
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(a, _)| *a)
    }

    /// `[start, end)` of a function: from its address to the next symbol's.
    pub fn range(&self, name: &str) -> Option<[u64; 2]> {
        let start = self.address(name)?;
        let end = self.by_addr.range(start + 1..).next().map(|(a, _)| *a)?;
        Some([start, end])
    }

    /// Whether addresses are visible (kptr_restrict hides them as zeros).
    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
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
    }

    #[test]
    fn hidden_addresses_parse_as_empty() {
        let k = Kallsyms::parse("0000000000000000 T blk_attempt_plug_merge\n");
        assert!(k.is_empty());
    }
}
