//! The bytes of a capture file around the events: preamble, chunk framing, the lost-event
//! payload. Pure (no I/O); docs/capture-format.md describes the same layout for people. Any
//! change to what a byte means bumps [`FORMAT_VERSION`]. The events' own encoding is
//! [`super::codec`].
use bytes::BufMut;

use super::codec::{put_varint, Cursor, DecodeError};

/// First 8 bytes of every capture. Never changes (the version follows it).
pub const MAGIC: [u8; 8] = *b"MTRACE\0\x01";
/// The newest format this build writes and reads. Readers accept `1..=FORMAT_VERSION`.
/// Format 3 is format 2's bytes, where a `bio_queue` or `throttle_charge` event can stand for
/// a run of bios (`aux64` more: `Event::run_len`); a format-2 reader would count it as one.
pub const FORMAT_VERSION: u16 = 3;
/// Magic, version (u16 LE), reserved (u16, 0).
pub const PREAMBLE_LEN: usize = 12;
/// Every chunk starts with this many bytes (see [`ChunkHeader`]).
pub const CHUNK_HEADER_LEN: usize = 28;
/// No chunk payload is larger: a reader refuses bigger ones as corrupt, writers never come
/// close (an event encodes to at most 72 bytes, a chunk holds at most 65,536 events).
pub const MAX_PAYLOAD: u32 = 16 << 20;

/// Chunk types. Bit 0x20 set (lower-case ASCII letters) = ancillary: a reader that does not
/// know the type skips it. Clear = critical: a reader that does not know it must stop.
pub mod chunk {
    /// JSON [`super::super::Header`]; always the first chunk, exactly once.
    pub const HEADER: u8 = b'H';
    /// Encoded events.
    pub const EVENTS: u8 = b'E';
    /// (kind, count) entries: the kernel dropped `count` events of `kind` here.
    pub const LOST: u8 = b'L';
    /// JSON [`super::super::Trailer`]; written on a clean close, always last.
    pub const END: u8 = b'Z';
    /// Ancillary, JSON [`super::super::LateCgroups`]: cgroups that appeared during the run.
    pub const CGROUPS: u8 = b'c';

    pub fn is_ancillary(t: u8) -> bool {
        t & 0x20 != 0
    }

    pub fn name(t: u8) -> &'static str {
        match t {
            HEADER => "header",
            EVENTS => "events",
            LOST => "lost",
            END => "end",
            CGROUPS => "cgroups",
            _ => "unknown",
        }
    }
}

/// The fixed part of a chunk, 28 bytes little-endian:
/// `type u8, flags u8, reserved u16, payload_len u32, count u32, base_ts u64, payload_crc u32,
/// header_crc u32` (CRC-32/ISO-HDLC of the 24 bytes before it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub kind: u8,
    /// Written as 0; readers ignore it.
    pub flags: u8,
    pub len: u32,
    /// Events (events chunk) or entries (lost chunk); 0 otherwise.
    pub count: u32,
    /// Timestamp of the chunk's first event (events chunk), the start time (header chunk).
    pub base_ts: u64,
    pub crc: u32,
}

impl ChunkHeader {
    pub fn encode(&self) -> [u8; CHUNK_HEADER_LEN] {
        let mut b = [0u8; CHUNK_HEADER_LEN];
        b[0] = self.kind;
        b[1] = self.flags;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.count.to_le_bytes());
        b[12..20].copy_from_slice(&self.base_ts.to_le_bytes());
        b[20..24].copy_from_slice(&self.crc.to_le_bytes());
        let hcrc = crc32fast::hash(&b[..24]);
        b[24..28].copy_from_slice(&hcrc.to_le_bytes());
        b
    }

    /// Checks the header's own CRC and the payload size limit.
    pub fn decode(b: &[u8; CHUNK_HEADER_LEN]) -> Result<ChunkHeader, &'static str> {
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        if crc32fast::hash(&b[..24]) != u32_at(24) {
            return Err("chunk header checksum mismatch");
        }
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&b[12..20]);
        let h = ChunkHeader {
            kind: b[0],
            flags: b[1],
            len: u32_at(4),
            count: u32_at(8),
            base_ts: u64::from_le_bytes(ts),
            crc: u32_at(20),
        };
        if h.len > MAX_PAYLOAD {
            return Err("chunk payload length over the 16 MiB limit");
        }
        Ok(h)
    }
}

/// The preamble: magic, version, reserved.
pub fn preamble(version: u16) -> [u8; PREAMBLE_LEN] {
    let mut b = [0u8; PREAMBLE_LEN];
    b[..8].copy_from_slice(&MAGIC);
    b[8..10].copy_from_slice(&version.to_le_bytes());
    b
}

/// Lost-chunk payload: per entry `kind u8, count varint`.
pub fn encode_lost(entries: &[(u8, u64)], out: &mut impl BufMut) {
    for (kind, count) in entries {
        out.put_u8(*kind);
        put_varint(out, *count);
    }
}

pub fn decode_lost(
    payload: &[u8],
    count: u32,
    out: &mut Vec<(u8, u64)>,
) -> Result<(), DecodeError> {
    out.clear();
    if count as usize > payload.len() / 2 {
        return Err(DecodeError {
            offset: 0,
            what: "entry count larger than the payload can hold",
        });
    }
    let mut c = Cursor::new(payload);
    for _ in 0..count {
        let kind = c.u8()?;
        let n = c.varint()?;
        out.push((kind, n));
    }
    if !c.at_end() {
        return Err(c.err("bytes left over after the last entry"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capture_chunk_header_round_trip_and_checksum() {
        let h = ChunkHeader {
            kind: chunk::EVENTS,
            flags: 0,
            len: 1234,
            count: 99,
            base_ts: u64::MAX - 5,
            crc: 0xdead_beef,
        };
        let b = h.encode();
        assert_eq!(ChunkHeader::decode(&b), Ok(h));
        for i in 0..CHUNK_HEADER_LEN {
            let mut c = b;
            c[i] ^= 0x10;
            assert!(
                ChunkHeader::decode(&c).is_err(),
                "flip in byte {i} not seen"
            );
        }
    }
}
