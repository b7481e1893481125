//! The reuse cache: blocks of the general pool freed recently (split-cache
//! pieces and large lake blocks), kept whole so that the next request of
//! the same rounded size takes one back with no split-cache or lake work.
//!
//! Training asks for the same sizes over and over (each layer's
//! activations, each step's gradients), and most frees are followed, soon,
//! by a request of a size just freed. Through the split cache or the lake
//! each such pair walks their B-trees (free index, per-chunk pieces, run
//! index, per-view runs): a few cold nodes each, 1.2–1.8 µs per call when
//! PyTorch has evicted them between two calls. Through this cache it is one
//! probe of a small hash map and the top of a short list: a few cache
//! lines. What the cache holds is reserved but idle, so it must never make
//! the pool reserve more: the pool empties it whole (small pieces back
//! into the split cache, large blocks into the lake) before the lake would
//! do anything but hand out a window of free chunks it already holds
//! (patch, stitch, grow, or report out of memory), when memory runs short
//! and on `empty_cache`. Whole, not in part: a lake that patches or
//! stitches while some blocks are still withheld lays the next steps out
//! around them and stitches again at every step (measured on the GPT-2
//! trace, `docs/PERF.md`, "Reuse cache for every size").
//!
//! Rules:
//! - an entry is a [`Block`] as the general pool handed it out (a piece of
//!   the general split cache, or a lake range), keyed by its capacity (the
//!   piece length, or the range rounded up to whole chunks), with the
//!   fence of its free: a request on stream T takes it only if the fence
//!   admits T (the stream rule, `lake/fence.rs`; on one stream, always);
//! - a request takes the newest admitted entry of exactly its capacity
//!   (last in, first out per capacity), so a block never serves a request
//!   it would round differently and the rounding statistics stay those of
//!   the split cache and the lake;
//! - only the general pool's blocks enter: private pools (CUDA graphs)
//!   keep their own stores, planned blocks their arena; and no large block
//!   over [`MAX_BLOCK_CHUNKS`] chunks;
//! - at most `max_entries` entries; a put beyond that is refused (the
//!   block goes home as if the cache were off), so a put never walks the
//!   cache. What is kept stays until a request takes it or the pool
//!   empties the cache.
//!
//! Concurrency: a plain value; the pool keeps it behind its mutex.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;

use super::block::{Block, Origin};
use crate::{AddrHasher, Fence, Progress, Requester};

/// Entries kept by default in `lake`: none (the cache is off, so the
/// pool's own tests see the split cache and the lake alone). `torch-alloc`
/// turns it on with [`SUGGESTED_ENTRIES`] (`docs/PERF.md`, "Reuse cache
/// for every size").
pub const DEFAULT_ENTRIES: usize = 0;

/// Entries worth keeping in training: more than the blocks a GPT-2 step
/// keeps at once (at most ~350 on the batch-16 trace, of ~1,400 requests
/// a step), few enough that emptying the cache costs well under a
/// millisecond.
pub const SUGGESTED_ENTRIES: usize = 512;

/// Large blocks of more chunks than this go to the lake, never into the
/// cache: GPT-2's logits and their gradient (1.6 and 3.2 GB at batch 16)
/// change size with the sequence length at every step, so a kept one is
/// never asked for again, and while it is withheld the lake places other
/// requests around its chunks and later stitches the next step's logits
/// (on the trace replay: ~200 driver calls per step instead of none).
pub const MAX_BLOCK_CHUNKS: u64 = 64;

/// Entries of one capacity tried for an admitting fence, newest first (on
/// one stream the newest always admits).
const SCAN_ENTRIES: usize = 8;

#[derive(Clone, Debug)]
struct Entry {
    block: Block,
    fence: Fence,
}

/// Recently freed blocks of the general pool, by capacity, newest last.
#[derive(Debug)]
pub struct ReuseCache {
    by_capacity: HashMap<u64, Vec<Entry>, BuildHasherDefault<AddrHasher>>,
    entries: usize,
    max_entries: usize,
    bytes: u64,
    hits: u64,
    returned: u64,
}

impl ReuseCache {
    /// An empty cache of at most `max_entries` blocks (0: the cache is off).
    pub fn new(max_entries: usize) -> ReuseCache {
        ReuseCache {
            by_capacity: HashMap::default(),
            entries: 0,
            max_entries,
            bytes: 0,
            hits: 0,
            returned: 0,
        }
    }

    /// Sets the bound to `max_entries` blocks; the cache must be empty
    /// (drained by the caller). The counts stay.
    pub fn set_max_entries(&mut self, max_entries: usize) {
        debug_assert!(self.is_empty(), "the bound changes on an empty cache");
        self.max_entries = max_entries;
    }

    /// Whether the cache keeps anything at all.
    pub fn is_on(&self) -> bool {
        self.max_entries > 0
    }

    /// Takes the newest block of exactly `capacity` bytes that `req` may
    /// reuse now.
    pub fn take(&mut self, capacity: u64, req: &Requester<'_>) -> Option<Block> {
        if self.entries == 0 {
            return None;
        }
        let list = self.by_capacity.get_mut(&capacity)?;
        let newest = list.len();
        let i = (newest.saturating_sub(SCAN_ENTRIES)..newest)
            .rev()
            .find(|&i| list[i].fence.admits(req))?;
        let e = list.remove(i);
        self.hits += 1;
        self.entries -= 1;
        self.bytes -= e.block.capacity;
        Some(e.block)
    }

    /// Keeps `block` (freed behind `fence`). With the cache off or full,
    /// hands it back, to go home as if there were no cache.
    pub fn put(&mut self, block: Block, fence: &Fence) -> Result<(), Block> {
        if self.entries >= self.max_entries {
            return Err(block);
        }
        debug_assert!(
            !matches!(block.origin, Origin::Planned),
            "planned blocks stay in their arena"
        );
        self.by_capacity
            .entry(block.capacity)
            .or_default()
            .push(Entry {
                block,
                fence: fence.clone(),
            });
        self.entries += 1;
        self.bytes += block.capacity;
        Ok(())
    }

    /// Empties the cache: every block with its fence. Lists of capacities
    /// no longer held are dropped when they outnumber the entries allowed
    /// (sizes that vary from step to step would otherwise pile them up).
    pub fn drain(&mut self) -> Vec<(Block, Fence)> {
        let mut out = Vec::with_capacity(self.entries);
        if self.entries > 0 {
            for list in self.by_capacity.values_mut() {
                out.extend(list.drain(..).map(|e| (e.block, e.fence)));
            }
        }
        if self.by_capacity.len() > self.max_entries {
            self.by_capacity.clear();
        }
        self.returned += out.len() as u64;
        self.entries = 0;
        self.bytes = 0;
        out
    }

    /// Requests served, and blocks handed back home (since creation).
    pub fn counts(&self) -> (u64, u64) {
        (self.hits, self.returned)
    }

    /// Whether the cache holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.entries
    }

    /// Bytes held (whole pieces and whole chunks).
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    fn iter(&self) -> impl Iterator<Item = &Entry> {
        self.by_capacity.values().flatten()
    }

    /// Bytes held whose fence still waits for an event on some stream.
    pub fn pending_bytes(&self, progress: &Progress) -> u64 {
        self.iter()
            .filter(|e| e.fence.pending(progress))
            .map(|e| e.block.capacity)
            .sum()
    }

    /// The largest block held.
    pub fn largest(&self) -> u64 {
        self.iter().map(|e| e.block.capacity).max().unwrap_or(0)
    }

    /// Whether `addr` starts a block held.
    pub fn holds(&self, addr: u64) -> bool {
        self.iter().any(|e| e.block.addr == addr)
    }

    /// The blocks held (for the pool's `check`).
    pub fn blocks(&self) -> impl Iterator<Item = &Block> {
        self.iter().map(|e| &e.block)
    }

    /// Checks the counts against the lists and every entry's key; the
    /// first broken rule, in words.
    pub fn check(&self) -> Result<(), String> {
        let mut entries = 0;
        let mut bytes = 0;
        for (&capacity, list) in &self.by_capacity {
            for e in list {
                if e.block.capacity != capacity {
                    return Err(format!(
                        "reuse cache: block {:#x} of {} bytes kept under {capacity}",
                        e.block.addr, e.block.capacity
                    ));
                }
                entries += 1;
                bytes += capacity;
            }
        }
        if (entries, bytes) != (self.entries, self.bytes) {
            return Err(format!(
                "reuse cache: counts {} blocks, {} bytes; holds {entries}, {bytes}",
                self.entries, self.bytes
            ));
        }
        if entries > self.max_entries {
            return Err(format!(
                "reuse cache: {entries} blocks over its bound {}",
                self.max_entries
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DeviceRange;

    const MIB: u64 = 1 << 20;

    fn large(addr: u64, len: u64, capacity: u64) -> Block {
        Block {
            addr,
            capacity,
            origin: Origin::Large(DeviceRange { addr, len }),
        }
    }

    fn small(addr: u64, len: u64) -> Block {
        Block {
            addr,
            capacity: len,
            origin: Origin::Small,
        }
    }

    #[test]
    fn takes_newest_of_exact_capacity() {
        let mut c = ReuseCache::new(4);
        let req = Requester::unfenced();
        let none = Fence::none();
        assert!(c.put(large(0x1000, 3 * MIB, 4 * MIB), &none).is_ok());
        assert!(c.put(large(0x9000, 4 * MIB, 4 * MIB), &none).is_ok());
        assert!(c.put(small(0x20000, 1024), &none).is_ok());
        assert_eq!(c.bytes(), 8 * MIB + 1024);
        assert_eq!(c.take(2 * MIB, &req), None, "no block of that capacity");
        assert_eq!(c.take(512, &req), None, "a piece serves only its length");
        assert_eq!(c.take(4 * MIB, &req).map(|b| b.addr), Some(0x9000));
        assert_eq!(c.take(4 * MIB, &req).map(|b| b.addr), Some(0x1000));
        assert_eq!(c.take(4 * MIB, &req), None);
        assert_eq!(c.take(1024, &req), Some(small(0x20000, 1024)));
        assert!(c.is_empty() && c.bytes() == 0);
        c.check().unwrap();
    }

    #[test]
    fn full_cache_refuses_and_off_refuses_all() {
        let mut c = ReuseCache::new(2);
        let none = Fence::none();
        assert!(c.put(small(1 << 21, 512), &none).is_ok());
        assert!(c.put(small(2 << 21, 512), &none).is_ok());
        assert_eq!(c.put(small(3 << 21, 512), &none), Err(small(3 << 21, 512)));
        assert_eq!(c.len(), 2);
        assert!(c.holds(2 << 21) && !c.holds(3 << 21));
        let mut drained: Vec<u64> = c.drain().iter().map(|(b, _)| b.addr).collect();
        drained.sort_unstable();
        assert_eq!(drained, vec![1 << 21, 2 << 21]);
        assert!(c.is_empty() && c.bytes() == 0);
        c.check().unwrap();

        let mut off = ReuseCache::new(0);
        assert!(!off.is_on());
        assert_eq!(
            off.put(small(5 << 21, 512), &none),
            Err(small(5 << 21, 512))
        );
        assert!(off.is_empty());
    }

    #[test]
    fn fences_keep_other_streams_out_until_their_event() {
        let mut c = ReuseCache::new(4);
        let mut progress = Progress::new();
        // Freed on stream 7 as its free number 3.
        c.put(small(0x4000, 2048), &Fence::single(7, 3)).unwrap();
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert_eq!(c.take(2048, &other), None, "stream 8 must wait");
        assert_eq!(c.pending_bytes(&progress), 2048);
        let own = Requester {
            stream: 7,
            progress: &progress,
        };
        assert!(
            c.take(2048, &own).is_some(),
            "the freeing stream reuses at once"
        );

        c.put(small(0x4000, 2048), &Fence::single(7, 3)).unwrap();
        progress.advance(7, 3);
        assert_eq!(c.pending_bytes(&progress), 0);
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert!(c.take(2048, &other).is_some(), "after the event anyone may");
    }

    #[test]
    fn an_older_admitted_entry_serves_when_the_newest_waits() {
        let mut c = ReuseCache::new(4);
        let progress = Progress::new();
        c.put(small(0x1000, 512), &Fence::none()).unwrap();
        c.put(small(0x2000, 512), &Fence::single(7, 1)).unwrap();
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert_eq!(c.take(512, &other).map(|b| b.addr), Some(0x1000));
        assert_eq!(c.take(512, &other), None);
        assert_eq!(c.len(), 1);
        c.check().unwrap();
    }

    #[test]
    fn drain_drops_lists_of_sizes_gone_when_they_pile_up() {
        let mut c = ReuseCache::new(2);
        let req = Requester::unfenced();
        for i in 1..=5u64 {
            c.put(small(i << 21, i * 512), &Fence::none()).unwrap();
            assert!(c.take(i * 512, &req).is_some());
        }
        assert_eq!(c.by_capacity.len(), 5, "empty lists kept until a drain");
        assert!(c.drain().is_empty());
        assert_eq!(c.by_capacity.len(), 0);
    }
}
