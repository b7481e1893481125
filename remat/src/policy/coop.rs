//! Coop (Zhang et al., NeurIPS 2023): evict the cheapest *contiguous* window.
//!
//! The pool's intervals, in address order, are scored: free space 0, an
//! evictable tensor h = c / s (projected cost over staleness, no size term:
//! the size is in the layout), and a pinned or locked tensor blocks (no window
//! may hold it). A two-pointer sweep finds, for every right end, the shortest
//! window ending there that holds the request; since scores are not negative
//! that window is also the cheapest ending there, so one pass (each pointer
//! moves at most N times, O(N)) finds the cheapest window overall.
//!
//! Only part of the pool is scored: no window holds a pinned tensor, so the
//! search walks the gaps between pinned tensors that the pool keeps
//! (`Pool::gap_runs_of_at_least_into`) and are at least as large as the request,
//! and skips the pinned intervals and the smaller gaps unread. It picks the
//! same window as a sweep over the whole pool
//! (`Coop::next_eviction_whole_pool`, which the tests compare it with).
//! A gap is a run of indices into the pool's dense array of intervals
//! (`Pool::interval_array`): the search reads each interval there, in
//! place, and writes only its score (`Scan`), and the sweep runs over each
//! run in turn, carrying the best window from one to the next (`Sweeper`).
//!
//! The scan is most of a search, and it is kept lean without changing a
//! score's bits: the projected cost and the recompute amplification come
//! from one read of the price cache (`Prices::projected_and_amplification`;
//! the amplification is cached beside the peak, the same division done
//! once), the tensor's dense state (`TensorTable::state`, 16 bytes) is
//! read once for pinned, locks, residency and staleness, and the buffers
//! are kept from search to search. The staleness term is the only part that
//! must be computed at every search (it changes with every op). The sweep
//! converts the best window's bytes to f64 once per new best, not at every
//! candidate, with the same products as `Window::better_than`.
//!
//! Cheap-tensor partitioning: a tensor whose op has a cost density (cost per
//! byte) below the executor's threshold is "cheap" and goes to the right end of
//! the highest free block that fits; an expensive one goes to the left end of
//! the lowest. Inside an evicted window, expensive tensors go left and cheap
//! ones right (Algorithm 1). Recomputable in-place: an in-place op's output
//! takes its input's address, and again when the executor recomputes it.
//!
//! Unevictable tensors grouped (`pinned_at_ends`, off in the paper's Coop,
//! on in "Coop-G"): the paper allocates the parameters at the two ends of
//! the pool and updates them in place so that they never split the pool
//! (§3.5). A parameter's gradient, made during the backward pass, is just as
//! unevictable, but lands wherever the allocator finds room, in the middle of
//! the activations, where it cuts every later window in two. With the switch
//! on, a pinned request goes into a free block, or an evicted window, that
//! touches an end of the pool or another pinned tensor, on that side, so
//! that unevictable tensors grow as clusters from the ends. It takes a free
//! block elsewhere only when no such window exists. The anchored search is
//! the same two-pointer sweep, once forwards (windows whose right neighbour
//! anchors) and once backwards (left neighbour), so still O(N).
//!
//! Recompute-memory pricing (`price_recompute_memory`, not in the paper, on
//! by default): an evictable tensor's score is multiplied by its recompute
//! amplification (`super::recompute_amplification`), the bytes its
//! recomputation would need at once over its own size, so that a small
//! tensor whose inputs are gone (GPT-2's embedding gradient, 147 MiB, whose
//! recomputation needs three 785 MiB logits-sized tensors) is not evicted
//! while cheaper room exists. The projected cost already counts the compute
//! time of those inputs; this prices their memory.
//!
//! Windows ranked per byte (`rank_per_byte`, not in the paper, on by
//! default): the sweep's candidates are the paper's, the shortest window
//! ending at each interval that holds the request, but the cheapest is the
//! one with the lowest summed score over its bytes, not the lowest sum. The
//! paper's h has no size term because the layout carries the sizes; but a
//! window that frees more than the request leaves the rest free, and the
//! requests after it use that space without a search. On the vision traces,
//! whose activations shrink stage by stage, the summed ranking picks for
//! each request the one small tensor that just fits it (ResNet-50 at 0.9:
//! 19 evictions, each a 25 MiB activation whose BatchNorm input was
//! overwritten in place, so each costs a two-op recomputation), where DTR
//! evicts a few large old tensors whose space then serves several requests
//! (6 evictions); per byte, Coop does the same (4). It is DTR's size term,
//! c / (m s), taken from one tensor to one window. The comparison
//! cross-multiplies (no division), so the search stays one linear pass.
//!
//! Leftover merged (`merge_leftover`, not in the paper, on by default in
//! Coop): a window usually frees more than the request, and Algorithm 1
//! puts an expensive tensor at its left end, so the rest stays free at the
//! right end. When the interval just left of the window is free and the one
//! just right of it is not, that rest becomes a hole of its own while free
//! space lies one interval away; the request then goes to the right end
//! instead, and the rest joins the free block on the left. Cheap tensors
//! keep the right end, as the partitioning puts them: the same rule for
//! them too (left end when only the right neighbour is free) cost Swin-T
//! its overhead lead at 0.45, and for cheap tensors alone it did not let
//! ResNet-50 finish at 0.4. Measured: ResNet-50 finishes at 0.4, where it
//! ran out, and Swin-T's minimum is 0.297 (0.302) (`--merge-ablation`).
//!
//! Dropped inputs freed again (`drop_dead_inputs`, not in the paper, on by
//! default in Coop): a tensor that the program has dropped comes back only
//! as an input of a recomputation; once that recomputation (and any other
//! that holds it) is done, the executor frees it again, as the program's
//! drop did, instead of leaving it resident until some search evicts it.
//! Left resident, such tensors are freshly touched and so score high: on
//! Swin-T's backward pass at 0.5 they held 0.9-2.2 GiB of a 3.4 GiB pool,
//! while the live tensors between them were evicted and the backward
//! temporaries' holes among them made most of the free space. Off in
//! Coop-G, whose anchored windows then evict the same chains over and
//! over (overhead in the thousands of percent on Swin-T).
//!
//! Locked inputs moved beside the output (`relocate_inputs`, not in the
//! paper, on by default in Coop): when an op's output, or a tensor being
//! recomputed, fits nowhere, the executor slides the inputs that only that
//! op holds together against the free space on one side, so that the free
//! space on either side of them joins, and places the output as usual;
//! failing that, it places them with the output as one request
//! (`AddedRules::relocate_inputs`). On Swin-T at 0.26, op 1,303's two
//! locked 294 MiB inputs sat in the middle of a 1,089 MiB run between
//! gradients, 13 MiB short of room for the output on either side. It acts
//! only where a replay would otherwise run out of memory: GPT-2's minimum
//! 0.405 -> 0.360, the others unchanged. Off in Coop-G.
//!
//! Held tensors moved together (`move_held_tensors`, not in the paper, on
//! by default in Coop): when a tensor still fits nowhere after those moves,
//! every tensor the op and its recomputation chain hold (resident, unpinned,
//! locked) is moved and placed with it as one request, and failing that one
//! pinned tensor that alone splits a long enough run is moved out of it
//! first (`AddedRules::move_held_tensors`, `executor/held.rs`). On
//! Swin-T below 0.266 a chain that brings back a 294 MiB GELU output holds
//! up to four tensors strewn over the run it needs. Only where a replay
//! would otherwise run out of memory: Swin-T's minimum 0.288 -> 0.230 with
//! the next rule on (`--held-ablation`). Off in Coop-G.
//!
//! Pinned requests in the shortest run (`pinned_in_short_gaps`, not in the
//! paper, on by default in Coop): a gradient that fits a free block goes to
//! the shortest run between pinned tensors that has one, against the end of
//! the block nearer an end of the run (`super::short_gap`), instead of the
//! lowest free block, so that the long runs stay whole; unlike Coop-G it
//! evicts nothing for that. Off in Coop-G, which anchors gradients.
//!
//! Holes credited (`credit_holes`, not in the paper, off by default): with
//! the per-byte ranking, the free bytes inside a window count twice, as
//! bytes freed and as a hole absorbed (`Ranking::PerByteAndHole`). What is
//! left of the free space at Coop's evicting allocations on Swin-T is holes
//! that forward temporaries left between evictable tensors (3-6% of the
//! pool before a search, of which a window absorbed 0.1-0.7%), and on GPT-2
//! at 0.9 a 436 MiB hole beside the logits. Measured (`--hole-ablation`):
//! GPT-2's largest mean fragmentation 6.0% -> 3.4% and BERT-Large's minimum
//! 0.346 -> 0.338, but Swin-T's minimum 0.230 -> 0.252 and ResNet-50
//! finishing at 0.35 with 9.9% fragmentation; no row set wins everywhere.
//!
//! Amplification over the run (`amplify_over_run`, not in the paper, on by
//! default in Coop, branch `remat-frag`): the recompute amplification of
//! an evictable tensor is its recompute peak over the bytes its eviction
//! frees in one run, its own and those of the free blocks beside it, not
//! over its own bytes alone. The pricing asks how much memory bringing a
//! tensor back needs against how much its eviction gives; a small tensor
//! between two holes gives both holes joined. On ResNet-50's backward
//! pass, BatchNorm statistics of a few KiB between 98 MiB holes were
//! priced 10^4-10^5 times their cost (their dropped 98 MiB input counted
//! against their own bytes), so no window joined the holes. With nothing
//! free beside a tensor the price is the cached one, unchanged; with free
//! space beside it, its cached peak and projected cost, two more reads.
//!
//! Holes absorbed (`absorb_holes`, not in the paper, on by default in
//! Coop, branch `remat-frag`): when some free block holds at least half
//! the request, the cheapest window that holds one (found in the same
//! sweep as the pick, which tracks it only then) challenges the per-byte
//! pick and is taken when it evicts fewer bytes than the pick (free space
//! after an evicting allocation is the free space before, plus the bytes
//! evicted, less the request: fewer bytes evicted, less left free) and
//! costs no more per byte with its free bytes counted twice
//! (`absorbs_hole`). Half the request: the
//! window then evicts no more bytes than it takes back from the hole.
//! Unlike `credit_holes`, no other window's rank changes. On GPT-2 at 0.9
//! the 785 MiB logits went to an 816 MiB window elsewhere while a 436 MiB
//! hole beside the locked logits stayed free. Measured with both
//! (`--frag-ablation`): GPT-2's largest mean fragmentation 6.0% -> 3.4%;
//! minimum budgets BERT-Large 0.310 -> 0.302, ResNet-50 0.346 -> 0.293,
//! Swin-T 0.257 -> 0.252; ResNet-50 at 0.35 and Swin-T at 0.7 and its
//! minimum still above 5%. Alone, each broke another criterion (see
//! `docs/PERF.md`, "Coop's fragmentation: holes absorbed per request").
//!
//! Inputs brought back in order, and dropped chains kept (`order_inputs`,
//! `keep_dropped_chains`, not in the paper, branch `remat-resnet`;
//! `chain_order`, `dropped_chain`, `--chain-ablation`; since the merge with
//! `remat-swin`'s rules only `keep_dropped_chains` is on by default in Coop:
//! with both, Swin-T's minimum is 0.266 instead of 0.257, and without the
//! ordering Coop still finishes ResNet-50 at DTR's minimum):
//! an op's inputs locked resident-first and the missing ones recomputed
//! deepest chain first, and no window taken that holds a tensor whose
//! recomputation runs through a chain of at least 8 tensors the program
//! drops as it goes (a gradient deep in a backward pass). On ResNet-50 at
//! 0.32 Coop evicted such a gradient and its chain later recomputed much
//! of the step; together the rules lower ResNet-50's minimum from 0.391 to
//! 0.302 and BERT-Large's from 0.346 to 0.302; neither alone does.
//!
//! Side outputs best-fit and live inputs borrowed (`side_outputs_best_fit`,
//! `borrow_live_inputs`, not in the paper; on in Coop since the seventeenth
//! session, `super::rules` says what each does): alone each moved Swin-T's
//! minimum below its 20% margin; together Coop's overhead is at or below
//! DTR's and DTE's at every ratio of the four recorded traces and the
//! margins hold (`docs/PERF.md`, "Side outputs best-fit and live inputs
//! borrowed, together").
//!
//! Holes joined by moves (`join_holes_by_moves`, not in the paper; on in
//! Coop since the eighteenth session, `super::rules` says what it does):
//! an executor pass before this search, for a request that fits no free
//! block while the free bytes would hold it; when it places the request,
//! Coop is not asked to evict. It takes Coop's largest mean fragmentation
//! on ResNet-50 from 5.7% to 3.9% and on Swin-T from 6.6% to 5.0%
//! (`docs/PERF.md`, "Holes joined by moves").
//!
//! Each layout rule can be switched off (or on) for ablations.
//!
//! Owned by one executor; single-threaded. Keeps the step count of its last
//! search so that tests can check that the search is linear.

use std::ops::Range;

use super::{AddedRules, Eviction, EvictionPolicy, RECOMPUTE_DEPTH, Request, SearchContext};
use crate::dropped_chain::on_dropped_chain;
use crate::pool::Interval;
use crate::tensor::{Prices, TensorId, TensorTable};

/// A tensor may be scored as moved out of a window (its op's cost) rather
/// than evicted when its bytes times this are under the request's
/// (`AddedRules::move_small_in_windows`). 1 (every tensor smaller than the
/// request), 64 and 4096 were measured; none keeps every minimum budget.
const MOVE_FRACTION: u64 = 4096;

/// One interval as the window search sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowItem {
    /// Start address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Eviction score (0 for free space), or `None` when it may not be evicted.
    pub score: Option<f64>,
    /// A pinned tensor: a pinned request may be placed against it.
    pub pinned: bool,
}

/// The result of a window search: items `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Window {
    /// Index of the first item.
    pub first: usize,
    /// Index of the last item (inclusive).
    pub last: usize,
    /// Sum of the scores.
    pub score: f64,
    /// Sum of the sizes.
    pub bytes: u64,
    /// Bytes of the free items (score 0) in it: holes it absorbs.
    pub holes: u64,
}

impl Window {
    /// Whether this window ranks before `other` (none: it does) under
    /// `ranking`; ties go to the smaller window.
    fn better_than(&self, other: Option<&Window>, ranking: Ranking) -> bool {
        other.is_none_or(|b| {
            let (mine, theirs) = match ranking {
                Ranking::Sum => (self.score, b.score),
                // score / bytes < b.score / b.bytes, without a division
                // (bytes > 0: a window holds the request).
                Ranking::PerByte => (self.score * b.bytes as f64, b.score * self.bytes as f64),
                Ranking::PerByteAndHole => (
                    self.score * (b.bytes + b.holes) as f64,
                    b.score * (self.bytes + self.holes) as f64,
                ),
            };
            self.before(b, mine, theirs)
        })
    }

    /// Whether this window ranks before `b` when their ranking keys are
    /// `mine` and `theirs`; ties go to the smaller window.
    #[inline]
    fn before(&self, b: &Window, mine: f64, theirs: f64) -> bool {
        mine < theirs || (mine == theirs && self.bytes < b.bytes)
    }
}

/// `bytes as f64`, through i64: one conversion instruction where u64 takes
/// several, and the same value below 2^63 bytes.
#[inline]
fn bytes_f64(bytes: u64) -> f64 {
    debug_assert!(bytes < 1 << 63);
    bytes as i64 as f64
}

/// How the sweep ranks the candidate windows (the shortest window that
/// holds the request, one per right end).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ranking {
    /// By summed score, as the paper does.
    Sum,
    /// By summed score over the bytes the window frees (not in the paper):
    /// a window that frees more than the request leaves the rest free for
    /// the requests after it, so its cost is spread over more bytes.
    PerByte,
    /// As `PerByte`, with the free bytes inside the window counted twice
    /// (not in the paper): once as bytes the window frees and once as a hole
    /// that it absorbs, which would otherwise stay behind as fragmentation.
    PerByteAndHole,
}

/// The best window offered so far under one ranking.
struct Best {
    window: Option<Window>,
    /// The best window's ranked bytes as f64, for the per-byte comparison:
    /// converted once when it becomes the best, not at every candidate.
    bytes: f64,
}

impl Best {
    const NONE: Best = Best {
        window: None,
        bytes: 0.0,
    };

    /// Keeps `window` if it ranks before the best so far (the same products
    /// as `Window::better_than`).
    #[inline(always)]
    fn offer(&mut self, window: Window, ranking: Ranking) {
        let better = match (&self.window, ranking) {
            (None, _) => true,
            (Some(b), Ranking::Sum) => window.before(b, window.score, b.score),
            (Some(b), Ranking::PerByte) => window.before(
                b,
                window.score * self.bytes,
                b.score * bytes_f64(window.bytes),
            ),
            (Some(b), Ranking::PerByteAndHole) => window.before(
                b,
                window.score * self.bytes,
                b.score * bytes_f64(window.bytes + window.holes),
            ),
        };
        if better {
            self.window = Some(window);
            self.bytes = match ranking {
                Ranking::PerByteAndHole => bytes_f64(window.bytes + window.holes),
                _ => bytes_f64(window.bytes),
            };
        }
    }
}

/// The two-pointer sweep's running state over *runs*: ranges of positions
/// that no window crosses (the sweep starts afresh at each, as at a blocked
/// item), the best windows carried from one run to the next, so that a
/// search over several gaps offers the same windows in the same order as a
/// sweep over the gaps' items laid end to end with a blocked item between.
struct Sweeper {
    request: u64,
    ranking: Ranking,
    best: Best,
    /// With `HOLE`: the best window that holds a big hole ([`big_hole`]).
    best_hole: Best,
    /// Pointer moves (at most 2N over N positions).
    steps: usize,
}

impl Sweeper {
    fn new(request: u64, ranking: Ranking) -> Sweeper {
        Sweeper {
            request,
            ranking,
            best: Best::NONE,
            best_hole: Best::NONE,
            steps: 0,
        }
    }

    /// Sweeps the positions of `run`, position `k` having `size(k)` bytes
    /// and score `score_of(k)` (`None`: blocked): for each position `right`
    /// that `accept`s, the shortest window ending there with at least
    /// `request` bytes and no blocked position (with scores not negative it
    /// is also the cheapest ending there) is offered to the best so far
    /// under the ranking, and (when `HOLE`) to the best of those that hold
    /// a position of score 0 of at least half the request ([`big_hole`]).
    #[inline(always)]
    fn run<const HOLE: bool>(
        &mut self,
        run: Range<usize>,
        size: impl Fn(usize) -> u64,
        score_of: impl Fn(usize) -> Option<f64>,
        accept: impl Fn(usize) -> bool,
    ) {
        let (request, ranking) = (self.request, self.ranking);
        // The carried state in locals for the loop (kept in registers, not
        // stored back through `self` at every position).
        let (mut best, mut best_hole, mut steps) = (
            std::mem::replace(&mut self.best, Best::NONE),
            std::mem::replace(&mut self.best_hole, Best::NONE),
            self.steps,
        );
        let (mut left, mut bytes, mut score) = (run.start, 0u64, 0.0f64);
        // Free bytes (positions of score 0) in the current window, counted
        // only for the ranking that reads them (the branch goes the same way
        // at every position).
        let mut holes = 0u64;
        let credit = ranking == Ranking::PerByteAndHole;
        let hole = |k: usize| {
            if credit && score_of(k) == Some(0.0) {
                size(k)
            } else {
                0
            }
        };
        // With `HOLE`: the last position of score 0 of at least half the
        // request (a window holds one when it starts at or before it).
        let mut last_big = usize::MAX;
        for right in run {
            steps += 1;
            let Some(s) = score_of(right) else {
                (left, bytes, score, holes) = (right + 1, 0, 0.0, 0);
                continue;
            };
            let right_size = size(right);
            if HOLE && s == 0.0 && big_hole(right_size, request) {
                last_big = right;
            }
            bytes += right_size;
            score += s;
            holes += hole(right);
            while left < right && bytes - size(left) >= request {
                bytes -= size(left);
                score -= score_of(left).unwrap_or(0.0);
                holes -= hole(left);
                left += 1;
                steps += 1;
            }
            if bytes < request || !accept(right) {
                continue;
            }
            let window = Window {
                first: left,
                last: right,
                score: score.max(0.0),
                bytes,
                holes,
            };
            best.offer(window, ranking);
            if HOLE && last_big != usize::MAX && last_big >= left {
                best_hole.offer(window, ranking);
            }
        }
        (self.best, self.best_hole, self.steps) = (best, best_hole, steps);
    }
}

/// The cheapest window over `runs` of positions (`size` and `score_of` as
/// in [`Sweeper::run`]), with `HOLE` the cheapest that holds a big hole,
/// and the pointer moves.
fn cheapest_over<const HOLE: bool>(
    runs: &[Range<usize>],
    size: impl Fn(usize) -> u64,
    score_of: impl Fn(usize) -> Option<f64>,
    request: u64,
    ranking: Ranking,
) -> (Option<Window>, Option<Window>, usize) {
    let mut sweeper = Sweeper::new(request, ranking);
    for run in runs {
        sweeper.run::<HOLE>(run.clone(), &size, &score_of, |_| true);
    }
    (sweeper.best.window, sweeper.best_hole.window, sweeper.steps)
}

/// The cheapest run of consecutive items with at least `request` bytes and no
/// blocked item under `ranking`, and the number of pointer moves the sweep
/// made (at most 2N).
pub fn cheapest_window(
    items: &[WindowItem],
    request: u64,
    ranking: Ranking,
) -> (Option<Window>, usize) {
    let (best, _, steps) = cheapest_over::<false>(
        std::slice::from_ref(&(0..items.len())),
        |k| items[k].size,
        |k| items[k].score,
        request,
        ranking,
    );
    (best, steps)
}

/// The cheapest window (as [`cheapest_window`]), the cheapest that holds
/// an item of score 0 of at least half the request ([`big_hole`]), and the
/// pointer moves of the one sweep that finds both (at most 2N).
pub fn cheapest_window_and_hole(
    items: &[WindowItem],
    request: u64,
    ranking: Ranking,
) -> (Option<Window>, Option<Window>, usize) {
    cheapest_over::<true>(
        std::slice::from_ref(&(0..items.len())),
        |k| items[k].size,
        |k| items[k].score,
        request,
        ranking,
    )
}

/// Whether a free block of `size` bytes is a hole worth absorbing for a
/// request of `request` bytes: it holds at least half the request, so a
/// window around it evicts no more bytes than it takes back from the hole.
#[inline]
pub fn big_hole(size: u64, request: u64) -> bool {
    size.saturating_mul(2) >= request
}

/// Bytes of the positions of score 0 (free space) in `window`.
fn free_in(
    window: &Window,
    size: impl Fn(usize) -> u64,
    score_of: impl Fn(usize) -> Option<f64>,
) -> u64 {
    (window.first..=window.last)
        .filter(|&k| score_of(k) == Some(0.0))
        .map(size)
        .sum()
}

/// Whether `hole`, the cheapest window that holds a hole of at least half
/// the request, is taken instead of `pick`, the plain search's window: it
/// evicts fewer bytes, so that less is left free after the allocation
/// (free after = free before + bytes evicted - request), and its summed
/// score per byte, with its free bytes counted once more (once as bytes
/// freed, once as a hole absorbed), is no higher than the pick's.
pub fn absorbs_hole(items: &[WindowItem], hole: &Window, pick: &Window) -> bool {
    let free = |w: &Window| free_in(w, |k| items[k].size, |k| items[k].score);
    absorbs_hole_with(hole, pick, free)
}

/// [`absorbs_hole`], with `free` the free bytes of a window.
fn absorbs_hole_with(hole: &Window, pick: &Window, free: impl Fn(&Window) -> u64) -> bool {
    let (hole_free, pick_free) = (free(hole), free(pick));
    hole.bytes - hole_free < pick.bytes - pick_free
        && hole.score * bytes_f64(pick.bytes) <= pick.score * bytes_f64(hole.bytes + hole_free)
}

/// Which side of an anchored window touches its anchor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The item after the window is pinned, or the window ends the pool.
    Right,
    /// The item before the window is pinned, or the window starts the pool.
    Left,
}

/// The cheapest window (as [`cheapest_window`]) that touches an end of the
/// pool or a pinned item, with the side it touches (right wins ties), and the
/// pointer moves of the two sweeps (at most 4N).
pub fn cheapest_anchored_window(
    items: &[WindowItem],
    request: u64,
    ranking: Ranking,
) -> (Option<(Window, Side)>, usize) {
    let n = items.len();
    let position = Position {
        size: |k: usize| items[k].size,
        score_of: |k: usize| items[k].score,
        pinned: |k: usize| items[k].pinned,
    };
    anchored_over(std::slice::from_ref(&(0..n)), n, position, request, ranking)
}

/// What the anchored sweep reads of a position: its bytes, its score
/// (`None`: blocked), whether it is pinned.
struct Position<S, C, P> {
    size: S,
    score_of: C,
    pinned: P,
}

/// [`cheapest_anchored_window`] over `runs` of positions below `n`: a run's
/// ends anchor as a pinned neighbour does (outside a run lies a pinned
/// tensor or an end of the pool).
fn anchored_over(
    runs: &[Range<usize>],
    n: usize,
    at: Position<impl Fn(usize) -> u64, impl Fn(usize) -> Option<f64>, impl Fn(usize) -> bool>,
    request: u64,
    ranking: Ranking,
) -> (Option<(Window, Side)>, usize) {
    let Position {
        size,
        score_of,
        pinned,
    } = at;
    let mut forwards = Sweeper::new(request, ranking);
    for run in runs {
        let end = run.end;
        let anchors = |k: usize| k + 1 >= end || pinned(k + 1);
        forwards.run::<false>(run.clone(), &size, &score_of, anchors);
    }
    // Backwards: position p is index n-1-p, the runs in reverse order, and
    // the index after position p in the sweep is the one before it.
    let mut backwards = Sweeper::new(request, ranking);
    for run in runs.iter().rev() {
        let start = run.start;
        backwards.run::<false>(
            n - run.end..n - run.start,
            |p| size(n - 1 - p),
            |p| score_of(n - 1 - p),
            |p| n - 1 - p == start || pinned(n - 2 - p),
        );
    }
    let right = forwards.best.window;
    let left = backwards.best.window.map(|w| Window {
        first: n - 1 - w.last,
        last: n - 1 - w.first,
        ..w
    });
    let best = match (right, left) {
        (Some(r), Some(l)) if l.better_than(Some(&r), ranking) => Some((l, Side::Left)),
        (Some(r), _) => Some((r, Side::Right)),
        (None, l) => l.map(|l| (l, Side::Left)),
    };
    (best, forwards.steps + backwards.steps)
}

/// A search's view of the pool: which runs of the pool's intervals it
/// reads, and the score of each interval in them, by the interval's index
/// in the pool's array (`Pool::interval_array`); the bytes, address and
/// tensor of an interval are read from the pool itself, not copied. A
/// search's buffers, kept by the policy so that a search allocates nothing
/// but its victim list.
#[derive(Debug, Clone, Default)]
pub struct Scan {
    /// Index ranges of the pool's intervals that the sweep reads, each a
    /// gap between pinned tensors (or the whole pool): no window crosses
    /// an end of one, since beyond it lies a pinned tensor or an end of the
    /// pool.
    runs: Vec<Range<usize>>,
    /// The score of each interval of the runs, by pool index (`None`: it
    /// may not be evicted); entries outside the runs mean nothing.
    scores: Vec<Option<f64>>,
    /// Bytes of the largest interval of score 0 (free space, or a tensor
    /// that costs nothing to evict): whether a hole challenger is looked
    /// for.
    largest_zero: u64,
    /// Intervals (pool indices) of tensors on a dropped chain that are
    /// scored as moved, not evicted (`AddedRules::move_small_in_windows`).
    moving: Vec<usize>,
    /// Bytes of the request being searched for.
    request: u64,
}

impl Scan {
    /// Empties the scan for a pool of `intervals` intervals.
    fn clear(&mut self, intervals: usize) {
        self.moving.clear();
        self.runs.clear();
        self.largest_zero = 0;
        if self.scores.len() < intervals {
            self.scores.resize(intervals, None);
        }
    }

    /// The run that holds pool index `k` (empty when none does).
    fn run_of(&self, k: usize) -> Range<usize> {
        self.runs
            .iter()
            .find(|run| run.contains(&k))
            .cloned()
            .unwrap_or_default()
    }
}

/// The Coop policy.
#[derive(Debug, Clone)]
pub struct Coop {
    /// Cheap-tensor partitioning on.
    pub partition: bool,
    /// Recomputable in-place on.
    pub in_place: bool,
    /// Unevictable tensors placed against the ends of the pool or other
    /// unevictable tensors (not in the paper; off by default).
    pub pinned_at_ends: bool,
    /// A tensor's score is scaled by its recompute amplification (not in
    /// the paper; on by default here, see the module docs).
    pub price_recompute_memory: bool,
    /// Windows ranked by summed score per byte freed (`Ranking::PerByte`,
    /// not in the paper; on by default here, see the module docs) instead
    /// of by summed score.
    pub rank_per_byte: bool,
    /// An expensive request goes to the right end of its evicted window,
    /// instead of the left, when the interval left of the window is free
    /// and the one right of it is not, so that the window's leftover joins
    /// that free block instead of becoming a hole of its own (not in the
    /// paper; on by default in Coop, off in Coop-G; see the module docs).
    pub merge_leftover: bool,
    /// The rules added to the paper's policies that act outside the window
    /// search, or beside it (`super::rules`; `AddedRules::COOP` in Coop:
    /// dropped inputs freed again, locked inputs moved beside the output,
    /// held tensors moved together, pinned requests in the shortest run,
    /// dropped chains kept, side outputs best-fit, live inputs borrowed
    /// and holes joined by moves; see the module docs and `rules`). None
    /// in Coop-G and the paper's Coop.
    pub rules: AddedRules,
    /// With `rank_per_byte`: the free bytes inside a window count twice,
    /// as bytes freed and as a hole absorbed (`Ranking::PerByteAndHole`; not
    /// in the paper; off by default, see the module docs).
    pub credit_holes: bool,
    /// An evictable tensor's recompute amplification is taken over the
    /// bytes its eviction frees in one run, its own and the free blocks
    /// beside it, instead of its own bytes alone (with
    /// `price_recompute_memory`; not in the paper; on by default in Coop,
    /// see the module docs).
    pub amplify_over_run: bool,
    /// When some free block holds at least half the request, the cheapest
    /// window that holds one challenges the plain search's pick and is
    /// taken when it evicts fewer bytes and costs no more per byte with its
    /// free bytes counted twice (`absorbs_hole`; not in the paper; on by
    /// default in Coop, see the module docs).
    pub absorb_holes: bool,
    /// Pointer moves of the last search.
    pub last_steps: usize,
    /// Intervals seen by the last search.
    pub last_items: usize,
    /// Buffers reused from search to search (no meaning between them).
    pub scratch: Scan,
}

impl Default for Coop {
    fn default() -> Coop {
        Coop {
            partition: true,
            in_place: true,
            pinned_at_ends: false,
            price_recompute_memory: true,
            rank_per_byte: true,
            merge_leftover: true,
            rules: AddedRules::COOP,
            credit_holes: false,
            amplify_over_run: true,
            absorb_holes: true,
            last_steps: 0,
            last_items: 0,
            scratch: Scan::default(),
        }
    }
}

impl Coop {
    /// Coop with unevictable tensors grouped at the ends ("Coop-G").
    /// It keeps the paper's placement inside a window (`merge_leftover`
    /// off), as before that switch was added: with it, its minimum budget
    /// rose on ResNet-50 and Swin-T.
    pub fn grouped() -> Coop {
        Coop {
            pinned_at_ends: true,
            merge_leftover: false,
            rules: AddedRules::NONE,
            amplify_over_run: false,
            absorb_holes: false,
            ..Coop::default()
        }
    }

    /// The paper's Coop: windows ranked by summed score, no recompute-memory
    /// pricing, the paper's placement inside a window, recomputed dropped
    /// inputs left resident (partitioning and recomputable in-place on).
    pub fn paper() -> Coop {
        Coop {
            price_recompute_memory: false,
            rank_per_byte: false,
            merge_leftover: false,
            rules: AddedRules::NONE,
            amplify_over_run: false,
            absorb_holes: false,
            ..Coop::default()
        }
    }

    /// How this Coop ranks windows.
    pub fn ranking(&self) -> Ranking {
        if self.rank_per_byte && self.credit_holes {
            Ranking::PerByteAndHole
        } else if self.rank_per_byte {
            Ranking::PerByte
        } else {
            Ranking::Sum
        }
    }

    /// The scan for a search for `request` bytes: the pool's gaps between
    /// pinned tensors of at least `request` bytes
    /// (`Pool::gap_runs_of_at_least_into`), in address order, as runs of the pool's
    /// intervals, each scored. Every window of the whole pool lies in one
    /// such gap (a pinned tensor blocks), and the sweep starts afresh at
    /// each run as it does after a blocked item, so it finds the same
    /// windows in the same order with the same sums as over the whole
    /// pool, and anchoring sees a pinned neighbour at a run's ends, where
    /// the pool has one. Only the skipped intervals are not read.
    fn gap_runs(&self, ctx: &SearchContext<'_>, request: u64, scan: &mut Scan) {
        let intervals = ctx.pool.interval_array();
        scan.clear(intervals.len());
        scan.request = request;
        ctx.pool.gap_runs_of_at_least_into(request, &mut scan.runs);
        for k in 0..scan.runs.len() {
            let run = scan.runs[k].clone();
            self.score_run(ctx, intervals, run, scan);
        }
    }

    /// Scores the intervals of `run` (indices into `intervals`, the pool's
    /// array) into `scan.scores`, reading each in place. Scores come from
    /// the table's price cache when it has one, borrowed once for the pass.
    fn score_run(
        &self,
        ctx: &SearchContext<'_>,
        intervals: &[Interval],
        run: Range<usize>,
        scan: &mut Scan,
    ) {
        let mut prices = ctx.tensors.prices();
        let over_run = self.amplifies_over_run();
        for k in run.clone() {
            let i = &intervals[k];
            // Free bytes just before this interval in the run, for the run
            // pricing.
            let free_before = match k.checked_sub(1).map(|j| &intervals[j]) {
                Some(before) if over_run && k > run.start && before.tensor.is_none() => before.size,
                _ => 0,
            };
            // The tensor's state settles pinned, locked and staleness in
            // one read.
            let score = match i.tensor.map(|t| (t, ctx.tensors.state(t))) {
                None => {
                    if over_run {
                        self.rescore_before_free(ctx, &mut prices, intervals, &run, k, scan);
                    }
                    scan.largest_zero = scan.largest_zero.max(i.size);
                    Some(0.0)
                }
                Some((_, Ok(tensor))) if tensor.pinned => None,
                Some((t, Ok(tensor))) if tensor.is_evictable() => {
                    let staleness = tensor.staleness(ctx.now);
                    let mut score = self.score(&mut prices, t, staleness, i.size, free_before);
                    if score == 0.0 {
                        scan.largest_zero = scan.largest_zero.max(i.size);
                    }
                    if self.rules.move_small_in_windows
                        && i.size.saturating_mul(MOVE_FRACTION) < scan.request
                        && let Ok(moved) = ctx.tensors.get(t)
                        && moved.cost < score
                    {
                        scan.moving.push(k);
                        score = moved.cost;
                    }
                    Some(score)
                }
                Some(_) => None,
            };
            scan.scores[k] = score;
        }
    }

    /// Free interval `k` of `run` is about to be scored: if the interval
    /// before it in the run is an evictable tensor, its eviction frees this
    /// block too, so its score is taken again over its run of free space
    /// (the free block before it, if any, itself, and this one). A tensor
    /// of score 0 costs nothing either way and is left as it is.
    #[cold]
    fn rescore_before_free(
        &self,
        ctx: &SearchContext<'_>,
        prices: &mut Prices<'_>,
        intervals: &[Interval],
        run: &Range<usize>,
        k: usize,
        scan: &mut Scan,
    ) {
        if k <= run.start {
            return;
        }
        let j = k - 1;
        let (Some(t), Some(score)) = (intervals[j].tensor, scan.scores[j]) else {
            return;
        };
        if score == 0.0 || scan.moving.last() == Some(&j) {
            return;
        }
        let Ok(state) = ctx.tensors.state(t) else {
            return;
        };
        let before = if j > run.start
            && scan.scores[j - 1] == Some(0.0)
            && intervals[j - 1].tensor.is_none()
        {
            intervals[j - 1].size
        } else {
            0
        };
        let free = intervals[k].size;
        let staleness = state.staleness(ctx.now);
        scan.scores[j] = Some(self.score(prices, t, staleness, intervals[j].size, before + free));
    }

    /// Whether an evictable tensor's amplification is taken over the run
    /// its eviction frees (`amplify_over_run`; only with the pricing).
    fn amplifies_over_run(&self) -> bool {
        self.price_recompute_memory && self.amplify_over_run
    }

    /// The score of evictable tensor `t` of `size` bytes, last used
    /// `staleness` ops ago, with `free_beside` free bytes next to it (0
    /// when the run pricing is off): h = c / s, times (with the pricing)
    /// the amplification of its recompute peak over the bytes its eviction
    /// frees in one run. With nothing free beside it, the cached
    /// amplification over its own size. Inlined into the walk, which calls
    /// it for every evictable interval.
    #[inline(always)]
    fn score(
        &self,
        prices: &mut Prices<'_>,
        t: TensorId,
        staleness: f64,
        size: u64,
        free_beside: u64,
    ) -> f64 {
        if !self.price_recompute_memory {
            return prices.projected_cost(t) / staleness;
        }
        if free_beside == 0 {
            let (projected, amplification) = prices.projected_and_amplification(t, RECOMPUTE_DEPTH);
            return projected / staleness * amplification;
        }
        let projected = prices.projected_cost(t);
        let peak = prices.recompute_peak(t, RECOMPUTE_DEPTH);
        projected / staleness * super::amplification(peak, size + free_beside)
    }

    /// The reference search that tests compare `next_eviction` with: every
    /// interval of the pool (no gaps), each score computed term by term as
    /// the module docs define it, h = c / s times the amplification of the
    /// recompute peak, from fresh prices (`TensorTable::*_uncached`, not the
    /// cache) and the interval's own size, into fresh buffers.
    pub fn next_eviction_whole_pool(
        &mut self,
        ctx: &SearchContext<'_>,
        request: &Request,
    ) -> Option<Eviction> {
        let table = ctx.tensors;
        let intervals = ctx.pool.interval_array();
        let mut scan = Scan::default();
        scan.clear(intervals.len());
        scan.runs.push(0..intervals.len());
        // Free bytes beside interval k (its run), for the run pricing.
        let free = |k: Option<usize>| {
            k.and_then(|k| intervals.get(k))
                .filter(|i| i.tensor.is_none())
                .map_or(0, |i| i.size)
        };
        for (k, i) in intervals.iter().enumerate() {
            let score = match i.tensor {
                None => Some(0.0),
                Some(t) if table.is_pinned(t) => None,
                Some(t) if table.is_evictable(t) => {
                    let h = table.projected_cost_uncached(t) / table.staleness(t, ctx.now);
                    let score = if self.price_recompute_memory {
                        let peak = table.recompute_peak_uncached(t, RECOMPUTE_DEPTH);
                        let beside = if self.amplify_over_run {
                            free(k.checked_sub(1)) + free(Some(k + 1))
                        } else {
                            0
                        };
                        h * super::amplification(peak, i.size + beside)
                    } else {
                        h
                    };
                    Some(score)
                }
                Some(_) => None,
            };
            if score == Some(0.0) {
                scan.largest_zero = scan.largest_zero.max(i.size);
            }
            scan.scores[k] = score;
        }
        self.search(&mut scan, intervals, request, table)
    }

    /// The cheapest window over the runs of `scan`, whose indices are into
    /// `intervals`, the pool's array (anchored first for a pinned request
    /// of Coop-G), and its eviction.
    ///
    /// With `keep_dropped_chains`, a window that holds a tensor on a
    /// dropped chain (`dropped_chain`) is not taken: those tensors are
    /// marked blocked and the sweep runs again over the same runs, until
    /// the cheapest window holds none. The result is the search with them
    /// blocked from the start, but only the tensors of candidate windows
    /// are walked, not every evictable one (the walk reads up to
    /// `CHAIN_DEPTH` levels of inputs; asked of every tensor at every
    /// search it doubled Coop's search time on the vision traces).
    fn search(
        &mut self,
        scan: &mut Scan,
        intervals: &[Interval],
        request: &Request,
        table: &TensorTable,
    ) -> Option<Eviction> {
        let (mut found, mut steps) = (None, 0);
        let size = |k: usize| intervals[k].size;
        let pinned = |k: usize| {
            intervals[k]
                .tensor
                .is_some_and(|t| table.state(t).is_ok_and(|s| s.pinned))
        };
        loop {
            let scores = &scan.scores;
            let score_of = |k: usize| scores[k];
            let mut candidate = None;
            if request.pinned && self.pinned_at_ends {
                let at = Position {
                    size,
                    score_of,
                    pinned,
                };
                let (anchored, anchored_steps) = anchored_over(
                    &scan.runs,
                    intervals.len(),
                    at,
                    request.size,
                    self.ranking(),
                );
                candidate = anchored.map(|(w, side)| (w, Some(side)));
                steps += anchored_steps;
            }
            if candidate.is_none() {
                let ranking = self.ranking();
                // The hole challenger is found in the same sweep, when some
                // interval is large enough to be one.
                let (mut window, hole, window_steps) =
                    if self.absorb_holes && big_hole(scan.largest_zero, request.size) {
                        cheapest_over::<true>(&scan.runs, size, score_of, request.size, ranking)
                    } else {
                        cheapest_over::<false>(&scan.runs, size, score_of, request.size, ranking)
                    };
                steps += window_steps;
                if let (Some(pick), Some(hole)) = (window, hole)
                    && absorbs_hole_with(&hole, &pick, |w| free_in(w, size, score_of))
                {
                    window = Some(hole);
                }
                candidate = window.map(|w| (w, None));
            }
            let Some((window, _)) = candidate else {
                break;
            };
            let mut kept = false;
            if self.rules.keep_dropped_chains {
                let run = scan.run_of(window.first);
                for k in window.first..=window.last {
                    if scan.moving.contains(&k) {
                        continue;
                    }
                    if let Some(t) = intervals[k].tensor
                        && on_dropped_chain(table, t)
                    {
                        let size = intervals[k].size;
                        let beside_larger = |j: Option<usize>| {
                            j.is_some_and(|j| run.contains(&j) && intervals[j].size > size)
                        };
                        scan.scores[k] = if self.rules.move_small_in_windows
                            && size < request.size
                            && beside_larger(k.checked_sub(1))
                            && beside_larger(Some(k + 1))
                        {
                            scan.moving.push(k);
                            table.get(t).ok().map(|t| t.cost)
                        } else {
                            None
                        };
                        kept = true;
                    }
                }
            }
            if !kept {
                found = candidate;
                break;
            }
        }
        (self.last_steps, self.last_items) = (steps, scan.runs.iter().map(|r| r.len()).sum());
        let (window, side) = found?;
        let span = (intervals[window.first].addr, window.bytes);
        let (mut victims, mut moved) = (Vec::new(), Vec::new());
        let inside = intervals[window.first..=window.last].iter();
        for (k, interval) in (window.first..).zip(inside) {
            if let Some(t) = interval.tensor {
                if scan.moving.contains(&k) {
                    moved.push(t);
                } else {
                    victims.push(t);
                }
            }
        }
        // Free space beside the window: a scored interval of its run with
        // no tensor (outside the run lies a pinned tensor or an end of the
        // pool).
        let run = scan.run_of(window.first);
        let free = |k: usize| {
            run.contains(&k) && scan.scores[k].is_some() && intervals[k].tensor.is_none()
        };
        let mut addr = self.addr_in(span, request, side);
        let expensive = !(self.partition && request.cheap);
        if self.merge_leftover
            && side.is_none()
            && expensive
            && window.first > 0
            && free(window.first - 1)
            && !free(window.last + 1)
        {
            addr = span.0 + span.1 - request.size;
        }
        Some(Eviction {
            victims,
            window: Some(span),
            addr: Some(addr),
            moved,
        })
    }

    /// Where `request` goes in the span `(start, bytes)`: against the anchor
    /// for a pinned one, else expensive left and cheap right (Algorithm 1).
    fn addr_in(&self, (start, bytes): (u64, u64), request: &Request, side: Option<Side>) -> u64 {
        let right = match side {
            Some(side) => side == Side::Right,
            None => self.partition && request.cheap,
        };
        if right {
            start + bytes - request.size
        } else {
            start
        }
    }
}

impl EvictionPolicy for Coop {
    fn name(&self) -> &'static str {
        if self.pinned_at_ends {
            "Coop-G"
        } else {
            "Coop"
        }
    }

    fn next_eviction(&mut self, ctx: &SearchContext<'_>, request: &Request) -> Option<Eviction> {
        let mut scan = std::mem::take(&mut self.scratch);
        self.gap_runs(ctx, request.size, &mut scan);
        let found = self.search(&mut scan, ctx.pool.interval_array(), request, ctx.tensors);
        self.scratch = scan;
        found
    }

    fn place(&mut self, ctx: &SearchContext<'_>, request: &Request) -> Option<u64> {
        if request.pinned && self.pinned_at_ends {
            // The highest free block that fits and touches an anchor.
            let items: Vec<_> = ctx.pool.intervals().collect();
            let pinned = |k: usize| {
                items[k]
                    .tensor
                    .is_some_and(|t| ctx.tensors.get(t).is_ok_and(|t| t.pinned))
            };
            let found = (0..items.len()).rev().find_map(|k| {
                let block = items[k];
                if block.tensor.is_some() || block.size < request.size {
                    return None;
                }
                let span = (block.addr, block.size);
                if k + 1 == items.len() || pinned(k + 1) {
                    Some(self.addr_in(span, request, Some(Side::Right)))
                } else if k == 0 || pinned(k - 1) {
                    Some(self.addr_in(span, request, Some(Side::Left)))
                } else {
                    None
                }
            });
            // None: the executor asks for a window, which is an anchored one
            // where one exists and else the cheapest (a free block anywhere
            // costs nothing).
            return found;
        }
        if request.pinned && self.rules.pinned_in_short_gaps {
            return super::short_gap::place_in_shortest_gap(ctx.pool, request.size);
        }
        if self.partition && request.cheap {
            ctx.pool.last_fit(request.size)
        } else {
            ctx.pool.first_fit(request.size)
        }
    }

    fn recomputes_in_place(&self) -> bool {
        self.in_place
    }

    fn caches_prices(&self) -> bool {
        true
    }

    fn rules(&self) -> AddedRules {
        self.rules
    }
}
