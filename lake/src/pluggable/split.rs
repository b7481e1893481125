//! `SplitCache`: small requests (under one lake chunk, 2 MiB on H100)
//! served from chunks taken from the lake, each carved into pieces.
//!
//! Rules:
//! - **rounding**: a request of `n` bytes takes a piece of `n` rounded up to
//!   a multiple of [`PIECE_ALIGN`] (512 bytes), so every piece starts
//!   512-byte aligned (chunks are granule-aligned), enough for any CUDA
//!   vector type and for cuBLAS/cuDNN workspaces;
//! - **fit**: the smallest free piece that holds the rounded size and whose
//!   fence admits the requester (see `lake/fence.rs`: on one stream, any),
//!   the lowest address among equals; the rest of it stays a free piece
//!   behind the same fence;
//! - **coalescing**: a piece that becomes free merges at once with the free
//!   pieces right before and after it *in the same chunk* (their fences
//!   join); never across chunks, whose addresses are unrelated lake
//!   allocations. A chunk whose pieces have all merged back into one is
//!   wholly free: the pool gives all but [`SplitCache::SPARE_EMPTY`] such
//!   chunks back to the lake at once ([`SplitCache::take_empty_chunks`]),
//!   where they serve requests of any size.
//!
//! The cache is plain tables and makes no driver call itself: the pool
//! takes chunks from the lake and hands them in ([`SplitCache::add_chunk`]).
//!
//! Concurrency: not synchronised; the pool keeps it behind its own lock.

use std::collections::{BTreeMap, BTreeSet};

use crate::{AddrMap, DeviceRange, Fence, Progress, Requester};

/// Granularity of pieces: sizes are rounded up to it, pieces start on it.
pub const PIECE_ALIGN: u64 = 512;

/// A piece handed out: its address and its (rounded) length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes in the piece (the request rounded up to [`PIECE_ALIGN`]).
    pub len: u64,
}

/// One chunk from the lake and its pieces.
#[derive(Debug)]
struct Chunk {
    range: DeviceRange,
    /// Piece start -> (length, `Some(fence)` when free, `None` in use). The
    /// pieces tile the chunk.
    pieces: BTreeMap<u64, (u64, Option<Fence>)>,
}

/// Chunks carved into pieces for small requests.
#[derive(Debug)]
pub struct SplitCache {
    chunk_bytes: u64,
    /// Chunk base address -> chunk. Hashed, not ordered: chunks come from
    /// the lake aligned to their size, so the chunk of an address is found
    /// by rounding it down (one probe instead of a walk of cold tree nodes
    /// at every small alloc and free).
    chunks: AddrMap<Chunk>,
    /// Free pieces of every chunk, by (length, address).
    free: BTreeSet<(u64, u64)>,
    /// Bytes in free pieces.
    free_bytes: u64,
    /// Wholly free chunks, by base address.
    empty: BTreeSet<u64>,
    /// Chunks that may hold free neighbours left apart (fences not
    /// mergeable at the time).
    unsettled: BTreeSet<u64>,
}

impl SplitCache {
    /// A cache of chunks of `chunk_bytes` (the lake's granularity, a
    /// multiple of [`PIECE_ALIGN`]).
    pub fn new(chunk_bytes: u64) -> SplitCache {
        assert!(
            chunk_bytes > 0 && chunk_bytes.is_multiple_of(PIECE_ALIGN),
            "chunk size {chunk_bytes} is not a positive multiple of {PIECE_ALIGN}"
        );
        SplitCache {
            chunk_bytes,
            chunks: AddrMap::default(),
            free: BTreeSet::new(),
            free_bytes: 0,
            empty: BTreeSet::new(),
            unsettled: BTreeSet::new(),
        }
    }

    /// Wholly free chunks kept when the others go back to the lake (so a
    /// small tensor made and dropped in a loop does not move a chunk to
    /// and fro).
    pub const SPARE_EMPTY: usize = 1;

    /// Free pieces [`SplitCache::take`] looks at, best fit first.
    const SCAN_PIECES: usize = 64;

    /// Bytes in one chunk.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Whether a request of `size` bytes (> 0) is small: served here.
    pub fn is_small(&self, size: u64) -> bool {
        size < self.chunk_bytes
    }

    /// The piece length a request of `size` bytes takes.
    pub fn rounded(size: u64) -> u64 {
        size.max(1).div_ceil(PIECE_ALIGN) * PIECE_ALIGN
    }

    /// A piece for `size` bytes for `req` from the free pieces, if one
    /// fits.
    pub fn take(&mut self, size: u64, req: &Requester<'_>) -> Option<Piece> {
        let want = Self::rounded(size);
        let (len, addr, base) = self
            .free
            .range((want, 0)..)
            .take(Self::SCAN_PIECES)
            .find_map(|&(len, addr)| {
                let chunk = self.chunk_of(addr).expect("a free piece lies in a chunk");
                let admitted = chunk.pieces[&addr]
                    .1
                    .as_ref()
                    .is_some_and(|f| f.admits(req));
                admitted.then_some((len, addr, chunk.range.addr))
            })?;
        self.free.remove(&(len, addr));
        self.free_bytes -= want;
        let chunk = self
            .chunks
            .get_mut(&base)
            .expect("a free piece lies in a chunk");
        let fence = chunk
            .pieces
            .insert(addr, (want, None))
            .and_then(|(_, f)| f)
            .expect("the piece was free");
        if len > want {
            chunk.pieces.insert(addr + want, (len - want, Some(fence)));
            self.free.insert((len - want, addr + want));
        }
        if len == self.chunk_bytes {
            // Only a piece as long as its chunk leaves a wholly free one.
            self.empty.remove(&base);
        }
        Some(Piece { addr, len: want })
    }

    /// The piece of `size` bytes starting exactly at `addr`, if that range
    /// lies in one free piece (which is cut around it; the rest keeps its
    /// fence). Used to give a CUDA graph pool back the allocations a
    /// checkpoint recorded, on the stream that made them.
    pub fn take_at(&mut self, addr: u64, size: u64) -> Option<Piece> {
        let want = Self::rounded(size);
        let chunk = self.chunk_of_mut(addr)?;
        let base = chunk.range.addr;
        let (&start, (len, fence)) = chunk.pieces.range(..=addr).next_back()?;
        let (len, fence) = (*len, fence.clone()?);
        if addr + want > start + len {
            return None;
        }
        chunk.pieces.remove(&start);
        let mut rest = Vec::new();
        if addr > start {
            chunk
                .pieces
                .insert(start, (addr - start, Some(fence.clone())));
            rest.push((addr - start, start));
        }
        chunk.pieces.insert(addr, (want, None));
        let end = start + len;
        if addr + want < end {
            chunk
                .pieces
                .insert(addr + want, (end - addr - want, Some(fence)));
            rest.push((end - addr - want, addr + want));
        }
        self.free.remove(&(len, start));
        self.free.extend(rest);
        self.free_bytes -= want;
        self.empty.remove(&base);
        Some(Piece { addr, len: want })
    }

    /// Adds a chunk taken from the lake (`range.len` is one chunk), wholly
    /// free and unfenced.
    pub fn add_chunk(&mut self, range: DeviceRange) {
        debug_assert_eq!(range.len, self.chunk_bytes, "a chunk is one granule");
        debug_assert!(
            range.addr.is_multiple_of(self.chunk_bytes),
            "chunk {:#x} is not aligned to its size",
            range.addr
        );
        let mut pieces = BTreeMap::new();
        pieces.insert(range.addr, (self.chunk_bytes, Some(Fence::none())));
        self.chunks.insert(range.addr, Chunk { range, pieces });
        self.free.insert((self.chunk_bytes, range.addr));
        self.free_bytes += self.chunk_bytes;
        self.empty.insert(range.addr);
    }

    /// The base of the chunk that would hold `addr` (chunks are aligned to
    /// their size, see `add_chunk`).
    fn base_of(&self, addr: u64) -> u64 {
        addr - addr % self.chunk_bytes
    }

    fn chunk_of(&self, addr: u64) -> Option<&Chunk> {
        self.chunks.get(&self.base_of(addr))
    }

    fn chunk_of_mut(&mut self, addr: u64) -> Option<&mut Chunk> {
        let base = self.base_of(addr);
        self.chunks.get_mut(&base)
    }

    /// The piece in use starting at `addr`, if there is one.
    pub fn piece_at(&self, addr: u64) -> Option<Piece> {
        let chunk = self.chunk_of(addr)?;
        match chunk.pieces.get(&addr) {
            Some(&(len, None)) => Some(Piece { addr, len }),
            _ => None,
        }
    }

    /// Frees the piece in use at `addr` behind `fence` and merges it with
    /// the free neighbours in its chunk whose fences are
    /// [`Fence::mergeable`] with it once `progress` settles them (fences
    /// join). Neighbours that are not stay apart until
    /// [`SplitCache::settle`]. `None` if no piece in use starts there.
    ///
    /// The merged piece is worked out first and written once: one lookup
    /// of the chunk and one insert into the free index per free (each is a
    /// walk of cold tree nodes inside a training loop).
    pub fn give_back(&mut self, addr: u64, fence: &Fence, progress: &Progress) -> Option<Piece> {
        let chunk_bytes = self.chunk_bytes;
        // The field, not `chunk_of_mut`: the free index is updated while
        // the chunk is held.
        let base = self.base_of(addr);
        let chunk = self.chunks.get_mut(&base)?;
        let len = match chunk.pieces.get(&addr) {
            Some(&(len, None)) => len,
            _ => return None,
        };
        let mut fence = fence.settled(progress);
        let (mut start, mut end) = (addr, addr + len);
        let mut apart = false;
        if let Some((next_len, Some(next))) = chunk.pieces.get(&end) {
            let (next_len, next) = (*next_len, next.settled(progress));
            if fence.mergeable(&next) {
                fence.join(&next);
                chunk.pieces.remove(&end);
                self.free.remove(&(next_len, end));
                end += next_len;
            } else {
                apart = true;
            }
        }
        // The pieces tile the chunk: the one before ends at `addr`.
        let before = chunk
            .pieces
            .range(..addr)
            .next_back()
            .and_then(|(&p, (l, f))| f.as_ref().map(|f| (p, *l, f.settled(progress))));
        if let Some((prev, prev_len, before)) = before {
            if before.mergeable(&fence) {
                fence.join(&before);
                chunk.pieces.remove(&addr);
                self.free.remove(&(prev_len, prev));
                start = prev;
            } else {
                apart = true;
            }
        }
        chunk.pieces.insert(start, (end - start, Some(fence)));
        self.free.insert((end - start, start));
        self.free_bytes += len;
        if end - start == chunk_bytes {
            self.empty.insert(base);
        }
        if apart {
            self.unsettled.insert(base);
        }
        Some(Piece { addr, len })
    }

    /// Merges the free piece at `addr` of chunk `base` with the free piece
    /// right after it when their settled fences are mergeable; returns the
    /// start of the piece that now holds `addr`'s bytes. Keeps the free
    /// index, the wholly-free set and the unsettled set.
    fn merge_at(&mut self, base: u64, addr: u64, progress: &Progress) -> u64 {
        let chunk_bytes = self.chunk_bytes;
        let chunk = self.chunks.get_mut(&base).expect("live chunk");
        let Some((len, Some(f))) = chunk.pieces.get(&addr).cloned() else {
            return addr;
        };
        let next = addr + len;
        let mut merged = None;
        if let Some((nlen, Some(nf))) = chunk.pieces.get(&next).cloned() {
            let (f, nf) = (f.settled(progress), nf.settled(progress));
            if f.mergeable(&nf) {
                let mut joined = f;
                joined.join(&nf);
                chunk.pieces.remove(&next);
                chunk.pieces.insert(addr, (len + nlen, Some(joined)));
                merged = Some(nlen);
            } else {
                self.unsettled.insert(base);
            }
        }
        if let Some(nlen) = merged {
            self.free.remove(&(len, addr));
            self.free.remove(&(nlen, next));
            self.free.insert((len + nlen, addr));
            if len + nlen == chunk_bytes {
                self.empty.insert(base);
            }
        } else if len == chunk_bytes {
            self.empty.insert(base);
        }
        addr
    }

    /// Merges the free neighbours left apart by [`SplitCache::give_back`]
    /// whose fences `progress` now settles (call it when events complete).
    pub fn settle(&mut self, progress: &Progress) {
        let bases: Vec<u64> = std::mem::take(&mut self.unsettled).into_iter().collect();
        for base in bases {
            let Some(chunk) = self.chunks.get_mut(&base) else {
                continue;
            };
            for (_, f) in chunk.pieces.values_mut() {
                if let Some(f) = f {
                    *f = f.settled(progress);
                }
            }
            loop {
                let starts: Vec<u64> = self.chunks[&base].pieces.keys().copied().collect();
                let mut changed = false;
                for addr in starts {
                    let Some(&(before, _)) = self.chunks[&base].pieces.get(&addr) else {
                        continue;
                    };
                    self.merge_at(base, addr, progress);
                    changed |= self.chunks[&base].pieces[&addr].0 != before;
                }
                if !changed {
                    break;
                }
            }
        }
    }

    /// Removes wholly free chunks beyond the `keep` of lowest address and
    /// returns their lake ranges with their fences (to be freed to the
    /// lake by the caller).
    pub fn take_empty_chunks(&mut self, keep: usize) -> Vec<(DeviceRange, Fence)> {
        if self.empty.len() <= keep {
            // Every small free asks: answered without walking the set.
            return Vec::new();
        }
        let bytes = self.chunk_bytes;
        let gone: Vec<u64> = self.empty.iter().skip(keep).copied().collect();
        gone.into_iter()
            .map(|a| {
                self.empty.remove(&a);
                self.unsettled.remove(&a);
                self.free.remove(&(bytes, a));
                self.free_bytes -= bytes;
                let mut chunk = self.chunks.remove(&a).expect("listed chunk");
                let (_, fence) = chunk.pieces.remove(&a).expect("one free piece");
                (chunk.range, fence.expect("free"))
            })
            .collect()
    }

    /// Chunks held.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes in free pieces.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Bytes in free pieces some stream may not reuse yet.
    pub fn pending_bytes(&self, progress: &Progress) -> u64 {
        self.chunks
            .values()
            .flat_map(|c| c.pieces.values())
            .filter(|(_, f)| f.as_ref().is_some_and(|f| f.pending(progress)))
            .map(|&(len, _)| len)
            .sum()
    }

    /// The largest free piece, in bytes (0 when none).
    pub fn largest_free(&self) -> u64 {
        self.free.iter().next_back().map_or(0, |&(len, _)| len)
    }

    /// Checks that the pieces of every chunk tile it without overlap, that
    /// no two free pieces are adjacent (coalescing) outside chunks marked
    /// unsettled, and that the free index
    /// lists exactly the free pieces; the first broken rule, in words.
    pub fn check(&self) -> Result<(), String> {
        let mut free_seen = BTreeSet::new();
        let mut empty_seen = BTreeSet::new();
        for (&base, chunk) in &self.chunks {
            if chunk.pieces.len() == 1 && chunk.pieces.values().all(|(_, f)| f.is_some()) {
                empty_seen.insert(base);
            }
            let mut at = base;
            let mut prev_free = false;
            for (&addr, (len, fence)) in &chunk.pieces {
                let (len, free) = (*len, fence.is_some());
                if addr != at {
                    return Err(format!(
                        "chunk {base:#x}: piece {addr:#x} does not start at {at:#x}"
                    ));
                }
                if len == 0 || !len.is_multiple_of(PIECE_ALIGN) {
                    return Err(format!("chunk {base:#x}: piece {addr:#x} has length {len}"));
                }
                if free && prev_free && !self.unsettled.contains(&base) {
                    return Err(format!(
                        "chunk {base:#x}: free piece {addr:#x} not coalesced"
                    ));
                }
                if free {
                    free_seen.insert((len, addr));
                }
                prev_free = free;
                at = addr + len;
            }
            if at != base + self.chunk_bytes {
                return Err(format!("chunk {base:#x}: pieces end at {at:#x}"));
            }
        }
        if free_seen != self.free {
            return Err("the free index differs from the free pieces".to_string());
        }
        if self.free.iter().map(|&(len, _)| len).sum::<u64>() != self.free_bytes {
            return Err("the free byte count differs from the free pieces".to_string());
        }
        if empty_seen != self.empty {
            return Err("the wholly-free set differs from the chunks".to_string());
        }
        Ok(())
    }
}
