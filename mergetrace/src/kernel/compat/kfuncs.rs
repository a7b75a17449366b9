//! The kernel functions (kfuncs) the programs call where the kernel has them, and the linking
//! of those calls. aya 0.14 does not link kfunc calls, so a program calls a placeholder
//! helper number (`mergetrace_common::RDONLY_CAST_CALL`) and [`link`] rewrites each such call
//! in a copy of the object before it is loaded: into the kfunc's call where this kernel has
//! the kfunc, else into `r0 = 0`. The programs take the kfunc's path only where a frozen value
//! says so (`KernelOffsets::throtl_grp_btf_id`, from [`throtl_grp_btf_id`]), so on other
//! kernels the rewritten call is dead code the verifier drops.
use anyhow::{bail, Context, Result};
use mergetrace_common::RDONLY_CAST_CALL;
use object::{Object, ObjectSection, SectionKind};

use super::Btf;
use crate::kernel::btf::{KIND_FUNC, KIND_STRUCT};

/// The kfuncs this kernel offers the programs: each one's BTF id in vmlinux, or `None`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Kfuncs {
    /// `bpf_rdonly_cast(obj, btf_id)` (6.2+).
    pub rdonly_cast: Option<u32>,
}

impl Kfuncs {
    /// The kfuncs of the running kernel (its BTF), where it can call them: a kfunc call needs
    /// the JIT (`net.core.bpf_jit_enable`), which hardened hosts may have turned off.
    pub fn of_kernel(btf: &Btf) -> Kfuncs {
        Kfuncs::in_btf(btf, jit_enabled())
    }

    fn in_btf(btf: &Btf, jit: bool) -> Kfuncs {
        Kfuncs {
            rdonly_cast: btf.find(KIND_FUNC, "bpf_rdonly_cast").filter(|_| jit),
        }
    }
}

/// What `KernelOffsets::throtl_grp_btf_id` is: `struct throtl_grp`'s BTF id where the
/// programs can cast a blk-throttle group to it, else 0.
pub fn throtl_grp_btf_id(btf: &Btf, kfuncs: &Kfuncs) -> u32 {
    match kfuncs.rdonly_cast {
        Some(_) => btf.find(KIND_STRUCT, "throtl_grp").unwrap_or(0),
        None => 0,
    }
}

fn jit_enabled() -> bool {
    std::fs::read_to_string("/proc/sys/net/core/bpf_jit_enable").is_ok_and(|v| v.trim() != "0")
}

/// `call imm` (BPF_JMP | BPF_CALL), a helper call: registers 0, offset 0.
const CALL: u8 = 0x85;
/// A kfunc call's source register (`BPF_PSEUDO_KFUNC_CALL`), in the high nibble of the
/// registers byte; offset 0 names vmlinux's BTF.
const PSEUDO_KFUNC_CALL: u8 = 2 << 4;
/// `r0 = imm` (BPF_ALU64 | BPF_MOV | BPF_K).
const MOV_R0_IMM: u8 = 0xb7;

/// A copy of the eBPF object `elf` with every placeholder call linked for this kernel, 8-byte
/// aligned as the ELF parser wants its input.
pub fn link(elf: &[u8], kfuncs: &Kfuncs) -> Result<Linked> {
    let file = object::File::parse(elf).context("cannot parse the eBPF object")?;
    let mut linked = Linked::copy_of(elf);
    let bytes = linked.bytes_mut();
    for section in file.sections() {
        if section.kind() != SectionKind::Text {
            continue;
        }
        let Some((start, len)) = section.file_range() else {
            continue;
        };
        let (start, len) = (start as usize, len as usize);
        let Some(code) = bytes.get_mut(start..start + len) else {
            bail!(
                "the eBPF object's section {:?} ends past the file",
                section.name()
            );
        };
        for insn in code.chunks_exact_mut(8) {
            // (An ld_imm64's second half has opcode 0: never taken for a call.)
            let imm = i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]);
            if insn[0] != CALL || insn[1] != 0 || imm != RDONLY_CAST_CALL {
                continue;
            }
            let (code, regs, imm) = match kfuncs.rdonly_cast {
                Some(id) => (CALL, PSEUDO_KFUNC_CALL, id as i32),
                None => (MOV_R0_IMM, 0, 0),
            };
            insn[0] = code;
            insn[1] = regs;
            insn[2..4].fill(0);
            insn[4..8].copy_from_slice(&imm.to_le_bytes());
        }
    }
    Ok(linked)
}

/// An eBPF object's bytes in 8-byte aligned memory.
pub struct Linked {
    words: Vec<u64>,
    len: usize,
}

impl Linked {
    fn copy_of(elf: &[u8]) -> Linked {
        let mut linked = Linked {
            words: vec![0u64; elf.len().div_ceil(8)],
            len: elf.len(),
        };
        linked.bytes_mut().copy_from_slice(elf);
        linked
    }

    pub fn bytes(&self) -> &[u8] {
        // SAFETY: u64s are plain bytes; `len` is at most 8 * words.len().
        unsafe { std::slice::from_raw_parts(self.words.as_ptr() as *const u8, self.len) }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr() as *mut u8, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel::attach::OBJECT;

    /// How many placeholder calls an object's code holds.
    fn placeholders(elf: &[u8]) -> usize {
        let file = object::File::parse(elf).unwrap();
        let is_placeholder = |i: &[u8]| {
            i[0] == CALL && i32::from_le_bytes([i[4], i[5], i[6], i[7]]) == RDONLY_CAST_CALL
        };
        file.sections()
            .filter(|s| s.kind() == SectionKind::Text)
            .map(|s| {
                s.data()
                    .unwrap()
                    .chunks_exact(8)
                    .filter(|i| is_placeholder(i))
                    .count()
            })
            .sum()
    }

    /// The programs that read blk-throttle's rules call the placeholder; linking leaves none,
    /// and changes nothing else.
    #[test]
    fn link_rewrites_every_placeholder_call_and_nothing_else() {
        let found = placeholders(OBJECT);
        assert!(
            found > 0,
            "the eBPF object has no bpf_rdonly_cast placeholder call"
        );
        for kfuncs in [
            Kfuncs {
                rdonly_cast: Some(64911),
            },
            Kfuncs { rdonly_cast: None },
        ] {
            let calls = found;
            let linked = link(OBJECT, &kfuncs).unwrap();
            let out = linked.bytes();
            assert_eq!(out.len(), OBJECT.len());
            assert_eq!(placeholders(out), 0);
            let changed: Vec<usize> = (0..out.len()).filter(|&i| out[i] != OBJECT[i]).collect();
            // At most the opcode, registers and immediate of each call (8 bytes each).
            assert!(
                changed.len() <= 8 * calls,
                "{} bytes changed",
                changed.len()
            );
            let file = object::File::parse(out).unwrap();
            let text: Vec<&[u8]> = file
                .sections()
                .filter(|s| s.kind() == SectionKind::Text)
                .map(|s| s.data().unwrap())
                .collect();
            let wanted: [u8; 8] = match kfuncs.rdonly_cast {
                Some(id) => {
                    let mut w = [CALL, PSEUDO_KFUNC_CALL, 0, 0, 0, 0, 0, 0];
                    w[4..].copy_from_slice(&(id as i32).to_le_bytes());
                    w
                }
                None => [MOV_R0_IMM, 0, 0, 0, 0, 0, 0, 0],
            };
            let linked_calls = text
                .iter()
                .flat_map(|d| d.chunks_exact(8))
                .filter(|i| *i == wanted)
                .count();
            assert!(linked_calls >= calls);
        }
    }

    /// The kfunc is used only where BTF has it and the JIT is on; the cast's type comes with it.
    #[test]
    fn kfuncs_need_btf_and_the_jit() {
        let mut b = crate::kernel::btf::tests::Builder::new();
        let int = b.int("int", 4);
        b.record(KIND_STRUCT, "throtl_grp", 8, &[("td", int, 0)]);
        let f = b.func("bpf_rdonly_cast");
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(Kfuncs::in_btf(&btf, true).rdonly_cast, Some(f));
        assert_eq!(Kfuncs::in_btf(&btf, false).rdonly_cast, None);
        let tg = btf.find(KIND_STRUCT, "throtl_grp").unwrap();
        assert_eq!(throtl_grp_btf_id(&btf, &Kfuncs::in_btf(&btf, true)), tg);
        assert_eq!(throtl_grp_btf_id(&btf, &Kfuncs::in_btf(&btf, false)), 0);
        let without = crate::kernel::btf::tests::Builder::new();
        let btf = Btf::parse(&without.build()).unwrap();
        assert_eq!(Kfuncs::in_btf(&btf, true).rdonly_cast, None);
    }
}
