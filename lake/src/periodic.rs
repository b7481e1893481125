//! The periodic training-like trace (the lake's convergence test and issue
//! 13's fragmentation benchmark, the `periodic` example), and a replay that
//! measures an allocator on it: peak live and reserved bytes, and the wall
//! time of each alloc and free once the periods repeat.
//!
//! One period (a training step) of `layers` layers:
//! - forward, layer by layer: alloc a temporary, alloc the layer's
//!   activation (kept), free the temporary;
//! - backward, in reverse: alloc the layer's gradient, free its
//!   activation, free the gradient.
//!
//! Sizes are drawn per layer from the seed (the same every period, so the
//! trace is periodic), byte-granular, in `unit`s: activations 1 to 8
//! units, temporaries 1 byte to 5 units, gradients ½ to 9½ units. The
//! tests use a unit of one 64 KiB model chunk; [`PeriodShape::gpu_like`]
//! one of 32 MiB over 2 MiB chunks (about 2 GiB live at the peak).
//!
//! Fragmentation is GMLake's ratio (Guo et al., ASPLOS 2024, §6): 1 − peak
//! active / peak reserved, live bytes counted as requested.
//!
//! Concurrency: the generator is a pure function; a replay makes its calls
//! from the calling thread, one at a time.

use std::collections::HashMap;
use std::fmt;
use std::time::Instant;

use gpu_kernels::workload::SplitMix64;

use super::caching::CachingPool;
use super::driver::VmmDriver;
use super::error::{LakeError, LakeResult};
use super::pool::{DeviceRange, Lake};
use super::trace::{Event, EventKind, Site};

/// Phase tag of the forward half of a period.
pub const FORWARD: u32 = 0;
/// Phase tag of the backward half.
pub const BACKWARD: u32 = 1;

/// The criterion of issue 13: the lake's fragmentation below this...
pub const LAKE_MAX_FRAGMENTATION: f64 = 0.05;
/// ...where the best-fit caching pool's is above this...
pub const CACHING_MIN_FRAGMENTATION: f64 = 0.20;
/// ...with the lake's median allocation time at most this many times the
/// caching pool's, once converged.
pub const MAX_LATENCY_RATIO: f64 = 2.0;

/// The shape of the periodic trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeriodShape {
    /// Layers per period.
    pub layers: u64,
    /// Bytes of one size unit.
    pub unit: u64,
    /// Seed of the per-layer sizes.
    pub seed: u64,
}

impl PeriodShape {
    /// The unit of [`PeriodShape::gpu_like`]: 32 MiB.
    pub const GPU_UNIT: u64 = 32 << 20;

    /// Twelve layers of GPU-like sizes: 32 MiB units over the H100's 2 MiB
    /// chunks.
    pub fn gpu_like(seed: u64) -> PeriodShape {
        PeriodShape {
            layers: 12,
            unit: PeriodShape::GPU_UNIT,
            seed,
        }
    }
}

/// The events of one period. Addresses are slot numbers, unique within the
/// period (every allocation is freed in it); a free carries its
/// allocation's size.
pub fn period(shape: &PeriodShape) -> Vec<Event> {
    let (n, u) = (shape.layers, shape.unit);
    let mut rng = SplitMix64(shape.seed);
    let act: Vec<u64> = (0..n).map(|_| u + rng.below(7 * u)).collect();
    let tmp: Vec<u64> = (0..n).map(|_| 1 + rng.below(5 * u)).collect();
    let grad: Vec<u64> = (0..n).map(|_| u / 2 + rng.below(9 * u)).collect();
    let event = |kind, size, addr, phase| Event {
        kind,
        size,
        addr,
        site: Site { stream: 0, phase },
        time_ns: 0,
    };
    // Slots: activations 0..n, temporaries n..2n, gradients 2n..3n.
    let mut out = Vec::with_capacity(6 * n as usize);
    for l in 0..n {
        let i = l as usize;
        out.push(event(EventKind::Alloc, tmp[i], n + l, FORWARD));
        out.push(event(EventKind::Alloc, act[i], l, FORWARD));
        out.push(event(EventKind::Free, tmp[i], n + l, FORWARD));
    }
    for l in (0..n).rev() {
        let i = l as usize;
        out.push(event(EventKind::Alloc, grad[i], 2 * n + l, BACKWARD));
        out.push(event(EventKind::Free, act[i], l, BACKWARD));
        out.push(event(EventKind::Free, grad[i], 2 * n + l, BACKWARD));
    }
    out
}

/// Peak bytes of an allocator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peaks {
    /// Highest live bytes (as requested).
    pub live: u64,
    /// Highest reserved (mapped) bytes.
    pub reserved: u64,
}

/// An allocator the trace can be replayed through.
pub trait PeriodicAllocator {
    /// Allocates `size` bytes as one contiguous range.
    fn alloc_at(&self, size: u64, site: Site) -> LakeResult<DeviceRange>;
    /// Frees a range from `alloc_at`.
    fn free_at(&self, range: DeviceRange, site: Site) -> LakeResult<()>;
    /// Peak live and reserved bytes so far.
    fn peaks(&self) -> Peaks;
    /// Driver calls made so far.
    fn driver_calls(&self) -> u64;
}

impl<D: VmmDriver> PeriodicAllocator for Lake<D> {
    fn alloc_at(&self, size: u64, site: Site) -> LakeResult<DeviceRange> {
        Lake::alloc_at(self, size, site)
    }
    fn free_at(&self, range: DeviceRange, site: Site) -> LakeResult<()> {
        Lake::free_at(self, range, site)
    }
    fn peaks(&self) -> Peaks {
        let st = self.stats();
        Peaks {
            live: st.peak_active_bytes,
            reserved: st.peak_reserved_bytes,
        }
    }
    fn driver_calls(&self) -> u64 {
        self.driver().counters().total().calls
    }
}

impl<D: VmmDriver> PeriodicAllocator for CachingPool<D> {
    fn alloc_at(&self, size: u64, _site: Site) -> LakeResult<DeviceRange> {
        self.alloc(size)
    }
    fn free_at(&self, range: DeviceRange, _site: Site) -> LakeResult<()> {
        self.free(range)
    }
    fn peaks(&self) -> Peaks {
        let st = self.stats();
        Peaks {
            live: st.peak_live_bytes,
            reserved: st.peak_reserved_bytes,
        }
    }
    fn driver_calls(&self) -> u64 {
        self.driver().counters().total().calls
    }
}

/// Plays `events` (one or more whole periods) through `a`, calling
/// `timed(kind, nanoseconds)` after each alloc and free with its wall time.
pub fn play_timed<A: PeriodicAllocator>(
    a: &A,
    events: &[Event],
    mut timed: impl FnMut(EventKind, u64),
) -> LakeResult<()> {
    let mut live: HashMap<u64, DeviceRange> = HashMap::new();
    for e in events {
        match e.kind {
            EventKind::Alloc => {
                let start = Instant::now();
                let r = a.alloc_at(e.size, e.site)?;
                timed(EventKind::Alloc, nanos_since(start));
                live.insert(e.addr, r);
            }
            EventKind::Free => {
                let r = live.remove(&e.addr).ok_or(LakeError::NotOurs {
                    addr: e.addr,
                    len: e.size,
                    why: "the trace frees a slot it did not allocate",
                })?;
                let start = Instant::now();
                a.free_at(r, e.site)?;
                timed(EventKind::Free, nanos_since(start));
            }
        }
    }
    Ok(())
}

/// [`play_timed`] without the times.
pub fn play<A: PeriodicAllocator>(a: &A, events: &[Event]) -> LakeResult<()> {
    play_timed(a, events, |_, _| {})
}

fn nanos_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Wall times of one kind of call, in nanoseconds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Latency {
    sorted: Vec<u64>,
}

impl Latency {
    /// From samples in any order.
    pub fn new(mut samples: Vec<u64>) -> Latency {
        samples.sort_unstable();
        Latency { sorted: samples }
    }

    /// Number of samples.
    pub fn count(&self) -> usize {
        self.sorted.len()
    }

    /// The `q`-quantile (nearest rank; 0 without samples).
    pub fn quantile(&self, q: f64) -> u64 {
        match self.sorted.len() {
            0 => 0,
            n => {
                let rank = (q * n as f64).ceil() as usize;
                self.sorted[rank.clamp(1, n) - 1]
            }
        }
    }

    /// The median.
    pub fn median(&self) -> u64 {
        self.quantile(0.5)
    }

    /// The 99th percentile.
    pub fn p99(&self) -> u64 {
        self.quantile(0.99)
    }
}

/// What one allocator did on the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    /// Peak live and reserved bytes over all periods.
    pub peaks: Peaks,
    /// Wall time of each alloc after the warm-up.
    pub alloc: Latency,
    /// Wall time of each free after the warm-up.
    pub free: Latency,
    /// Driver calls made during the warm-up.
    pub warm_up_driver_calls: u64,
    /// Driver calls made after it (none once an allocator has converged).
    pub driver_calls: u64,
}

impl Measured {
    /// 1 − peak live / peak reserved (GMLake's fragmentation ratio).
    pub fn fragmentation(&self) -> f64 {
        match self.peaks.reserved {
            0 => 0.0,
            r => 1.0 - self.peaks.live as f64 / r as f64,
        }
    }
}

/// Replays `periods` periods of `shape` through `a`; the calls of the
/// first `warm_up` periods are not timed (growth, the lake's stitching).
pub fn measure<A: PeriodicAllocator>(
    a: &A,
    shape: &PeriodShape,
    periods: usize,
    warm_up: usize,
) -> LakeResult<Measured> {
    let events = period(shape);
    let (mut alloc, mut free) = (Vec::new(), Vec::new());
    let before = a.driver_calls();
    let mut warmed = before;
    for p in 0..periods {
        if p == warm_up {
            warmed = a.driver_calls();
        }
        if p < warm_up {
            play(a, &events)?;
        } else {
            play_timed(a, &events, |kind, ns| match kind {
                EventKind::Alloc => alloc.push(ns),
                EventKind::Free => free.push(ns),
            })?;
        }
    }
    Ok(Measured {
        peaks: a.peaks(),
        alloc: Latency::new(alloc),
        free: Latency::new(free),
        warm_up_driver_calls: warmed - before,
        driver_calls: a.driver_calls() - warmed,
    })
}

/// Issue 13's criterion on one pair of measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Verdict {
    /// The lake's fragmentation.
    pub lake_fragmentation: f64,
    /// The caching pool's.
    pub caching_fragmentation: f64,
    /// Lake's median alloc time over the caching pool's.
    pub alloc_median_ratio: f64,
    /// Same at the 99th percentile (reported, not judged).
    pub alloc_p99_ratio: f64,
    /// Lake's median free time over the caching pool's (reported).
    pub free_median_ratio: f64,
}

fn ratio(a: u64, b: u64) -> f64 {
    a as f64 / b.max(1) as f64
}

impl Verdict {
    /// Compares the lake with the caching pool.
    pub fn new(lake: &Measured, caching: &Measured) -> Verdict {
        Verdict {
            lake_fragmentation: lake.fragmentation(),
            caching_fragmentation: caching.fragmentation(),
            alloc_median_ratio: ratio(lake.alloc.median(), caching.alloc.median()),
            alloc_p99_ratio: ratio(lake.alloc.p99(), caching.alloc.p99()),
            free_median_ratio: ratio(lake.free.median(), caching.free.median()),
        }
    }

    /// The fragmentation half: the lake under 5%, the caching pool over 20%.
    pub fn fragmentation_holds(&self) -> bool {
        self.lake_fragmentation < LAKE_MAX_FRAGMENTATION
            && self.caching_fragmentation > CACHING_MIN_FRAGMENTATION
    }

    /// The latency half: the lake's median alloc within 2× the pool's.
    pub fn latency_holds(&self) -> bool {
        self.alloc_median_ratio <= MAX_LATENCY_RATIO
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let word = |ok| if ok { "PASS" } else { "FAIL" };
        write!(
            f,
            "{}: fragmentation lake {:.1}% (< {:.0}%), caching {:.1}% (> {:.0}%) {}; \
             alloc median lake/caching {:.2}x (<= {:.0}x) {} (p99 {:.2}x, free median {:.2}x)",
            word(self.fragmentation_holds() && self.latency_holds()),
            self.lake_fragmentation * 100.0,
            LAKE_MAX_FRAGMENTATION * 100.0,
            self.caching_fragmentation * 100.0,
            CACHING_MIN_FRAGMENTATION * 100.0,
            word(self.fragmentation_holds()),
            self.alloc_median_ratio,
            MAX_LATENCY_RATIO,
            word(self.latency_holds()),
            self.alloc_p99_ratio,
            self.free_median_ratio,
        )
    }
}
