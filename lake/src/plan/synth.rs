//! The plan synthesizer: where every profiled request lives in one address
//! space, so that no two requests alive at the same position share a byte.
//!
//! The steps follow STWeaver §5.1 on our timeline (positions, see
//! [`super::profile`]), which has no forward/backward marks: it is cut
//! into `phases` equal spans and a request's phases are those of its first
//! and last position.
//! 1. **HomoPhase groups**: requests with the same allocation and free phase
//!    (at least `min_group` of them). Each is packed on its own: largest
//!    first, each at the lowest offset free during its lifetime.
//! 2. **Fusion**: a group whose end phase is another's start phase absorbs
//!    it (the smaller packed into the larger's bubbles) when the fused time–
//!    memory product (bytes × positions used over height × span) is no
//!    lower than either one's: fewer, denser blocks.
//! 3. **HomoSize layers**: the requests left (lone in their phase pair)
//!    grouped by size and stacked into layers by Algorithm 1 (sorted by
//!    start, each joins the layer that ended last before it starts, else
//!    opens a new one): a layer is one row of its size over time.
//! 4. **Global placement**: blocks (fused groups and layers) in descending
//!    height, each rigid, at the lowest base where none of its requests
//!    collides with one already placed.
//!
//! The same placement run request by request (largest, longest-lived or
//! largest-area first, the best of the three) is computed too, and the
//! lower of the two arenas is kept ([`SynthStats`] says which
//! won and both heights): on the traces at hand it shows what the block
//! structure costs or saves.
//!
//! Dynamic requests are planned at their largest profiled size (a *slot*,
//! plus [`SynthConfig::dynamic_headroom_pct`], which also widens the
//! prologue's transient requests: seen once, their size may differ in
//! another run) unless
//! [`SynthConfig::plan_dynamic`] is off; either way, the space the
//! plan leaves idle during a window ([`Plan::idle_during`], the dynamic
//! reusable space of §5.2) is where the runtime best-fits a dynamic request
//! that its slot cannot hold.
//!
//! Concurrency: pure functions.

use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

use super::place::{Slot, first_collision, height, lowest_fit};
use super::profile::{Lifetime, Part, Profile, Request};

/// How to synthesize.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SynthConfig {
    /// Equal spans the timeline is cut into for HomoPhase grouping.
    pub phases: u64,
    /// Requests a phase pair needs to form a HomoPhase group.
    pub min_group: usize,
    /// Whether groups are fused.
    pub fuse: bool,
    /// Whether dynamic requests get a slot of their largest size.
    pub plan_dynamic: bool,
    /// Percent added to a dynamic request's slot over its largest profiled
    /// size, for later steps that run larger (e.g. longer sequences); also
    /// to the prologue's requests that do not live for good.
    pub dynamic_headroom_pct: u64,
}

impl Default for SynthConfig {
    fn default() -> SynthConfig {
        SynthConfig {
            phases: 32,
            min_group: 2,
            fuse: true,
            plan_dynamic: true,
            dynamic_headroom_pct: 0,
        }
    }
}

/// Which placement gave the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// HomoPhase groups, fusion, HomoSize layers, blocks by height.
    Blocks,
    /// Request by request, largest first.
    Requests,
}

/// What synthesis did and how long it took.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SynthStats {
    /// HomoPhase groups formed.
    pub groups: usize,
    /// Groups absorbed by fusion.
    pub fusions: usize,
    /// HomoSize layers formed.
    pub layers: usize,
    /// Requests placed through layers.
    pub layered: usize,
    /// Arena of the block placement.
    pub blocks_arena: u64,
    /// Arena of the best request-by-request placement.
    pub requests_arena: u64,
    /// The order that gave it (`size`, `duration` or `area` first).
    pub requests_order: &'static str,
    /// The one kept.
    pub strategy: Strategy,
    /// Wall-clock seconds of synthesis.
    pub seconds: f64,
}

/// A request and its offset (none for a dynamic request left to the
/// runtime's idle-space search).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedRequest {
    /// The profiled request.
    pub request: Request,
    /// Its offset in the arena.
    pub offset: Option<u64>,
}

/// A plan: offsets in one arena for the prologue and the template.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// Requests under this many bytes have ordinals of their own.
    pub small_below: u64,
    /// Steps in the prologue.
    pub prologue_steps: usize,
    /// Profiled iterations.
    pub iterations: usize,
    /// Positions of the prologue.
    pub prologue_len: u64,
    /// Positions of the template.
    pub template_len: u64,
    /// Bytes of the arena: the highest planned end.
    pub arena: u64,
    /// Peak live bytes of the profiled trace.
    pub trace_peak_live: u64,
    /// Template ordinals the profile left out.
    pub unplanned: usize,
    /// The requests, prologue first, each part in ordinal order.
    pub requests: Vec<PlannedRequest>,
    /// How it was made.
    pub stats: SynthStats,
}

/// A packed set of requests, offsets relative to its base.
#[derive(Clone, Debug)]
struct Block {
    slots: Vec<Slot>,
    first_phase: u64,
    last_phase: u64,
}

impl Block {
    fn height(&self) -> u64 {
        height(&self.slots)
    }

    fn start(&self) -> u64 {
        self.slots.iter().map(|s| s.life.start()).min().unwrap_or(0)
    }

    /// Time–memory product: bytes × positions used over height × span.
    fn tmp(&self) -> f64 {
        let used: f64 = self
            .slots
            .iter()
            .map(|s| s.size as f64 * s.life.duration() as f64)
            .sum();
        let end = self.slots.iter().map(|s| s.life.end()).max().unwrap_or(0);
        used / (self.height() as f64 * (end - self.start()).max(1) as f64)
    }
}

/// Packs `slots` (offsets ignored) largest first into `into`.
fn pack(into: &mut Vec<Slot>, slots: &[Slot]) {
    let mut order: Vec<Slot> = slots.to_vec();
    order.sort_by_key(|s| (std::cmp::Reverse(s.size), s.life.start(), s.req));
    pack_in_order(into, order);
}

/// Orders tried for the request-by-request placement: largest first,
/// longest-lived first, largest area (bytes × positions) first.
const ORDERS: [&str; 3] = ["size", "duration", "area"];

/// Packs `slots` request by request in the order named `order`.
fn pack_ordered(slots: &[Slot], order: &str) -> Vec<Slot> {
    use std::cmp::Reverse;
    let mut v: Vec<Slot> = slots.to_vec();
    match order {
        "duration" => v.sort_by_key(|s| (Reverse(s.life.duration()), Reverse(s.size), s.req)),
        "area" => v.sort_by_key(|s| {
            (
                Reverse(u128::from(s.size) * u128::from(s.life.duration())),
                s.req,
            )
        }),
        _ => v.sort_by_key(|s| (Reverse(s.size), s.life.start(), s.req)),
    }
    let mut placed = Vec::with_capacity(v.len());
    pack_in_order(&mut placed, v);
    placed
}

/// Places each of `order` at the lowest offset free during its lifetime.
fn pack_in_order(into: &mut Vec<Slot>, order: Vec<Slot>) {
    for mut s in order {
        s.off = 0;
        s.off = lowest_fit(into, std::slice::from_ref(&s));
        into.push(s);
    }
}

/// Places `blocks` in descending height, each rigid.
fn place_blocks(mut blocks: Vec<Block>) -> Vec<Slot> {
    blocks.sort_by_key(|b| (std::cmp::Reverse(b.height()), b.start()));
    let mut placed: Vec<Slot> = Vec::new();
    for b in blocks {
        let base = lowest_fit(&placed, &b.slots);
        placed.extend(b.slots.iter().map(|s| Slot {
            off: s.off + base,
            ..*s
        }));
    }
    placed
}

impl Plan {
    /// Synthesizes a plan for `profile`.
    pub fn synthesize(profile: &Profile, config: &SynthConfig) -> Plan {
        let started = Instant::now();
        let total = (profile.prologue_len + profile.template_len).max(1);
        let phases = config.phases.max(1);
        let phase_of = |pos: u64| (pos.min(total - 1) * phases / total).min(phases - 1);
        let slots: Vec<Slot> = profile
            .requests
            .iter()
            .enumerate()
            .filter(|(_, r)| config.plan_dynamic || !r.dynamic)
            .map(|(i, r)| Slot {
                req: i,
                off: 0,
                size: if r.dynamic || (r.part == Part::Prologue && r.life.end() < total) {
                    super::align_up(r.size + r.size * config.dynamic_headroom_pct / 100)
                } else {
                    r.size
                },
                life: r.life,
            })
            .collect();

        // 1. HomoPhase groups.
        let mut by_phase: BTreeMap<(u64, u64), Vec<Slot>> = BTreeMap::new();
        for s in &slots {
            by_phase
                .entry((phase_of(s.life.start()), phase_of(s.life.end() - 1)))
                .or_default()
                .push(*s);
        }
        let mut groups: Vec<Option<Block>> = Vec::new();
        let mut lone: Vec<Slot> = Vec::new();
        for ((first_phase, last_phase), members) in by_phase {
            if members.len() < config.min_group.max(1) {
                lone.extend(members);
                continue;
            }
            let mut packed = Vec::with_capacity(members.len());
            pack(&mut packed, &members);
            groups.push(Some(Block {
                slots: packed,
                first_phase,
                last_phase,
            }));
        }
        let group_count = groups.len();

        // 2. Fusion of adjacent groups by time–memory product.
        let mut fusions = 0;
        if config.fuse {
            for i in 0..groups.len() {
                let mut j = 0;
                while j < groups.len() {
                    let (Some(a), Some(b)) = (&groups[i], &groups[j]) else {
                        j += 1;
                        continue;
                    };
                    if i == j || a.last_phase != b.first_phase {
                        j += 1;
                        continue;
                    }
                    let (big, small) = if a.height() >= b.height() {
                        (a, b)
                    } else {
                        (b, a)
                    };
                    let mut fused = big.slots.clone();
                    pack(&mut fused, &small.slots);
                    let fused = Block {
                        slots: fused,
                        first_phase: a.first_phase,
                        last_phase: b.last_phase,
                    };
                    if fused.tmp() >= a.tmp().max(b.tmp()) {
                        groups[i] = Some(fused);
                        groups[j] = None;
                        fusions += 1;
                        j = 0; // the new end phase may meet groups seen before
                    } else {
                        j += 1;
                    }
                }
            }
        }

        // 3. HomoSize layers of the lone requests (Algorithm 1).
        let mut by_size: BTreeMap<u64, Vec<Slot>> = BTreeMap::new();
        for s in &lone {
            by_size.entry(s.size).or_default().push(*s);
        }
        let mut blocks: Vec<Block> = groups.into_iter().flatten().collect();
        let mut layers = 0;
        for (_, mut members) in by_size {
            members.sort_by_key(|s| (s.life.start(), s.req));
            let mut rows: Vec<(u64, Vec<Slot>)> = Vec::new();
            for s in members {
                let row = rows
                    .iter_mut()
                    .filter(|(end, _)| *end <= s.life.start())
                    .max_by_key(|(end, _)| *end);
                match row {
                    Some((end, row)) => {
                        *end = s.life.end();
                        row.push(s);
                    }
                    None => rows.push((s.life.end(), vec![s])),
                }
            }
            layers += rows.len();
            blocks.extend(rows.into_iter().map(|(_, row)| Block {
                first_phase: phase_of(row[0].life.start()),
                last_phase: phase_of(row.iter().map(|s| s.life.end()).max().unwrap_or(1) - 1),
                slots: row,
            }));
        }

        // 4. Global placement, and request by request for comparison.
        let by_blocks = place_blocks(blocks);
        let (by_requests, order) = ORDERS
            .iter()
            .map(|o| (pack_ordered(&slots, o), *o))
            .min_by_key(|(p, _)| height(p))
            .expect("orders");
        let (blocks_arena, requests_arena) = (height(&by_blocks), height(&by_requests));
        let (placed, strategy) = if blocks_arena <= requests_arena {
            (by_blocks, Strategy::Blocks)
        } else {
            (by_requests, Strategy::Requests)
        };

        let mut offsets: HashMap<usize, u64> = HashMap::with_capacity(placed.len());
        let mut slot_size: HashMap<usize, u64> = HashMap::with_capacity(placed.len());
        for s in &placed {
            offsets.insert(s.req, s.off);
            slot_size.insert(s.req, s.size);
        }
        let requests = profile
            .requests
            .iter()
            .enumerate()
            .map(|(i, r)| PlannedRequest {
                request: Request {
                    size: slot_size.get(&i).copied().unwrap_or(r.size),
                    ..*r
                },
                offset: offsets.get(&i).copied(),
            })
            .collect();
        Plan {
            small_below: profile.small_below,
            prologue_steps: profile.prologue_steps,
            iterations: profile.iterations,
            prologue_len: profile.prologue_len,
            template_len: profile.template_len,
            arena: height(&placed),
            trace_peak_live: profile.trace_peak_live,
            unplanned: profile.unplanned,
            requests,
            stats: SynthStats {
                groups: group_count,
                fusions,
                layers,
                layered: lone.len(),
                blocks_arena,
                requests_arena,
                requests_order: order,
                strategy,
                seconds: started.elapsed().as_secs_f64(),
            },
        }
    }

    fn slots(&self) -> Vec<Slot> {
        self.requests
            .iter()
            .enumerate()
            .filter_map(|(i, p)| {
                p.offset.map(|off| Slot {
                    req: i,
                    off,
                    size: p.request.size,
                    life: p.request.life,
                })
            })
            .collect()
    }

    /// Checks the plan: no two placed requests overlap in both lifetime and
    /// address, and all lie within the arena. Says which pair if not.
    pub fn check(&self) -> Result<(), String> {
        let slots = self.slots();
        if let Some(s) = slots.iter().find(|s| s.off + s.size > self.arena) {
            return Err(format!("request {} ends past the arena", s.req));
        }
        match first_collision(&slots) {
            None => Ok(()),
            Some((a, b)) => Err(format!(
                "requests {a} ({:?}) and {b} ({:?}) overlap in time and address",
                self.requests[a], self.requests[b]
            )),
        }
    }

    /// Address ranges `[start, end)` of the arena that no placed request
    /// other than `except` uses at any position of `life`: the dynamic
    /// reusable space of that window, lowest first.
    pub fn idle_during(&self, life: &Lifetime, except: Option<usize>) -> Vec<(u64, u64)> {
        let mut used: Vec<(u64, u64)> = self
            .requests
            .iter()
            .enumerate()
            .filter(|(i, p)| Some(*i) != except && p.request.life.overlaps(life))
            .filter_map(|(_, p)| p.offset.map(|o| (o, o + p.request.size)))
            .collect();
        used.sort_unstable();
        let mut idle = Vec::new();
        let mut at = 0;
        for (s, e) in used {
            if s > at {
                idle.push((at, s));
            }
            at = at.max(e);
        }
        if at < self.arena {
            idle.push((at, self.arena));
        }
        idle
    }

    /// Planned live bytes at the template's positions: `(least, mean)` of
    /// the arena left idle over the template iteration.
    pub fn template_idle(&self) -> (u64, u64) {
        let (p, e) = (self.prologue_len, self.template_len);
        if e == 0 {
            return (self.arena, self.arena);
        }
        let mut delta = vec![0i128; e as usize + 1];
        for r in self.requests.iter().filter(|r| r.offset.is_some()) {
            for &(s, t) in r.request.life.spans() {
                let (s, t) = (s.max(p), t.min(p + e));
                if s < t {
                    delta[(s - p) as usize] += r.request.size as i128;
                    delta[(t - p) as usize] -= r.request.size as i128;
                }
            }
        }
        let (mut live, mut most, mut sum) = (0i128, 0i128, 0i128);
        for d in &delta[..e as usize] {
            live += d;
            most = most.max(live);
            sum += live;
        }
        let arena = self.arena as i128;
        ((arena - most) as u64, (arena - sum / e as i128) as u64)
    }

    /// The most bytes the plan holds at one position: the least arena any
    /// placement of these requests could have (a sweep over their spans).
    pub fn planned_peak(&self) -> u64 {
        let mut edges: Vec<(u64, i128)> = Vec::new();
        for r in self.requests.iter().filter(|r| r.offset.is_some()) {
            for &(s, e) in r.request.life.spans() {
                edges.push((s, r.request.size as i128));
                edges.push((e, -(r.request.size as i128)));
            }
        }
        // At one position the frees (negative) come before the allocations.
        edges.sort_unstable();
        let (mut now, mut peak) = (0i128, 0i128);
        for (_, d) in edges {
            now += d;
            peak = peak.max(now);
        }
        peak as u64
    }

    /// Placed requests that are static and dynamic.
    pub fn counts(&self) -> (usize, usize) {
        let dynamic = self.requests.iter().filter(|r| r.request.dynamic).count();
        (self.requests.len() - dynamic, dynamic)
    }
}
