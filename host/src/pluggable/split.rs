//! `SplitCache`: small requests (under one lake chunk, 2 MiB on H100)
//! served from chunks taken from the lake, each carved into pieces.
//!
//! Rules:
//! - **rounding**: a request of `n` bytes takes a piece of `n` rounded up to
//!   a multiple of [`PIECE_ALIGN`] (512 bytes), so every piece starts
//!   512-byte aligned (chunks are granule-aligned), enough for any CUDA
//!   vector type and for cuBLAS/cuDNN workspaces;
//! - **fit**: the smallest free piece that holds the rounded size, the
//!   lowest address among equals; the rest of it stays a free piece;
//! - **coalescing**: a piece that becomes free merges at once with the free
//!   pieces right before and after it *in the same chunk*; never across
//!   chunks, whose addresses are unrelated lake allocations. A chunk whose
//!   pieces have all merged back into one is wholly free and may be given
//!   back to the lake ([`SplitCache::take_empty_chunks`]).
//!
//! The cache is plain tables and makes no driver call itself: the pool
//! takes chunks from the lake and hands them in ([`SplitCache::add_chunk`]).
//!
//! Concurrency: not synchronised; the pool keeps it behind its own lock.

use std::collections::{BTreeMap, BTreeSet};

use crate::lake::DeviceRange;

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
    /// Piece start -> (length, free). The pieces tile the chunk.
    pieces: BTreeMap<u64, (u64, bool)>,
}

/// Chunks carved into pieces for small requests.
#[derive(Debug)]
pub struct SplitCache {
    chunk_bytes: u64,
    /// Chunk base address -> chunk.
    chunks: BTreeMap<u64, Chunk>,
    /// Free pieces of every chunk, by (length, address).
    free: BTreeSet<(u64, u64)>,
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
            chunks: BTreeMap::new(),
            free: BTreeSet::new(),
        }
    }

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

    /// A piece for `size` bytes from the free pieces, if one fits.
    pub fn take(&mut self, size: u64) -> Option<Piece> {
        let want = Self::rounded(size);
        let &(len, addr) = self.free.range((want, 0)..).next()?;
        self.free.remove(&(len, addr));
        let chunk = self
            .chunk_of_mut(addr)
            .expect("a free piece lies in a chunk");
        chunk.pieces.insert(addr, (want, false));
        if len > want {
            chunk.pieces.insert(addr + want, (len - want, true));
            self.free.insert((len - want, addr + want));
        }
        Some(Piece { addr, len: want })
    }

    /// The piece of `size` bytes starting exactly at `addr`, if that range
    /// lies in one free piece (which is cut around it). Used to give a
    /// CUDA graph pool back the allocations a checkpoint recorded.
    pub fn take_at(&mut self, addr: u64, size: u64) -> Option<Piece> {
        let want = Self::rounded(size);
        let chunk = self.chunk_of_mut(addr)?;
        let (&start, &(len, free)) = chunk.pieces.range(..=addr).next_back()?;
        if !free || addr + want > start + len {
            return None;
        }
        chunk.pieces.remove(&start);
        let mut freed = Vec::new();
        if addr > start {
            chunk.pieces.insert(start, (addr - start, true));
            freed.push((addr - start, start));
        }
        chunk.pieces.insert(addr, (want, false));
        let end = start + len;
        if addr + want < end {
            chunk.pieces.insert(addr + want, (end - addr - want, true));
            freed.push((end - addr - want, addr + want));
        }
        self.free.remove(&(len, start));
        self.free.extend(freed);
        Some(Piece { addr, len: want })
    }

    /// Adds a chunk taken from the lake (`range.len` is one chunk), wholly
    /// free.
    pub fn add_chunk(&mut self, range: DeviceRange) {
        debug_assert_eq!(range.len, self.chunk_bytes, "a chunk is one granule");
        let mut pieces = BTreeMap::new();
        pieces.insert(range.addr, (self.chunk_bytes, true));
        self.chunks.insert(range.addr, Chunk { range, pieces });
        self.free.insert((self.chunk_bytes, range.addr));
    }

    fn chunk_of_mut(&mut self, addr: u64) -> Option<&mut Chunk> {
        let bytes = self.chunk_bytes;
        self.chunks
            .range_mut(..=addr)
            .next_back()
            .map(|(_, c)| c)
            .filter(|c| addr < c.range.addr + bytes)
    }

    /// The piece in use starting at `addr`, if there is one.
    pub fn piece_at(&self, addr: u64) -> Option<Piece> {
        let (_, chunk) = self.chunks.range(..=addr).next_back()?;
        match chunk.pieces.get(&addr) {
            Some(&(len, false)) => Some(Piece { addr, len }),
            _ => None,
        }
    }

    /// Frees the piece in use at `addr` and merges it with free
    /// neighbours in its chunk. `None` if no piece in use starts there.
    pub fn give_back(&mut self, addr: u64) -> Option<Piece> {
        let piece = self.piece_at(addr)?;
        let mut start = addr;
        let mut len = piece.len;
        let chunk = self.chunk_of_mut(addr).expect("a piece lies in a chunk");
        chunk.pieces.remove(&addr);
        let mut merged = Vec::new();
        if let Some((&prev, &(plen, true))) = chunk.pieces.range(..addr).next_back() {
            chunk.pieces.remove(&prev);
            merged.push((plen, prev));
            start = prev;
            len += plen;
        }
        if let Some(&(nlen, true)) = chunk.pieces.get(&(addr + piece.len)) {
            chunk.pieces.remove(&(addr + piece.len));
            merged.push((nlen, addr + piece.len));
            len += nlen;
        }
        chunk.pieces.insert(start, (len, true));
        for m in merged {
            self.free.remove(&m);
        }
        self.free.insert((len, start));
        Some(piece)
    }

    /// Removes every wholly free chunk and returns their lake ranges (to be
    /// freed to the lake by the caller).
    pub fn take_empty_chunks(&mut self) -> Vec<DeviceRange> {
        let bytes = self.chunk_bytes;
        let empty: Vec<u64> = self
            .chunks
            .iter()
            .filter(|(_, c)| c.pieces.len() == 1 && c.pieces.values().all(|&(_, f)| f))
            .map(|(&a, _)| a)
            .collect();
        empty
            .into_iter()
            .map(|a| {
                self.free.remove(&(bytes, a));
                self.chunks.remove(&a).expect("listed chunk").range
            })
            .collect()
    }

    /// Chunks held.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len()
    }

    /// Bytes in free pieces.
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|&(len, _)| len).sum()
    }

    /// The largest free piece, in bytes (0 when none).
    pub fn largest_free(&self) -> u64 {
        self.free.iter().next_back().map_or(0, |&(len, _)| len)
    }

    /// Checks that the pieces of every chunk tile it without overlap, that
    /// no two free pieces are adjacent (coalescing) and that the free index
    /// lists exactly the free pieces; the first broken rule, in words.
    pub fn check(&self) -> Result<(), String> {
        let mut free_seen = BTreeSet::new();
        for (&base, chunk) in &self.chunks {
            let mut at = base;
            let mut prev_free = false;
            for (&addr, &(len, free)) in &chunk.pieces {
                if addr != at {
                    return Err(format!(
                        "chunk {base:#x}: piece {addr:#x} does not start at {at:#x}"
                    ));
                }
                if len == 0 || !len.is_multiple_of(PIECE_ALIGN) {
                    return Err(format!("chunk {base:#x}: piece {addr:#x} has length {len}"));
                }
                if free && prev_free {
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
        Ok(())
    }
}
