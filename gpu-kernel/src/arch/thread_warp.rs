//! A host warp of ordinary threads (not loom): up to [`WARP_SIZE`] std
//! threads that [`join`] one [`ThreadWarp`] run warp-cooperative code as its
//! lanes, so the warp-per-vertex graph updates (`gpu_kernels::graph::warp`) run on
//! the host through the same `arch` calls as on the GPU. The loom model of a
//! warp is `host_warp.rs`; this one is for CPU tests with real threads.
//!
//! What it models, and how:
//! - A collective over the whole warp (`ballot`, `shfl`, `match`,
//!   `warp_sync` with the mask [`ThreadWarp::mask`]) is an all-gather: each
//!   lane posts its value with its exchange count (release), waits until
//!   every lane has posted that count (acquire), then reads every value. So
//!   it also orders memory like `bar.warp.sync`: a lane's writes before any
//!   collective happen before every lane's accesses after it (stronger than
//!   `shfl` on the GPU, which the GPU code never relies on: it calls
//!   `warp_sync` where it needs the order).
//! - A collective over the lane's own bit only is answered at once, as for a
//!   lone thread; `active_mask` is the lane's own bit. The allocator's team
//!   paths (`crate::team`) therefore see a team of one when a lane calls
//!   `malloc` or `free` on its own, as a diverged lane does on the GPU.
//! - Any other mask is a misuse of this model and panics.
//!
//! Contract (the SIMT contract the GPU code keeps): every lane of the warp
//! executes every whole-warp collective, in the same order.
//!
//! Values live in two buffers by exchange parity: a lane overwrites its
//! buffer for exchange `k + 2` only after exchange `k + 1` completed, i.e.
//! after every lane posted `k + 1` and so finished reading exchange `k`.

extern crate std;

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::cell::RefCell;
use std::sync::Arc;

use crate::arch::WARP_SIZE;

/// Shared state of one host warp.
pub struct ThreadWarp {
    lanes: u32,
    /// Exchanges each lane has posted.
    phase: [AtomicU32; WARP_SIZE as usize],
    /// Posted values, by exchange parity and lane.
    values: [[AtomicU64; WARP_SIZE as usize]; 2],
}

impl ThreadWarp {
    /// A warp of `lanes` lanes (1 ..= [`WARP_SIZE`]) that no thread joined yet.
    pub fn new(lanes: u32) -> Arc<ThreadWarp> {
        assert!(
            (1..=WARP_SIZE).contains(&lanes),
            "a host warp has 1..=32 lanes"
        );
        Arc::new(ThreadWarp {
            lanes,
            phase: core::array::from_fn(|_| AtomicU32::new(0)),
            values: core::array::from_fn(|_| core::array::from_fn(|_| AtomicU64::new(0))),
        })
    }

    /// The mask of all its lanes (what the warp code passes to collectives).
    pub fn mask(&self) -> u32 {
        if self.lanes == WARP_SIZE {
            u32::MAX
        } else {
            (1 << self.lanes) - 1
        }
    }
}

struct Lane {
    warp: Arc<ThreadWarp>,
    lane: u32,
    exchanges: u32,
}

std::thread_local! {
    static LANE: RefCell<Option<Lane>> = const { RefCell::new(None) };
}

/// Makes this thread lane `lane` of `warp` (until [`leave`] or its end).
pub fn join(warp: Arc<ThreadWarp>, lane: u32) {
    assert!(lane < warp.lanes, "lane {lane} outside the host warp");
    LANE.with(|l| {
        *l.borrow_mut() = Some(Lane {
            warp,
            lane,
            exchanges: 0,
        })
    });
}

/// Makes this thread a lone thread again.
pub fn leave() {
    LANE.with(|l| *l.borrow_mut() = None);
}

/// This thread's lane, if it joined a warp.
pub fn lane() -> Option<u32> {
    LANE.with(|l| l.borrow().as_ref().map(|l| l.lane))
}

/// If `mask` is the whole warp this thread is a lane of: every lane's
/// `value`, by lane. `None` if the thread is alone or `mask` is its own bit.
pub fn gather(mask: u32, value: u64) -> Option<[u64; WARP_SIZE as usize]> {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        let l = l.as_mut()?;
        if mask == 1 << l.lane {
            return None;
        }
        assert_eq!(
            mask,
            l.warp.mask(),
            "host warp collectives take the whole warp or the lane alone"
        );
        l.exchanges += 1;
        let k = l.exchanges;
        let w = &l.warp;
        let parity = (k & 1) as usize;
        w.values[parity][l.lane as usize].store(value, Ordering::Relaxed);
        // Release: the value above and this lane's earlier writes happen
        // before the accesses of any lane that sees this count.
        w.phase[l.lane as usize].store(k, Ordering::Release);
        let mut all = [0u64; WARP_SIZE as usize];
        for ((slot, phase), value) in all
            .iter_mut()
            .zip(&w.phase)
            .zip(&w.values[parity])
            .take(w.lanes as usize)
        {
            // Acquire: pairs with the other lane's release of its count.
            while phase.load(Ordering::Acquire) < k {
                std::thread::yield_now();
            }
            *slot = value.load(Ordering::Relaxed);
        }
        Some(all)
    })
}
