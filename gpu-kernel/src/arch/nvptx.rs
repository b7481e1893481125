//! The GPU side of [`crate::arch`]: inline PTX for atomics with `.gpu` scope,
//! warp votes, shuffles and matches, and special registers.
//!
//! Every atomic converts its generic pointer to a global one inside the asm
//! (`cvta.to.global`), because heap metadata always lives in global memory and
//! `.global` atomics skip the generic-address check.

use core::arch::asm;
use core::cell::UnsafeCell;

/// A 64-bit word of heap metadata, only ever touched through the functions of
/// this module.
#[repr(transparent)]
pub struct Word(UnsafeCell<u64>);

// SAFETY: every access to a `Word` is an atomic PTX instruction.
unsafe impl Sync for Word {}

impl Word {
    /// A word holding `v` (used by tests and by host-built images).
    pub const fn new(v: u64) -> Word {
        Word(UnsafeCell::new(v))
    }
}

/// A 32-bit word, for the self-test and for counters that fit in 32 bits.
#[repr(transparent)]
pub struct Word32(UnsafeCell<u32>);

// SAFETY: every access to a `Word32` is an atomic PTX instruction.
unsafe impl Sync for Word32 {}

impl Word32 {
    /// A word holding `v`.
    pub const fn new(v: u32) -> Word32 {
        Word32(UnsafeCell::new(v))
    }
}

macro_rules! load64 {
    ($name:ident, $sem:literal, $doc:literal) => {
        #[doc = $doc]
        #[inline(always)]
        pub fn $name(w: &Word) -> u64 {
            let r: u64;
            // SAFETY: `w` is a live reference to global memory; the load is atomic.
            unsafe {
                asm!(concat!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; ld.", $sem,
                             ".gpu.global.u64 {r}, [%a]; }}"),
                     p = in(reg64) w.0.get(), r = out(reg64) r, options(nostack));
            }
            r
        }
    };
}

load64!(
    load_relaxed,
    "relaxed",
    "Relaxed load at device scope (coherent in L2, never a stale L1 line)."
);
load64!(load_acquire, "acquire", "Acquire load at device scope.");

macro_rules! store64 {
    ($name:ident, $sem:literal, $doc:literal) => {
        #[doc = $doc]
        #[inline(always)]
        pub fn $name(w: &Word, v: u64) {
            // SAFETY: `w` is a live reference to global memory; the store is atomic.
            unsafe {
                asm!(concat!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; st.", $sem,
                             ".gpu.global.u64 [%a], {v}; }}"),
                     p = in(reg64) w.0.get(), v = in(reg64) v, options(nostack));
            }
        }
    };
}

store64!(store_relaxed, "relaxed", "Relaxed store at device scope.");
store64!(store_release, "release", "Release store at device scope.");
store64!(
    store_relaxed_racing_rmw,
    "relaxed",
    "Relaxed store at device scope to a word that other threads may change \
     with RMWs at the same time: coherence and RMW atomicity order the two \
     (the host twin says why it is an exchange under loom)."
);

macro_rules! rmw64 {
    ($name:ident, $sem:literal, $op:literal, $doc:literal) => {
        #[doc = $doc]
        #[inline(always)]
        pub fn $name(w: &Word, v: u64) -> u64 {
            let r: u64;
            // SAFETY: `w` is a live reference to global memory; the RMW is atomic.
            unsafe {
                asm!(concat!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; atom.", $sem,
                             ".gpu.global.", $op, " {r}, [%a], {v}; }}"),
                     p = in(reg64) w.0.get(), v = in(reg64) v, r = out(reg64) r,
                     options(nostack));
            }
            r
        }
    };
}

rmw64!(
    fetch_add_relaxed,
    "relaxed",
    "add.u64",
    "Relaxed add; returns the old value."
);
/// Relaxed add whose result the caller's later accesses depend on by
/// address (a slot's reservation: the slice's address is computed from it),
/// so they cannot be performed before it. The same instruction as
/// [`fetch_add_relaxed`]; the host twin models it under loom as an acquire,
/// since loom has no dependency ordering.
#[inline(always)]
pub fn fetch_add_dependent(w: &Word, v: u64) -> u64 {
    fetch_add_relaxed(w, v)
}
rmw64!(
    fetch_add_release,
    "release",
    "add.u64",
    "Release add; returns the old value."
);
rmw64!(
    fetch_add_acq_rel,
    "acq_rel",
    "add.u64",
    "Acquire-release add; returns the old value."
);
rmw64!(
    fetch_or_acq_rel,
    "acq_rel",
    "or.b64",
    "Acquire-release or; returns the old value."
);
rmw64!(
    fetch_and_acq_rel,
    "acq_rel",
    "and.b64",
    "Acquire-release and; returns the old value."
);
rmw64!(
    swap_acq_rel,
    "acq_rel",
    "exch.b64",
    "Acquire-release exchange; returns the old value."
);

/// Acquire-release compare-and-swap: `Ok(old)` if the word held `current` and
/// now holds `new`, else `Err(actual)`.
#[inline(always)]
pub fn compare_exchange_acq_rel(w: &Word, current: u64, new: u64) -> Result<u64, u64> {
    let r: u64;
    // SAFETY: `w` is a live reference to global memory; the CAS is atomic.
    unsafe {
        asm!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; atom.acq_rel.gpu.global.cas.b64 {r}, [%a], {c}, {n}; }}",
             p = in(reg64) w.0.get(), c = in(reg64) current, n = in(reg64) new,
             r = out(reg64) r, options(nostack));
    }
    if r == current { Ok(r) } else { Err(r) }
}

/// Relaxed 32-bit load at device scope.
#[inline(always)]
pub fn load_relaxed32(w: &Word32) -> u32 {
    let r: u32;
    // SAFETY: `w` is a live reference to global memory; the load is atomic.
    unsafe {
        asm!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; ld.relaxed.gpu.global.u32 {r}, [%a]; }}",
             p = in(reg64) w.0.get(), r = out(reg32) r, options(nostack));
    }
    r
}

/// Acquire-release 32-bit add; returns the old value.
#[inline(always)]
pub fn fetch_add_acq_rel32(w: &Word32, v: u32) -> u32 {
    let r: u32;
    // SAFETY: `w` is a live reference to global memory; the RMW is atomic.
    unsafe {
        asm!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; atom.acq_rel.gpu.global.add.u32 {r}, [%a], {v}; }}",
             p = in(reg64) w.0.get(), v = in(reg32) v, r = out(reg32) r, options(nostack));
    }
    r
}

/// Acquire-release 32-bit compare-and-swap.
#[inline(always)]
pub fn compare_exchange_acq_rel32(w: &Word32, current: u32, new: u32) -> Result<u32, u32> {
    let r: u32;
    // SAFETY: `w` is a live reference to global memory; the CAS is atomic.
    unsafe {
        asm!("{{ .reg .u64 %a; cvta.to.global.u64 %a, {p}; atom.acq_rel.gpu.global.cas.b32 {r}, [%a], {c}, {n}; }}",
             p = in(reg64) w.0.get(), c = in(reg32) current, n = in(reg32) new,
             r = out(reg32) r, options(nostack));
    }
    if r == current { Ok(r) } else { Err(r) }
}

/// A device-scope acquire-release fence.
#[inline(always)]
pub fn fence_acq_rel() {
    // SAFETY: a fence has no operands.
    unsafe { asm!("fence.acq_rel.gpu;", options(nostack)) }
}

/// The lanes of this warp executing this instruction together.
#[inline(always)]
pub fn active_mask() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("activemask.b32 {r};", r = out(reg32) r, options(nostack)) }
    r
}

/// This thread's lane in its warp.
#[inline(always)]
pub fn lane_id() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %laneid;", r = out(reg32) r, options(pure, nomem, nostack)) }
    r
}

/// The streaming multiprocessor this thread runs on (used only to spread
/// contention; it may change between calls).
#[inline(always)]
pub fn sm_id() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %smid;", r = out(reg32) r, options(nostack)) }
    r
}

/// This warp's slot on its SM (`%warpid`, below 64 on every GPU so far):
/// with [`sm_id`], what tells apart the warps running at once, used only
/// to spread contention (it may change between calls).
#[inline(always)]
pub fn warp_in_sm() -> u32 {
    let r: u32;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u32 {r}, %warpid;", r = out(reg32) r, options(nostack)) }
    r
}

/// The lanes of `mask` whose `value` equals this thread's. Every lane of
/// `mask` must execute it.
#[inline(always)]
pub fn match_any(mask: u32, value: u32) -> u32 {
    let r: u32;
    // SAFETY: a warp-synchronous instruction over the caller's mask.
    unsafe {
        asm!("match.any.sync.b32 {r}, {v}, {m};", r = out(reg32) r, v = in(reg32) value,
             m = in(reg32) mask, options(nostack))
    }
    r
}

/// The lanes of `mask` whose 64-bit `value` equals this thread's.
#[inline(always)]
pub fn match_any64(mask: u32, value: u64) -> u32 {
    let r: u32;
    // SAFETY: a warp-synchronous instruction over the caller's mask.
    unsafe {
        asm!("match.any.sync.b64 {r}, {v}, {m};", r = out(reg32) r, v = in(reg64) value,
             m = in(reg32) mask, options(nostack))
    }
    r
}

/// Waits until every lane of `mask` reaches this call, and orders memory
/// among them (`bar.warp.sync`): a lane's writes before the call happen
/// before any lane's accesses after it. `match` and `shfl` order nothing;
/// this does. Every lane of `mask` must execute it.
#[inline(always)]
pub fn warp_sync(mask: u32) {
    // SAFETY: a warp-synchronous barrier over the caller's mask.
    unsafe { asm!("bar.warp.sync {m};", m = in(reg32) mask, options(nostack)) }
}

/// The lanes of `mask` whose predicate is true.
#[inline(always)]
pub fn ballot(mask: u32, predicate: bool) -> u32 {
    let r: u32;
    // SAFETY: a warp-synchronous instruction over the caller's mask.
    unsafe {
        asm!("{{ .reg .pred %q; setp.ne.u32 %q, {x}, 0; vote.sync.ballot.b32 {r}, %q, {m}; }}",
             r = out(reg32) r, x = in(reg32) predicate as u32, m = in(reg32) mask,
             options(nostack))
    }
    r
}

/// `value` as held by lane `src` (which must be in `mask`).
#[inline(always)]
pub fn shfl_u32(mask: u32, value: u32, src: u32) -> u32 {
    let r: u32;
    // SAFETY: a warp-synchronous instruction over the caller's mask.
    unsafe {
        asm!("shfl.sync.idx.b32 {r}, {v}, {s}, 31, {m};", r = out(reg32) r, v = in(reg32) value,
             s = in(reg32) src, m = in(reg32) mask, options(nostack))
    }
    r
}

/// 64-bit [`shfl_u32`].
#[inline(always)]
pub fn shfl_u64(mask: u32, value: u64, src: u32) -> u64 {
    let lo = shfl_u32(mask, value as u32, src);
    let hi = shfl_u32(mask, (value >> 32) as u32, src);
    (hi as u64) << 32 | lo as u64
}

/// Doublings of [`backoff`]'s 32 ns sleep: 4 (512 ns) unless
/// `GPUMALLOC_BACKOFF_MAX_DOUBLINGS` (0 to 6) is set at build time, for
/// measuring how long a waiter oversleeps an install (`docs/PERF.md`).
const BACKOFF_MAX_DOUBLINGS: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_BACKOFF_MAX_DOUBLINGS"), 4);
const _: () = assert!(BACKOFF_MAX_DOUBLINGS <= 6);

/// Lets other warps run while this one waits on a word.
#[inline(always)]
pub fn backoff(round: u32) {
    // 32 ns doubling to 512 ns: long sleeps delay waking after an install.
    let ns = 32u32 << round.min(BACKOFF_MAX_DOUBLINGS);
    // SAFETY: nanosleep only delays this thread.
    unsafe { asm!("nanosleep.u32 {n};", n = in(reg32) ns, options(nostack)) }
}

/// The SM's cycle counter.
#[inline(always)]
pub fn clock64() -> u64 {
    let r: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {r}, %clock64;", r = out(reg64) r, options(nostack)) }
    r
}

/// Nanoseconds of the GPU's global timer (one clock for every SM, unlike
/// `clock64`): for waits bounded in time.
#[inline(always)]
pub fn global_nanos() -> u64 {
    let r: u64;
    // SAFETY: reads a special register.
    unsafe { asm!("mov.u64 {r}, %globaltimer;", r = out(reg64) r, options(nostack)) }
    r
}

/// The index of this thread in the whole grid (x dimension).
#[inline(always)]
pub fn global_thread_index() -> u64 {
    use core::arch::nvptx::*;
    // SAFETY: reads special registers.
    unsafe { _block_idx_x() as u64 * _block_dim_x() as u64 + _thread_idx_x() as u64 }
}

/// The number of threads in the grid (x dimension).
#[inline(always)]
pub fn grid_threads() -> u64 {
    use core::arch::nvptx::*;
    // SAFETY: reads special registers.
    unsafe { _grid_dim_x() as u64 * _block_dim_x() as u64 }
}

unsafe extern "C" {
    /// CUDA's device printf.
    fn vprintf(format: *const u8, args: *const u8) -> i32;
}

/// Prints `message` (a NUL-terminated string) with one integer and stops the
/// kernel: the launch fails with an illegal-instruction error.
#[cold]
pub fn trap_with(message: &'static [u8], value: u64) -> ! {
    let args = [value];
    // SAFETY: `message` is NUL-terminated with one `%llu`; `args` matches it.
    unsafe {
        vprintf(message.as_ptr(), args.as_ptr() as *const u8);
        core::arch::nvptx::trap()
    }
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // SAFETY: trap only ends the kernel.
    unsafe { core::arch::nvptx::trap() }
}
