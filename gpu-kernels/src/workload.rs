//! The work test and benchmark kernels do on each allocation, shared by the
//! GPU kernels and their CPU twins so both do exactly the same thing: a
//! seeded size for mixed-size runs, and a pattern written into every byte of
//! an allocation and verified later (never zeros, different per thread).

/// The increment of SplitMix64's state (the golden ratio in 64 bits).
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// splitmix64: a well-mixed 64-bit hash.
#[inline(always)]
pub fn hash64(mut x: u64) -> u64 {
    x = x.wrapping_add(GOLDEN_GAMMA);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// SplitMix64 (Steele, Lea & Flood, OOPSLA 2014): the seeded generator of
/// every host-side workload (R-MAT graphs, update picks, test sequences).
/// Output `i` is `hash64(seed + i * GOLDEN_GAMMA)`.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// Bits of an `f64` mantissa (53) taken from the top of the output.
    const MANTISSA_BITS: u32 = f64::MANTISSA_DIGITS;

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let x = self.0;
        self.0 = x.wrapping_add(GOLDEN_GAMMA);
        hash64(x)
    }

    /// Uniform in `0..n` (`n > 0`; the modulo bias is below 2^-32 for the
    /// sizes used here).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> (u64::BITS - Self::MANTISSA_BITS)) as f64
            / (1u64 << Self::MANTISSA_BITS) as f64
    }
}

/// The size thread `id` asks for in a mixed run: uniform in `lo..=hi`.
#[inline(always)]
pub fn mixed_size(seed: u64, id: u64, lo: u64, hi: u64) -> u64 {
    lo + hash64(seed ^ hash64(id)) % (hi - lo + 1)
}

/// The pattern word `index` of the allocation of thread `id`.
#[inline(always)]
pub fn pattern(id: u64, index: u64) -> u64 {
    hash64(id << 20 ^ index) | 1
}

/// Writes the pattern of `id` into `size` bytes at `p`.
///
/// # Safety
/// `p` must be valid for `size` bytes of writes and 8-byte aligned.
#[inline]
pub unsafe fn fill(p: *mut u8, size: u64, id: u64) {
    // SAFETY: as documented.
    unsafe { fill_range(p, size, id, 0, size) }
}

/// Counts the words (and tail bytes) at `p` that do not hold `id`'s pattern.
///
/// # Safety
/// `p` must be valid for `size` bytes of reads and 8-byte aligned.
#[inline]
pub unsafe fn verify(p: *const u8, size: u64, id: u64) -> u64 {
    // SAFETY: as documented.
    unsafe { verify_range(p, size, id, 0, size) }
}

/// Bytes of one allocation that one thread of the piecewise pattern
/// kernels (`fill_pattern_pieces`, `verify_pattern_pieces`) covers.
pub const PATTERN_PIECE: u64 = 4096;

/// Writes piece `piece` (bytes `piece * PATTERN_PIECE ..`, at most
/// `PATTERN_PIECE` of them) of `id`'s pattern into the `size` bytes at `p`:
/// together, the pieces write what [`fill`] writes.
///
/// # Safety
/// As for [`fill`].
#[inline]
pub unsafe fn fill_piece(p: *mut u8, size: u64, id: u64, piece: u64) {
    let start = piece * PATTERN_PIECE;
    if start < size {
        // SAFETY: as documented; start < end <= size.
        unsafe { fill_range(p, size, id, start, (start + PATTERN_PIECE).min(size)) }
    }
}

/// Counts the wrong words (and tail bytes) of piece `piece` of `id`'s
/// pattern at `p`: together, the pieces count what [`verify`] counts.
///
/// # Safety
/// As for [`verify`].
#[inline]
pub unsafe fn verify_piece(p: *const u8, size: u64, id: u64, piece: u64) -> u64 {
    let start = piece * PATTERN_PIECE;
    if start >= size {
        return 0;
    }
    // SAFETY: as documented; start < end <= size.
    unsafe { verify_range(p, size, id, start, (start + PATTERN_PIECE).min(size)) }
}

/// Writes the words of `id`'s pattern from byte `start` (a multiple of 8)
/// up to `end`, and the tail bytes after the last whole word if `end` is
/// `size`.
///
/// # Safety
/// As for [`fill`]; `start <= end <= size`.
#[inline]
unsafe fn fill_range(p: *mut u8, size: u64, id: u64, start: u64, end: u64) {
    let words = size / 8;
    for i in start / 8..end / 8 {
        // SAFETY: i < size / 8 and p is aligned and valid for size bytes.
        unsafe { (p as *mut u64).add(i as usize).write(pattern(id, i)) };
    }
    if end == size {
        let tail = pattern(id, words);
        for i in words * 8..size {
            // SAFETY: i < size.
            unsafe { p.add(i as usize).write((tail >> ((i % 8) * 8)) as u8) };
        }
    }
}

/// Counts the wrong words (and tail bytes) that [`fill_range`] with the
/// same bounds writes.
///
/// # Safety
/// As for [`verify`]; `start <= end <= size`.
#[inline]
unsafe fn verify_range(p: *const u8, size: u64, id: u64, start: u64, end: u64) -> u64 {
    let words = size / 8;
    let mut wrong = 0;
    for i in start / 8..end / 8 {
        // SAFETY: as in `fill_range`.
        wrong += (unsafe { (p as *const u64).add(i as usize).read() } != pattern(id, i)) as u64;
    }
    if end == size {
        let tail = pattern(id, words);
        for i in words * 8..size {
            // SAFETY: i < size.
            wrong += (unsafe { p.add(i as usize).read() } != (tail >> ((i % 8) * 8)) as u8) as u64;
        }
    }
    wrong
}

/// The size thread `id` asks for at step `step` of a log-uniform run over
/// `lo..=hi` (powers of two): an octave `[2^e, 2^(e+1)]` uniform among those
/// of the range, then a size uniform within it. The same on host and GPU.
#[inline(always)]
pub fn log_uniform_size(seed: u64, id: u64, step: u64, lo: u64, hi: u64) -> u64 {
    let r = hash64(seed ^ hash64(id ^ hash64(step)));
    let (low, high) = (lo.trailing_zeros() as u64, hi.trailing_zeros() as u64);
    if high <= low {
        return lo;
    }
    let octave = low + (r >> 40) % (high - low);
    let base = 1u64 << octave;
    base + (r & 0xff_ffff) % (base + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces write and check exactly what `fill` and `verify` do, tail
    /// bytes included, and a wrong byte is found by one piece.
    #[test]
    fn pieces_match_the_whole_pattern() {
        for size in [
            1,
            7,
            8,
            4095,
            4096,
            4097,
            3 * PATTERN_PIECE + 13,
            17 * PATTERN_PIECE,
        ] {
            let mut buf = [0u64; (17 * PATTERN_PIECE / 8) as usize];
            let p = buf.as_mut_ptr() as *mut u8;
            let pieces = size.div_ceil(PATTERN_PIECE);
            // SAFETY: buf holds at least size bytes (the largest is its
            // length), 8-byte aligned.
            unsafe {
                for piece in 0..pieces + 1 {
                    fill_piece(p, size, 5, piece);
                }
                assert_eq!(verify(p, size, 5), 0, "size {size}");
                let wrong = |p| {
                    (0..pieces)
                        .map(|k| verify_piece(p, size, 5, k))
                        .sum::<u64>()
                };
                assert_eq!(wrong(p), 0, "size {size}");
                *p.add(size as usize - 1) ^= 0x40;
                assert_eq!(wrong(p), 1, "size {size}");
                assert_eq!(verify(p, size, 5), 1, "size {size}");
            }
        }
    }
}
