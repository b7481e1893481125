//! `PlannedRoute`: the planned mode of the general pool (STWeaver, see
//! [`crate::plan`]). It owns one lake range of the plan's arena size and a
//! [`PlannedArena`] that decides, request by request, whether the plan
//! serves it (planned offset, dynamic slot, idle planned space) or not; what
//! the plan does not serve goes on to the ordinary pool (split cache, reuse
//! cache, lake), which the [`super::StreamPool`] routes as before.
//!
//! Rules (this file owns them; the pool only calls in):
//! - **one stream**: the arena hands out addresses again in the order the
//!   CPU frees and asks, which is safe on one stream only (the GPU runs one
//!   stream's work in order). It serves the stream the plan's requests were
//!   made on, found by first appearance as the trace recorder numbers
//!   streams (stream 0 of the plan is the first stream that asks after the
//!   plan was loaded). Requests of other streams use up their ordinal
//!   ([`PlannedArena::skip`]) and are served by the pool, which keeps the
//!   stream rule for them.
//! - **fences**: a planned block freed on its own stream by its only user
//!   goes back to the arena at once. One that another stream used
//!   (`record_stream`) or that was freed on another stream comes back
//!   behind the pool's fence and waits ([`PlannedRoute::give_back`]) until
//!   the fence admits the arena's stream; meanwhile its range stays live in
//!   the arena, so the plan's later requests for it take idle space or
//!   fall back.
//! - **never fails because of the plan**: a request that does not match
//!   (another model, another batch) is a fallback; the arena's own
//!   freedom check (one predecessor lookup) keeps a strayed run correct.
//! - **bytes**: the arena's physical bytes are the range's whole chunks;
//!   they are live planned blocks (rounded to [`crate::plan::ALIGN`]),
//!   blocks waiting on fences, or free planned space
//!   ([`PlannedRoute::free_bytes`]), so the pool's breakdown still sums to
//!   its reserved bytes.
//!
//! Concurrency: plain state behind the pool's lock.

use std::collections::HashMap;

use super::block::{Block, Origin};
use super::event::StreamId;
use crate::plan::{Plan, PlannedArena, RuntimeStats, align_up};
use crate::{DeviceRange, Fence, Progress, Requester};

/// The planned arena of a pool and the streams it has seen.
#[derive(Debug)]
pub struct PlannedRoute {
    arena: PlannedArena,
    /// The arena's lake range (`None` for a plan with an empty arena).
    range: Option<DeviceRange>,
    /// Physical bytes of the range (whole lake chunks).
    physical: u64,
    /// The plan's stream the arena serves (its index by first appearance).
    plan_stream: u32,
    /// Runtime streams by first appearance since the plan was loaded.
    streams: HashMap<StreamId, u32>,
    /// Capacities of live planned blocks, by address.
    live: HashMap<u64, u64>,
    /// Freed planned blocks whose fences do not yet admit the arena's
    /// stream: (address, capacity, fence).
    waiting: Vec<(u64, u64, Fence)>,
    live_bytes: u64,
    waiting_bytes: u64,
}

impl PlannedRoute {
    /// The stream of `plan` with most placed requests (the one the arena
    /// serves), lowest index on ties.
    pub fn main_stream(plan: &Plan) -> u32 {
        let mut counts: HashMap<u32, usize> = HashMap::new();
        for r in plan.requests.iter().filter(|r| r.offset.is_some()) {
            *counts.entry(r.request.stream).or_default() += 1;
        }
        counts
            .into_iter()
            .max_by_key(|&(s, n)| (n, std::cmp::Reverse(s)))
            .map_or(0, |(s, _)| s)
    }

    /// Serves `plan` from `range` (of at least `plan.arena` bytes, on a
    /// lake of `chunk`-byte chunks; `None` when the arena is empty).
    pub fn new(plan: Plan, range: Option<DeviceRange>, chunk: u64) -> PlannedRoute {
        debug_assert!(range.is_some_and(|r| r.len >= plan.arena) || plan.arena == 0);
        PlannedRoute {
            plan_stream: PlannedRoute::main_stream(&plan),
            arena: PlannedArena::new(plan),
            physical: range.map_or(0, |r| r.len.div_ceil(chunk) * chunk),
            range,
            streams: HashMap::new(),
            live: HashMap::new(),
            waiting: Vec::new(),
            live_bytes: 0,
            waiting_bytes: 0,
        }
    }

    /// The runtime stream the arena serves, once it has asked.
    pub fn arena_stream(&self) -> Option<StreamId> {
        self.streams
            .iter()
            .find(|&(_, &i)| i == self.plan_stream)
            .map(|(&s, _)| s)
    }

    /// A block of the plan for `size` bytes on `stream`, or `None` (the
    /// request falls back to the pool; counted as a fallback).
    pub fn alloc(&mut self, size: u64, stream: StreamId) -> Option<Block> {
        let next = self.streams.len() as u32;
        let index = *self.streams.entry(stream).or_insert(next);
        let (Some(range), true) = (self.range, index == self.plan_stream) else {
            self.arena.skip(size);
            return None;
        };
        let (offset, _) = self.arena.try_planned(size, index)?;
        let capacity = align_up(size);
        let addr = range.addr + offset;
        self.live.insert(addr, capacity);
        self.live_bytes += capacity;
        Some(Block {
            addr,
            capacity,
            origin: Origin::Planned,
        })
    }

    /// Takes back the planned block at `addr`, behind `fence`: at once if
    /// the fence admits the arena's stream, else when [`PlannedRoute::settle`]
    /// finds it does.
    pub fn give_back(&mut self, addr: u64, fence: &Fence, progress: &Progress) {
        let Some(capacity) = self.live.remove(&addr) else {
            debug_assert!(false, "{addr:#x} is not a live planned block");
            return;
        };
        self.live_bytes -= capacity;
        if self.admits(fence, progress) {
            self.release(addr);
        } else {
            self.waiting.push((addr, capacity, fence.clone()));
            self.waiting_bytes += capacity;
        }
    }

    /// Releases the waiting blocks whose fences now admit the arena's
    /// stream.
    pub fn settle(&mut self, progress: &Progress) {
        let mut i = 0;
        while i < self.waiting.len() {
            if self.admits(&self.waiting[i].2, progress) {
                let (addr, capacity, _) = self.waiting.swap_remove(i);
                self.waiting_bytes -= capacity;
                self.release(addr);
            } else {
                i += 1;
            }
        }
    }

    fn admits(&self, fence: &Fence, progress: &Progress) -> bool {
        let stream = self.arena_stream().map_or(u64::MAX, |s| s.0);
        fence.admits(&Requester { stream, progress })
    }

    fn release(&mut self, addr: u64) {
        let base = self.range.expect("a planned block lies in the arena").addr;
        self.arena
            .free(addr - base)
            .expect("the arena handed this offset out");
    }

    /// Marks the start of the next training step.
    pub fn step(&mut self) {
        self.arena.step();
    }

    /// The arena's counters.
    pub fn stats(&self) -> RuntimeStats {
        self.arena.stats()
    }

    /// Physical bytes of the arena.
    pub fn physical_bytes(&self) -> u64 {
        self.physical
    }

    /// Bytes of freed planned blocks waiting on fences.
    pub fn waiting_bytes(&self) -> u64 {
        self.waiting_bytes
    }

    /// Physical bytes of the arena neither live nor waiting.
    pub fn free_bytes(&self) -> u64 {
        self.physical - self.live_bytes - self.waiting_bytes
    }

    /// Whether a block is live or waiting.
    pub fn in_use(&self) -> bool {
        !self.live.is_empty() || !self.waiting.is_empty()
    }

    /// The arena's lake range, for the pool to give back (the route must
    /// not be in use).
    pub fn into_range(self) -> Option<DeviceRange> {
        debug_assert!(!self.in_use());
        self.range
    }

    /// Checks the route's tables against the pool's live planned blocks
    /// (address, capacity); the first broken rule, in words.
    pub fn check(&self, pool_live: &HashMap<u64, u64>) -> Result<(), String> {
        if pool_live != &self.live {
            return Err(format!(
                "planned route: {} live planned blocks, the pool lists {}",
                self.live.len(),
                pool_live.len()
            ));
        }
        let sum: u64 = self.live.values().sum();
        let waiting: u64 = self.waiting.iter().map(|w| w.1).sum();
        if sum != self.live_bytes || waiting != self.waiting_bytes {
            return Err("planned route: byte counters disagree with the tables".to_string());
        }
        if self.live_bytes + self.waiting_bytes > self.physical {
            return Err("planned route: more bytes in use than the arena holds".to_string());
        }
        Ok(())
    }
}
