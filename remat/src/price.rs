//! Cached eviction prices: each tensor's projected cost (DTR's c, own cost
//! plus the evicted classes next to it) and recompute peak
//! (`TensorTable::recompute_peak`), kept between searches and invalidated
//! only by the events that can change them. Coop's window search scores every
//! evictable tensor in the pool at each evicting allocation; most of those
//! scores did not change since the previous search, and computing them (a
//! union-find walk per evicted neighbour, up to four levels of missing
//! inputs) was most of the search's time. A cached price is the value the
//! uncached computation returns, to the last bit, so decisions do not change.
//!
//! What each price reads, and the event that invalidates it:
//!
//! - The projected cost of t reads which of its neighbours (inputs and
//!   consumers) are in an evicted class, and those classes' roots and costs.
//!   A neighbour that joins or leaves a class (evicted, released,
//!   recomputed) invalidates t directly. When t's cost is computed, t
//!   registers as a *watcher* of each root it summed; a class whose cost or
//!   root changes (a union, a member recomputed) invalidates its watchers
//!   and forgets them (they register again when recomputed, so a watcher
//!   list holds at most the reads made since its last change).
//! - The recompute peak of t at depth d reads the residency of its ancestors
//!   up to d + 1 levels up, through ancestors that are missing. A tensor that
//!   becomes resident or missing invalidates its consumers, and theirs
//!   through missing ones, d + 1 levels down. The walk stops at a resident
//!   tensor (a price computed through it while it was missing was already
//!   invalidated when it came back) and at an unborn one (nothing born
//!   descends from it).
//! - With live inputs borrowed (`TensorTable::borrow_live_inputs`), both
//!   prices of t also read whether a missing input is evicted or dropped;
//!   an evicted tensor that the program drops invalidates its neighbours'
//!   projected costs and the peaks below it, as above.
//! - The staleness term is not cached: it changes with every op.
//!
//! Owned by a `TensorTable` (in a `RefCell`, so that a search fills it
//! through the shared reference it reads the table by); single-threaded.
//! `TensorTable::check_prices` compares every cached price with a fresh
//! computation (run by the executor's invariant checks in the tests).

use super::tensor::TensorId;

/// Both cached prices of one tensor, side by side (a search reads both),
/// with the recompute amplification of the cached peak (Coop's score reads
/// it at every search; it changes only with the peak).
#[derive(Debug, Clone, Copy, Default)]
struct Entry {
    projected: f64,
    peak: u64,
    /// `policy::amplification(peak, size)`, valid with `peak`.
    amplification: f64,
    has_projected: bool,
    has_peak: bool,
}
/// The cached prices of one tensor table.
#[derive(Debug, Clone, Default)]
pub struct PriceCache {
    depth: u32,
    entries: Vec<Entry>,
    /// By class node: the first link of the list of tensors whose cached
    /// projected cost summed that root (in `links`).
    watchers: Vec<Option<u32>>,
    /// The watcher lists of all roots, linked through one arena (a tensor
    /// and the next link of its list), so that registering a watcher, which
    /// a search does for every price it computes, allocates nothing once
    /// the arena has grown; links of invalidated lists are reused
    /// (`free_links`).
    links: Vec<(TensorId, Option<u32>)>,
    /// The first link of the list of reusable links.
    free_links: Option<u32>,
    /// Scratch: the roots of one projected-cost computation.
    pub(super) roots: Vec<usize>,
    /// Scratch: changed class roots, and the descendant walk's stack.
    changed: Vec<usize>,
    stack: Vec<(TensorId, u32)>,
    /// Prices read from the cache, and computed, since the start.
    hits: u64,
    misses: u64,
}

impl PriceCache {
    /// An empty cache for `count` tensors whose recompute peaks are priced
    /// `depth` levels up.
    pub fn new(count: usize, depth: u32) -> PriceCache {
        PriceCache {
            depth,
            entries: vec![Entry::default(); count],
            ..PriceCache::default()
        }
    }

    /// The depth of the recompute peaks it caches.
    pub fn depth(&self) -> u32 {
        self.depth
    }

    /// Makes room for tensor ids below `count`.
    pub fn grow_to(&mut self, count: usize) {
        if self.entries.len() < count {
            self.entries.resize(count, Entry::default());
        }
    }

    /// The cached projected cost of `t`, if still valid.
    pub fn projected(&mut self, t: TensorId) -> Option<f64> {
        let entry = &self.entries[t];
        let value = entry.has_projected.then_some(entry.projected);
        self.count(value.is_some());
        value
    }

    /// Caches the projected cost of `t`, computed from the classes whose
    /// roots are in `self.roots`; `t` watches those roots.
    pub fn store_projected(&mut self, t: TensorId, value: f64) {
        let entry = &mut self.entries[t];
        (entry.projected, entry.has_projected) = (value, true);
        for &root in &self.roots {
            if self.watchers.len() <= root {
                // Doubling: class nodes are made at every eviction and
                // release, and a new root past the end is common.
                let len = (root + 1).max(2 * self.watchers.len());
                self.watchers.resize(len, None);
            }
            let next = self.watchers[root];
            let link = match self.free_links {
                Some(free) => {
                    self.free_links = self.links[free as usize].1;
                    self.links[free as usize] = (t, next);
                    free
                }
                None => {
                    let link = u32::try_from(self.links.len())
                        .expect("fewer than 2^32 watchers registered at once");
                    self.links.push((t, next));
                    link
                }
            };
            self.watchers[root] = Some(link);
        }
    }

    /// The cached recompute peak of `t`, if still valid.
    pub fn peak(&mut self, t: TensorId) -> Option<u64> {
        let entry = &self.entries[t];
        let value = entry.has_peak.then_some(entry.peak);
        self.count(value.is_some());
        value
    }

    /// The cached recompute amplification of `t`, if its peak is still
    /// valid (counted as a read of the peak).
    #[inline]
    pub fn amplification(&mut self, t: TensorId) -> Option<f64> {
        let entry = &self.entries[t];
        let value = entry.has_peak.then_some(entry.amplification);
        self.count(value.is_some());
        value
    }

    /// Both the projected cost and the recompute amplification of `t`
    /// when both are cached (counted as two reads), else `None` (counting
    /// nothing: the caller reads them one by one).
    #[inline]
    pub fn projected_and_amplification(&mut self, t: TensorId) -> Option<(f64, f64)> {
        let entry = &self.entries[t];
        if entry.has_projected && entry.has_peak {
            self.hits += 2;
            Some((entry.projected, entry.amplification))
        } else {
            None
        }
    }

    /// Caches the recompute peak of `t`, a tensor of `size` bytes, and its
    /// recompute amplification.
    pub fn store_peak(&mut self, t: TensorId, value: u64, size: u64) {
        let entry = &mut self.entries[t];
        (entry.peak, entry.has_peak) = (value, true);
        entry.amplification = crate::policy::amplification(value, size);
    }

    fn count(&mut self, hit: bool) {
        if hit {
            self.hits += 1;
        } else {
            self.misses += 1;
        }
    }

    /// Prices read from the cache and prices computed, since the start.
    pub fn stats(&self) -> (u64, u64) {
        (self.hits, self.misses)
    }

    /// Both cached prices of `t` (for checks; counts nothing).
    pub fn cached(&self, t: TensorId) -> (Option<f64>, Option<u64>) {
        let entry = &self.entries[t];
        (
            entry.has_projected.then_some(entry.projected),
            entry.has_peak.then_some(entry.peak),
        )
    }

    /// The cached recompute amplification of `t` (for checks; counts
    /// nothing).
    pub fn cached_amplification(&self, t: TensorId) -> Option<f64> {
        let entry = &self.entries[t];
        entry.has_peak.then_some(entry.amplification)
    }

    /// Forgets both prices of `t`.
    pub fn invalidate(&mut self, t: TensorId) {
        self.entries[t] = Entry::default();
    }

    /// Forgets the projected costs of `neighbours` (one of their neighbours
    /// joined or left an evicted class).
    pub fn invalidate_projected(&mut self, neighbours: impl Iterator<Item = TensorId>) {
        for n in neighbours {
            self.entries[n].has_projected = false;
        }
    }

    /// Forgets the projected costs that read any class root in `roots`
    /// (classes whose cost or root changed); `roots` is left empty.
    pub fn invalidate_classes(&mut self, roots: &mut Vec<usize>) {
        for root in roots.drain(..) {
            let Some(head) = self.watchers.get_mut(root) else {
                continue;
            };
            let mut next = head.take();
            while let Some(link) = next {
                let (t, after) = self.links[link as usize];
                self.entries[t].has_projected = false;
                // The link joins the free list.
                self.links[link as usize].1 = self.free_links;
                self.free_links = Some(link);
                next = after;
            }
        }
    }

    /// The class-root scratch list, to fill with changed roots and pass to
    /// [`Self::invalidate_classes`].
    pub fn take_changed_buffer(&mut self) -> Vec<usize> {
        std::mem::take(&mut self.changed)
    }

    /// Returns the scratch list taken by [`Self::take_changed_buffer`].
    pub fn put_changed_buffer(&mut self, buffer: Vec<usize>) {
        self.changed = buffer;
    }

    /// Forgets the recompute peaks that can read the residency of `from`
    /// (which just became resident or missing): its consumers, and theirs
    /// through consumers that are `missing`, `depth + 1` levels down.
    pub fn invalidate_descendants(
        &mut self,
        from: TensorId,
        consumers: &[Vec<TensorId>],
        missing: impl Fn(TensorId) -> bool,
    ) {
        let mut stack = std::mem::take(&mut self.stack);
        stack.clear();
        stack.push((from, 0));
        while let Some((t, level)) = stack.pop() {
            for &c in &consumers[t] {
                self.entries[c].has_peak = false;
                // A price at depth d reads ancestors up to d + 1 levels up.
                if level < self.depth && missing(c) {
                    stack.push((c, level + 1));
                }
            }
        }
        self.stack = stack;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watchers_are_forgotten_with_their_class_and_links_are_reused() {
        let mut cache = PriceCache::new(4, 3);
        // Tensors 0 and 1 read class root 7, tensor 2 reads roots 7 and 3.
        for (t, roots) in [(0, &[7usize][..]), (1, &[7]), (2, &[7, 3])] {
            cache.roots = roots.to_vec();
            cache.store_projected(t, 1.0);
        }
        let arena = cache.links.len();
        cache.invalidate_classes(&mut vec![3]);
        assert_eq!(cache.cached(2).0, None, "a watcher of root 3");
        assert_eq!(cache.cached(0).0, Some(1.0), "not a watcher of root 3");
        cache.invalidate_classes(&mut vec![7]);
        for t in 0..3 {
            assert_eq!(cache.cached(t).0, None, "tensor {t} watched root 7");
        }
        // Priced again: the freed links serve the new registrations.
        for t in 0..3 {
            cache.roots = vec![7];
            cache.store_projected(t, 2.0);
        }
        assert_eq!(cache.links.len(), arena, "no new link");
        cache.invalidate_classes(&mut vec![7]);
        assert!((0..3).all(|t| cache.cached(t).0.is_none()));
        cache.invalidate_classes(&mut vec![7, 3, 100]);
    }
}
