//! Replays an op trace under a memory budget with one eviction policy, and
//! measures what the policy cost: recomputation, fragmentation at each
//! eviction, evictions, and the wall time of each search. Also a bisection for
//! the smallest budget at which a policy finishes, and a scan for the lowest
//! budget down to which it finishes at every step (`steady_min_ratio`).
//!
//! An op runs in three steps: its inputs are made resident (evicted ones are
//! recomputed recursively, inputs first, each held by a lock while its
//! siblings are recomputed) and locked; its outputs are placed (evicting what
//! the policy says until they fit); then the program's drops are applied.
//! A recomputation recomputes only the tensor asked for, at the full cost of
//! its op (multi-output ops are not recomputed as a unit). A recomputed
//! input that the program had dropped stays resident afterwards, evictable,
//! unless the policy asks for it to be freed again once nothing holds it
//! (`AddedRules::drop_dead_inputs`, Coop's default). When a tensor
//! fits nowhere, a policy may ask for its inputs that only its op holds to
//! be moved so that it fits beside them (`AddedRules::relocate_inputs`,
//! Coop's default; each move charged as a device copy of the moved tensor
//! where the trace says what a copy costs and
//! `ReplayOptions::moves_as_copies` is on, the default, else as a
//! recomputation of it), and failing that for every tensor the op and its
//! recomputation chain hold, and one pinned tensor splitting a run, to be
//! moved (`AddedRules::move_held_tensors`, Coop's default,
//! `executor/held.rs`);
//! otherwise the replay runs out of memory there. Before the policy evicts
//! for a request that fits no free block while the pool's free bytes would
//! hold it, the tensors of the window with the fewest of them may be moved
//! out so that the holes join (`AddedRules::join_holes_by_moves`, Coop's
//! default, `executor/moves.rs`; its time counts in the search time of
//! an allocation that then evicts). Two more moves, off in every policy,
//! join holes divided by small tensors (`AddedRules::compact_dividers`,
//! `AddedRules::move_small_in_windows`, `executor/compact.rs`).
//!
//! In-place ops: under DTR and DTE the output is a copy (copy-on-write, as
//! DTR's prototype rewrites in-place ops) and the input dies after it; Coop
//! writes at the input's address, and does so again when it recomputes the
//! op over a recomputed input that the program had dropped. An in-place op over a *pinned* tensor (an
//! optimizer updating a parameter or its state, a gradient accumulating)
//! writes in place under every policy: a pinned tensor is never evicted, so
//! keeping its old version for recomputation buys nothing, and a copy of a
//! large parameter at the end of a step, when almost everything resident is
//! pinned, would decide a baseline's minimum budget by itself.
//!
//! One executor owns its pool, table and policy; single-threaded.

use std::time::Instant;

mod compact;
mod held;
mod moves;

use super::chain_order::ordered_inputs;
use super::error::{RematError, RematResult};
use super::policy::{EvictionPolicy, RECOMPUTE_DEPTH, Request, SearchContext};
use super::pool::Pool;
use super::tensor::{Residency, TensorId, TensorTable};
use super::trace::{CopyCost, Op, Trace};

/// What one replay measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Policy name.
    pub policy: &'static str,
    /// Pool capacity in bytes.
    pub budget: u64,
    /// Why the replay stopped early, or `None` when it finished.
    pub error: Option<RematError>,
    /// Ops run to completion.
    pub ops_done: usize,
    /// Sum of the trace's op costs.
    pub original_cost: f64,
    /// Sum of the costs of all recomputations.
    pub recompute_cost: f64,
    /// Tensors recomputed.
    pub recomputations: usize,
    /// Tensors evicted.
    pub evictions: usize,
    /// Tensors moved by a layout rule (`AddedRules::relocate_inputs` and
    /// the others); each move is charged in `recompute_cost`.
    pub relocations: usize,
    /// The part of `recompute_cost` charged for moves: copies
    /// (`ReplayOptions::moves_as_copies`) or recomputations.
    pub move_cost: f64,
    /// Free bytes / capacity, right after each allocation that had to evict.
    pub fragmentation: Vec<f64>,
    /// Wall time of the policy's search for each allocation that had to evict
    /// (all its rounds together, and the failed passes of
    /// `AddedRules::join_holes_by_moves` and `compact_dividers` before
    /// them), in nanoseconds.
    pub search_ns: Vec<u64>,
}

impl Report {
    /// Whether the whole trace ran.
    pub fn finished(&self) -> bool {
        self.error.is_none()
    }

    /// Recomputation cost over the original cost.
    pub fn overhead(&self) -> f64 {
        if self.original_cost > 0.0 {
            self.recompute_cost / self.original_cost
        } else {
            0.0
        }
    }

    /// Mean fragmentation over the evicting allocations (0 if none).
    pub fn fragmentation_mean(&self) -> f64 {
        mean(self.fragmentation.iter().copied())
    }

    /// Largest fragmentation seen (0 if none).
    pub fn fragmentation_max(&self) -> f64 {
        self.fragmentation.iter().copied().fold(0.0, f64::max)
    }

    /// Mean search time per evicting allocation, in microseconds.
    pub fn search_us_mean(&self) -> f64 {
        mean(self.search_ns.iter().map(|&n| n as f64 / 1e3))
    }
}

fn mean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(s, c), v| (s + v, c + 1));
    if count == 0 { 0.0 } else { sum / count as f64 }
}

/// Replay options.
#[derive(Debug, Clone, Copy)]
pub struct ReplayOptions {
    /// Run `Pool::check` and the residency cross-check after every op (slow).
    pub check_invariants: bool,
    /// Charge a move of a resident tensor as the device-to-device copy it is
    /// (`Trace::copy`; on by default), not as a recomputation of its op (the
    /// charge before, kept for the ablation `compare::copy_ablation`). A
    /// trace that does not say what a copy costs (a built or synthetic one,
    /// in modelled cost units) is charged recomputations either way.
    pub moves_as_copies: bool,
}

impl Default for ReplayOptions {
    fn default() -> ReplayOptions {
        ReplayOptions {
            check_invariants: false,
            moves_as_copies: true,
        }
    }
}

/// Runs `trace` in a pool of `budget` bytes with `policy`.
pub fn replay(
    trace: &Trace,
    budget: u64,
    policy: &mut dyn EvictionPolicy,
    options: ReplayOptions,
) -> Report {
    let name = policy.name();
    let mut executor = match Executor::new(trace, budget, policy, options) {
        Ok(e) => e,
        Err(error) => {
            return Report {
                error: Some(error),
                ..Report::new(name, budget)
            };
        }
    };
    let result = executor.run(trace, options);
    let mut report = executor.report;
    report.error = result.err();
    report
}

impl Report {
    fn new(policy: &'static str, budget: u64) -> Report {
        Report {
            policy,
            budget,
            error: None,
            ops_done: 0,
            original_cost: 0.0,
            recompute_cost: 0.0,
            recomputations: 0,
            evictions: 0,
            relocations: 0,
            move_cost: 0.0,
            fragmentation: Vec::new(),
            search_ns: Vec::new(),
        }
    }
}

/// The state of one replay.
struct Executor<'p> {
    tensors: TensorTable,
    pool: Pool,
    policy: &'p mut dyn EvictionPolicy,
    first_output: Vec<TensorId>,
    /// For the in-place output of an op, the input it overwrote.
    overwrites: Vec<Option<TensorId>>,
    /// Tensors the program has dropped (a recomputed one is still dead).
    dead: Vec<bool>,
    cheap_below: f64,
    /// What a move costs, when it is charged as a copy.
    copy: Option<CopyCost>,
    /// Per tensor: an output of its op other than the op's largest (the
    /// first largest is the main one); for `side_outputs_best_fit`.
    side_output: Vec<bool>,
    now: u64,
    report: Report,
}

impl<'p> Executor<'p> {
    fn new(
        trace: &Trace,
        budget: u64,
        policy: &'p mut dyn EvictionPolicy,
        options: ReplayOptions,
    ) -> RematResult<Executor<'p>> {
        let mut tensors = TensorTable::default();
        let mut first_output = Vec::with_capacity(trace.ops.len());
        let mut overwrites = Vec::with_capacity(trace.tensor_count());
        let mut side_output = Vec::with_capacity(trace.tensor_count());
        for op in &trace.ops {
            first_output.push(tensors.len());
            side_output.extend(side_outputs(op));
            for (k, out) in op.outputs.iter().enumerate() {
                tensors.add(out.size, op.cost, op.inputs.clone(), out.pinned)?;
                overwrites.push((op.in_place && k == 0).then(|| op.inputs[0]));
                if op.in_place && k == 0 {
                    tensors.mark_overwritten(op.inputs[0]);
                }
            }
        }
        if policy.rules().borrow_live_inputs {
            tensors.borrow_live_inputs();
        }
        if policy.caches_prices() {
            tensors.cache_prices(RECOMPUTE_DEPTH);
        }
        let mut report = Report::new(policy.name(), budget);
        report.original_cost = trace.total_cost();
        Ok(Executor {
            tensors,
            pool: Pool::new(budget),
            policy,
            first_output,
            dead: vec![false; overwrites.len()],
            overwrites,
            cheap_below: cheap_threshold(trace),
            copy: trace.copy.filter(|_| options.moves_as_copies),
            side_output,
            now: 0,
            report,
        })
    }

    fn run(&mut self, trace: &Trace, options: ReplayOptions) -> RematResult<()> {
        for (index, op) in trace.ops.iter().enumerate() {
            self.now = index as u64 + 1;
            self.materialize(&op.inputs)?;
            let first = self.first_output[index];
            let outputs: Vec<TensorId> = (first..first + op.outputs.len()).collect();
            // The in-place output goes last: its input dies when it is placed,
            // and the other outputs still read that input.
            for &out in outputs.iter().skip(1) {
                self.compute_output(&op.inputs, out)?;
                self.lock(out, 1)?;
            }
            let in_place = match outputs.first() {
                Some(&out) if op.in_place && self.writes_in_place(op.inputs[0]) => {
                    self.try_in_place(op.inputs[0], out)?
                }
                _ => false,
            };
            if let Some(&out) = outputs.first().filter(|_| !in_place) {
                self.compute_output(&op.inputs, out)?;
                self.lock(out, 1)?;
            }
            let still_locked = &op.inputs[usize::from(in_place)..];
            for &t in still_locked.iter().chain(&outputs) {
                self.lock(t, -1)?;
            }
            for &t in &op.frees {
                self.release(t)?;
            }
            if options.check_invariants {
                self.check()?;
            }
            self.report.ops_done = index + 1;
        }
        Ok(())
    }

    /// Makes every input resident and locks it.
    fn materialize(&mut self, inputs: &[TensorId]) -> RematResult<()> {
        let ordered;
        let inputs = if self.policy.rules().order_inputs {
            ordered = ordered_inputs(&self.tensors, inputs);
            &ordered[..]
        } else {
            inputs
        };
        for &input in inputs {
            if !self.tensors.is_resident(input) {
                self.rematerialize(input)?;
            }
            self.lock(input, 1)?;
        }
        Ok(())
    }

    /// Recomputes an evicted (or released) tensor, recomputing its missing
    /// inputs first; an explicit stack keeps deep chains off the call stack.
    fn rematerialize(&mut self, root: TensorId) -> RematResult<()> {
        let mut stack: Vec<(TensorId, usize)> = vec![(root, 0)];
        // Dropped tensors brought back for this chain: freed again once the
        // whole chain is done, not as soon as their consumer is, since a
        // sibling further up may need them too (freed at once, a chain whose
        // dropped tensors share inputs recomputes them once per consumer,
        // exponentially in its depth).
        let mut recomputed_dead = Vec::new();
        // Each tensor's inputs in the order they are brought back, fixed
        // when it is pushed (`chain_order`, when the policy asks for it).
        let mut orders: Vec<Vec<TensorId>> = vec![self.input_order(root)?];
        while let Some(&(t, next)) = stack.last() {
            let inputs = orders.last().cloned().unwrap_or_default();
            if let Some(&input) = inputs.get(next) {
                if let Some(top) = stack.last_mut() {
                    top.1 += 1;
                }
                if self.tensors.is_resident(input) {
                    self.lock(input, 1)?;
                } else {
                    stack.push((input, 0));
                    orders.push(self.input_order(input)?);
                }
                continue;
            }
            if !self.recompute_in_place(t)? {
                self.compute_output(&inputs, t)?;
            }
            self.report.recompute_cost += self.tensors.get(t)?.cost;
            self.report.recomputations += 1;
            for &input in &inputs {
                self.lock(input, -1)?;
            }
            // The root is what the caller needs next, dropped or not (a
            // dropped tensor can be an op's input again where the program
            // read an old version after an in-place op).
            if self.dead[t] && t != root {
                recomputed_dead.push(t);
            }
            stack.pop();
            orders.pop();
            if !stack.is_empty() {
                self.lock(t, 1)?;
            }
        }
        if self.policy.rules().drop_dead_inputs {
            for t in recomputed_dead {
                self.drop_dead(t)?;
            }
        }
        Ok(())
    }

    /// The inputs of `t` in the order a recomputation of `t` brings them
    /// back: as recorded, or `chain_order`'s when the policy orders inputs.
    fn input_order(&self, t: TensorId) -> RematResult<Vec<TensorId>> {
        let inputs = &self.tensors.get(t)?.inputs;
        Ok(if self.policy.rules().order_inputs {
            ordered_inputs(&self.tensors, inputs)
        } else {
            inputs.clone()
        })
    }

    /// Places tensor `t` (its inputs must be resident) and marks its inputs used.
    fn compute(&mut self, t: TensorId) -> RematResult<()> {
        let inputs = self.tensors.get(t)?.inputs.clone();
        if let Some(&input) = inputs.iter().find(|&&i| !self.tensors.is_resident(i)) {
            return Err(RematError::InputNotResident { tensor: t, input });
        }
        let addr = self.allocate(t)?;
        self.tensors.set_resident(t, addr, self.now)?;
        for input in inputs {
            self.tensors.touch(input, self.now)?;
        }
        Ok(())
    }

    /// Computes output `out` of an op whose inputs are resident and locked.
    /// When it does not fit anywhere and the policy relocates inputs
    /// (`AddedRules::relocate_inputs`), tries once more with the op's
    /// movable inputs and `out` placed as one request
    /// ([`Executor::compute_beside_inputs`]); when that fails too and the
    /// policy moves held tensors (`AddedRules::move_held_tensors`),
    /// with every held tensor moved (`executor/held.rs`).
    fn compute_output(&mut self, inputs: &[TensorId], out: TensorId) -> RematResult<()> {
        let result = match self.compute(out) {
            Err(error @ RematError::OutOfMemory { .. }) if self.policy.rules().relocate_inputs => {
                self.compute_beside_inputs(inputs, out, error)
            }
            result => result,
        };
        match result {
            Err(error @ RematError::OutOfMemory { .. })
                if self.policy.rules().move_held_tensors =>
            {
                self.compute_with_held_and_pinned_moved(out, error)
            }
            result => result,
        }
    }

    /// The op's output `out` fits nowhere, though its locked inputs and the
    /// free and evictable space around them may hold all of them together
    /// (Swin-T at 0.26: two locked 294 MiB inputs in the middle of a
    /// 1,089 MiB run between gradients, 280.7 MiB on one side of them and
    /// 220.5 MiB on the other, for a 294 MiB output). The movable inputs
    /// (resident, not pinned, held by this op alone) are slid, in address
    /// order, against the free space on their left, so that the free space
    /// there joins the space on their right, and the output is placed as
    /// usual; failing that, slid to the right; failing that, they leave
    /// their places and the policy finds room for their bytes and the
    /// output's as one request, where they go side by side in address
    /// order, the output after them. A move is charged
    /// ([`Executor::charge_move`]) and counted in `Report::relocations`.
    /// When nothing works the inputs go back where they were (nothing was
    /// placed since) and `error` is returned.
    fn compute_beside_inputs(
        &mut self,
        inputs: &[TensorId],
        out: TensorId,
        error: RematError,
    ) -> RematResult<()> {
        let mut moved: Vec<(u64, TensorId, u64)> = Vec::new();
        for &i in inputs {
            let state = self.tensors.state(i)?;
            if !state.resident || state.pinned || state.locks != 1 {
                continue;
            }
            if let Some(interval) = self.pool.interval_of(i)
                && !moved.iter().any(|m| m.1 == i)
            {
                moved.push((interval.addr, i, interval.size));
            }
        }
        if moved.is_empty() {
            return Err(error);
        }
        moved.sort_unstable();
        for to_left in [true, false] {
            let order: Vec<_> = if to_left {
                moved.clone()
            } else {
                moved.iter().rev().copied().collect()
            };
            for &(addr, i, size) in &order {
                self.pool.release(i)?;
                let block = self
                    .pool
                    .free_block_at(addr)
                    .ok_or(RematError::UnknownTensor(i))?;
                let to = if to_left {
                    block.addr
                } else {
                    block.addr + block.size - size
                };
                self.pool.place(i, to, size)?;
            }
            match self.compute(out) {
                Ok(()) => return self.settle_moved(&moved),
                Err(RematError::OutOfMemory { .. }) => self.put_back(&moved)?,
                Err(other) => return Err(other),
            }
        }
        self.compute_with_moved_as_one(out, &moved, error)
    }

    /// Computes `out` (its inputs resident and locked) with the tensors of
    /// `moved` (`(old address, tensor, size)`) placed with it as one request:
    /// the moved tensors first, in order, then the output. If no room can be
    /// found, the moved tensors go back where they were and `error` is
    /// returned.
    fn compute_with_moved_as_one(
        &mut self,
        out: TensorId,
        moved: &[(u64, TensorId, u64)],
        error: RematError,
    ) -> RematResult<()> {
        let mut request = self.request_for(out)?;
        let output_size = request.size;
        request.size += moved.iter().map(|m| m.2).sum::<u64>();
        for &(_, i, _) in moved {
            self.pool.release(i)?;
        }
        let Ok((start, evicting)) = self.find_room(&request) else {
            for &(addr, i, size) in moved {
                self.pool.place(i, addr, size)?;
            }
            return Err(error);
        };
        let mut addr = start;
        for &(_, i, size) in moved {
            self.pool.place(i, addr, size)?;
            addr += size;
        }
        self.place(out, addr, output_size)?;
        self.tensors.set_resident(out, addr, self.now)?;
        for input in self.tensors.get(out)?.inputs.clone() {
            self.tensors.touch(input, self.now)?;
        }
        self.record_evicting(evicting);
        self.settle_moved(moved)
    }

    /// Moves the pool's intervals of `moved` (`(old address, tensor, size)`)
    /// back to their old addresses.
    fn put_back(&mut self, moved: &[(u64, TensorId, u64)]) -> RematResult<()> {
        for &(_, i, _) in moved {
            self.pool.release(i)?;
        }
        for &(addr, i, size) in moved {
            self.pool.place(i, addr, size)?;
        }
        Ok(())
    }

    /// The table follows the pool for the inputs of `moved` that the pool
    /// now holds elsewhere; each move is charged and counted.
    fn settle_moved(&mut self, moved: &[(u64, TensorId, u64)]) -> RematResult<()> {
        for &(old, i, _) in moved {
            let addr = self
                .pool
                .interval_of(i)
                .ok_or(RematError::UnknownTensor(i))?
                .addr;
            if addr != old {
                self.charge_move(i, addr)?;
            }
        }
        Ok(())
    }

    /// The table follows a tensor the pool now holds at `to`, and the move is
    /// charged ([`Executor::move_cost`]) and counted as a relocation (every
    /// move rule charges its moves here).
    fn charge_move(&mut self, t: TensorId, to: u64) -> RematResult<()> {
        self.tensors.set_resident(t, to, self.now)?;
        let cost = self.move_cost(t)?;
        self.report.recompute_cost += cost;
        self.report.move_cost += cost;
        self.report.relocations += 1;
        Ok(())
    }

    /// What moving `t` costs: a device copy of its bytes when moves are
    /// charged as copies (`ReplayOptions::moves_as_copies` and a trace that
    /// says what a copy costs), else a recomputation of it (its op's cost).
    fn move_cost(&self, t: TensorId) -> RematResult<f64> {
        let tensor = self.tensors.get(t)?;
        Ok(match self.copy {
            Some(copy) => copy.of(tensor.size),
            None => tensor.cost,
        })
    }

    /// Whether an in-place op over `input` writes at its address: under
    /// a policy with recomputable in-place (Coop), or when `input` is pinned.
    fn writes_in_place(&self, input: TensorId) -> bool {
        self.policy.recomputes_in_place() || self.tensors.get(input).is_ok_and(|t| t.pinned)
    }

    /// Coop's recomputable in-place: `out` takes the address of `input`, which
    /// dies. Returns false (and does nothing) when that cannot be done.
    fn try_in_place(&mut self, input: TensorId, out: TensorId) -> RematResult<bool> {
        let source = self.tensors.get(input)?;
        let Residency::Resident(addr) = source.residency else {
            return Ok(false);
        };
        let size = self.tensors.get(out)?.size;
        if self.tensors.state(input)?.locks != 1 || size > source.size {
            return Ok(false);
        }
        self.lock(input, -1)?;
        self.release(input)?;
        self.place(out, addr, size)?;
        self.tensors.set_resident(out, addr, self.now)?;
        self.lock(out, 1)?;
        Ok(true)
    }

    /// Recomputable in-place during recomputation: an in-place op that is
    /// recomputed writes over its input again when the program has dropped
    /// that input (it was overwritten the first time too) and nothing else
    /// holds it, so that recomputing it needs no second buffer. Returns false
    /// (and does nothing) when that does not apply.
    fn recompute_in_place(&mut self, t: TensorId) -> RematResult<bool> {
        let Some(input) = self.overwrites[t] else {
            return Ok(false);
        };
        if !self.policy.recomputes_in_place() || !self.dead[input] {
            return Ok(false);
        }
        let source = self.tensors.get(input)?;
        let Residency::Resident(addr) = source.residency else {
            return Ok(false);
        };
        let size = self.tensors.get(t)?.size;
        // One lock: the one this recomputation took on its input.
        if self.tensors.state(input)?.locks != 1 || size > source.size || source.pinned {
            return Ok(false);
        }
        let inputs = self.tensors.get(t)?.inputs.clone();
        if inputs.iter().any(|&i| !self.tensors.is_resident(i)) {
            return Ok(false);
        }
        self.pool.release(input)?;
        self.tensors.drop_value(input, Residency::Released)?;
        self.place(t, addr, size)?;
        self.tensors.set_resident(t, addr, self.now)?;
        for i in inputs.into_iter().filter(|&i| i != input) {
            self.tensors.touch(i, self.now)?;
        }
        Ok(true)
    }

    /// Puts `t` into the pool at `addr`, as pinned when it is (so that the
    /// pool keeps the gaps between pinned tensors for window searches).
    fn place(&mut self, t: TensorId, addr: u64, size: u64) -> RematResult<()> {
        if self.tensors.is_pinned(t) {
            self.pool.place_pinned(t, addr, size)
        } else {
            self.pool.place(t, addr, size)
        }
    }

    /// What the policy is asked to find room for when `t` is made.
    fn request_for(&self, t: TensorId) -> RematResult<Request> {
        let tensor = self.tensors.get(t)?;
        Ok(Request {
            size: tensor.size,
            cheap: tensor.cost_density() < self.cheap_below,
            pinned: tensor.pinned,
        })
    }

    /// Finds space for `t`, evicting as the policy says.
    fn allocate(&mut self, t: TensorId) -> RematResult<u64> {
        let request = self.request_for(t)?;
        if let Some(addr) = self.side_output_block(t, &request) {
            self.place(t, addr, request.size)?;
            return Ok(addr);
        }
        let (addr, evicting) = self.find_room(&request)?;
        self.place(t, addr, request.size)?;
        self.record_evicting(evicting);
        Ok(addr)
    }

    /// With `side_outputs_best_fit`, where side output `t` goes without
    /// evicting: the smallest free block that holds it.
    fn side_output_block(&self, t: TensorId, request: &Request) -> Option<u64> {
        let side = self.side_output.get(t).copied().unwrap_or(false);
        if !side || request.pinned || !self.policy.rules().side_outputs_best_fit {
            return None;
        }
        self.pool.best_fit(request.size)
    }

    /// After an allocation that evicted (`search_ns` is then its search
    /// time), records the search time and the pool's free share.
    fn record_evicting(&mut self, search_ns: Option<u64>) {
        if let Some(search_ns) = search_ns {
            self.report.search_ns.push(search_ns);
            let free = self.pool.free_bytes() as f64 / self.pool.capacity().max(1) as f64;
            self.report.fragmentation.push(free);
        }
    }

    /// Where `request` can go, evicting as the policy says; with the
    /// search's time when anything was evicted. Places nothing.
    fn find_room(&mut self, request: &Request) -> RematResult<(u64, Option<u64>)> {
        let request = *request;
        let ctx = SearchContext {
            pool: &self.pool,
            tensors: &self.tensors,
            now: self.now,
        };
        if let Some(addr) = self.policy.place(&ctx, &request) {
            return Ok((addr, None));
        }
        // The passes that move tensors instead of evicting are timed: when
        // they fail, they were part of finding room for the allocation that
        // then evicts, so their time counts in its search time.
        let started = Instant::now();
        let rules = self.policy.rules();
        if rules.compact_dividers
            && let Some(addr) = self.place_after_compaction(&request)?
        {
            return Ok((addr, None));
        }
        if rules.join_holes_by_moves
            && let Some(addr) = self.place_after_moves(&request)?
        {
            return Ok((addr, None));
        }
        let (mut search_ns, mut evicted) = (started.elapsed().as_nanos() as u64, 0usize);
        loop {
            let ctx = SearchContext {
                pool: &self.pool,
                tensors: &self.tensors,
                now: self.now,
            };
            let started = Instant::now();
            let eviction = self.policy.next_eviction(&ctx, &request);
            search_ns += started.elapsed().as_nanos() as u64;
            let Some(eviction) = eviction.filter(|e| !e.victims.is_empty() || e.addr.is_some())
            else {
                return Err(RematError::OutOfMemory {
                    request: request.size,
                    free: self.pool.free_bytes(),
                });
            };
            for &victim in &eviction.victims {
                self.evict(victim)?;
            }
            evicted += eviction.victims.len();
            if let Some(span) = eviction.window {
                evicted += self.move_out_of(&eviction.moved, span)?;
            }
            let ctx = SearchContext {
                pool: &self.pool,
                tensors: &self.tensors,
                now: self.now,
            };
            let addr = eviction.addr.or_else(|| self.policy.place(&ctx, &request));
            if let Some(addr) = addr {
                return Ok((addr, (evicted > 0).then_some(search_ns)));
            }
        }
    }

    /// Frees `t` again when the program has dropped it, it is resident (it
    /// was recomputed for a recomputation chain that is now done) and
    /// nothing holds it.
    fn drop_dead(&mut self, t: TensorId) -> RematResult<()> {
        let state = self.tensors.state(t)?;
        if !self.dead[t] || !state.resident || state.locks != 0 || state.pinned {
            return Ok(());
        }
        self.pool.release(t)?;
        self.tensors.drop_value(t, Residency::Released)
    }

    fn evict(&mut self, t: TensorId) -> RematResult<()> {
        if !self.tensors.is_evictable(t) {
            return Err(RematError::NotEvictable(t));
        }
        self.pool.release(t)?;
        self.tensors.drop_value(t, Residency::Evicted)?;
        self.report.evictions += 1;
        Ok(())
    }

    /// The program drops `t`: its space is freed; its metadata stays.
    fn release(&mut self, t: TensorId) -> RematResult<()> {
        self.dead[t] = true;
        match self.tensors.get(t)?.residency {
            Residency::Resident(_) => {
                self.pool.release(t)?;
                self.tensors.drop_value(t, Residency::Released)
            }
            Residency::Evicted => self.tensors.release_evicted(t),
            Residency::Unborn | Residency::Released => Ok(()),
        }
    }

    fn lock(&mut self, t: TensorId, delta: i32) -> RematResult<()> {
        self.tensors.lock(t, delta)
    }

    /// Pool invariants, plus: every resident tensor sits where the pool says,
    /// no lock outlives its op, and every cached price is what a fresh
    /// computation gives.
    fn check(&self) -> RematResult<()> {
        self.pool.check()?;
        self.tensors.check_prices()?;
        for id in 0..self.tensors.len() {
            let tensor = self.tensors.get(id)?;
            let placed = self.pool.interval_of(id).map(|i| i.addr);
            let resident = match tensor.residency {
                Residency::Resident(addr) => Some(addr),
                _ => None,
            };
            let locks = self.tensors.state(id)?.locks;
            if placed != resident || locks != 0 {
                return Err(RematError::Invariant(format!(
                    "tensor {id}: table says {:?} with {locks} locks, pool says {placed:?}",
                    tensor.residency
                )));
            }
        }
        Ok(())
    }
}

/// Cost density (cost per output byte) below which an op counts as cheap.
/// The paper observes that super-linear ops (matmul, conv) are about an order
/// of magnitude denser than element-wise ones (its Table 1), so the densities
/// of the tensors the partitioning places form two clusters on a log scale.
/// The threshold splits them where the two classes are best separated
/// (Otsu's criterion: the largest between-class variance), over the ops whose
/// outputs may be evicted, each weighted by its output bytes. Pinned outputs
/// are left out, and the weighting keeps launch-bound ops on tiny tensors
/// from setting it: on a real step the optimizer's per-parameter ops are
/// thousands of such points, and an unweighted split over all ops lands
/// among them, calling every activation cheap.
pub fn cheap_threshold(trace: &Trace) -> f64 {
    let mut points: Vec<(f64, f64)> = trace
        .ops
        .iter()
        .filter(|op| op.cost > 0.0 && !op.outputs.is_empty())
        .filter(|op| op.outputs.iter().all(|o| !o.pinned))
        .map(|op| {
            let bytes: u64 = op.outputs.iter().map(|o| o.size).sum();
            ((op.cost / bytes.max(1) as f64).ln(), bytes as f64)
        })
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = points.iter().map(|p| p.1).sum();
    let moment: f64 = points.iter().map(|p| p.0 * p.1).sum();
    let (mut weight, mut sum) = (0.0, 0.0);
    let mut best: Option<(f64, f64)> = None;
    for pair in points.windows(2) {
        weight += pair[0].1;
        sum += pair[0].0 * pair[0].1;
        let rest = total - weight;
        if pair[1].0 == pair[0].0 || rest <= 0.0 {
            continue;
        }
        let gap = sum / weight - (moment - sum) / rest;
        let between = weight * rest * gap * gap;
        if best.is_none_or(|(b, _)| between > b) {
            best = Some((between, (pair[0].0 + pair[1].0) / 2.0));
        }
    }
    best.map_or(0.0, |(_, log)| log.exp())
}

/// For each output of `op`, whether it is a side output: not the op's
/// first largest output.
pub fn side_outputs(op: &Op) -> impl Iterator<Item = bool> + '_ {
    let main = op
        .outputs
        .iter()
        .enumerate()
        .max_by(|(i, a), (j, b)| a.size.cmp(&b.size).then(j.cmp(i)))
        .map(|(k, _)| k);
    (0..op.outputs.len()).map(move |k| Some(k) != main)
}

/// Pool capacity for a budget ratio of the trace's peak live bytes.
pub fn budget_for(trace: &Trace, ratio: f64) -> u64 {
    (trace.peak_live_bytes() as f64 * ratio).ceil() as u64
}

/// The smallest budget ratio in `[low, high]` (to within `tolerance`) at which
/// a fresh policy from `make` finishes, by bisection; `None` if it does not
/// finish at `high`. Finishing is not strictly monotone in the budget, so this
/// is the boundary bisection finds, not a proof that nothing lower works.
pub fn min_budget_ratio(
    trace: &Trace,
    make: &dyn Fn() -> Box<dyn EvictionPolicy>,
    (low, high): (f64, f64),
    tolerance: f64,
) -> Option<f64> {
    let finishes = |ratio: f64| finishes_at(trace, make, ratio);
    if !finishes(high) {
        return None;
    }
    let (mut fail, mut pass) = (low, high);
    if finishes(low) {
        return Some(low);
    }
    while pass - fail > tolerance {
        let mid = (fail + pass) / 2.0;
        if finishes(mid) {
            pass = mid
        } else {
            fail = mid
        }
    }
    Some(pass)
}

/// Where the grid of [`steady_min_ratio`] starts: a pool of the step's peak
/// live bytes (where a policy may still have to evict, since the pool
/// fragments).
pub const STEADY_TOP: f64 = 1.0;

/// The grid step of [`steady_min_ratio`].
pub const STEADY_STEP: f64 = 0.005;

/// The steady minimum budget ratio of a fresh policy from `make`: the lowest
/// ratio of the grid [`STEADY_TOP`], `STEADY_TOP - STEADY_STEP`, … (not below
/// `floor`) down to which it finishes at every ratio of the grid; `None` if
/// it does not finish at the top. Finishing is not monotone in the budget
/// (a different budget gives a different layout), so a bisection
/// ([`min_budget_ratio`]) can stop on a ratio far below others at which the
/// policy fails; this is the budget from which a user can rely on it.
pub fn steady_min_ratio(
    trace: &Trace,
    make: &dyn Fn() -> Box<dyn EvictionPolicy>,
    floor: f64,
) -> Option<f64> {
    steady_minimum(STEADY_TOP, STEADY_STEP, floor, |ratio| {
        finishes_at(trace, make, ratio)
    })
}

/// Whether a fresh policy from `make` replays the whole trace at `ratio`.
fn finishes_at(trace: &Trace, make: &dyn Fn() -> Box<dyn EvictionPolicy>, ratio: f64) -> bool {
    let mut policy = make();
    replay(
        trace,
        budget_for(trace, ratio),
        policy.as_mut(),
        ReplayOptions::default(),
    )
    .finished()
}

/// Scanning `top`, `top - step`, … down to `floor`, the last ratio before
/// the first at which `finishes` is false (the lowest grid ratio not below
/// `floor` when none is); `None` when it is false at `top` or the grid is
/// empty (`step` not positive, `top` below `floor`, any of them not
/// finite). Grid ratios are rounded to 1e-4 so that they print exactly:
/// meant for steps of 1e-3 and more.
pub fn steady_minimum(
    top: f64,
    step: f64,
    floor: f64,
    mut finishes: impl FnMut(f64) -> bool,
) -> Option<f64> {
    if !(step > 0.0 && top.is_finite() && floor.is_finite() && step.is_finite()) || top < floor {
        return None;
    }
    let points = ((top - floor) / step + 1e-9).floor() as u32;
    let mut steady = None;
    for k in 0..=points {
        // From the step count, rounded, so that the grid prints exactly.
        let ratio = ((top - step * f64::from(k)) * 1e4).round() / 1e4;
        if !finishes(ratio) {
            break;
        }
        steady = Some(ratio);
    }
    steady
}
