//! Tensor metadata of a replay: size, the compute cost of the op that made the
//! tensor, the op's inputs, whether it may be evicted, where it lives, when it
//! was last used, and how many running ops hold it (locks). Also the evicted
//! neighbourhood used by the DTR-style costs.
//!
//! What changes while a replay runs and a search reads for every interval
//! (last use, locks, residency, pinned) is kept apart from the fixed
//! description, densely ([`TensorState`], 16 bytes a tensor): a search reads
//! it for every tensor in the pool, most of them cold since the last search,
//! and four states share a cache line where a whole [`Tensor`] (its input
//! list included) took more than one.
//!
//! A [`TensorTable`] belongs to one executor and is touched by one thread; the
//! policies read it through `&TensorTable` while they search. With
//! [`TensorTable::cache_prices`] on, projected costs and recompute peaks are
//! kept between searches (`super::price`); residency must then change only
//! through `drop_value`, `set_resident` and `release_evicted`, which
//! invalidate them. With [`TensorTable::borrow_live_inputs`] on, a tensor's
//! prices leave out its inputs that are evicted but not dropped.

use std::cell::{RefCell, RefMut};

use super::error::{RematError, RematResult};
use super::neighbourhood::EvictedClasses;
use super::price::PriceCache;

/// Index of a tensor in its trace (outputs are numbered in order of creation).
pub type TensorId = usize;

/// Where a tensor's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Not computed yet.
    Unborn,
    /// In the pool at this address.
    Resident(u64),
    /// Dropped by a policy; recomputable from its inputs.
    Evicted,
    /// Dropped by the program (its last use passed, or an in-place op wrote
    /// over it); kept as metadata because an evicted tensor may still need it.
    Released,
}

/// Everything the executor and the policies know about one tensor.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Bytes.
    pub size: u64,
    /// Compute cost of the op that makes it (same unit as the trace's costs).
    pub cost: f64,
    /// Inputs of the op that makes it.
    pub inputs: Vec<TensorId>,
    /// Parameters, gradients, optimizer state: never evicted. Fixed when
    /// the tensor is added (its [`TensorState`] keeps a copy).
    pub pinned: bool,
    /// Where the value is (its [`TensorState`] says whether it is resident).
    pub residency: Residency,
}

impl Tensor {
    /// Compute cost per byte; the cheap/expensive split of Coop uses it.
    pub fn cost_density(&self) -> f64 {
        self.cost / self.size.max(1) as f64
    }
}

/// The part of a tensor that a search reads for every interval, kept densely
/// by the [`TensorTable`] (`TensorTable::state`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TensorState {
    /// Logical time (op index) of the last use.
    pub last_access: u64,
    /// Running ops that need it resident; a locked tensor is not evictable.
    pub locks: u32,
    /// Its residency is `Resident`.
    pub resident: bool,
    /// `Tensor::pinned`.
    pub pinned: bool,
}

impl TensorState {
    /// Logical time since the last use, at least 1.
    #[inline]
    pub fn staleness(&self, now: u64) -> f64 {
        let ops = now.saturating_sub(self.last_access) + 1;
        // Through i64, one conversion instruction where u64 takes several
        // (a search does this for every evictable tensor): the same value,
        // since op counts are far below 2^63.
        debug_assert!(ops < 1 << 63);
        ops as i64 as f64
    }

    /// True when a policy may evict it now: resident, not pinned, not locked.
    #[inline]
    pub fn is_evictable(&self) -> bool {
        !self.pinned && self.locks == 0 && self.resident
    }
}

/// All tensors of a replay plus who consumes whom and the evicted classes.
#[derive(Debug, Clone, Default)]
pub struct TensorTable {
    tensors: Vec<Tensor>,
    consumers: Vec<Vec<TensorId>>,
    /// Each tensor's [`TensorState`]; `resident` is kept by `drop_value`
    /// and `set_resident`, the only ways in and out of the pool.
    states: Vec<TensorState>,
    classes: EvictedClasses,
    /// Cached prices, when on; filled by searches through `&self`.
    price_cache: Option<RefCell<PriceCache>>,
    /// Per tensor: an in-place op writes over it (its output takes its
    /// place), so the program drops it as an old version, not because its
    /// last use passed (`dropped_chain`).
    overwritten: Vec<bool>,
    /// Prices leave out the inputs that a policy evicted and the program
    /// still holds (`AddedRules::borrow_live_inputs`): see
    /// [`TensorTable::borrow_live_inputs`].
    live_inputs_borrowed: bool,
}

impl TensorTable {
    /// Adds a tensor made by an op with these inputs; returns its id.
    pub fn add(
        &mut self,
        size: u64,
        cost: f64,
        inputs: Vec<TensorId>,
        pinned: bool,
    ) -> RematResult<TensorId> {
        let id = self.tensors.len();
        for &input in &inputs {
            let list = self.consumers.get_mut(input).ok_or_else(|| {
                RematError::BadTrace(format!("tensor {id} uses tensor {input} before it is made"))
            })?;
            list.push(id);
        }
        self.tensors.push(Tensor {
            size,
            cost,
            inputs,
            pinned,
            residency: Residency::Unborn,
        });
        self.consumers.push(Vec::new());
        self.overwritten.push(false);
        self.states.push(TensorState {
            pinned,
            ..TensorState::default()
        });
        self.classes.grow_to(id + 1);
        if let Some(prices) = &mut self.price_cache {
            prices.get_mut().grow_to(id + 1);
        }
        Ok(id)
    }

    /// Notes that an in-place op writes over `id` (see `overwritten`).
    pub fn mark_overwritten(&mut self, id: TensorId) {
        if let Some(o) = self.overwritten.get_mut(id) {
            *o = true;
        }
    }

    /// Whether an in-place op writes over `id` in the trace.
    pub fn is_overwritten(&self, id: TensorId) -> bool {
        self.overwritten.get(id).copied().unwrap_or(false)
    }

    /// Keeps projected costs and recompute peaks at `depth` between searches
    /// from now on, each recomputed only after an event that can change it
    /// (`super::price`). The values returned are the same either way.
    pub fn cache_prices(&mut self, depth: u32) {
        self.price_cache = Some(RefCell::new(PriceCache::new(self.tensors.len(), depth)));
        self.classes.note_changes(true);
    }

    /// From now on a tensor's prices leave out its inputs that are evicted
    /// but not dropped by the program (`Residency::Evicted`): the projected
    /// cost the evicted classes reached only through them, the recompute
    /// peak their bytes and chains, at every level. Such an input is read
    /// by the program again, so it comes back, with its chain, whether or
    /// not the tensor is evicted; bringing it back to recompute the tensor
    /// borrows it early (on Swin-T, fc1's output is read by `gelu_backward`
    /// just after fc2's backward reads the GELU output made from it). A
    /// dropped input is rebuilt for the tensor alone and still counts
    /// (`AddedRules::borrow_live_inputs`; set before any price is asked).
    pub fn borrow_live_inputs(&mut self) {
        self.live_inputs_borrowed = true;
    }

    /// Whether input `input` is left out of its consumers' prices: it is
    /// evicted and not dropped, and [`Self::borrow_live_inputs`] is on.
    #[inline]
    fn borrowed(&self, input: TensorId) -> bool {
        self.live_inputs_borrowed && self.tensors[input].residency == Residency::Evicted
    }

    /// Prices read from the cache and prices computed, when caching.
    pub fn price_stats(&self) -> Option<(u64, u64)> {
        self.price_cache.as_ref().map(|p| p.borrow().stats())
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// One tensor.
    pub fn get(&self, id: TensorId) -> RematResult<&Tensor> {
        self.tensors.get(id).ok_or(RematError::UnknownTensor(id))
    }

    fn get_mut(&mut self, id: TensorId) -> RematResult<&mut Tensor> {
        self.tensors
            .get_mut(id)
            .ok_or(RematError::UnknownTensor(id))
    }

    /// The state of one tensor (last use, locks, resident, pinned).
    #[inline]
    pub fn state(&self, id: TensorId) -> RematResult<TensorState> {
        self.states
            .get(id)
            .copied()
            .ok_or(RematError::UnknownTensor(id))
    }

    /// Marks `id` as used at logical time `now`.
    pub fn touch(&mut self, id: TensorId, now: u64) -> RematResult<()> {
        let state = self
            .states
            .get_mut(id)
            .ok_or(RematError::UnknownTensor(id))?;
        state.last_access = now;
        Ok(())
    }

    /// Adds `delta` to the locks of `id` (a running op holds or lets go of it).
    pub fn lock(&mut self, id: TensorId, delta: i32) -> RematResult<()> {
        let state = self
            .states
            .get_mut(id)
            .ok_or(RematError::UnknownTensor(id))?;
        state.locks = state.locks.checked_add_signed(delta).ok_or_else(|| {
            RematError::Invariant(format!("tensor {id} unlocked more often than locked"))
        })?;
        Ok(())
    }

    /// The program dropped an evicted tensor: it stays out of the pool, now
    /// as `Released` (it was missing already, so nothing it prices changes,
    /// unless live inputs are borrowed: then its consumers' prices count it
    /// from now on, and are forgotten).
    pub fn release_evicted(&mut self, id: TensorId) -> RematResult<()> {
        let tensor = self.get_mut(id)?;
        if tensor.residency == Residency::Evicted {
            tensor.residency = Residency::Released;
            if self.live_inputs_borrowed {
                self.invalidate_prices(id, true, true);
            }
        }
        Ok(())
    }

    /// True when the tensor is in the pool.
    pub fn is_resident(&self, id: TensorId) -> bool {
        self.states.get(id).is_some_and(|s| s.resident)
    }

    /// True when the tensor may never be evicted (an unknown id is not).
    pub fn is_pinned(&self, id: TensorId) -> bool {
        self.states.get(id).is_some_and(|s| s.pinned)
    }

    /// True when a policy may evict it now: resident, not pinned, not locked.
    pub fn is_evictable(&self, id: TensorId) -> bool {
        self.states.get(id).is_some_and(TensorState::is_evictable)
    }

    /// Inputs and consumers of a tensor: its graph neighbourhood.
    pub fn neighbours(&self, id: TensorId) -> Vec<TensorId> {
        let mut all = self.tensors[id].inputs.clone();
        all.extend_from_slice(&self.consumers[id]);
        all
    }

    /// DTR's projected cost: own cost plus the evicted classes next to it
    /// (with [`Self::borrow_live_inputs`], not those reached only through
    /// an input that is evicted and not dropped).
    pub fn projected_cost(&self, id: TensorId) -> f64 {
        self.prices().projected_cost(id)
    }

    /// [`Self::projected_cost`] computed afresh, never read from or written
    /// to the price cache (the reference that cached prices are checked
    /// against).
    pub fn projected_cost_uncached(&self, id: TensorId) -> f64 {
        let mut neighbours = self.neighbours(id);
        // Only with the rule on (DTR's uncached price is its search, and
        // the baseline of the latency criterion: no extra pass by default).
        if self.live_inputs_borrowed {
            let inputs = self.tensors[id].inputs.len();
            let mut k = 0;
            neighbours.retain(|&n| {
                k += 1;
                k > inputs || !self.borrowed(n)
            });
        }
        self.tensors[id].cost + self.classes.neighbour_cost(&neighbours)
    }

    /// Projected costs and recompute peaks for one search, reading the price
    /// cache (when on) through one borrow.
    pub fn prices(&self) -> Prices<'_> {
        Prices {
            table: self,
            cache: self.price_cache.as_ref().map(RefCell::borrow_mut),
        }
    }

    /// Bytes that must be resident at once to recompute `id` from what is
    /// resident now: the tensor, its missing (evicted or released) inputs,
    /// and, for each of those in turn, what recomputing it needs on top of
    /// the missing siblings recomputed before it (the executor recomputes
    /// inputs in order and holds each until its consumer runs). Followed
    /// `depth` levels up the graph of missing tensors; deeper ancestors count
    /// as resident, so this is a lower bound on the true peak. With
    /// [`Self::borrow_live_inputs`], inputs that are evicted and not dropped
    /// count as resident, at every level.
    pub fn recompute_peak(&self, id: TensorId, depth: u32) -> u64 {
        self.prices().recompute_peak(id, depth)
    }

    /// [`Self::recompute_peak`] computed afresh, never read from or written
    /// to the price cache.
    pub fn recompute_peak_uncached(&self, id: TensorId, depth: u32) -> u64 {
        let tensor = &self.tensors[id];
        let inputs = &tensor.inputs;
        // Missing inputs, each once (an op may read a tensor twice); input
        // lists are short, so the quadratic check allocates nothing.
        let missing = inputs
            .iter()
            .enumerate()
            .filter(|&(k, &i)| !self.is_resident(i) && !inputs[..k].contains(&i))
            .filter(|&(_, &i)| !self.borrowed(i))
            .map(|(_, &i)| i);
        let (mut held, mut chain) = (0u64, 0u64);
        for input in missing {
            if depth > 0 {
                chain = chain.max(held + self.recompute_peak_uncached(input, depth - 1));
            }
            held += self.tensors[input].size;
        }
        (tensor.size + held).max(chain)
    }

    /// Logical time since the last use, at least 1.
    pub fn staleness(&self, id: TensorId, now: u64) -> f64 {
        self.states[id].staleness(now)
    }

    /// Marks a resident tensor as gone (`Evicted` or `Released`) and joins it
    /// to its evicted neighbours.
    pub fn drop_value(&mut self, id: TensorId, to: Residency) -> RematResult<()> {
        let neighbours = self.neighbours(id);
        let tensor = self.get_mut(id)?;
        let was_resident = matches!(tensor.residency, Residency::Resident(_));
        tensor.residency = to;
        let cost = tensor.cost;
        self.states[id].resident = false;
        self.classes.add(id, cost, &neighbours);
        self.invalidate_prices(id, true, was_resident);
        Ok(())
    }

    /// Marks a tensor as computed at `addr`.
    pub fn set_resident(&mut self, id: TensorId, addr: u64, now: u64) -> RematResult<()> {
        let tensor = self.get_mut(id)?;
        let cost = tensor.cost;
        // Unborn to resident reads no new residency: nothing born descends
        // from a tensor computed for the first time.
        let was_missing = matches!(tensor.residency, Residency::Evicted | Residency::Released);
        tensor.residency = Residency::Resident(addr);
        let state = &mut self.states[id];
        (state.resident, state.last_access) = (true, now);
        let left_class = self.classes.remove(id, cost);
        self.invalidate_prices(id, left_class, was_missing);
        Ok(())
    }

    /// The cached prices that `id` leaving or joining an evicted class
    /// (`class_moved`) and becoming resident or missing (`residency_moved`)
    /// can change (`super::price`).
    fn invalidate_prices(&mut self, id: TensorId, class_moved: bool, residency_moved: bool) {
        let Some(prices) = &mut self.price_cache else {
            return;
        };
        let prices = prices.get_mut();
        prices.invalidate(id);
        if class_moved {
            let neighbours = self.tensors[id].inputs.iter().chain(&self.consumers[id]);
            prices.invalidate_projected(neighbours.copied());
        }
        let mut changed = prices.take_changed_buffer();
        self.classes.take_changed(&mut changed);
        prices.invalidate_classes(&mut changed);
        prices.put_changed_buffer(changed);
        if residency_moved {
            let tensors = &self.tensors;
            prices.invalidate_descendants(id, &self.consumers, |c| {
                matches!(
                    tensors[c].residency,
                    Residency::Evicted | Residency::Released
                )
            });
        }
    }

    /// Compares every cached price with a fresh computation, and the dense
    /// residency flags with the tensors' records.
    pub fn check_prices(&self) -> RematResult<()> {
        for (id, tensor) in self.tensors.iter().enumerate() {
            // Cached projected costs walk consumers in increasing id order.
            if !self.consumers[id].is_sorted() {
                return Err(RematError::Invariant(format!(
                    "tensor {id}: consumers {:?} out of order",
                    self.consumers[id]
                )));
            }
            let resident = matches!(tensor.residency, Residency::Resident(_));
            let state = self.states[id];
            if state.resident != resident || state.pinned != tensor.pinned {
                return Err(RematError::Invariant(format!(
                    "tensor {id}: {:?}, pinned {}, but its state says {state:?}",
                    tensor.residency, tensor.pinned
                )));
            }
        }
        let Some(prices) = &self.price_cache else {
            return Ok(());
        };
        let prices = prices.borrow();
        for id in 0..self.tensors.len() {
            let (projected, peak) = prices.cached(id);
            let fresh = self.projected_cost_uncached(id);
            if projected.is_some_and(|p| p.to_bits() != fresh.to_bits()) {
                return Err(RematError::Invariant(format!(
                    "tensor {id}: cached projected cost {projected:?}, fresh {fresh}"
                )));
            }
            let fresh = self.recompute_peak_uncached(id, prices.depth());
            if peak.is_some_and(|p| p != fresh) {
                return Err(RematError::Invariant(format!(
                    "tensor {id}: cached recompute peak {peak:?}, fresh {fresh}"
                )));
            }
            let fresh = crate::policy::amplification(fresh, self.tensors[id].size);
            let amplification = prices.cached_amplification(id);
            if amplification.is_some_and(|a| a.to_bits() != fresh.to_bits()) {
                return Err(RematError::Invariant(format!(
                    "tensor {id}: cached recompute amplification {amplification:?}, fresh {fresh}"
                )));
            }
        }
        Ok(())
    }
}

/// Projected costs and recompute peaks with the table's price cache, when
/// it has one, borrowed for as long as this lives (one search).
pub struct Prices<'a> {
    table: &'a TensorTable,
    cache: Option<RefMut<'a, PriceCache>>,
}

impl Prices<'_> {
    /// [`TensorTable::projected_cost`].
    pub fn projected_cost(&mut self, id: TensorId) -> f64 {
        let table = self.table;
        let Some(cache) = &mut self.cache else {
            return table.projected_cost_uncached(id);
        };
        if let Some(cost) = cache.projected(id) {
            return cost;
        }
        // The same sum over the same neighbours in the same order (inputs
        // but the borrowed ones, then consumers, which `add` lists in
        // increasing id order) as the uncached one, with no allocation.
        let classes = table.classes.neighbour_cost_roots_sorted(
            &table.tensors[id].inputs,
            &table.consumers[id],
            |n| table.borrowed(n),
            &mut cache.roots,
        );
        let cost = table.tensors[id].cost + classes;
        cache.store_projected(id, cost);
        cost
    }

    /// [`TensorTable::recompute_peak`]; cached only at the cache's depth.
    pub fn recompute_peak(&mut self, id: TensorId, depth: u32) -> u64 {
        let table = self.table;
        match &mut self.cache {
            Some(cache) if cache.depth() == depth => {
                if let Some(peak) = cache.peak(id) {
                    return peak;
                }
                let peak = table.recompute_peak_uncached(id, depth);
                cache.store_peak(id, peak, table.tensors[id].size);
                peak
            }
            _ => table.recompute_peak_uncached(id, depth),
        }
    }

    /// `(self.projected_cost(id), self.recompute_amplification(id, depth))`,
    /// the two prices of Coop's score, with one read of the cache when it
    /// holds both.
    #[inline]
    pub fn projected_and_amplification(&mut self, id: TensorId, depth: u32) -> (f64, f64) {
        if let Some(cache) = &mut self.cache
            && cache.depth() == depth
            && let Some(both) = cache.projected_and_amplification(id)
        {
            return both;
        }
        self.projected_and_amplification_one_by_one(id, depth)
    }

    #[inline(never)]
    fn projected_and_amplification_one_by_one(&mut self, id: TensorId, depth: u32) -> (f64, f64) {
        (
            self.projected_cost(id),
            self.recompute_amplification(id, depth),
        )
    }

    /// `policy::amplification(self.recompute_peak(id, depth), size of id)`,
    /// kept in the cache beside the peak (no division when cached).
    #[inline]
    pub fn recompute_amplification(&mut self, id: TensorId, depth: u32) -> f64 {
        let table = self.table;
        let size = table.tensors[id].size;
        match &mut self.cache {
            Some(cache) if cache.depth() == depth => {
                if let Some(amplification) = cache.amplification(id) {
                    return amplification;
                }
                let peak = table.recompute_peak_uncached(id, depth);
                cache.store_peak(id, peak, size);
                crate::policy::amplification(peak, size)
            }
            _ => crate::policy::amplification(table.recompute_peak_uncached(id, depth), size),
        }
    }
}
