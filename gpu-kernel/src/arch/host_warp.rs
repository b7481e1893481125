//! A host warp of two lanes, for loom models only (`--cfg loom`): two loom
//! threads that [`join`] one [`HostWarp`] run the allocator as lanes 0 and 1
//! of one warp, so its team paths (`match`, `shfl`, `bar.warp.sync`) are
//! model-checked through the real code.
//!
//! What it models, and how:
//! - `activemask`: on Volta and later a lane may find itself alone at any
//!   point, so a lane is alone unless the other lane arrives at the same
//!   call site while it waits to converge: it posts itself (with the call
//!   site and its exchange count), then withdraws; if the other lane took
//!   the post first, both are converged (mask `0b11`) and start counting
//!   exchanges from the same number. Loom explores both.
//! - `match`: a two-party exchange of values that orders no other memory
//!   (relaxed; read-modify-writes read the latest value, as a register
//!   exchange would), as on the GPU.
//! - `shfl`: the same exchange with release/acquire: the allocator uses a
//!   shuffled value as an address, and on the GPU that dependency orders the
//!   receiver's accesses after the sender's read; loom has no dependency
//!   ordering, so the model grants it this way.
//! - `bar.warp.sync`: the same exchange with release/acquire, so a lane's
//!   writes before it happen before the other lane's accesses after it.
//!
//! Every collective over `0b11` must be executed by both lanes in the same
//! order (the SIMT contract the allocator already keeps on the GPU); one
//! over a lane's own bit is answered at once.

extern crate std;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use std::cell::RefCell;

/// Shared state of one two-lane warp.
pub struct HostWarp {
    /// The meeting word of `activemask`: empty, a lane's post (lane, call
    /// site, exchange count) or the taker's answer (the common count).
    meet: AtomicU64,
    /// Exchanges each lane has posted.
    phase: [AtomicU32; 2],
    /// Posted values, by lane and exchange parity.
    values: [[AtomicU64; 2]; 2],
}

impl HostWarp {
    /// A warp no lane has joined yet.
    pub fn new() -> Arc<HostWarp> {
        Arc::new(HostWarp {
            meet: AtomicU64::new(EMPTY),
            phase: [AtomicU32::new(0), AtomicU32::new(0)],
            values: [
                [AtomicU64::new(0), AtomicU64::new(0)],
                [AtomicU64::new(0), AtomicU64::new(0)],
            ],
        })
    }
}

struct Lane {
    warp: Arc<HostWarp>,
    lane: u32,
    exchanges: u32,
}

loom::thread_local! {
    static LANE: RefCell<Option<Lane>> = RefCell::new(None);
}

/// Makes this loom thread lane `lane` (0 or 1) of `warp`.
pub fn join(warp: Arc<HostWarp>, lane: u32) {
    assert!(lane < 2, "a host warp has two lanes");
    LANE.with(|l| {
        *l.borrow_mut() = Some(Lane {
            warp,
            lane,
            exchanges: 0,
        })
    });
}

/// This thread's lane, if it joined a warp.
pub fn lane() -> Option<u32> {
    LANE.with(|l| l.borrow().as_ref().map(|l| l.lane))
}

const EMPTY: u64 = 0;
const POST: u64 = 1 << 62;
const ANSWER: u64 = 2 << 62;

fn post(lane: u32, site: u32, count: u32) -> u64 {
    POST | (lane as u64) << 61 | ((site as u64) & 0x1fff_ffff) << 32 | count as u64
}

/// The active mask at call site `site` (see the module docs).
pub fn active_mask(site: u32) -> Option<u32> {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        let l = l.as_mut()?;
        let me = 1u32 << l.lane;
        let meet = &l.warp.meet;
        // Read-modify-write: the latest word.
        let seen = meet.fetch_add(0, Ordering::Relaxed);
        if seen & POST != 0 && seen == post(1 - l.lane, site, seen as u32) {
            // The other lane waits here: take its post; both converge and
            // count exchanges from the larger count.
            let common = l.exchanges.max(seen as u32);
            if meet
                .compare_exchange(
                    seen,
                    ANSWER | common as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                l.exchanges = common;
                return Some(0b11);
            }
            return Some(me);
        }
        let mine = post(l.lane, site, l.exchanges);
        if meet
            .compare_exchange(EMPTY, mine, Ordering::Relaxed, Ordering::Relaxed)
            .is_err()
        {
            return Some(me);
        }
        // Withdraw; if the post was taken, read the common count and empty
        // the word for the next meeting.
        match meet.compare_exchange(mine, EMPTY, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => Some(me),
            Err(answer) => {
                l.exchanges = answer as u32;
                meet.swap(EMPTY, Ordering::Relaxed);
                Some(0b11)
            }
        }
    })
}

/// Exchanges `value` with the other lane over mask `0b11`; returns the
/// other lane's value. `ordered`: release/acquire (`bar.warp.sync`), else
/// relaxed (`match`, `shfl`).
pub fn exchange(value: u64, ordered: bool) -> u64 {
    LANE.with(|l| {
        let mut l = l.borrow_mut();
        let l = l.as_mut().expect("exchange outside a host warp");
        let (me, other) = (l.lane as usize, 1 - l.lane as usize);
        l.exchanges += 1;
        let k = l.exchanges;
        let w = &l.warp;
        let parity = (k & 1) as usize;
        w.values[me][parity].swap(value, Ordering::Relaxed);
        let (post, wait) = if ordered {
            (Ordering::Release, Ordering::Acquire)
        } else {
            (Ordering::Relaxed, Ordering::Relaxed)
        };
        w.phase[me].swap(k, post);
        // Read-modify-writes: the latest value, never a stale one.
        while w.phase[other].fetch_add(0, wait) < k {
            loom::thread::yield_now();
        }
        // The other lane reuses this parity only after waiting for our next
        // post, which comes after this read.
        w.values[other][parity].fetch_add(0, Ordering::Relaxed)
    })
}
