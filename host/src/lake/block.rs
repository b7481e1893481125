//! The lake's blocks and the driver work that makes and unmakes them:
//! chunks, primitive blocks (pBlocks), stitched blocks (sBlocks) and the
//! virtual reservations they live in. No policy here (that is `pool.rs`):
//! this file keeps the tables consistent and undoes half-done driver work.
//!
//! - A **chunk** is one granule of physical memory (`cuMemCreate`). It is
//!   mapped once at its *home* address, inside the reservation made when it
//!   was created, and stays there until it is released.
//! - A **pBlock** is a run of chunks at consecutive home addresses: its
//!   range is primitive (no extra mapping). Splitting a pBlock cuts the run
//!   in two; no driver call is needed, the chunks stay where they are.
//!   pBlocks never merge, so every sBlock always covers whole pBlocks.
//! - An **sBlock** is its own reservation with the chunks of several pBlocks
//!   mapped back to back. It is *available* when none of its pBlocks is in
//!   use; while cached and inactive its chunks may serve other allocations.
//!
//! Concurrency: none of its own; it lives inside the lake's state mutex and
//! every method runs under that lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::driver::{ChunkHandle, VmmDriver, VmmResult};

/// Index of a chunk in [`Blocks`].
pub type ChunkId = u64;
/// Index of a primitive block.
pub type PId = u64;
/// Index of a stitched block.
pub type SId = u64;

/// One physical chunk.
#[derive(Debug)]
pub struct Chunk {
    /// The driver's handle.
    pub handle: ChunkHandle,
    /// Where it is mapped in its home reservation.
    pub home: u64,
    /// The home reservation's start.
    pub reservation: u64,
    /// The pBlock it belongs to now.
    pub pblock: PId,
}

/// A primitive block: chunks at consecutive home addresses.
#[derive(Debug)]
pub struct PBlock {
    /// Home address of the first chunk.
    pub addr: u64,
    /// Its chunks, in address order.
    pub chunks: Vec<ChunkId>,
    /// Whether an allocation uses it (directly or through an sBlock).
    pub in_use: bool,
}

/// A stitched block: a reservation of its own mapping chunks back to back.
#[derive(Debug)]
pub struct SBlock {
    /// Start of its reservation.
    pub addr: u64,
    /// Its chunks, in address order.
    pub chunks: Vec<ChunkId>,
    /// Whether an allocation is this sBlock.
    pub active: bool,
    /// Lake clock at its last allocation (for the LRU sweep).
    pub last_used: u64,
}

/// A virtual reservation holding chunks' home mappings.
#[derive(Debug)]
struct Reservation {
    size: u64,
    /// Chunks homed here that are still live.
    homed: usize,
}

/// Driver resources that could not be returned when asked (a release or
/// address free failed after the mapping was gone). Kept and retried on the
/// next [`Blocks::retry_orphans`], so nothing is lost.
#[derive(Debug, Default)]
struct Orphans {
    chunks: Vec<ChunkHandle>,
    reservations: Vec<(u64, u64)>,
}

/// All blocks of a lake.
#[derive(Debug, Default)]
pub struct Blocks {
    granularity: u64,
    chunks: HashMap<ChunkId, Chunk>,
    pblocks: HashMap<PId, PBlock>,
    sblocks: HashMap<SId, SBlock>,
    /// Free pBlocks by (chunk count, id): the best-fit index.
    free: BTreeSet<(usize, PId)>,
    /// sBlocks by chunk count.
    by_size: BTreeMap<usize, BTreeSet<SId>>,
    /// Reservations of chunk homes, by start.
    reservations: HashMap<u64, Reservation>,
    orphans: Orphans,
    next_id: u64,
}

/// Unmaps the granules at `addrs` (all mapped by us), best effort: used only
/// to undo work after an earlier failure, whose error is the one reported.
fn undo_maps(driver: &dyn VmmDriver, addrs: impl Iterator<Item = u64>) -> usize {
    addrs.filter(|&a| driver.unmap(a).is_err()).count()
}

impl Blocks {
    /// Empty tables for chunks of `granularity` bytes.
    pub fn new(granularity: u64) -> Blocks {
        Blocks {
            granularity,
            next_id: 1,
            ..Blocks::default()
        }
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Live chunks, the ones an orphaned release still holds included.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len() + self.orphans.chunks.len()
    }

    /// A pBlock.
    pub fn pblock(&self, id: PId) -> &PBlock {
        &self.pblocks[&id]
    }

    /// An sBlock.
    pub fn sblock(&self, id: SId) -> &SBlock {
        &self.sblocks[&id]
    }

    /// A chunk.
    pub fn chunk(&self, id: ChunkId) -> &Chunk {
        &self.chunks[&id]
    }

    /// All sBlocks.
    pub fn sblocks(&self) -> impl Iterator<Item = (SId, &SBlock)> {
        self.sblocks.iter().map(|(&id, s)| (id, s))
    }

    /// All pBlocks.
    pub fn pblocks(&self) -> impl Iterator<Item = (PId, &PBlock)> {
        self.pblocks.iter().map(|(&id, p)| (id, p))
    }

    /// Free pBlocks as (chunk count, id), smallest first.
    pub fn free_pblocks(&self) -> impl DoubleEndedIterator<Item = (usize, PId)> + '_ {
        self.free.iter().copied()
    }

    /// The smallest free pBlock of at least `n` chunks and at least
    /// `min_chunks`.
    pub fn smallest_free_at_least(&self, n: usize, min_chunks: usize) -> Option<(usize, PId)> {
        self.free.range((n.max(min_chunks), 0)..).next().copied()
    }

    /// sBlocks of exactly `n` chunks.
    pub fn sblocks_of(&self, n: usize) -> impl Iterator<Item = SId> + '_ {
        self.by_size.get(&n).into_iter().flatten().copied()
    }

    /// The distinct pBlocks under a list of chunks.
    pub fn pblocks_under(&self, chunks: &[ChunkId]) -> BTreeSet<PId> {
        chunks.iter().map(|c| self.chunks[c].pblock).collect()
    }

    /// Whether an sBlock could be allocated now: inactive, and none of its
    /// pBlocks in use.
    pub fn sblock_available(&self, id: SId) -> bool {
        let s = &self.sblocks[&id];
        !s.active
            && s.chunks
                .iter()
                .all(|c| !self.pblocks[&self.chunks[c].pblock].in_use)
    }

    /// Marks a pBlock used or free, keeping the free index.
    pub fn set_in_use(&mut self, id: PId, in_use: bool) {
        let p = self.pblocks.get_mut(&id).expect("live pBlock");
        debug_assert_ne!(p.in_use, in_use, "pBlock {id} use flag set twice");
        p.in_use = in_use;
        let key = (p.chunks.len(), id);
        if in_use {
            self.free.remove(&key);
        } else {
            self.free.insert(key);
        }
    }

    /// Marks an sBlock active (with its pBlocks in use) or inactive.
    pub fn set_sblock_active(&mut self, id: SId, active: bool, clock: u64) {
        let chunks = {
            let s = self.sblocks.get_mut(&id).expect("live sBlock");
            s.active = active;
            s.last_used = clock;
            s.chunks.clone()
        };
        for p in self.pblocks_under(&chunks) {
            self.set_in_use(p, active);
        }
    }

    /// Creates `n` chunks at a new reservation as one free pBlock: reserve,
    /// create and map each chunk, grant access. On failure everything made
    /// so far is undone and the driver's error returned.
    pub fn create_pblock(&mut self, driver: &dyn VmmDriver, n: usize) -> VmmResult<PId> {
        let g = self.granularity;
        let size = g * n as u64;
        let base = driver.reserve(size)?;
        let mut made: Vec<ChunkHandle> = Vec::with_capacity(n);
        let mut mapped = 0usize;
        let result = (|| {
            for i in 0..n {
                made.push(driver.create()?);
                driver.map(base + g * i as u64, made[i])?;
                mapped += 1;
            }
            driver.set_access(base, size)
        })();
        if let Err(e) = result {
            undo_maps(driver, (0..mapped).map(|i| base + g * i as u64));
            for h in made {
                if driver.release(h).is_err() {
                    self.orphans.chunks.push(h);
                }
            }
            if driver.free_address(base, size).is_err() {
                self.orphans.reservations.push((base, size));
            }
            return Err(e);
        }
        let pid = self.id();
        let mut ids = Vec::with_capacity(n);
        for (i, handle) in made.into_iter().enumerate() {
            let cid = self.id();
            let chunk = Chunk {
                handle,
                home: base + g * i as u64,
                reservation: base,
                pblock: pid,
            };
            self.chunks.insert(cid, chunk);
            ids.push(cid);
        }
        self.reservations
            .insert(base, Reservation { size, homed: n });
        self.pblocks.insert(
            pid,
            PBlock {
                addr: base,
                chunks: ids,
                in_use: false,
            },
        );
        self.free.insert((n, pid));
        Ok(pid)
    }

    /// Splits free pBlock `id` after its first `n` chunks (`0 < n < len`).
    /// `id` keeps the first `n`; the rest becomes a new free pBlock, whose id
    /// is returned. No driver call: the chunks stay mapped where they are.
    pub fn split(&mut self, id: PId, n: usize) -> PId {
        let rest_id = self.id();
        let p = self.pblocks.get_mut(&id).expect("live pBlock");
        assert!(
            !p.in_use && n > 0 && n < p.chunks.len(),
            "split of a used block or at an end"
        );
        let old_len = p.chunks.len();
        let rest = p.chunks.split_off(n);
        let rest_addr = self.chunks[&rest[0]].home;
        for c in &rest {
            self.chunks.get_mut(c).expect("live chunk").pblock = rest_id;
        }
        self.free.remove(&(old_len, id));
        self.free.insert((n, id));
        self.free.insert((rest.len(), rest_id));
        self.pblocks.insert(
            rest_id,
            PBlock {
                addr: rest_addr,
                chunks: rest,
                in_use: false,
            },
        );
        rest_id
    }

    /// Stitches the chunks of `parts` (free pBlocks), in order, into a new
    /// inactive sBlock: reserve, map each chunk, grant access. A failure
    /// halfway unmaps what was mapped and frees the reservation.
    pub fn stitch(&mut self, driver: &dyn VmmDriver, parts: &[PId], clock: u64) -> VmmResult<SId> {
        let g = self.granularity;
        let chunks: Vec<ChunkId> = parts
            .iter()
            .flat_map(|p| self.pblocks[p].chunks.iter().copied())
            .collect();
        let size = g * chunks.len() as u64;
        let base = driver.reserve(size)?;
        let mut mapped = 0usize;
        let result = (|| {
            for (i, c) in chunks.iter().enumerate() {
                driver.map(base + g * i as u64, self.chunks[c].handle)?;
                mapped += 1;
            }
            driver.set_access(base, size)
        })();
        if let Err(e) = result {
            undo_maps(driver, (0..mapped).map(|i| base + g * i as u64));
            if driver.free_address(base, size).is_err() {
                self.orphans.reservations.push((base, size));
            }
            return Err(e);
        }
        let sid = self.id();
        self.by_size.entry(chunks.len()).or_default().insert(sid);
        self.sblocks.insert(
            sid,
            SBlock {
                addr: base,
                chunks,
                active: false,
                last_used: clock,
            },
        );
        Ok(sid)
    }

    /// Unmaps an inactive sBlock and frees its reservation. If an unmap
    /// fails, the granules already unmapped are mapped again and the sBlock
    /// stays cached.
    pub fn drop_sblock(&mut self, driver: &dyn VmmDriver, id: SId) -> VmmResult<()> {
        let g = self.granularity;
        let s = &self.sblocks[&id];
        assert!(!s.active, "dropping an active sBlock");
        let (base, chunks) = (s.addr, s.chunks.clone());
        for (i, _) in chunks.iter().enumerate() {
            if let Err(e) = driver.unmap(base + g * i as u64) {
                self.remap(driver, base, &chunks[..i]);
                return Err(e);
            }
        }
        if driver.free_address(base, g * chunks.len() as u64).is_err() {
            self.orphans
                .reservations
                .push((base, g * chunks.len() as u64));
        }
        self.sblocks.remove(&id);
        let set = self.by_size.get_mut(&chunks.len()).expect("indexed sBlock");
        set.remove(&id);
        if set.is_empty() {
            self.by_size.remove(&chunks.len());
        }
        Ok(())
    }

    /// Maps `chunks` back at `base..` after a failed teardown, best effort:
    /// a failure here leaves the granule unmapped, which only makes the
    /// already-failed sBlock unreadable there, never another block.
    fn remap(&self, driver: &dyn VmmDriver, base: u64, chunks: &[ChunkId]) {
        let g = self.granularity;
        let mut ok = true;
        for (i, c) in chunks.iter().enumerate() {
            ok &= driver
                .map(base + g * i as u64, self.chunks[c].handle)
                .is_ok();
        }
        if ok && !chunks.is_empty() {
            // Access is lost with the unmap; grant it again.
            let _ = driver.set_access(base, g * chunks.len() as u64);
        }
    }

    /// Returns free pBlock `id`'s chunks to the driver: unmap every home
    /// mapping (undone on failure), then release each chunk and free a
    /// reservation left with no chunks. The caller has dropped every sBlock
    /// over it. Returns the chunks released.
    pub fn release_pblock(&mut self, driver: &dyn VmmDriver, id: PId) -> VmmResult<usize> {
        let p = &self.pblocks[&id];
        assert!(!p.in_use, "releasing a used pBlock");
        let chunks = p.chunks.clone();
        for (i, c) in chunks.iter().enumerate() {
            if let Err(e) = driver.unmap(self.chunks[c].home) {
                self.remap(driver, self.chunks[&chunks[0]].home, &chunks[..i]);
                return Err(e);
            }
        }
        self.free.remove(&(chunks.len(), id));
        self.pblocks.remove(&id);
        for c in &chunks {
            let chunk = self.chunks.remove(c).expect("live chunk");
            if driver.release(chunk.handle).is_err() {
                self.orphans.chunks.push(chunk.handle);
            }
            let r = self
                .reservations
                .get_mut(&chunk.reservation)
                .expect("live reservation");
            r.homed -= 1;
            if r.homed == 0 {
                let size = r.size;
                self.reservations.remove(&chunk.reservation);
                if driver.free_address(chunk.reservation, size).is_err() {
                    self.orphans.reservations.push((chunk.reservation, size));
                }
            }
        }
        Ok(chunks.len())
    }

    /// Tries again to return orphaned chunks and reservations.
    pub fn retry_orphans(&mut self, driver: &dyn VmmDriver) {
        self.orphans.chunks.retain(|&h| driver.release(h).is_err());
        self.orphans
            .reservations
            .retain(|&(a, s)| driver.free_address(a, s).is_err());
    }

    /// Checks the tables' invariants; the first broken one, in words.
    pub fn check(&self) -> Result<(), String> {
        let g = self.granularity;
        let mut seen = BTreeSet::new();
        for (&pid, p) in &self.pblocks {
            if p.chunks.is_empty() {
                return Err(format!("pBlock {pid} is empty"));
            }
            for (i, c) in p.chunks.iter().enumerate() {
                let chunk = self
                    .chunks
                    .get(c)
                    .ok_or(format!("pBlock {pid} holds dead chunk {c}"))?;
                if chunk.pblock != pid || chunk.home != p.addr + g * i as u64 {
                    return Err(format!("chunk {c} is out of place in pBlock {pid}"));
                }
                if !seen.insert(*c) {
                    return Err(format!("chunk {c} is in two pBlocks"));
                }
            }
            if self.free.contains(&(p.chunks.len(), pid)) == p.in_use {
                return Err(format!("free index disagrees with pBlock {pid}"));
            }
        }
        if seen.len() != self.chunks.len() || self.free.len() > self.pblocks.len() {
            return Err("chunks outside every pBlock, or stale free entries".into());
        }
        for (&sid, s) in &self.sblocks {
            if !self
                .by_size
                .get(&s.chunks.len())
                .is_some_and(|set| set.contains(&sid))
            {
                return Err(format!("sBlock {sid} is not in the size index"));
            }
            for p in self.pblocks_under(&s.chunks) {
                let pb = &self.pblocks[&p];
                if !pb.chunks.iter().all(|c| s.chunks.contains(c)) {
                    return Err(format!("sBlock {sid} covers part of pBlock {p}"));
                }
                if s.active && !pb.in_use {
                    return Err(format!("active sBlock {sid} over free pBlock {p}"));
                }
            }
        }
        Ok(())
    }
}
