//! `CachingPool`: a best-fit caching allocator over the same VMM driver as
//! the lake, the baseline the lake is measured against (issue 13: "on the
//! periodic trace, the lake's fragmentation under 5% where a best-fit
//! caching pool on the same chunks shows over 20%").
//!
//! It works like a classic caching allocator (PyTorch's large pool):
//! - a request is rounded up to [`MIN_BLOCK`] bytes and served from the
//!   smallest free cached block that fits (best fit), split when the rest
//!   is at least [`MIN_BLOCK`] bytes;
//! - when no free block fits, a new **segment** is made: one virtual
//!   reservation of the request rounded up to whole chunks, each chunk
//!   created and mapped in it, access granted once;
//! - a free marks its block free and merges it with its free neighbours in
//!   the same segment; nothing is unmapped, remapped or stitched, and
//!   blocks of two segments never merge, even when their reservations
//!   happen to be adjacent;
//! - memory goes back to the driver only when a new segment would pass the
//!   limit (or the driver is out of memory): then every wholly free
//!   segment is released and the request tried once more, as PyTorch does
//!   before it reports out of memory; and at drop.
//!
//! Live bytes are counted as requested and reserved bytes as mapped, as
//! the lake counts them ([`super::LakeStats::fragmentation`]).
//!
//! Concurrency: one mutex guards all state; every public call takes it once
//! and makes its driver calls while holding it.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, MutexGuard};

use super::driver::{ChunkHandle, DriverCounters, VmmDriver};
use super::error::{LakeError, LakeResult};
use super::pool::DeviceRange;

/// Requests are rounded up to this many bytes (PyTorch's `kMinBlockSize`),
/// and a block is split only when the rest is at least this large.
pub const MIN_BLOCK: u64 = 512;

/// One reservation with its chunks mapped back to back.
struct Segment {
    size: u64,
    chunks: Vec<ChunkHandle>,
}

/// A piece of a segment, free or handed out.
#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    /// Base address of the segment it lies in.
    segment: u64,
    /// Bytes asked for; `None` when the block is free.
    asked: Option<u64>,
}

/// Everything behind the pool's mutex.
#[derive(Default)]
struct State {
    /// Segments by base address.
    segments: BTreeMap<u64, Segment>,
    /// Every block, free or not, by address.
    blocks: BTreeMap<u64, Block>,
    /// Free blocks as (size, address): the best fit is the first at or
    /// after (asked, 0).
    free: BTreeSet<(u64, u64)>,
    live_bytes: u64,
    peak_live: u64,
    reserved: u64,
    peak_reserved: u64,
    segments_made: u64,
    segments_released: u64,
    allocs: u64,
    frees: u64,
}

/// A snapshot of a [`CachingPool`].
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CachingStats {
    /// Bytes of live blocks, as requested.
    pub live_bytes: u64,
    /// Bytes mapped in segments.
    pub reserved_bytes: u64,
    /// Highest `live_bytes` seen.
    pub peak_live_bytes: u64,
    /// Highest `reserved_bytes` seen.
    pub peak_reserved_bytes: u64,
    /// Segments held now.
    pub segments: u64,
    /// Segments ever made.
    pub segments_made: u64,
    /// Segments released to make room under the limit.
    pub segments_released: u64,
    /// Free cached blocks.
    pub free_blocks: u64,
    /// Largest free cached block, in bytes.
    pub largest_free_bytes: u64,
    /// Allocations served.
    pub allocs: u64,
    /// Frees done.
    pub frees: u64,
    /// Driver calls made and time spent in them.
    pub driver: DriverCounters,
}

impl CachingStats {
    /// 1 − peak live / peak reserved (0 before anything was reserved): the
    /// lake's measure ([`super::LakeStats::fragmentation`]) and GMLake's
    /// fragmentation ratio.
    pub fn fragmentation(&self) -> f64 {
        match self.peak_reserved_bytes {
            0 => 0.0,
            r => 1.0 - self.peak_live_bytes as f64 / r as f64,
        }
    }
}

/// A best-fit caching allocator of contiguous device ranges.
pub struct CachingPool<D: VmmDriver> {
    driver: D,
    limit: u64,
    state: Mutex<State>,
}

impl<D: VmmDriver> CachingPool<D> {
    /// A pool mapping at most `limit_bytes` (rounded down to whole chunks).
    pub fn new(driver: D, limit_bytes: u64) -> CachingPool<D> {
        let g = driver.granularity();
        CachingPool {
            driver,
            limit: limit_bytes / g * g,
            state: Mutex::new(State::default()),
        }
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.driver
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every call leaves the state consistent before anything can panic.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `size` bytes as one contiguous device range.
    pub fn alloc(&self, size: u64) -> LakeResult<DeviceRange> {
        if size == 0 {
            return Err(LakeError::ZeroSize);
        }
        let rounded = size.next_multiple_of(MIN_BLOCK);
        let mut s = self.state();
        let (block_size, addr) = match s.free.range((rounded, 0)..).next() {
            Some(&fit) => fit,
            None => self.new_segment(&mut s, rounded)?,
        };
        s.free.remove(&(block_size, addr));
        let segment = s.blocks[&addr].segment;
        let rest = block_size - rounded;
        let taken = if rest >= MIN_BLOCK {
            let tail = addr + rounded;
            s.blocks.insert(
                tail,
                Block {
                    size: rest,
                    segment,
                    asked: None,
                },
            );
            s.free.insert((rest, tail));
            rounded
        } else {
            block_size
        };
        s.blocks.insert(
            addr,
            Block {
                size: taken,
                segment,
                asked: Some(size),
            },
        );
        s.allocs += 1;
        s.live_bytes += size;
        s.peak_live = s.peak_live.max(s.live_bytes);
        Ok(DeviceRange { addr, len: size })
    }

    /// Frees a range from [`CachingPool::alloc`]: its block is cached, merged
    /// with its free neighbours in the segment (no driver call).
    pub fn free(&self, range: DeviceRange) -> LakeResult<()> {
        let mut s = self.state();
        let Some(&block) = s.blocks.get(&range.addr) else {
            return Err(LakeError::NotOurs {
                addr: range.addr,
                len: range.len,
                why: "no block of the caching pool starts there",
            });
        };
        let Some(asked) = block.asked else {
            return Err(LakeError::DoubleFree { addr: range.addr });
        };
        if asked != range.len {
            return Err(LakeError::NotOurs {
                addr: range.addr,
                len: range.len,
                why: "the block there was allocated with another length",
            });
        }
        s.frees += 1;
        s.live_bytes -= asked;
        let (mut start, mut size) = (range.addr, block.size);
        let next = start + size;
        if let Some(&n) = s.blocks.get(&next)
            && n.segment == block.segment
            && n.asked.is_none()
        {
            s.blocks.remove(&next);
            s.free.remove(&(n.size, next));
            size += n.size;
        }
        if let Some((&p_addr, &p)) = s.blocks.range(..start).next_back()
            && p.segment == block.segment
            && p.asked.is_none()
        {
            debug_assert_eq!(p_addr + p.size, start, "blocks tile their segment");
            s.blocks.remove(&start);
            s.free.remove(&(p.size, p_addr));
            start = p_addr;
            size += p.size;
        }
        s.blocks.insert(
            start,
            Block {
                size,
                segment: block.segment,
                asked: None,
            },
        );
        s.free.insert((size, start));
        Ok(())
    }

    /// Makes a segment for a request of `rounded` bytes and returns its one
    /// free block; when it would pass the limit or the driver is out of
    /// memory, first releases every wholly free segment and tries again.
    fn new_segment(&self, s: &mut State, rounded: u64) -> LakeResult<(u64, u64)> {
        let g = self.driver.granularity();
        let bytes = rounded.next_multiple_of(g);
        let mut released = false;
        loop {
            let over = s.reserved + bytes > self.limit;
            let made = if over {
                None
            } else {
                match self.map_segment(bytes) {
                    Ok(made) => Some(made),
                    Err(e) if e.is_out_of_memory() && !released => None,
                    Err(e) => return Err(e),
                }
            };
            if let Some((addr, chunks)) = made {
                s.segments.insert(
                    addr,
                    Segment {
                        size: bytes,
                        chunks,
                    },
                );
                s.blocks.insert(
                    addr,
                    Block {
                        size: bytes,
                        segment: addr,
                        asked: None,
                    },
                );
                s.free.insert((bytes, addr));
                s.segments_made += 1;
                s.reserved += bytes;
                s.peak_reserved = s.peak_reserved.max(s.reserved);
                return Ok((bytes, addr));
            }
            if released {
                return Err(LakeError::OutOfMemory {
                    asked: rounded,
                    reserved: s.reserved,
                    active: s.live_bytes,
                    limit: self.limit,
                    largest_free: s.free.last().map_or(0, |&(size, _)| size),
                });
            }
            self.release_free_segments(s);
            released = true;
        }
    }

    /// Reserves `bytes` and maps new chunks over all of it; on a failure,
    /// undoes what was done.
    fn map_segment(&self, bytes: u64) -> LakeResult<(u64, Vec<ChunkHandle>)> {
        let g = self.driver.granularity();
        let addr = self.driver.reserve(bytes)?;
        let mut chunks = Vec::with_capacity((bytes / g) as usize);
        let mapped = (|| {
            for i in 0..bytes / g {
                let chunk = self.driver.create()?;
                if let Err(e) = self.driver.map(addr + i * g, chunk) {
                    let _ = self.driver.release(chunk);
                    return Err(e);
                }
                chunks.push(chunk);
            }
            self.driver.set_access(addr, bytes)
        })();
        match mapped {
            Ok(()) => Ok((addr, chunks)),
            Err(e) => {
                // Rollback: errors here leave the driver holding what it
                // refused; the first failure is the one reported.
                self.unmap_segment(addr, bytes, &chunks);
                Err(e.into())
            }
        }
    }

    /// Unmaps and releases a segment's chunks and frees its reservation,
    /// ignoring failures (the driver keeps what it refused).
    fn unmap_segment(&self, addr: u64, size: u64, chunks: &[ChunkHandle]) {
        let g = self.driver.granularity();
        for (i, &chunk) in chunks.iter().enumerate() {
            let _ = self.driver.unmap(addr + i as u64 * g);
            let _ = self.driver.release(chunk);
        }
        let _ = self.driver.free_address(addr, size);
    }

    /// Gives every segment that is one free block back to the driver.
    fn release_free_segments(&self, s: &mut State) {
        let empty: Vec<u64> = s
            .segments
            .iter()
            .filter(|&(addr, seg)| {
                s.blocks
                    .get(addr)
                    .is_some_and(|b| b.asked.is_none() && b.size == seg.size)
            })
            .map(|(&addr, _)| addr)
            .collect();
        for addr in empty {
            let seg = s.segments.remove(&addr).expect("listed above");
            s.blocks.remove(&addr);
            s.free.remove(&(seg.size, addr));
            self.unmap_segment(addr, seg.size, &seg.chunks);
            s.reserved -= seg.size;
            s.segments_released += 1;
        }
    }

    /// A snapshot of the pool.
    pub fn stats(&self) -> CachingStats {
        let s = self.state();
        CachingStats {
            live_bytes: s.live_bytes,
            reserved_bytes: s.reserved,
            peak_live_bytes: s.peak_live,
            peak_reserved_bytes: s.peak_reserved,
            segments: s.segments.len() as u64,
            segments_made: s.segments_made,
            segments_released: s.segments_released,
            free_blocks: s.free.len() as u64,
            largest_free_bytes: s.free.last().map_or(0, |&(size, _)| size),
            allocs: s.allocs,
            frees: s.frees,
            driver: self.driver.counters(),
        }
    }

    /// Checks the pool's invariants (for tests): the blocks of each segment
    /// tile it exactly, no two free blocks of a segment are neighbours, the
    /// best-fit index lists exactly the free blocks, and the byte counts
    /// add up.
    pub fn check(&self) -> Result<(), String> {
        let s = self.state();
        let mut live = 0;
        let mut reserved = 0;
        for (&base, seg) in &s.segments {
            reserved += seg.size;
            let mut at = base;
            let mut last_free = false;
            for (&addr, b) in s.blocks.range(base..base + seg.size) {
                if addr != at {
                    return Err(format!("segment {base:#x}: gap or overlap at {addr:#x}"));
                }
                if b.segment != base {
                    return Err(format!("block {addr:#x} names segment {:#x}", b.segment));
                }
                let free = b.asked.is_none();
                if free && last_free {
                    return Err(format!("free block {addr:#x} follows a free block"));
                }
                if free != s.free.contains(&(b.size, addr)) {
                    return Err(format!("block {addr:#x}: best-fit index disagrees"));
                }
                if let Some(asked) = b.asked {
                    if asked > b.size {
                        return Err(format!("block {addr:#x} smaller than asked"));
                    }
                    live += asked;
                }
                last_free = free;
                at = addr + b.size;
            }
            if at != base + seg.size {
                return Err(format!("segment {base:#x}: blocks end at {at:#x}"));
            }
        }
        let in_segments: usize = s
            .segments
            .iter()
            .map(|(&b, seg)| s.blocks.range(b..b + seg.size).count())
            .sum();
        if in_segments != s.blocks.len() {
            return Err("a block lies outside every segment".into());
        }
        let free_blocks = s.blocks.values().filter(|b| b.asked.is_none()).count();
        if free_blocks != s.free.len() {
            return Err("the best-fit index lists blocks that are not free".into());
        }
        if (live, reserved) != (s.live_bytes, s.reserved) {
            return Err(format!(
                "counted {live} live and {reserved} reserved bytes, recorded {} and {}",
                s.live_bytes, s.reserved
            ));
        }
        Ok(())
    }
}

impl<D: VmmDriver> Drop for CachingPool<D> {
    fn drop(&mut self) {
        // Everything goes back to the driver, live blocks included: their
        // users must be done with them once the pool is gone.
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let segments = std::mem::take(&mut s.segments);
        for (addr, seg) in segments {
            self.unmap_segment(addr, seg.size, &seg.chunks);
        }
    }
}
