//! The reuse cache: large blocks of the general pool freed recently, kept
//! whole so that the next request of the same capacity takes one back with
//! no lake work.
//!
//! Training asks for the same sizes over and over (each layer's
//! activations, each step's gradients), and most frees are followed by a
//! request of a size just freed. Through the lake each such pair updates
//! the free runs of every view a chunk belongs to; through this cache it is
//! a scan of a short list. What the cache holds is reserved but idle, so it
//! must never make the pool grow: the pool empties it into the lake before
//! the lake places any request ([`ReuseCache::drain`]), when memory runs
//! short, and on `empty_cache`.
//!
//! Rules:
//! - an entry is a block as the lake handed it out (its [`DeviceRange`]),
//!   its capacity (the range rounded up to whole chunks) and the fence of
//!   its free: a request on stream T takes it only if the fence admits T
//!   (the stream rule, `lake/fence.rs`);
//! - a request takes the newest admitted entry of exactly its capacity, so
//!   a block never serves a request it would round differently and the
//!   rounding statistics stay those of the lake;
//! - at most `capacity` entries; a put beyond that hands back the oldest
//!   entry, which the pool returns to the lake.
//!
//! Concurrency: a plain value; the pool keeps it behind its mutex.

use crate::lake::{DeviceRange, Fence, Progress, Requester};

/// Entries kept by default: none (the cache is off). On the CPU replay of
/// the GPT-2 trace 32 entries cut the pool's time per call by 35-50%, but
/// on the H100 the host time per training step did not fall (16 MiB
/// chunks: a median of ~6.4 ms per step with it, ~6.0 without, with spikes
/// where a miss empties the cache; 2 MiB chunks: ~10 against ~11.5, in
/// different runs): `docs/PERF.md`. `GPUMALLOC_REUSE_ENTRIES=32` (or
/// [`crate::pluggable::StreamPool::set_reuse_entries`]) turns it on for a
/// comparison in one run.
pub const DEFAULT_ENTRIES: usize = 0;

/// Entries worth trying: one transformer layer's large tensors of one
/// phase, few enough that a scan stays in a few cache lines.
pub const SUGGESTED_ENTRIES: usize = 32;

#[derive(Clone, Debug)]
struct Entry {
    capacity: u64,
    range: DeviceRange,
    fence: Fence,
}

/// Recently freed large blocks, oldest first.
#[derive(Debug)]
pub struct ReuseCache {
    entries: Vec<Entry>,
    max_entries: usize,
    bytes: u64,
}

impl ReuseCache {
    /// An empty cache of at most `max_entries` blocks (0: the cache is off).
    pub fn new(max_entries: usize) -> ReuseCache {
        ReuseCache {
            entries: Vec::with_capacity(max_entries),
            max_entries,
            bytes: 0,
        }
    }

    /// Takes the newest block of exactly `capacity` bytes that `req` may
    /// reuse now.
    pub fn take(&mut self, capacity: u64, req: &Requester<'_>) -> Option<DeviceRange> {
        let i = self
            .entries
            .iter()
            .rposition(|e| e.capacity == capacity && e.fence.admits(req))?;
        let e = self.entries.remove(i);
        self.bytes -= e.capacity;
        Some(e.range)
    }

    /// Keeps `range` (freed behind `fence`, `capacity` bytes of chunks).
    /// With the cache off or full, answers the block to give to the lake
    /// instead: `range` itself when off, else the oldest entry.
    pub fn put(
        &mut self,
        range: DeviceRange,
        capacity: u64,
        fence: Fence,
    ) -> Option<(DeviceRange, Fence)> {
        if self.max_entries == 0 {
            return Some((range, fence));
        }
        self.entries.push(Entry {
            capacity,
            range,
            fence,
        });
        self.bytes += capacity;
        if self.entries.len() > self.max_entries {
            let old = self.entries.remove(0);
            self.bytes -= old.capacity;
            return Some((old.range, old.fence));
        }
        None
    }

    /// Empties the cache: every block with its fence, oldest first.
    pub fn drain(&mut self) -> Vec<(DeviceRange, Fence)> {
        self.bytes = 0;
        self.entries.drain(..).map(|e| (e.range, e.fence)).collect()
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes held (whole chunks).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Bytes held whose fence still waits for an event on some stream.
    pub fn pending_bytes(&self, progress: &Progress) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.fence.pending(progress))
            .map(|e| e.capacity)
            .sum()
    }

    /// The largest block held.
    pub fn largest(&self) -> u64 {
        self.entries.iter().map(|e| e.capacity).max().unwrap_or(0)
    }

    /// Whether `addr` starts a block held.
    pub fn holds(&self, addr: u64) -> bool {
        self.entries.iter().any(|e| e.range.addr == addr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn range(addr: u64, len: u64) -> DeviceRange {
        DeviceRange { addr, len }
    }

    #[test]
    fn takes_newest_of_exact_capacity() {
        let mut c = ReuseCache::new(4);
        let req = Requester::unfenced();
        assert!(
            c.put(range(0x1000, 3 * MIB), 4 * MIB, Fence::none())
                .is_none()
        );
        assert!(
            c.put(range(0x9000, 4 * MIB), 4 * MIB, Fence::none())
                .is_none()
        );
        assert!(
            c.put(range(0x20000, 5 * MIB), 6 * MIB, Fence::none())
                .is_none()
        );
        assert_eq!(c.bytes(), 14 * MIB);
        assert_eq!(c.take(2 * MIB, &req), None, "no block of that capacity");
        assert_eq!(c.take(4 * MIB, &req), Some(range(0x9000, 4 * MIB)));
        assert_eq!(c.take(4 * MIB, &req), Some(range(0x1000, 3 * MIB)));
        assert_eq!(c.take(4 * MIB, &req), None);
        assert_eq!(c.bytes(), 6 * MIB);
        assert_eq!(c.largest(), 6 * MIB);
    }

    #[test]
    fn full_cache_hands_back_the_oldest_and_off_hands_back_all() {
        let mut c = ReuseCache::new(2);
        assert!(c.put(range(1 << 21, MIB), 2 * MIB, Fence::none()).is_none());
        assert!(c.put(range(2 << 21, MIB), 2 * MIB, Fence::none()).is_none());
        let out = c.put(range(3 << 21, MIB), 2 * MIB, Fence::none());
        assert_eq!(out.map(|(r, _)| r.addr), Some(1 << 21));
        assert_eq!(c.bytes(), 4 * MIB);
        assert!(c.holds(3 << 21) && !c.holds(1 << 21));
        let drained: Vec<u64> = c.drain().iter().map(|(r, _)| r.addr).collect();
        assert_eq!(drained, vec![2 << 21, 3 << 21]);
        assert!(c.is_empty() && c.bytes() == 0);

        let mut off = ReuseCache::new(0);
        let out = off.put(range(5 << 21, MIB), 2 * MIB, Fence::none());
        assert_eq!(out.map(|(r, _)| r.addr), Some(5 << 21));
        assert!(off.is_empty());
    }

    #[test]
    fn fences_keep_other_streams_out_until_their_event() {
        let mut c = ReuseCache::new(4);
        let mut progress = Progress::new();
        // Freed on stream 7 as its free number 3.
        c.put(range(0x4000, MIB), 2 * MIB, Fence::single(7, 3));
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert_eq!(c.take(2 * MIB, &other), None, "stream 8 must wait");
        assert_eq!(c.pending_bytes(&progress), 2 * MIB);
        let own = Requester {
            stream: 7,
            progress: &progress,
        };
        assert!(
            c.take(2 * MIB, &own).is_some(),
            "the freeing stream reuses at once"
        );

        c.put(range(0x4000, MIB), 2 * MIB, Fence::single(7, 3));
        progress.advance(7, 3);
        assert_eq!(c.pending_bytes(&progress), 0);
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert!(
            c.take(2 * MIB, &other).is_some(),
            "after the event anyone may"
        );
    }
}
