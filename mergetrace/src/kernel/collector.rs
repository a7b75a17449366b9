//! Moves events from the kernel's ring buffer to a consumer in batches.
use anyhow::Result;
use aya::maps::{MapData, RingBuf};
use mergetrace_common::Event;
use tokio::{io::unix::AsyncFd, sync::watch};

/// How often the reader looks without a wake-up (the programs wake it for big batches only).
const POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Decodes one ring buffer record; `None` for a record of the wrong size.
pub fn decode(bytes: &[u8]) -> Option<Event> {
    (bytes.len() >= std::mem::size_of::<Event>())
        // SAFETY: Event is plain old data of this size; read_unaligned has no alignment needs.
        .then(|| unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Event) })
}

/// Drains everything available into `batch`; returns how many records it read.
fn drain(ring: &mut RingBuf<MapData>, batch: &mut Vec<Event>) -> usize {
    let mut n = 0;
    while let Some(item) = ring.next() {
        if let Some(ev) = decode(&item) {
            batch.push(ev);
        }
        n += 1;
    }
    n
}

/// Reads `ring` until `stop` changes, handing each batch to `sink`; after the stop it drains
/// what is left (call it after detaching the programs so that nothing more arrives).
pub async fn run(
    ring: RingBuf<MapData>,
    mut stop: watch::Receiver<bool>,
    mut sink: impl FnMut(&[Event]) + Send,
) -> Result<()> {
    // SAFETY: the AsyncFd owns the ring buffer, so its fd stays open while registered.
    let mut fd = unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE)? };
    let mut batch = Vec::with_capacity(4096);
    // The programs wake us only once a batch is waiting; this picks up the rest.
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = poll.tick() => {
                drain(fd.get_mut(), &mut batch);
                if !batch.is_empty() {
                    sink(&batch);
                    batch.clear();
                }
            }
            guard = fd.readable_mut() => {
                let mut guard = guard?;
                drain(guard.get_inner_mut(), &mut batch);
                guard.clear_ready();
                if !batch.is_empty() {
                    sink(&batch);
                    batch.clear();
                }
            }
            _ = stop.changed() => break,
        }
    }
    drain(fd.get_mut(), &mut batch);
    if !batch.is_empty() {
        sink(&batch);
    }
    Ok(())
}
