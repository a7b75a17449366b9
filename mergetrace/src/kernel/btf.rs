//! A small reader for the kernel's BTF (`/sys/kernel/btf/vmlinux`): just enough to find struct
//! member offsets (through anonymous unions and structs), enum values, and whether a function
//! or tracepoint exists. Untrusted input: every read is bounds-checked, errors never panic.
use anyhow::{bail, Context, Result};

const MAGIC: u16 = 0xeb9f;

pub const KIND_INT: u8 = 1;
pub const KIND_PTR: u8 = 2;
pub const KIND_ARRAY: u8 = 3;
pub const KIND_STRUCT: u8 = 4;
pub const KIND_UNION: u8 = 5;
pub const KIND_ENUM: u8 = 6;
pub const KIND_FWD: u8 = 7;
pub const KIND_TYPEDEF: u8 = 8;
pub const KIND_VOLATILE: u8 = 9;
pub const KIND_CONST: u8 = 10;
pub const KIND_RESTRICT: u8 = 11;
pub const KIND_FUNC: u8 = 12;
pub const KIND_FUNC_PROTO: u8 = 13;
pub const KIND_VAR: u8 = 14;
pub const KIND_DATASEC: u8 = 15;
pub const KIND_FLOAT: u8 = 16;
pub const KIND_DECL_TAG: u8 = 17;
pub const KIND_TYPE_TAG: u8 = 18;
pub const KIND_ENUM64: u8 = 19;

#[derive(Debug, Clone, Copy)]
pub struct Member {
    /// Offset of the name in the string section (0: anonymous).
    name: u32,
    pub type_id: u32,
    /// Offset in bits from the start of the containing struct.
    pub bit_offset: u32,
}

#[derive(Debug, Clone)]
pub struct Type {
    pub kind: u8,
    /// Offset of the name in the string section (0: anonymous).
    name: u32,
    /// `size` for INT/STRUCT/UNION/ENUM/FLOAT/DATASEC, `type` for PTR/TYPEDEF/modifiers/FUNC.
    pub size_or_type: u32,
    /// STRUCT/UNION members or FUNC_PROTO parameters: a range of [`Btf::members`].
    members: std::ops::Range<u32>,
    /// ARRAY: (element type, element count).
    pub array: Option<(u32, u32)>,
}

/// A parsed BTF blob. Type id 0 is `void`; ids start at 1 as in the kernel.
///
/// Names stay offsets into the string section and members sit in one array, so a kernel's
/// ~100,000 types cost no allocation each: the parse is part of every start.
pub struct Btf {
    strings: Vec<u8>,
    types: Vec<Type>,
    members: Vec<Member>,
    /// (name offset, value) of every enumerator: C enumerators share one namespace, so they
    /// are looked up all together.
    enumerators: Vec<(u32, i64)>,
    /// (hash of the name, id) of every named type, sorted: a lookup is a binary search.
    by_name: Vec<(u64, u32)>,
    hasher: foldhash::fast::RandomState,
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u32(&mut self) -> Result<u32> {
        let end = self.pos.checked_add(4).context("BTF offset overflow")?;
        let b = self
            .bytes
            .get(self.pos..end)
            .context("BTF type section ends inside a record")?;
        self.pos = end;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn skip(&mut self, n: usize) -> Result<()> {
        self.pos = self.pos.checked_add(n).context("BTF offset overflow")?;
        if self.pos > self.bytes.len() {
            bail!("BTF type section ends inside a record");
        }
        Ok(())
    }
    /// A name's offset, checked to lie in the string section (at its end: an empty name).
    fn name(&mut self, strings: &[u8]) -> Result<u32> {
        let off = self.u32()?;
        if off as usize > strings.len() {
            bail!("BTF string offset {off} is out of range");
        }
        Ok(off)
    }
}

fn read_u32(bytes: &[u8], at: usize) -> Result<u32> {
    let b = bytes.get(at..at + 4).context("BTF header is truncated")?;
    Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

/// The type and string sections of a blob, after checking its header.
fn sections(bytes: &[u8]) -> Result<(&[u8], &[u8])> {
    if bytes.len() < 24 {
        bail!("BTF blob is {} bytes, shorter than its header", bytes.len());
    }
    let magic = u16::from_le_bytes([bytes[0], bytes[1]]);
    if magic != MAGIC {
        bail!("not BTF (magic {magic:#06x}, expected {MAGIC:#06x}, little-endian)");
    }
    let hdr_len = read_u32(bytes, 4)? as usize;
    let type_off = read_u32(bytes, 8)? as usize;
    let type_len = read_u32(bytes, 12)? as usize;
    let str_off = read_u32(bytes, 16)? as usize;
    let str_len = read_u32(bytes, 20)? as usize;
    let section = |off: usize, len: usize, what: &str| -> Result<&[u8]> {
        let start = hdr_len.checked_add(off).context("BTF header overflow")?;
        let end = start.checked_add(len).context("BTF header overflow")?;
        bytes
            .get(start..end)
            .with_context(|| format!("BTF {what} section lies outside the blob"))
    };
    Ok((
        section(type_off, type_len, "type")?,
        section(str_off, str_len, "string")?,
    ))
}

/// One type record (type `id`): its common part, then what its kind adds (appended to
/// `members` and `enumerators`).
fn read_type(
    r: &mut Reader,
    strings: &[u8],
    members: &mut Vec<Member>,
    enumerators: &mut Vec<(u32, i64)>,
    id: usize,
) -> Result<Type> {
    let name = r.name(strings)?;
    let info = r.u32()?;
    let size_or_type = r.u32()?;
    let vlen = (info & 0xffff) as usize;
    let kind = ((info >> 24) & 0x1f) as u8;
    let kind_flag = info >> 31 != 0;
    let mut t = Type {
        kind,
        name,
        size_or_type,
        ..Type::void()
    };
    let m0 = members.len() as u32;
    match kind {
        KIND_INT | KIND_VAR | KIND_DECL_TAG => r.skip(4)?,
        KIND_PTR | KIND_FWD | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT
        | KIND_FUNC | KIND_FLOAT | KIND_TYPE_TAG => {}
        KIND_ARRAY => {
            let elem = r.u32()?;
            let _index = r.u32()?;
            let n = r.u32()?;
            t.array = Some((elem, n));
        }
        KIND_STRUCT | KIND_UNION => {
            for _ in 0..vlen {
                let name = r.name(strings)?;
                let type_id = r.u32()?;
                let off = r.u32()?;
                let bit_offset = if kind_flag { off & 0xff_ffff } else { off };
                members.push(Member {
                    name,
                    type_id,
                    bit_offset,
                });
            }
        }
        KIND_ENUM => {
            for _ in 0..vlen {
                let name = r.name(strings)?;
                let raw = r.u32()?;
                let val = if kind_flag {
                    raw as i32 as i64
                } else {
                    raw as i64
                };
                enumerators.push((name, val));
            }
        }
        KIND_ENUM64 => {
            for _ in 0..vlen {
                let name = r.name(strings)?;
                let lo = r.u32()? as u64;
                let hi = r.u32()? as u64;
                enumerators.push((name, ((hi << 32) | lo) as i64));
            }
        }
        KIND_FUNC_PROTO => {
            // Parameters, as members at offset 0 (name, type).
            for _ in 0..vlen {
                let name = r.name(strings)?;
                let type_id = r.u32()?;
                members.push(Member {
                    name,
                    type_id,
                    bit_offset: 0,
                });
            }
        }
        KIND_DATASEC => r.skip(vlen.checked_mul(12).context("BTF overflow")?)?,
        other => bail!("BTF type {id} has unknown kind {other}"),
    }
    t.members = m0..members.len() as u32;
    Ok(t)
}

impl Type {
    /// Type id 0.
    fn void() -> Type {
        Type {
            kind: 0,
            name: 0,
            size_or_type: 0,
            members: 0..0,
            array: None,
        }
    }
}

impl Btf {
    /// Where the running kernel's BTF is: `/sys/kernel/btf/vmlinux`, or `$MERGETRACE_BTF` (for
    /// kernels whose BTF ships as a separate file, and for tests).
    pub fn kernel_path() -> std::path::PathBuf {
        std::env::var_os("MERGETRACE_BTF")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/sys/kernel/btf/vmlinux".into())
    }

    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Btf> {
        let path = Btf::kernel_path();
        let bytes = std::fs::read(&path).with_context(|| {
            format!(
                "this kernel has no BTF ({} is missing): mergetrace needs a kernel built with \
                 CONFIG_DEBUG_INFO_BTF=y, or its BTF file in MERGETRACE_BTF",
                path.display()
            )
        })?;
        Btf::parse(&bytes).with_context(|| format!("cannot parse the BTF in {}", path.display()))
    }

    /// Parses a little-endian BTF blob.
    pub fn parse(bytes: &[u8]) -> Result<Btf> {
        let (type_sec, strings) = sections(bytes)?;
        let (mut members, mut enumerators) = (Vec::new(), Vec::new());
        let mut types = vec![Type::void()];
        let mut r = Reader {
            bytes: type_sec,
            pos: 0,
        };
        while r.pos < type_sec.len() {
            let t = read_type(&mut r, strings, &mut members, &mut enumerators, types.len())?;
            types.push(t);
        }
        let mut btf = Btf {
            strings: strings.to_vec(),
            types,
            members,
            enumerators,
            by_name: Vec::new(),
            hasher: Default::default(),
        };
        let mut by_name: Vec<(u64, u32)> = (btf.types.iter().enumerate().skip(1))
            .filter(|(_, t)| t.name != 0)
            .map(|(id, t)| (btf.hash(btf.name(t.name)), id as u32))
            .collect();
        by_name.sort_unstable();
        btf.by_name = by_name;
        Ok(btf)
    }

    /// The name at `off` of the string section (checked at parse), up to its NUL.
    fn name(&self, off: u32) -> &[u8] {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        &rest[..rest.iter().position(|&c| c == 0).unwrap_or(rest.len())]
    }

    fn hash(&self, name: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        self.hasher.hash_one(name)
    }

    pub fn get(&self, id: u32) -> Option<&Type> {
        self.types.get(id as usize)
    }

    /// Members (or parameters) of a type.
    fn members_of(&self, t: &Type) -> &[Member] {
        let r = t.members.start as usize..t.members.end as usize;
        self.members.get(r).unwrap_or_default()
    }

    /// The id of the first type named `name` of kind `kind`.
    pub fn find(&self, kind: u8, name: &str) -> Option<u32> {
        let h = self.hash(name.as_bytes());
        let from = self.by_name.partition_point(|&(x, _)| x < h);
        self.by_name[from..]
            .iter()
            .take_while(|&&(x, _)| x == h)
            .map(|&(_, id)| id)
            .find(|&id| {
                let t = &self.types[id as usize];
                t.kind == kind && self.name(t.name) == name.as_bytes()
            })
    }

    /// Follows typedefs and qualifiers to the underlying type (bounded, so loops cannot hang).
    pub fn resolve(&self, mut id: u32) -> Option<u32> {
        for _ in 0..32 {
            let t = self.get(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Some(id),
            }
        }
        None
    }

    /// Byte offset of `path` (e.g. `"bi_iter.bi_sector"`) inside `struct name`, looking through
    /// anonymous unions and structs as C does.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Result<u32> {
        let mut id = self
            .find(KIND_STRUCT, struct_name)
            .or_else(|| self.find(KIND_UNION, struct_name))
            .with_context(|| format!("struct {struct_name} is not in this kernel's BTF"))?;
        let mut bits = 0u64;
        for part in path.split('.') {
            let (off, member_type) = self
                .find_member(id, part, 0)
                .with_context(|| format!("struct {struct_name} has no member {path}"))?;
            bits += off as u64;
            id = self
                .resolve(member_type)
                .with_context(|| format!("{struct_name}.{path}: broken type chain"))?;
        }
        if !bits.is_multiple_of(8) {
            bail!("{struct_name}.{path} is a bitfield");
        }
        u32::try_from(bits / 8).context("offset out of range")
    }

    /// (bit offset, type id) of member `name` in the struct/union `id`, recursing into anonymous
    /// members. Depth-bounded against malformed input.
    fn find_member(&self, id: u32, name: &str, depth: u32) -> Option<(u32, u32)> {
        if depth > 8 {
            return None;
        }
        let t = self.get(self.resolve(id)?)?;
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return None;
        }
        let members = self.members_of(t);
        for m in members {
            if self.name(m.name) == name.as_bytes() {
                return Some((m.bit_offset, m.type_id));
            }
        }
        for m in members {
            if self.name(m.name).is_empty() {
                if let Some((off, ty)) = self.find_member(m.type_id, name, depth + 1) {
                    return Some((m.bit_offset.checked_add(off)?, ty));
                }
            }
        }
        None
    }

    /// Element count of an array member, e.g. `blkcg_gq.pd[6]` → 6.
    pub fn array_len(&self, struct_name: &str, member: &str) -> Result<u32> {
        let id = self
            .find(KIND_STRUCT, struct_name)
            .with_context(|| format!("struct {struct_name} is not in this kernel's BTF"))?;
        let (_, ty) = self
            .find_member(id, member, 0)
            .with_context(|| format!("struct {struct_name} has no member {member}"))?;
        let t = self
            .get(self.resolve(ty).context("broken type chain")?)
            .context("bad type id")?;
        t.array
            .map(|(_, n)| n)
            .with_context(|| format!("{struct_name}.{member} is not an array"))
    }

    /// Size in bytes of a struct.
    #[cfg(test)]
    pub fn struct_size(&self, name: &str) -> Option<u32> {
        Some(self.get(self.find(KIND_STRUCT, name)?)?.size_or_type)
    }

    /// Value of an enumerator, searched across all enums (C enumerators share one namespace).
    pub fn enum_value(&self, enumerator: &str) -> Option<i64> {
        self.enumerators
            .iter()
            .find(|(n, _)| self.name(*n) == enumerator.as_bytes())
            .map(|(_, v)| *v)
    }

    /// Whether the kernel has a function of this name in BTF (a candidate for fentry).
    pub fn has_function(&self, name: &str) -> bool {
        self.find(KIND_FUNC, name).is_some()
    }

    /// Whether a BTF-enabled tracepoint exists (its `btf_trace_<name>` typedef).
    pub fn has_tracepoint(&self, name: &str) -> bool {
        self.find(KIND_TYPEDEF, &format!("btf_trace_{name}"))
            .is_some()
    }

    /// The parameters of the function prototype `id` leads to (through typedefs, qualifiers,
    /// a pointer, or a FUNC).
    fn proto_params(&self, id: u32) -> Option<&[Member]> {
        let mut id = self.resolve(id)?;
        for _ in 0..4 {
            let t = self.get(id)?;
            match t.kind {
                KIND_FUNC_PROTO => return Some(self.members_of(t)),
                KIND_PTR | KIND_FUNC => id = self.resolve(t.size_or_type)?,
                _ => return None,
            }
        }
        None
    }

    /// Whether type `id` is a pointer to `struct target`.
    fn points_to(&self, id: u32, target: &str) -> bool {
        let Some(p) = self.resolve(id).and_then(|i| self.get(i)) else {
            return false;
        };
        p.kind == KIND_PTR
            && self
                .resolve(p.size_or_type)
                .and_then(|i| self.get(i))
                .is_some_and(|t| t.kind == KIND_STRUCT && self.name(t.name) == target.as_bytes())
    }

    /// Index of the first argument of tracepoint `name` that points to `struct target`, as a
    /// BTF program sees its arguments (the prototype's leading `void *` is the tracepoint's
    /// own data, not passed). Up to 5.10 the bio tracepoints take the queue first.
    pub fn tracepoint_arg(&self, name: &str, target: &str) -> Option<u32> {
        let id = self.find(KIND_TYPEDEF, &format!("btf_trace_{name}"))?;
        let params = self.proto_params(id)?;
        let i = params
            .iter()
            .skip(1)
            .position(|m| self.points_to(m.type_id, target))?;
        u32::try_from(i).ok()
    }

    /// The number of parameters of kernel function `name` (an fexit program finds the return
    /// value after them).
    pub fn function_arity(&self, name: &str) -> Option<u32> {
        u32::try_from(self.proto_params(self.find(KIND_FUNC, name)?)?.len()).ok()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a BTF blob by hand: a tiny stand-in for a kernel's.
    #[derive(Default)]
    pub struct Builder {
        types: Vec<u8>,
        strings: Vec<u8>,
        pub next_id: u32,
    }

    impl Builder {
        pub fn new() -> Self {
            Builder {
                types: Vec::new(),
                strings: vec![0],
                next_id: 1,
            }
        }
        fn str(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }
        fn head(&mut self, name: &str, kind: u8, vlen: u32, size_or_type: u32) -> u32 {
            let n = self.str(name);
            self.types.extend_from_slice(&n.to_le_bytes());
            self.types
                .extend_from_slice(&(((kind as u32) << 24) | vlen).to_le_bytes());
            self.types.extend_from_slice(&size_or_type.to_le_bytes());
            let id = self.next_id;
            self.next_id += 1;
            id
        }
        pub fn int(&mut self, name: &str, size: u32) -> u32 {
            let id = self.head(name, KIND_INT, 0, size);
            self.types.extend_from_slice(&(size * 8).to_le_bytes());
            id
        }
        pub fn ptr(&mut self, to: u32) -> u32 {
            self.head("", KIND_PTR, 0, to)
        }
        pub fn typedef(&mut self, name: &str, to: u32) -> u32 {
            self.head(name, KIND_TYPEDEF, 0, to)
        }
        pub fn func(&mut self, name: &str) -> u32 {
            self.head(name, KIND_FUNC, 0, 0)
        }
        /// A FUNC_PROTO returning int (type 0 here) with unnamed parameters of these types.
        pub fn proto(&mut self, params: &[u32]) -> u32 {
            let id = self.head("", KIND_FUNC_PROTO, params.len() as u32, 0);
            for ty in params {
                self.types.extend_from_slice(&0u32.to_le_bytes());
                self.types.extend_from_slice(&ty.to_le_bytes());
            }
            id
        }
        pub fn func_of(&mut self, name: &str, proto: u32) -> u32 {
            self.head(name, KIND_FUNC, 0, proto)
        }
        /// members: (name, type id, byte offset)
        pub fn record(
            &mut self,
            kind: u8,
            name: &str,
            size: u32,
            members: &[(&str, u32, u32)],
        ) -> u32 {
            let id = self.head(name, kind, members.len() as u32, size);
            for (n, ty, off) in members {
                let n = self.str(n);
                self.types.extend_from_slice(&n.to_le_bytes());
                self.types.extend_from_slice(&ty.to_le_bytes());
                self.types.extend_from_slice(&(off * 8).to_le_bytes());
            }
            id
        }
        pub fn enumeration(&mut self, name: &str, values: &[(&str, i32)]) -> u32 {
            let id = self.head(name, KIND_ENUM, values.len() as u32, 4);
            for (n, v) in values {
                let n = self.str(n);
                self.types.extend_from_slice(&n.to_le_bytes());
                self.types.extend_from_slice(&v.to_le_bytes());
            }
            id
        }
        pub fn build(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.push(1);
            out.push(0);
            out.extend_from_slice(&24u32.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            out.extend_from_slice(&(self.types.len() as u32).to_le_bytes());
            out.extend_from_slice(&(self.strings.len() as u32).to_le_bytes());
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    #[test]
    fn argument_indexes_from_prototypes() {
        let mut b = Builder::new();
        let bio = b.record(KIND_STRUCT, "bio", 8, &[]);
        let queue = b.record(KIND_STRUCT, "request_queue", 8, &[]);
        let u32_t = b.int("unsigned int", 4);
        let (bio_p, q_p, void_p) = (b.ptr(bio), b.ptr(queue), b.ptr(0));
        // 6.x: block_bio_queue(bio); 5.10: block_split(q, bio, new_sector)
        let new = b.proto(&[void_p, bio_p]);
        let new_p = b.ptr(new);
        b.typedef("btf_trace_block_bio_queue", new_p);
        let old = b.proto(&[void_p, q_p, bio_p, u32_t]);
        let old_p = b.ptr(old);
        b.typedef("btf_trace_block_split", old_p);
        let f = b.proto(&[q_p, bio_p, u32_t, void_p]);
        b.func_of("blk_attempt_plug_merge", f);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(btf.tracepoint_arg("block_bio_queue", "bio"), Some(0));
        assert_eq!(btf.tracepoint_arg("block_split", "bio"), Some(1));
        assert_eq!(btf.tracepoint_arg("block_split", "request_queue"), Some(0));
        assert_eq!(btf.tracepoint_arg("block_split", "request"), None);
        assert_eq!(btf.function_arity("blk_attempt_plug_merge"), Some(4));
        assert_eq!(btf.tracepoint_arg("nosuch", "bio"), None);
    }

    #[test]
    fn finds_members_through_anonymous_unions() {
        let mut b = Builder::new();
        bio_with_union(&mut b, &["a", "b"]);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(btf.member_offset("bio", "bi_iter.bi_size").unwrap(), 40);
        assert_eq!(btf.member_offset("bio", "b").unwrap(), 8);
        assert_eq!(btf.struct_size("bio"), Some(64));
        let err = btf.member_offset("bio", "nope").unwrap_err().to_string();
        assert!(err.contains("struct bio has no member nope"), "{err}");
        assert!(btf.member_offset("request", "q").is_err());
    }

    #[test]
    fn enum_values_and_functions() {
        let mut b = Builder::new();
        b.enumeration("", &[("BIO_NO_PAGE_REF", 0), ("BIO_BPS_THROTTLED", 5)]);
        b.func("__blk_throtl_bio");
        let fnptr = b.ptr(0);
        b.typedef("btf_trace_block_split", fnptr);
        let btf = Btf::parse(&b.build()).unwrap();
        assert_eq!(btf.enum_value("BIO_BPS_THROTTLED"), Some(5));
        assert_eq!(btf.enum_value("BIO_NOPE"), None);
        assert!(btf.has_function("__blk_throtl_bio"));
        assert!(!btf.has_function("throtl_charge_bio"));
        assert!(btf.has_tracepoint("block_split"));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

        /// Arbitrary bytes never panic the reader, and neither does resolving offsets on
        /// whatever it accepts.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            if let Ok(btf) = Btf::parse(&bytes) {
                let kfuncs = crate::kernel::compat::Kfuncs::of_kernel(&btf);
                let _ = crate::kernel::compat::resolve_offsets(&btf, &kfuncs);
            }
        }

        /// A valid blob with bytes overwritten anywhere (header, types, strings) never panics.
        #[test]
        fn mutated_blobs_never_panic(edits in proptest::collection::vec((0usize..4096, proptest::prelude::any::<u8>()), 1..16)) {
            let mut blob = sample_blob();
            for (at, byte) in edits {
                let n = blob.len();
                blob[at % n] = byte;
            }
            if let Ok(btf) = Btf::parse(&blob) {
                let kfuncs = crate::kernel::compat::Kfuncs::of_kernel(&btf);
                let _ = crate::kernel::compat::resolve_offsets(&btf, &kfuncs);
                let _ = btf.member_offset("bio", "bi_iter.bi_sector");
                let _ = btf.array_len("blkcg_gq", "pd");
            }
        }
    }

    /// A 64-byte `struct bio`: bi_next at 0, an anonymous union of u64 `members` at 8 and a
    /// `bvec_iter` (a typedef'd bi_sector, bi_size) at 32.
    fn bio_with_union(b: &mut Builder, members: &[&str]) {
        let u64_t = b.int("long long unsigned int", 8);
        let sector_t = b.typedef("sector_t", u64_t);
        let iter = b.record(
            KIND_STRUCT,
            "bvec_iter",
            16,
            &[("bi_sector", sector_t, 0), ("bi_size", u64_t, 8)],
        );
        let union: Vec<_> = members.iter().map(|m| (*m, u64_t, 0)).collect();
        let anon = b.record(KIND_UNION, "", 8, &union);
        b.record(
            KIND_STRUCT,
            "bio",
            64,
            &[("bi_next", u64_t, 0), ("", anon, 8), ("bi_iter", iter, 32)],
        );
    }

    /// A small blob with the shapes the resolver walks (nested structs, typedefs, arrays).
    fn sample_blob() -> Vec<u8> {
        let mut b = Builder::new();
        bio_with_union(&mut b, &["a"]);
        b.enumeration("", &[("BIO_BPS_THROTTLED", 5)]);
        b.build()
    }

    /// Inputs that once mattered, kept as regression cases (mergetrace/tests/data/btf/):
    /// `ok-*` must parse, `bad-*` must be refused, none may panic.
    #[test]
    fn corpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/btf");
        let mut n = 0;
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = Btf::parse(&std::fs::read(e.path()).unwrap());
            match name.split('-').next() {
                Some("ok") => assert!(r.is_ok(), "{name}: {:?}", r.err()),
                Some("bad") => assert!(r.is_err(), "{name} parsed"),
                _ => panic!("corpus file {name} must start with ok- or bad-"),
            }
            n += 1;
        }
        assert!(n >= 3, "corpus has {n} files");
    }

    #[test]
    #[ignore = "writes the corpus; run by hand after changing the builder"]
    fn write_corpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/btf");
        std::fs::create_dir_all(dir).unwrap();
        let good = sample_blob();
        std::fs::write(format!("{dir}/ok-sample.btf"), &good).unwrap();
        std::fs::write(format!("{dir}/bad-truncated-in-types.btf"), &good[..40]).unwrap();
        let mut magic = good.clone();
        magic[0] = 0;
        std::fs::write(format!("{dir}/bad-magic.btf"), &magic).unwrap();
        let mut huge = good.clone();
        huge[12..16].copy_from_slice(&u32::MAX.to_le_bytes()); // type_len past the end
        std::fs::write(format!("{dir}/bad-section-out-of-range.btf"), &huge).unwrap();
        let mut kind = good;
        kind[24 + 7] = 0x1f; // first type: kind 31
        std::fs::write(format!("{dir}/bad-unknown-kind.btf"), &kind).unwrap();
    }

    #[test]
    fn rejects_garbage_without_panicking() {
        assert!(Btf::parse(&[]).is_err());
        assert!(Btf::parse(&[0u8; 64]).is_err());
        let mut b = Builder::new();
        b.int("int", 4);
        let good = b.build();
        for cut in 0..good.len() {
            let _ = Btf::parse(&good[..cut]);
        }
        let mut flipped = good.clone();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = Btf::parse(&flipped);
            flipped[i] ^= 0xff;
        }
    }
}
