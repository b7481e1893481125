//! The host twin of [`crate::arch`]: the same calls over `core::sync::atomic`
//! (or loom's atomics under `--cfg loom`), with the same orderings. A host
//! thread is a warp of one lane, unless it joined a host warp: a two-lane
//! [`HostWarp`] under loom (`host_warp.rs`), or a [`ThreadWarp`] of up to 32
//! std threads otherwise (`thread_warp.rs`).

extern crate std;

#[cfg(loom)]
#[path = "host_warp.rs"]
mod host_warp;
#[cfg(loom)]
pub use host_warp::{HostWarp, join as join_host_warp};

#[cfg(not(loom))]
#[path = "thread_warp.rs"]
mod thread_warp;
#[cfg(not(loom))]
pub use thread_warp::{ThreadWarp, join as join_thread_warp, leave as leave_thread_warp};

#[cfg(not(loom))]
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};
#[cfg(loom)]
use loom::sync::atomic::{AtomicU32, AtomicU64, Ordering, fence};

/// A 64-bit word of heap metadata.
pub type Word = AtomicU64;
/// A 32-bit word.
pub type Word32 = AtomicU32;

#[cfg(not(loom))]
std::thread_local! {
    /// (every, count): this thread yields at every `every`-th
    /// read-modify-write on a `Word` (see [`preempt_every`]).
    static PREEMPT: core::cell::Cell<(u32, u32)> = const { core::cell::Cell::new((0, 0)) };
}

/// Host twin only (tests): from now on this thread gives up its core at
/// every `every`-th read-modify-write on a [`Word`] (0: never, the default).
///
/// On a GPU thousands of threads interleave at every atomic; a host with
/// two cores rarely switches threads inside a protocol that takes a few
/// microseconds, so races that a GPU hits every launch (two run claims
/// taking parts of the same free segments) never show. A yield at the
/// atomics lets the CPU tests reach those interleavings. No-op under loom,
/// which explores interleavings itself.
pub fn preempt_every(every: u32) {
    #[cfg(not(loom))]
    PREEMPT.with(|p| p.set((every, 0)));
    #[cfg(loom)]
    let _ = every;
}

/// Where [`preempt_every`] may yield: before each read-modify-write.
#[inline(always)]
fn preempt_point() {
    #[cfg(not(loom))]
    PREEMPT.with(|p| {
        let (every, count) = p.get();
        if every != 0 {
            preempt_slow(p, every, count);
        }
    });
}

#[cfg(not(loom))]
#[cold]
#[inline(never)]
fn preempt_slow(p: &core::cell::Cell<(u32, u32)>, every: u32, count: u32) {
    let count = count + 1;
    if count >= every {
        p.set((every, 0));
        std::thread::yield_now();
    } else {
        p.set((every, count));
    }
}

/// Relaxed load.
#[inline(always)]
pub fn load_relaxed(w: &Word) -> u64 {
    w.load(Ordering::Relaxed)
}
/// Acquire load.
#[inline(always)]
pub fn load_acquire(w: &Word) -> u64 {
    w.load(Ordering::Acquire)
}
/// Relaxed store.
#[inline(always)]
pub fn store_relaxed(w: &Word, v: u64) {
    w.store(v, Ordering::Relaxed)
}
/// Release store.
#[inline(always)]
pub fn store_release(w: &Word, v: u64) {
    w.store(v, Ordering::Release)
}
/// Relaxed add; returns the old value.
#[inline(always)]
pub fn fetch_add_relaxed(w: &Word, v: u64) -> u64 {
    preempt_point();
    w.fetch_add(v, Ordering::Relaxed)
}
/// Relaxed add whose result later accesses depend on by address (see the
/// GPU side). Loom has no dependency ordering, so under loom it is an
/// acquire: a thread that takes a slice from an installer's word sees what
/// the installer published, as the dependency guarantees on the GPU.
#[inline(always)]
pub fn fetch_add_dependent(w: &Word, v: u64) -> u64 {
    preempt_point();
    #[cfg(loom)]
    {
        w.fetch_add(v, Ordering::Acquire)
    }
    #[cfg(not(loom))]
    {
        w.fetch_add(v, Ordering::Relaxed)
    }
}
/// Release add; returns the old value.
#[inline(always)]
pub fn fetch_add_release(w: &Word, v: u64) -> u64 {
    preempt_point();
    w.fetch_add(v, Ordering::Release)
}
/// Acquire-release add; returns the old value.
#[inline(always)]
pub fn fetch_add_acq_rel(w: &Word, v: u64) -> u64 {
    preempt_point();
    w.fetch_add(v, Ordering::AcqRel)
}
/// Acquire-release or; returns the old value.
#[inline(always)]
pub fn fetch_or_acq_rel(w: &Word, v: u64) -> u64 {
    preempt_point();
    w.fetch_or(v, Ordering::AcqRel)
}
/// Acquire-release and; returns the old value.
#[inline(always)]
pub fn fetch_and_acq_rel(w: &Word, v: u64) -> u64 {
    preempt_point();
    w.fetch_and(v, Ordering::AcqRel)
}
/// Relaxed store to a word that other threads may change with RMWs at the
/// same time (a segment's state word, which a stale block reservation may
/// subtract from while it is published). Coherence and RMW atomicity order
/// the two, in C++ as in PTX: the RMW reads the stored value, or the store
/// overwrites the RMW's result. So it is a plain relaxed store here and on
/// the GPU. Under loom it is an exchange: loom let a relaxed store be
/// overtaken by another thread's RMWs that read the value before it (a
/// store followed, in its own thread, by a load that read the other
/// thread's adds made on the old value), an outcome C++ forbids, which
/// broke a model of these paths; an RMW is ordered against RMWs there.
#[inline(always)]
pub fn store_relaxed_racing_rmw(w: &Word, v: u64) {
    #[cfg(loom)]
    {
        preempt_point();
        w.swap(v, Ordering::Relaxed);
    }
    #[cfg(not(loom))]
    {
        w.store(v, Ordering::Relaxed)
    }
}
/// Acquire-release exchange; returns the old value.
#[inline(always)]
pub fn swap_acq_rel(w: &Word, v: u64) -> u64 {
    preempt_point();
    w.swap(v, Ordering::AcqRel)
}
/// Acquire-release compare-and-swap.
#[inline(always)]
pub fn compare_exchange_acq_rel(w: &Word, current: u64, new: u64) -> Result<u64, u64> {
    preempt_point();
    w.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
}
/// Relaxed 32-bit load.
#[inline(always)]
pub fn load_relaxed32(w: &Word32) -> u32 {
    w.load(Ordering::Relaxed)
}
/// Acquire-release 32-bit add.
#[inline(always)]
pub fn fetch_add_acq_rel32(w: &Word32, v: u32) -> u32 {
    w.fetch_add(v, Ordering::AcqRel)
}
/// Acquire-release 32-bit compare-and-swap.
#[inline(always)]
pub fn compare_exchange_acq_rel32(w: &Word32, current: u32, new: u32) -> Result<u32, u32> {
    w.compare_exchange(current, new, Ordering::AcqRel, Ordering::Acquire)
}
/// Acquire-release fence.
#[inline(always)]
pub fn fence_acq_rel() {
    fence(Ordering::AcqRel)
}
/// A host thread is a one-lane warp (under loom, a lane of a two-lane
/// [`HostWarp`] if it joined one). A lane of a [`ThreadWarp`] is always
/// alone here (its own bit): the warp code that runs on one names the whole
/// warp's mask itself.
#[inline(always)]
#[cfg_attr(loom, track_caller)]
pub fn active_mask() -> u32 {
    #[cfg(loom)]
    {
        let at = core::panic::Location::caller();
        if let Some(mask) = host_warp::active_mask(at.line() * 256 + at.column()) {
            return mask;
        }
    }
    1 << lane_id()
}
/// Lane 0, or the lane of the host warp this thread joined.
#[inline(always)]
pub fn lane_id() -> u32 {
    #[cfg(loom)]
    if let Some(lane) = host_warp::lane() {
        return lane;
    }
    #[cfg(not(loom))]
    if let Some(lane) = thread_warp::lane() {
        return lane;
    }
    0
}
/// A stable small number per host thread, standing in for the SM id.
#[inline(always)]
pub fn sm_id() -> u32 {
    #[cfg(loom)]
    {
        0
    }
    #[cfg(not(loom))]
    {
        use core::sync::atomic::AtomicU32 as StdU32;
        static NEXT: StdU32 = StdU32::new(0);
        std::thread_local!(static ID: u32 = NEXT.fetch_add(1, Ordering::Relaxed));
        ID.with(|id| *id)
    }
}
/// A host thread is alone on its stand-in SM ([`sm_id`]): slot 0.
#[inline(always)]
pub fn warp_in_sm() -> u32 {
    0
}
/// A one-lane warp matches only itself.
#[inline(always)]
pub fn match_any(mask: u32, value: u32) -> u32 {
    match_any64(mask, value as u64)
}
/// A one-lane warp matches only itself.
#[inline(always)]
pub fn match_any64(mask: u32, value: u64) -> u32 {
    #[cfg(loom)]
    if mask == 0b11 {
        let me = 1 << lane_id();
        return if host_warp::exchange(value, false) == value {
            0b11
        } else {
            me
        };
    }
    #[cfg(not(loom))]
    if let Some(all) = thread_warp::gather(mask, value) {
        return (0..super::WARP_SIZE)
            .filter(|&l| mask & (1 << l) != 0 && all[l as usize] == value)
            .fold(0, |m, l| m | 1 << l);
    }
    let _ = value;
    mask & (1 << lane_id())
}
/// A one-lane warp has nobody to wait for: its own program order already
/// orders its writes before its later accesses. (Under loom, a two-lane
/// host warp's lanes meet with release/acquire.)
#[inline(always)]
pub fn warp_sync(mask: u32) {
    #[cfg(loom)]
    if mask == 0b11 {
        host_warp::exchange(0, true);
    }
    #[cfg(not(loom))]
    let _ = thread_warp::gather(mask, 0);
    let _ = mask;
}
/// The predicate of the one lane.
#[inline(always)]
pub fn ballot(mask: u32, predicate: bool) -> u32 {
    #[cfg(loom)]
    if mask == 0b11 {
        let me = 1 << lane_id();
        let theirs = host_warp::exchange(predicate as u64, false) != 0;
        return (if predicate { me } else { 0 }) | (if theirs { 0b11 & !me } else { 0 });
    }
    #[cfg(not(loom))]
    if let Some(all) = thread_warp::gather(mask, predicate as u64) {
        return (0..super::WARP_SIZE)
            .filter(|&l| mask & (1 << l) != 0 && all[l as usize] != 0)
            .fold(0, |m, l| m | 1 << l);
    }
    mask & ((predicate as u32) << lane_id())
}
/// The lane's own value.
#[inline(always)]
pub fn shfl_u32(mask: u32, value: u32, src: u32) -> u32 {
    shfl_u64(mask, value as u64, src) as u32
}
/// The lane's own value.
#[inline(always)]
pub fn shfl_u64(mask: u32, value: u64, src: u32) -> u64 {
    #[cfg(loom)]
    if mask == 0b11 {
        // Ordered, unlike `match`: a shuffled value is used as an address
        // (a slot reservation, a claimed block), whose dependency orders the
        // receiver's accesses on the GPU; loom has no dependency ordering.
        let theirs = host_warp::exchange(value, true);
        return if src == lane_id() { value } else { theirs };
    }
    #[cfg(not(loom))]
    if let Some(all) = thread_warp::gather(mask, value) {
        return all[src as usize];
    }
    let _ = (mask, src);
    value
}
/// Yields to other threads while waiting on a word.
#[inline(always)]
pub fn backoff(_round: u32) {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}
/// Nanoseconds since an arbitrary start, standing in for the cycle counter.
#[inline(always)]
pub fn clock64() -> u64 {
    use std::sync::OnceLock;
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_nanos() as u64
}
/// Nanoseconds since an arbitrary start, the twin of the GPU's global
/// timer.
#[inline(always)]
pub fn global_nanos() -> u64 {
    clock64()
}
/// Reports misuse and stops: on the host, a panic with the message.
#[cold]
pub fn trap_with(message: &'static [u8], value: u64) -> ! {
    let text = core::str::from_utf8(message).unwrap_or("gpu-kernel trap");
    let text = text.trim_end_matches(['\0', '\n']);
    panic!("{} (value {value})", text.replace("%llu", "?"))
}
