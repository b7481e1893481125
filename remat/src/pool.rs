//! The address-ordered memory pool of a replay: a fixed capacity tiled by
//! intervals, each either free or holding one resident tensor. Space that an
//! evicted or released tensor held becomes free and merges with free
//! neighbours, so no two free intervals are ever adjacent.
//!
//! The intervals are one dense array in address order (a sorted `Vec`),
//! found by binary search and changed by shifting the array's tail: a pool
//! holds a few hundred to a few thousand intervals, so a placement or release
//! moves at most some tens of KiB, while a window search reads the intervals
//! of a range as one slice, by index (`intervals_in`), instead of stepping a
//! tree's iterator.
//!
//! The pool also keeps the *gaps* between the tensors placed as pinned
//! (`place_pinned`): the maximal address ranges that hold no such tensor. A
//! pinned tensor is never evicted, so no eviction window crosses one, and a
//! window search need only walk the gaps at least as large as its request
//! (`gaps_of_at_least`, from a size-ordered index) instead of the whole
//! pool, most of whose intervals in a training step are parameters,
//! gradients and optimizer state. Tensors placed with `place` count as not
//! pinned here even when they are; the gaps are then only coarser.
//!
//! The free intervals are also indexed by size (`free_by_size`), so that a
//! best fit (`best_fit`, `best_fit_outside`) reads only the free blocks
//! large enough, smallest first, instead of every interval.
//!
//! Owned by one executor, single-threaded; policies read it through `&Pool`.
//! `check()` validates the invariants (tiling, no overlap, merged free space,
//! index agreement, gaps, the free-size index) and is run by the tests after
//! every step.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Range;

use super::error::{RematError, RematResult};
use super::tensor::TensorId;

/// One interval of the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Interval {
    /// Start address (offset in the pool).
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// The resident tensor, or `None` for free space.
    pub tensor: Option<TensorId>,
}

/// A pool of `capacity` bytes.
#[derive(Debug, Clone)]
pub struct Pool {
    capacity: u64,
    /// The intervals in address order, tiling `[0, capacity)`.
    intervals: Vec<Interval>,
    addr_of: HashMap<TensorId, u64>,
    free_bytes: u64,
    /// Start -> end of each tensor placed as pinned.
    pinned: BTreeMap<u64, u64>,
    /// Start -> end of each gap between pinned tensors (never empty).
    gaps: BTreeMap<u64, u64>,
    /// The gaps as (bytes, start), to find the large ones.
    gaps_by_size: BTreeSet<(u64, u64)>,
    /// Every free interval as (bytes, start): exactly the free intervals
    /// of `intervals`, updated by `place` and `release`.
    free_by_size: BTreeSet<(u64, u64)>,
}

impl Pool {
    /// An empty pool: one free interval of `capacity` bytes.
    pub fn new(capacity: u64) -> Pool {
        let mut intervals = Vec::new();
        if capacity > 0 {
            intervals.push(Interval {
                addr: 0,
                size: capacity,
                tensor: None,
            });
        }
        let mut pool = Pool {
            capacity,
            intervals,
            addr_of: HashMap::new(),
            free_bytes: capacity,
            pinned: BTreeMap::new(),
            gaps: BTreeMap::new(),
            gaps_by_size: BTreeSet::new(),
            free_by_size: BTreeSet::new(),
        };
        if capacity > 0 {
            pool.free_by_size.insert((capacity, 0));
        }
        pool.add_gap(0, capacity);
        pool
    }

    /// Bytes in the pool.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Free bytes, wherever they are.
    pub fn free_bytes(&self) -> u64 {
        self.free_bytes
    }

    /// Number of intervals (free and resident).
    pub fn interval_count(&self) -> usize {
        self.intervals.len()
    }

    /// Intervals in address order.
    pub fn intervals(&self) -> impl Iterator<Item = &Interval> {
        self.intervals.iter()
    }

    /// Index of the interval that starts at `addr`, if one does.
    fn index_at(&self, addr: u64) -> Option<usize> {
        self.intervals.binary_search_by_key(&addr, |i| i.addr).ok()
    }

    /// Index of the first interval that starts at or after `addr`.
    fn index_from(&self, addr: u64) -> usize {
        self.intervals.partition_point(|i| i.addr < addr)
    }

    /// The interval of a resident tensor.
    pub fn interval_of(&self, id: TensorId) -> Option<&Interval> {
        let k = self.index_at(*self.addr_of.get(&id)?)?;
        Some(&self.intervals[k])
    }

    /// Free bytes directly left and right of a resident tensor (DTE's term).
    pub fn adjacent_free(&self, id: TensorId) -> u64 {
        let Some(k) = self.addr_of.get(&id).and_then(|&a| self.index_at(a)) else {
            return 0;
        };
        let left = k.checked_sub(1).map(|j| &self.intervals[j]);
        let right = self.intervals.get(k + 1);
        [left, right]
            .into_iter()
            .flatten()
            .filter(|i| i.tensor.is_none())
            .map(|i| i.size)
            .sum()
    }

    /// Start of the lowest-addressed free interval of at least `size` bytes.
    pub fn first_fit(&self, size: u64) -> Option<u64> {
        self.intervals()
            .find(|i| i.tensor.is_none() && i.size >= size)
            .map(|i| i.addr)
    }

    /// Start of the smallest free interval of at least `size` bytes (the
    /// lowest-addressed of equal ones).
    pub fn best_fit(&self, size: u64) -> Option<u64> {
        self.best_fit_where(size, |_| true)
    }

    /// [`Pool::best_fit`] among the free intervals that lie wholly outside
    /// `[start, end)` (where a tensor moved out of that span can go).
    pub fn best_fit_outside(&self, size: u64, start: u64, end: u64) -> Option<u64> {
        self.best_fit_where(size, |i| i.addr + i.size <= start || i.addr >= end)
    }

    /// The smallest free interval that holds `size` bytes and that `keep`
    /// accepts (the lowest address on ties): the first such in the size
    /// index, which is ordered by (bytes, start).
    fn best_fit_where(&self, size: u64, keep: impl Fn(&Interval) -> bool) -> Option<u64> {
        self.free_by_size
            .range((size, 0)..)
            .map(|&(size, addr)| Interval {
                addr,
                size,
                tensor: None,
            })
            .find(|i| keep(i))
            .map(|i| i.addr)
    }

    /// Address that puts `size` bytes at the right end of the highest-addressed
    /// free interval that can hold them.
    pub fn last_fit(&self, size: u64) -> Option<u64> {
        self.intervals
            .iter()
            .rev()
            .find(|i| i.tensor.is_none() && i.size >= size)
            .map(|i| i.addr + i.size - size)
    }

    /// The free interval that contains `addr`, if any.
    pub fn free_block_at(&self, addr: u64) -> Option<Interval> {
        let k = self.intervals.partition_point(|i| i.addr <= addr);
        let block = self.intervals[k.checked_sub(1)?];
        (block.tensor.is_none() && addr < block.addr + block.size).then_some(block)
    }

    /// The gaps between pinned tensors (see the module docs) of at least
    /// `bytes` bytes, as `(start, end)`, in address order.
    pub fn gaps_of_at_least(&self, bytes: u64) -> Vec<(u64, u64)> {
        let mut found: Vec<(u64, u64)> = self
            .gaps_by_size
            .range((bytes, 0)..)
            .map(|&(size, start)| (start, start + size))
            .collect();
        found.sort_unstable();
        found
    }

    /// The same gaps as [`Pool::gaps_of_at_least`], each as the index range
    /// of its intervals in [`Pool::interval_array`] ([`Pool::indices_in`]),
    /// in address order, into `runs` (cleared first, so that a search can
    /// reuse its buffer): what the window searches sweep, since no window
    /// holds a pinned tensor. Every gap has bytes and so starts an interval:
    /// no range is empty, and index order is address order.
    pub fn gap_runs_of_at_least_into(&self, bytes: u64, runs: &mut Vec<Range<usize>>) {
        runs.clear();
        runs.extend(
            self.gaps_by_size
                .range((bytes, 0)..)
                .map(|&(size, start)| self.indices_in(start, start + size)),
        );
        runs.sort_unstable_by_key(|run| run.start);
    }

    /// Intervals whose start lies in `[start, end)`, in address order, as
    /// one slice of the pool's array.
    pub fn intervals_in(&self, start: u64, end: u64) -> &[Interval] {
        &self.intervals[self.indices_in(start, end)]
    }

    /// The intervals in address order as one slice: a search that keeps
    /// something per interval keeps it by index into this slice (the
    /// indices hold until the pool changes).
    pub fn interval_array(&self) -> &[Interval] {
        &self.intervals
    }

    /// Indices in [`Pool::interval_array`] of the intervals whose start lies
    /// in `[start, end)`.
    pub fn indices_in(&self, start: u64, end: u64) -> Range<usize> {
        self.index_from(start)..self.index_from(end)
    }

    fn add_gap(&mut self, start: u64, end: u64) {
        if start < end {
            self.gaps.insert(start, end);
            self.gaps_by_size.insert((end - start, start));
        }
    }

    fn remove_gap(&mut self, start: u64) -> Option<u64> {
        let end = self.gaps.remove(&start)?;
        self.gaps_by_size.remove(&(end - start, start));
        Some(end)
    }

    /// Puts pinned tensor `id` of `size` bytes at `addr`, as [`Pool::place`],
    /// and splits the gap it lands in.
    pub fn place_pinned(&mut self, id: TensorId, addr: u64, size: u64) -> RematResult<()> {
        self.place(id, addr, size)?;
        if size > 0 {
            // A placed range is free space, which no pinned tensor holds, so
            // it lies inside one gap.
            if let Some((&start, _)) = self.gaps.range(..=addr).next_back()
                && let Some(end) = self.remove_gap(start)
            {
                self.add_gap(start, addr);
                self.add_gap(addr + size, end);
            }
            self.pinned.insert(addr, addr + size);
        }
        Ok(())
    }

    /// Puts tensor `id` of `size` bytes at `addr`; the space must be free.
    pub fn place(&mut self, id: TensorId, addr: u64, size: u64) -> RematResult<()> {
        if self.addr_of.contains_key(&id) {
            return Err(RematError::AlreadyResident(id));
        }
        let end = addr.saturating_add(size);
        if end > self.capacity {
            return Err(RematError::OutOfPool {
                tensor: id,
                end,
                capacity: self.capacity,
            });
        }
        let overlap = RematError::Overlap {
            tensor: id,
            addr,
            size,
        };
        let block = self.free_block_at(addr).ok_or(overlap.clone())?;
        if end > block.addr + block.size {
            return Err(overlap);
        }
        // The block becomes up to three intervals: free space before the
        // tensor, the tensor, free space after it; one splice, one shift of
        // the array's tail.
        let mut pieces = [block; 3];
        let mut count = 0;
        if addr > block.addr {
            pieces[count] = Interval {
                addr: block.addr,
                size: addr - block.addr,
                tensor: None,
            };
            count += 1;
        }
        pieces[count] = Interval {
            addr,
            size,
            tensor: Some(id),
        };
        count += 1;
        if end < block.addr + block.size {
            pieces[count] = Interval {
                addr: end,
                size: block.addr + block.size - end,
                tensor: None,
            };
            count += 1;
        }
        let k = self
            .index_at(block.addr)
            .expect("a free block starts an interval");
        self.free_by_size.remove(&(block.size, block.addr));
        for piece in pieces[..count].iter().filter(|p| p.tensor.is_none()) {
            self.free_by_size.insert((piece.size, piece.addr));
        }
        self.intervals
            .splice(k..=k, pieces[..count].iter().copied());
        self.addr_of.insert(id, addr);
        self.free_bytes -= size;
        Ok(())
    }

    /// Frees the space of tensor `id`, merging it with free neighbours.
    pub fn release(&mut self, id: TensorId) -> RematResult<()> {
        let addr = self
            .addr_of
            .remove(&id)
            .ok_or(RematError::UnknownTensor(id))?;
        let k = self.index_at(addr).ok_or(RematError::UnknownTensor(id))?;
        let size = self.intervals[k].size;
        self.free_bytes += size;
        if let Some(end) = self.pinned.remove(&addr) {
            // The gaps on either side (if any) and the tensor become one.
            let mut start = addr;
            if let Some((&left, &left_end)) = self.gaps.range(..addr).next_back()
                && left_end == addr
            {
                self.remove_gap(left);
                start = left;
            }
            let end = self.remove_gap(end).unwrap_or(end);
            self.add_gap(start, end);
        }
        // Intervals `first..=last` (the tensor's, and a free neighbour on
        // either side) become one free interval; one shift of the tail.
        let free = |j: usize| self.intervals.get(j).is_some_and(|i| i.tensor.is_none());
        let first = if k > 0 && free(k - 1) { k - 1 } else { k };
        let last = if free(k + 1) { k + 1 } else { k };
        let end = self.intervals[last].addr + self.intervals[last].size;
        let start = self.intervals[first].addr;
        for j in [first, last] {
            let neighbour = self.intervals[j];
            if neighbour.tensor.is_none() {
                self.free_by_size.remove(&(neighbour.size, neighbour.addr));
            }
        }
        self.free_by_size.insert((end - start, start));
        self.intervals[first] = Interval {
            addr: start,
            size: end - start,
            tensor: None,
        };
        self.intervals.drain(first + 1..=last);
        Ok(())
    }

    /// Validates the invariants: the intervals tile `[0, capacity)` in order,
    /// every tensor has exactly one interval (so no two live tensors overlap),
    /// no two free intervals touch, the gaps agree with the pinned ranges,
    /// the free-size index holds exactly the free intervals, and the
    /// free-byte count agrees.
    pub fn check(&self) -> RematResult<()> {
        let broken = |why: String| Err(RematError::Invariant(why));
        let (mut next, mut free, mut last_free, mut tensors) = (0u64, 0u64, false, 0usize);
        for i in &self.intervals {
            if i.addr != next || i.size == 0 {
                return broken(format!(
                    "interval at {:#x} ({} bytes) does not follow {next:#x}",
                    i.addr, i.size
                ));
            }
            match i.tensor {
                None if last_free => {
                    return broken(format!("two free intervals touch at {:#x}", i.addr));
                }
                None => free += i.size,
                Some(t) if self.addr_of.get(&t) != Some(&i.addr) => {
                    return broken(format!("tensor {t} at {:#x} is indexed elsewhere", i.addr));
                }
                Some(_) => tensors += 1,
            }
            last_free = i.tensor.is_none();
            next = i.addr + i.size;
        }
        if next != self.capacity {
            return broken(format!(
                "intervals end at {next:#x}, capacity is {:#x}",
                self.capacity
            ));
        }
        let (mut gaps, mut from) = (BTreeMap::new(), 0u64);
        for (&start, &end) in &self.pinned {
            if self
                .index_at(start)
                .map(|k| &self.intervals[k])
                .is_none_or(|i| i.tensor.is_none() || start + i.size != end)
            {
                return broken(format!(
                    "pinned range at {start:#x} is no tensor's interval"
                ));
            }
            if from < start {
                gaps.insert(from, start);
            }
            from = end;
        }
        if from < self.capacity {
            gaps.insert(from, self.capacity);
        }
        let by_size: BTreeSet<_> = gaps.iter().map(|(&s, &e)| (e - s, s)).collect();
        if gaps != self.gaps || by_size != self.gaps_by_size {
            return broken("gaps between pinned tensors disagree with the pinned ranges".into());
        }
        let free_blocks: BTreeSet<_> = self
            .intervals
            .iter()
            .filter(|i| i.tensor.is_none())
            .map(|i| (i.size, i.addr))
            .collect();
        if free_blocks != self.free_by_size {
            return broken("the free-size index disagrees with the free intervals".into());
        }
        if tensors != self.addr_of.len() || free != self.free_bytes {
            return broken(format!(
                "{tensors} tensor intervals for {} indexed tensors; {free} free bytes counted, {} recorded",
                self.addr_of.len(),
                self.free_bytes
            ));
        }
        Ok(())
    }
}

/// Interval constructors for the tests of the modules that read a pool's
/// intervals (the window searches).
#[cfg(test)]
pub(crate) mod test_intervals {
    use super::Interval;
    use crate::tensor::TensorId;

    /// Free space of `size` bytes at `addr`.
    pub(crate) fn free(addr: u64, size: u64) -> Interval {
        Interval {
            addr,
            size,
            tensor: None,
        }
    }

    /// Tensor `t` of `size` bytes at `addr`.
    pub(crate) fn used(addr: u64, size: u64, t: TensorId) -> Interval {
        Interval {
            addr,
            size,
            tensor: Some(t),
        }
    }
}
