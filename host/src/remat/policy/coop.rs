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
//! Cheap-tensor partitioning: a tensor whose op has a cost density (cost per
//! byte) below the executor's threshold is "cheap" and goes to the right end of
//! the highest free block that fits; an expensive one goes to the left end of
//! the lowest. Inside an evicted window, expensive tensors go left and cheap
//! ones right (Algorithm 1). Recomputable in-place: an in-place op's output
//! takes its input's address. Both can be switched off for ablations.
//!
//! Owned by one executor; single-threaded. Keeps the step count of its last
//! search so that tests can check that the search is linear.

use super::super::pool::Pool;
use super::{Eviction, EvictionPolicy, SearchContext};

/// One interval as the window search sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WindowItem {
    /// Start address.
    pub addr: u64,
    /// Bytes.
    pub size: u64,
    /// Eviction score (0 for free space), or `None` when it may not be evicted.
    pub score: Option<f64>,
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
}

/// The cheapest run of consecutive items with at least `request` bytes and no
/// blocked item, and the number of pointer moves the sweep made (at most 2N).
pub fn cheapest_window(items: &[WindowItem], request: u64) -> (Option<Window>, usize) {
    let (mut left, mut bytes, mut score, mut steps) = (0usize, 0u64, 0.0f64, 0usize);
    let mut best: Option<Window> = None;
    for (right, item) in items.iter().enumerate() {
        steps += 1;
        let Some(s) = item.score else {
            (left, bytes, score) = (right + 1, 0, 0.0);
            continue;
        };
        bytes += item.size;
        score += s;
        while left < right && bytes - items[left].size >= request {
            bytes -= items[left].size;
            score -= items[left].score.unwrap_or(0.0);
            left += 1;
            steps += 1;
        }
        let better = best.is_none_or(|b| score < b.score || (score == b.score && bytes < b.bytes));
        if bytes >= request && better {
            best = Some(Window {
                first: left,
                last: right,
                score: score.max(0.0),
                bytes,
            });
        }
    }
    (best, steps)
}

/// The Coop policy.
#[derive(Debug, Clone, Copy)]
pub struct Coop {
    /// Cheap-tensor partitioning on.
    pub partition: bool,
    /// Recomputable in-place on.
    pub in_place: bool,
    /// Pointer moves of the last search.
    pub last_steps: usize,
    /// Intervals seen by the last search.
    pub last_items: usize,
}

impl Default for Coop {
    fn default() -> Coop {
        Coop {
            partition: true,
            in_place: true,
            last_steps: 0,
            last_items: 0,
        }
    }
}

impl Coop {
    /// The pool as window items.
    pub fn items(ctx: &SearchContext<'_>) -> Vec<WindowItem> {
        ctx.pool
            .intervals()
            .map(|i| {
                let score = match i.tensor {
                    None => Some(0.0),
                    Some(t) if ctx.tensors.is_evictable(t) => {
                        Some(ctx.tensors.projected_cost(t) / ctx.tensors.staleness(t, ctx.now))
                    }
                    Some(_) => None,
                };
                WindowItem {
                    addr: i.addr,
                    size: i.size,
                    score,
                }
            })
            .collect()
    }
}

impl EvictionPolicy for Coop {
    fn name(&self) -> &'static str {
        "Coop"
    }

    fn next_eviction(&mut self, ctx: &SearchContext<'_>, request: u64) -> Option<Eviction> {
        let items = Coop::items(ctx);
        let (window, steps) = cheapest_window(&items, request);
        (self.last_steps, self.last_items) = (steps, items.len());
        let window = window?;
        let span = &items[window.first..=window.last];
        let victims = ctx
            .pool
            .intervals()
            .skip(window.first)
            .take(span.len())
            .filter_map(|i| i.tensor)
            .collect();
        Some(Eviction {
            victims,
            window: Some((span[0].addr, window.bytes)),
        })
    }

    fn place(&self, pool: &Pool, size: u64, cheap: bool) -> Option<u64> {
        if self.partition && cheap {
            pool.last_fit(size)
        } else {
            pool.first_fit(size)
        }
    }

    fn recomputes_in_place(&self) -> bool {
        self.in_place
    }
}
