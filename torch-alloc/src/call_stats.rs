//! Where the host time of `gm_malloc`/`gm_free` goes, per device: time and
//! count per kind of call, calls slower than [`SLOW_NANOS`], and calls made
//! from another thread than the call before (PyTorch frees from its
//! autograd thread what the Python thread allocated; every such switch
//! moves the pool's state between cores' caches).
//!
//! Concurrency: relaxed atomics. These are statistics that nothing else
//! depends on; each counter is exact (every update is one RMW), but a
//! reader may see one counter of a call before another.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A call longer than this (ns) is counted as slow.
pub const SLOW_NANOS: u64 = 10_000;

/// Counters of one device.
#[derive(Debug, Default)]
pub struct CallStats {
    alloc_nanos: AtomicU64,
    free_nanos: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
    slow_calls: AtomicU64,
    slow_nanos: AtomicU64,
    thread_switches: AtomicU64,
    last_thread: AtomicU64,
}

/// A snapshot of [`CallStats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCounts {
    /// Nanoseconds inside `gm_malloc`/`gm_malloc_in`.
    pub alloc_nanos: u64,
    /// Nanoseconds inside `gm_free`.
    pub free_nanos: u64,
    /// Timed allocation calls.
    pub allocs: u64,
    /// Timed free calls.
    pub frees: u64,
    /// Calls longer than [`SLOW_NANOS`].
    pub slow_calls: u64,
    /// Nanoseconds of those calls.
    pub slow_nanos: u64,
    /// Calls made from another thread than the call before.
    pub thread_switches: u64,
}

/// Which call is timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallKind {
    /// An allocation.
    Alloc,
    /// A free.
    Free,
}

thread_local! {
    /// This thread's number for switch counting (0: not drawn yet).
    static THREAD_NUMBER: Cell<u64> = const { Cell::new(0) };
}

/// A small number per thread, never 0.
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    THREAD_NUMBER.with(|n| {
        if n.get() == 0 {
            // Relaxed: only uniqueness matters, which the RMW gives.
            n.set(NEXT.fetch_add(1, Ordering::Relaxed));
        }
        n.get()
    })
}

impl CallStats {
    /// Records a call of `kind` that started at `started` and ends now.
    pub fn record(&self, kind: CallKind, started: Instant) {
        let nanos = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let (time, count) = match kind {
            CallKind::Alloc => (&self.alloc_nanos, &self.allocs),
            CallKind::Free => (&self.free_nanos, &self.frees),
        };
        // Relaxed throughout: statistics (see the module docs).
        time.fetch_add(nanos, Ordering::Relaxed);
        count.fetch_add(1, Ordering::Relaxed);
        if nanos > SLOW_NANOS {
            self.slow_calls.fetch_add(1, Ordering::Relaxed);
            self.slow_nanos.fetch_add(nanos, Ordering::Relaxed);
        }
        let me = thread_number();
        let before = self.last_thread.swap(me, Ordering::Relaxed);
        if before != 0 && before != me {
            self.thread_switches.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The counters now.
    pub fn counts(&self) -> CallCounts {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        CallCounts {
            alloc_nanos: get(&self.alloc_nanos),
            free_nanos: get(&self.free_nanos),
            allocs: get(&self.allocs),
            frees: get(&self.frees),
            slow_calls: get(&self.slow_calls),
            slow_nanos: get(&self.slow_nanos),
            thread_switches: get(&self.thread_switches),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn counts_kinds_slow_calls_and_thread_switches() {
        let s = CallStats::default();
        s.record(CallKind::Alloc, Instant::now());
        s.record(CallKind::Free, Instant::now());
        let slow = Instant::now() - Duration::from_micros(50);
        s.record(CallKind::Alloc, slow);
        let c = s.counts();
        assert_eq!((c.allocs, c.frees), (2, 1));
        assert_eq!(c.slow_calls, 1);
        assert!(c.slow_nanos >= 50_000 && c.alloc_nanos >= 50_000);
        assert_eq!(c.thread_switches, 0, "one thread so far");
        std::thread::scope(|t| {
            t.spawn(|| s.record(CallKind::Free, Instant::now()));
        });
        s.record(CallKind::Alloc, Instant::now());
        assert_eq!(s.counts().thread_switches, 2, "there and back");
    }
}
