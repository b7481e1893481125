//! `FreeBits`: one bit per slot of a home view, set while the slot holds a
//! free chunk: the lake's record of which chunks are used. This file owns
//! the word-level scans over them; `tables.rs` sets and clears them in its
//! run cut and join only, which keep the run index beside them.
//!
//! The bits answer "is this slot free", "where does the free stretch
//! around this slot start and end" (the run a cut or join changes) and
//! "where are the free stretches inside this piece" with a few word reads
//! (one per 64 slots) instead of a tree lookup per question: every take
//! and give asks the second per home stretch, best fit the third for every
//! piece of every stitched view of a size that may serve the request
//! (`Tables::stitched_runs`), `Tables::is_used` the first. A run of
//! thousands of slots costs a scan of tens of words.
//!
//! Concurrency: plain data inside the lake's state mutex.

/// Bits per word.
const WORD: usize = u64::BITS as usize;

/// One bit per slot: set = the slot holds a free chunk.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FreeBits {
    words: Vec<u64>,
}

/// The bits of a word at and above `from` (a position within the word).
fn from_bit(from: usize) -> u64 {
    u64::MAX << from
}

impl FreeBits {
    /// All clear, for `slots` slots.
    pub fn new(slots: usize) -> FreeBits {
        FreeBits {
            words: vec![0; slots.div_ceil(WORD)],
        }
    }

    /// Whether slot `i` is free.
    pub fn get(&self, i: usize) -> bool {
        self.words[i / WORD] >> (i % WORD) & 1 == 1
    }

    /// Sets (`free`) or clears slots `[a, b)`.
    pub fn put(&mut self, a: usize, b: usize, free: bool) {
        let mut i = a;
        while i < b {
            let w = i / WORD;
            let lo = i % WORD;
            let hi = (b - w * WORD).min(WORD);
            // Bits lo..hi of word w.
            let mask = from_bit(lo) & (u64::MAX >> (WORD - hi));
            if free {
                self.words[w] |= mask;
            } else {
                self.words[w] &= !mask;
            }
            i = (w + 1) * WORD;
        }
    }

    /// The first slot in `[i, b)` whose bit is `value`, else `b`.
    fn next(&self, i: usize, b: usize, value: bool) -> usize {
        if i >= b {
            return b;
        }
        let flip = if value { 0 } else { u64::MAX };
        let mut w = i / WORD;
        let mut bits = (self.words[w] ^ flip) & from_bit(i % WORD);
        loop {
            if bits != 0 {
                return (w * WORD + bits.trailing_zeros() as usize).min(b);
            }
            w += 1;
            if w * WORD >= b {
                return b;
            }
            bits = self.words[w] ^ flip;
        }
    }

    /// The lowest `s <= i` with slots `[s, i)` all free: where the free
    /// stretch ending just before `i` starts (`i` if slot `i - 1` is not
    /// free).
    pub fn free_from(&self, i: usize) -> usize {
        if i == 0 {
            return 0;
        }
        let mut w = (i - 1) / WORD;
        // The clear bits of word w below i.
        let mut clear = !self.words[w] & (u64::MAX >> (WORD * (w + 1) - i));
        loop {
            if clear != 0 {
                // Just above the highest clear bit.
                return w * WORD + WORD - clear.leading_zeros() as usize;
            }
            if w == 0 {
                return 0;
            }
            w -= 1;
            clear = !self.words[w];
        }
    }

    /// The first slot at or after `i` that is not free (slots past the
    /// end are not).
    pub fn free_until(&self, i: usize) -> usize {
        self.next(i, self.words.len() * WORD, false)
    }

    /// Calls `f(start, len)` for each maximal stretch of free slots within
    /// `[a, b)` (cut at `a` and `b`), in order.
    pub fn free_stretches(&self, a: usize, b: usize, mut f: impl FnMut(usize, usize)) {
        let mut i = a;
        while i < b {
            let start = self.next(i, b, true);
            if start == b {
                return;
            }
            let end = self.next(start, b, false);
            f(start, end - start);
            i = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stretches_match_a_bool_per_slot_over_random_puts() {
        use gpu_kernels::workload::SplitMix64;
        const SLOTS: usize = 300;
        let mut bits = FreeBits::new(SLOTS);
        let mut want = [false; SLOTS];
        let mut rng = SplitMix64(7);
        for _ in 0..2000 {
            let a = rng.below(SLOTS as u64) as usize;
            let b = a + rng.below((SLOTS - a) as u64 + 1) as usize;
            let free = rng.below(2) == 1;
            bits.put(a, b, free);
            want[a..b].fill(free);
            let (x, y) = {
                let x = rng.below(SLOTS as u64) as usize;
                (x, x + rng.below((SLOTS - x) as u64 + 1) as usize)
            };
            let mut got = Vec::new();
            bits.free_stretches(x, y, |s, l| got.push((s, l)));
            let mut expect: Vec<(usize, usize)> = Vec::new();
            let free_slots = (x..y).filter(|&i| want[i]);
            for i in free_slots {
                match expect.last_mut() {
                    Some((s, l)) if *s + *l == i => *l += 1,
                    _ => expect.push((i, 1)),
                }
            }
            assert_eq!(got, expect, "[{x}, {y})");
            let from = (0..=x)
                .rev()
                .take_while(|&s| s == x || want[s])
                .last()
                .unwrap();
            assert_eq!(bits.free_from(x), from, "free from {x}");
            let until = (y..SLOTS).find(|&i| !want[i]).unwrap_or(SLOTS);
            assert_eq!(bits.free_until(y), until, "free until {y}");
            assert!((0..SLOTS).all(|i| bits.get(i) == want[i]));
        }
    }
}
