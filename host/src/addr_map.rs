//! `AddrMap` and `AddrSet`: a hash map and a set keyed by device
//! addresses, with a hasher of one multiply ([`AddrHasher`]) instead of
//! the standard library's SipHash.
//!
//! The lake and the pluggable pool look their live allocations up by
//! address on every call (an `alloc` inserts, a `free` removes), and the
//! lake its freed addresses (to tell a double free); the lake's tables key
//! their per-stream fence counts by stream id the same way. Inside a
//! training loop those calls run with cold caches (PyTorch and Python run
//! between them), and SipHash's rounds and state add to the misses of the
//! table itself (`docs/PERF.md`, "Pool host cost per call"). Addresses are
//! handed out by the allocator itself, not chosen by an adversary, so a
//! hash that cannot resist flooding is fine.
//!
//! The hash is the 128-bit product of the key and an odd constant, its two
//! halves xored: device addresses are 512-byte aligned (their low bits are
//! zero, and a plain multiply would keep them zero, while the table picks
//! buckets by the low bits), and the high half brings the address's high
//! bits down.
//!
//! Concurrency: plain values; their owners keep them behind their locks.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

/// The multiplier: 2^64 divided by the golden ratio, odd.
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// A hasher for `u64` keys (device addresses): one widening multiply.
#[derive(Clone, Copy, Debug, Default)]
pub struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by `u64` keys; any other key still hashes correctly.
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u64(&mut self, n: u64) {
        let p = u128::from(self.0 ^ n) * u128::from(K);
        self.0 = (p as u64) ^ ((p >> 64) as u64);
    }
}

/// A hash map keyed by device addresses, with [`AddrHasher`].
pub type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;

/// A set of device addresses, with [`AddrHasher`].
pub type AddrSet = HashSet<u64, BuildHasherDefault<AddrHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn aligned_addresses_spread_over_low_bits() {
        let build = BuildHasherDefault::<AddrHasher>::default();
        // 4096 addresses 512 bytes apart: their hashes' low 12 bits (the
        // bucket of a table of 4096) should take most values.
        let mut seen = std::collections::HashSet::new();
        for i in 0..4096u64 {
            let addr = 0x7f00_0000_0000 + i * 512;
            seen.insert(build.hash_one(addr) & 0xfff);
        }
        assert!(seen.len() > 2048, "only {} buckets of 4096", seen.len());
    }

    #[test]
    fn map_keeps_entries() {
        let mut m: AddrMap<u32> = AddrMap::default();
        for i in 0..1000u64 {
            m.insert(i << 21, i as u32);
        }
        assert_eq!(m.len(), 1000);
        assert!((0..1000u64).all(|i| m.get(&(i << 21)) == Some(&(i as u32))));
        assert_eq!(m.remove(&(7 << 21)), Some(7));
        assert_eq!(m.get(&(7 << 21)), None);
    }
}
