//! `PrivatePools`: memory that belongs to CUDA graphs (and
//! `torch.cuda.MemPool`s) until they are destroyed, and the allocation
//! windows that route requests to them.
//!
//! Rules (what PyTorch's own allocator promises graph users):
//! - **windows**: between `begin(id)` and `end(id)` the caller routes the
//!   requests of the captured streams to pool `id`; while any window is
//!   open a capture may be under way, so the pool records and queries no
//!   event (a captured event fails every later query);
//! - **ownership**: a block allocated in pool `id` stays the pool's when it
//!   is freed: it goes to the store of its stream and only pool `id`'s later
//!   requests on that stream reuse it, so a replay never finds its memory
//!   used by eager code;
//! - **use count**: `begin` and `incref` add a user, `release` removes one
//!   (a graph reset, a `MemPool` deleted). A pool with no user is
//!   *freeable*: its free memory goes back to the general pool (after the
//!   device is synchronised, since a replay may still run), and blocks still
//!   allocated from it go back when they are freed.
//!
//! Concurrency: not synchronised; the pool keeps it behind its own lock.

use std::collections::HashMap;

use super::block::{Block, Origin, PoolId};
use super::event::StreamId;
use super::split::SplitCache;
use crate::{DeviceRange, Fence, Progress, Requester};

/// Free memory of one private pool on one stream.
#[derive(Debug)]
struct Store {
    /// Chunks carved into pieces for small requests.
    split: SplitCache,
    /// Free large blocks, each behind the fence of the streams other than
    /// the store's own that used it.
    large: Vec<(Block, Fence)>,
}

/// One private pool.
#[derive(Debug)]
struct PrivatePool {
    /// Users: open windows, graphs and `MemPool`s holding it.
    use_count: u32,
    /// Blocks allocated from it and not yet freed.
    live: usize,
    stores: HashMap<StreamId, Store>,
}

/// A large free block may serve a request only if it wastes no more than
/// the request itself (capacity at most twice the need).
const MAX_LARGE_WASTE_FACTOR: u64 = 2;

/// Every private pool of one device and the open windows.
#[derive(Debug)]
pub struct PrivatePools {
    chunk_bytes: u64,
    pools: HashMap<PoolId, PrivatePool>,
    /// Open allocation windows, in the order they were opened.
    windows: Vec<PoolId>,
}

impl PrivatePools {
    /// No pools; split caches of `chunk_bytes` chunks.
    pub fn new(chunk_bytes: u64) -> PrivatePools {
        PrivatePools {
            chunk_bytes,
            pools: HashMap::new(),
            windows: Vec::new(),
        }
    }

    fn pool_mut(&mut self, id: PoolId) -> &mut PrivatePool {
        self.pools.entry(id).or_insert_with(|| PrivatePool {
            use_count: 0,
            live: 0,
            stores: HashMap::new(),
        })
    }

    /// Adds a user to pool `id`, making it if needed.
    pub fn incref(&mut self, id: PoolId) {
        self.pool_mut(id).use_count += 1;
    }

    /// Opens a window on pool `id` (and adds a user, as PyTorch's allocator
    /// does). Refused if a window on `id` is open already.
    pub fn begin(&mut self, id: PoolId) -> Result<(), String> {
        if self.windows.contains(&id) {
            return Err(format!(
                "already allocating to private pool ({}, {})",
                id.0, id.1
            ));
        }
        self.incref(id);
        self.windows.push(id);
        Ok(())
    }

    /// Closes the window on pool `id`. Refused if none is open.
    pub fn end(&mut self, id: PoolId) -> Result<(), String> {
        let i =
            self.windows.iter().position(|&w| w == id).ok_or_else(|| {
                format!("no allocation window on private pool ({}, {})", id.0, id.1)
            })?;
        self.windows.remove(i);
        Ok(())
    }

    /// Removes a user of pool `id`; true if it has none left (freeable).
    /// Refused for a pool with no user.
    pub fn release(&mut self, id: PoolId) -> Result<bool, String> {
        let pool = self
            .pools
            .get_mut(&id)
            .filter(|p| p.use_count > 0)
            .ok_or_else(|| format!("private pool ({}, {}) has no user to release", id.0, id.1))?;
        pool.use_count -= 1;
        Ok(pool.use_count == 0)
    }

    /// Users of pool `id` (0 for an unknown pool).
    pub fn use_count(&self, id: PoolId) -> u32 {
        self.pools.get(&id).map_or(0, |p| p.use_count)
    }

    /// Whether a window is open (a capture may be under way).
    pub fn any_window(&self) -> bool {
        !self.windows.is_empty()
    }

    /// Whether pool `id` exists and has a user.
    pub fn is_held(&self, id: PoolId) -> bool {
        self.use_count(id) > 0
    }

    /// A free block of pool `id`'s store for `stream` that fits `size`
    /// bytes (a piece for a small request, else a large block of at least
    /// `capacity` bytes and at most twice that), marked allocated.
    pub fn take(
        &mut self,
        id: PoolId,
        stream: StreamId,
        size: u64,
        capacity: u64,
        progress: &Progress,
    ) -> Option<Block> {
        let chunk_bytes = self.chunk_bytes;
        let pool = self.pools.get_mut(&id)?;
        let store = pool.stores.get_mut(&stream)?;
        let req = Requester {
            stream: stream.0,
            progress,
        };
        let block = if size < chunk_bytes {
            let piece = store.split.take(size, &req)?;
            Block {
                addr: piece.addr,
                capacity: piece.len,
                origin: Origin::Small,
            }
        } else {
            let (i, _) = store
                .large
                .iter()
                .enumerate()
                .filter(|(_, (b, fence))| {
                    b.capacity >= capacity
                        && b.capacity <= capacity * MAX_LARGE_WASTE_FACTOR
                        && fence.admits(&req)
                })
                .min_by_key(|(_, (b, _))| b.capacity)?;
            store.large.swap_remove(i).0
        };
        pool.live += 1;
        Some(block)
    }

    /// The free block of pool `id`'s store for `stream` that starts at
    /// `addr` and holds `size` bytes (`capacity` for a large one), marked
    /// allocated: a checkpoint's allocation given back.
    pub fn take_at(
        &mut self,
        id: PoolId,
        stream: StreamId,
        addr: u64,
        size: u64,
        capacity: u64,
    ) -> Option<Block> {
        let chunk_bytes = self.chunk_bytes;
        let pool = self.pools.get_mut(&id)?;
        let store = pool.stores.get_mut(&stream)?;
        let block = if size < chunk_bytes {
            let piece = store.split.take_at(addr, size)?;
            Block {
                addr,
                capacity: piece.len,
                origin: Origin::Small,
            }
        } else {
            let i = store
                .large
                .iter()
                .position(|(b, _)| b.addr == addr && b.capacity >= capacity)?;
            store.large.swap_remove(i).0
        };
        pool.live += 1;
        Some(block)
    }

    /// Adds a chunk taken from the lake to pool `id`'s split cache for
    /// `stream`, wholly free.
    pub fn add_chunk(&mut self, id: PoolId, stream: StreamId, chunk: DeviceRange) {
        let chunk_bytes = self.chunk_bytes;
        self.store_mut(id, stream, chunk_bytes)
            .split
            .add_chunk(chunk);
    }

    fn store_mut(&mut self, id: PoolId, stream: StreamId, chunk_bytes: u64) -> &mut Store {
        self.pool_mut(id)
            .stores
            .entry(stream)
            .or_insert_with(|| Store {
                split: SplitCache::new(chunk_bytes),
                large: Vec::new(),
            })
    }

    /// Counts a block allocated from pool `id` outside [`PrivatePools::take`]
    /// (fresh from the lake).
    pub fn count_live(&mut self, id: PoolId) {
        self.pool_mut(id).live += 1;
    }

    /// Returns a block freed from pool `id` to its store for `stream`,
    /// behind `fence` (the other streams that used it).
    pub fn give_back(
        &mut self,
        id: PoolId,
        stream: StreamId,
        block: Block,
        fence: &Fence,
        progress: &Progress,
    ) {
        let chunk_bytes = self.chunk_bytes;
        let store = self.store_mut(id, stream, chunk_bytes);
        match block.origin {
            Origin::Small => {
                let piece = store.split.give_back(block.addr, fence, progress);
                debug_assert!(piece.is_some(), "piece {:#x} was in use", block.addr);
            }
            Origin::Large(_) => store.large.push((block, fence.clone())),
            Origin::Planned => debug_assert!(false, "planned blocks are never private"),
        }
        let pool = self.pools.get_mut(&id).expect("the store's pool exists");
        pool.live -= 1;
    }

    /// Whether some pool without users still holds free memory.
    pub fn has_freeable_memory(&self) -> bool {
        self.pools
            .values()
            .any(|p| p.use_count == 0 && !p.stores.is_empty())
    }

    /// Takes the free memory of every pool without users, for the caller
    /// to give back to the lake: large blocks' ranges and wholly free split
    /// chunks. Pools with nothing left are forgotten.
    pub fn drain_freeable(&mut self) -> Vec<DeviceRange> {
        let mut out = Vec::new();
        for pool in self.pools.values_mut().filter(|p| p.use_count == 0) {
            for store in pool.stores.values_mut() {
                out.extend(store.large.drain(..).filter_map(|(b, _)| match b.origin {
                    Origin::Large(range) => Some(range),
                    Origin::Small | Origin::Planned => None,
                }));
                // Fences no longer matter: the caller waits for the device.
                let chunks = store.split.take_empty_chunks(0);
                out.extend(chunks.into_iter().map(|(range, _)| range));
            }
            pool.stores.retain(|_, s| s.split.chunk_count() > 0);
        }
        self.pools
            .retain(|_, p| p.use_count > 0 || p.live > 0 || !p.stores.is_empty());
        out
    }

    /// Free bytes held by private pools (pieces and large blocks).
    pub fn free_bytes(&self) -> u64 {
        self.stores()
            .map(|s| s.split.free_bytes() + s.large.iter().map(|(b, _)| b.capacity).sum::<u64>())
            .sum()
    }

    /// Merges free pieces kept apart by fences that `progress` now settles.
    pub fn settle(&mut self, progress: &Progress) {
        for pool in self.pools.values_mut() {
            for store in pool.stores.values_mut() {
                store.split.settle(progress);
            }
        }
    }

    /// Chunks held by private pools' split caches.
    pub fn split_chunks(&self) -> usize {
        self.stores().map(|s| s.split.chunk_count()).sum()
    }

    fn stores(&self) -> impl Iterator<Item = &Store> {
        self.pools.values().flat_map(|p| p.stores.values())
    }

    /// Private pools that exist (held, or holding memory).
    pub fn count(&self) -> usize {
        self.pools.len()
    }

    /// Checks every store's split cache; the first broken rule, in words.
    pub fn check(&self) -> Result<(), String> {
        self.stores().try_for_each(|s| s.split.check())
    }
}
