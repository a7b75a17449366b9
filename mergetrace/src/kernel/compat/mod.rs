//! Everything that differs between kernel versions, in one place: struct offsets and enum
//! values read from BTF, kernel addresses read from kallsyms, and which hooks exist. The eBPF
//! programs take what this module resolves; nothing about one kernel's layout is compiled in.
//!
//! Which hook is used on which kernel, tier and program: [`hooks::HOOKS`] (docs/hooks.md is
//! its rendering; on each kernel `mergetrace check`'s `hooks` section checks it). Addresses:
//! [`kallsyms`]. Kernel functions the programs call where they exist: [`kfuncs`].
pub mod hooks;
pub mod kallsyms;
pub mod kfuncs;
pub mod offsets;

use super::btf::Btf;
pub use hooks::{hook_status, parse_release, program_variant, HookStatus, HOOKS};
pub use kallsyms::{resolve_symbols, Kallsyms};
pub use kfuncs::Kfuncs;
pub use offsets::resolve_offsets;
