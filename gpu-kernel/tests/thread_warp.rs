//! The host warp of std threads (`arch::ThreadWarp`, not loom): the
//! whole-warp collectives answer like the GPU's (`ballot`, `shfl`, `match`,
//! `warp_sync` ordering plain writes), a lane alone answers at once, and the
//! exchange buffers survive many back-to-back collectives. Fixed values; 5
//! lanes so that the mask is not a power of two.
#![cfg(not(loom))]

use std::sync::atomic::{AtomicU64, Ordering};

use gpu_kernel::arch::{self, ThreadWarp};

const LANES: u32 = 5;

/// Runs `body(lane, mask)` on every lane of one host warp; returns the
/// lanes' results by lane.
fn on_warp<T: Send>(body: impl Fn(u32, u32) -> T + Sync) -> Vec<T> {
    let warp = ThreadWarp::new(LANES);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..LANES)
            .map(|lane| {
                let (warp, body) = (warp.clone(), &body);
                s.spawn(move || {
                    let mask = warp.mask();
                    arch::join_thread_warp(warp, lane);
                    assert_eq!(arch::lane_id(), lane);
                    let out = body(lane, mask);
                    arch::leave_thread_warp();
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn collectives_answer_like_a_warp() {
    let results = on_warp(|lane, mask| {
        assert_eq!(mask, 0b1_1111);
        let odd = arch::ballot(mask, lane % 2 == 1);
        let from_three = arch::shfl_u64(mask, 100 + lane as u64, 3);
        let same_parity = arch::match_any64(mask, (lane % 2) as u64);
        // A lane alone: its own bit, answered without the others.
        let alone = arch::ballot(1 << lane, true);
        (odd, from_three, same_parity, alone, arch::active_mask())
    });
    for (lane, &(odd, from_three, same_parity, alone, active)) in results.iter().enumerate() {
        assert_eq!(odd, 0b0_1010);
        assert_eq!(from_three, 103);
        let want = if lane % 2 == 1 { 0b0_1010 } else { 0b1_0101 };
        assert_eq!(same_parity, want, "lane {lane}");
        assert_eq!((alone, active), (1 << lane, 1 << lane));
    }
}

#[test]
fn many_collectives_in_a_row_and_warp_sync_orders_writes() {
    let cells: Vec<AtomicU64> = (0..LANES).map(|_| AtomicU64::new(0)).collect();
    let sums = on_warp(|lane, mask| {
        let mut sum = 0;
        for round in 1..=2_000u64 {
            // Relaxed writes, read by other lanes after the sync: the sync's
            // release/acquire makes them visible.
            cells[lane as usize].store(round * (lane as u64 + 1), Ordering::Relaxed);
            arch::warp_sync(mask);
            let next = (lane + 1) % LANES;
            assert_eq!(
                cells[next as usize].load(Ordering::Relaxed),
                round * (next as u64 + 1)
            );
            sum += arch::shfl_u64(mask, round + lane as u64, round as u32 % LANES);
            arch::warp_sync(mask);
        }
        sum
    });
    assert!(sums.windows(2).all(|w| w[0] == w[1]), "{sums:?}");
}
