//! One measured round (allocate, check, free) and the statistics of many.
//!
//! A round times the allocation kernel and the free kernel with CUDA events
//! ([`Timing`] says whether the host's launch latency is inside them).
//! Between them, untimed, a check kernel writes a pattern into every returned
//! allocation and a second one verifies it: a null or a wrong word is
//! counted, and a round with either is not reported as a time.

use std::time::Duration;

use cudarc::driver::CudaSlice;
use gpu_kernels::workload::PATTERN_PIECE;
use host::error::DriverCall;
use host::gpu::Arg;
use host::{Gpu, Result};

use super::allocator::{Allocator, HeapSnapshot, Sizes};

/// Device arrays for one thread count.
pub struct Buffers {
    /// Returned pointers.
    pub ptrs: CudaSlice<u64>,
    /// Per-thread sizes (mixed runs).
    pub sizes: CudaSlice<u64>,
    /// `[nulls, wrong words]`.
    pub errors: CudaSlice<u64>,
    /// Threads.
    pub n: u64,
}

impl Buffers {
    /// Arrays for `n` threads.
    pub fn new(gpu: &Gpu, n: u64) -> Result<Buffers> {
        Ok(Buffers {
            ptrs: gpu.zeros(n as usize)?,
            sizes: gpu.zeros(n as usize)?,
            errors: gpu.zeros(2)?,
            n,
        })
    }

    /// Fills `sizes` with the seeded mixed sizes and returns them.
    pub fn mixed(&self, gpu: &Gpu, seed: u64, lo: u64, hi: u64) -> Result<Sizes> {
        let sizes = gpu.address(&self.sizes);
        gpu.launch(
            "mixed_sizes",
            self.n,
            &[
                Arg::U64(seed),
                Arg::U64(lo),
                Arg::U64(hi),
                Arg::U64(sizes),
                Arg::U64(self.n),
            ],
        )?;
        Ok(Sizes::PerThread(sizes))
    }
}

/// What one round measured.
#[derive(Clone, Debug)]
pub struct Round {
    /// Milliseconds of the allocation kernel.
    pub alloc_ms: f64,
    /// Milliseconds of the free kernel (`None` for allocators that do not free).
    pub free_ms: Option<f64>,
    /// Threads that got null.
    pub nulls: u64,
    /// Pattern words found wrong (overlapping allocations).
    pub wrong: u64,
    /// The pointers, when asked for.
    pub ptrs: Option<Vec<u64>>,
    /// Wholly free segments after the allocations, before the frees, when
    /// asked for and the heap says (a heap that grows).
    pub peak_free_segments: Option<u32>,
    /// The heap's statistics after the allocations, before the frees, when
    /// asked for and the allocator has them.
    pub peak_stats: Option<HeapSnapshot>,
}

/// What a round keeps beyond its times and errors (untimed).
#[derive(Clone, Copy, Debug, Default)]
pub struct Keep {
    /// The pointers.
    pub ptrs: bool,
    /// The heap's free segments at the round's peak (a warm-up round of a
    /// heap that grows: `bench::grow`).
    pub peak: bool,
    /// The heap's statistics at the round's peak, where the allocator has
    /// them (`bench frag`'s breakdown of what the heap holds).
    pub stats: bool,
}

/// How a round's kernels are timed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Timing {
    /// CUDA events recorded around the launch as the host submits it
    /// ([`Gpu::time`]): the GPU waits for the host between the start event
    /// and the kernel, so the time includes the launch's submission latency
    /// (several microseconds, varying with the host's state). Every result
    /// in the README before 2026-11-23 was taken this way.
    #[default]
    Launch,
    /// The same events with the kernel queued behind a hold of
    /// [`QUEUED_HOLD`] ([`Gpu::time_queued`]): the GPU's time alone. What
    /// to compare kernels of a few microseconds with (runs of segments: a
    /// 9 µs kernel measured 16-25 µs with `Launch`).
    Queued,
}

/// How long [`Timing::Queued`] holds the stream: far longer than the
/// host takes to submit a launch and an event.
pub const QUEUED_HOLD: Duration = Duration::from_micros(200);

/// The hold [`Timing::Queued`] uses: [`QUEUED_HOLD`], or
/// `GPUMALLOC_QUEUED_HOLD_US` microseconds where that is set. A diagnostic:
/// a hold of 0 runs an empty kernel just before the start event, so the GPU
/// is busy until then but still waits for the host's submission of the
/// timed kernel; comparing it with 200 µs and with [`Timing::Launch`] says
/// whether the time `Launch` adds is the host's submission or an idle GPU.
fn queued_hold() -> Duration {
    std::env::var("GPUMALLOC_QUEUED_HOLD_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(QUEUED_HOLD, Duration::from_micros)
}

impl Timing {
    /// Milliseconds of what `work` launches, timed this way.
    pub fn time(self, gpu: &Gpu, work: impl FnOnce() -> Result<()>) -> Result<f64> {
        match self {
            Timing::Launch => gpu.time(work),
            Timing::Queued => gpu.time_queued(queued_hold(), work),
        }
    }
}

/// Runs one round for `n` threads, keeping what `keep` asks for, timing
/// its kernels as `timing` says.
pub fn round(
    gpu: &Gpu,
    allocator: &mut dyn Allocator,
    buffers: &mut Buffers,
    sizes: Sizes,
    keep: Keep,
    timing: Timing,
) -> Result<Round> {
    let n = buffers.n;
    let ptrs = gpu.address(&buffers.ptrs);
    gpu.stream()
        .memset_zeros(&mut buffers.errors)
        .call("cuMemsetD8")?;
    let alloc_ms = timing.time(gpu, || allocator.alloc(gpu, sizes, ptrs, n))?;
    check(gpu, buffers, sizes)?;
    let errors = gpu.download(&buffers.errors)?;
    let kept = if keep.ptrs {
        Some(gpu.download(&buffers.ptrs)?)
    } else {
        None
    };
    // The download above waited for the allocation kernel: every block of
    // the round is held now.
    let peak_free_segments = if keep.peak {
        allocator.free_segments()?
    } else {
        None
    };
    let peak_stats = if keep.stats {
        allocator.heap_stats()?
    } else {
        None
    };
    let free_ms = if allocator.frees() {
        Some(timing.time(gpu, || allocator.free(gpu, ptrs, n))?)
    } else {
        allocator.free(gpu, ptrs, n)?;
        None
    };
    Ok(Round {
        alloc_ms,
        free_ms,
        nulls: errors[0],
        wrong: errors[1],
        ptrs: kept,
        peak_free_segments,
        peak_stats,
    })
}

/// Fills every allocation with its thread's pattern, then verifies all.
/// Sizes over 16 pieces are filled and verified a thread per piece.
pub fn check(gpu: &Gpu, buffers: &Buffers, sizes: Sizes) -> Result<()> {
    if let Sizes::Fixed(size) = sizes
        && size > 16 * PATTERN_PIECE
    {
        let args = [
            Arg::U64(gpu.address(&buffers.ptrs)),
            Arg::U64(size),
            Arg::U64(gpu.address(&buffers.errors)),
            Arg::U64(buffers.n),
        ];
        let threads = buffers.n * size.div_ceil(PATTERN_PIECE);
        gpu.launch("fill_pattern_pieces", threads, &args)?;
        return gpu.launch("verify_pattern_pieces", threads, &args);
    }
    let (size, per_thread) = match sizes {
        Sizes::Fixed(s) => (s, 0),
        Sizes::PerThread(a) => (0, a),
    };
    let args = [
        Arg::U64(gpu.address(&buffers.ptrs)),
        Arg::U64(size),
        Arg::U64(per_thread),
        Arg::U64(gpu.address(&buffers.errors)),
        Arg::U64(buffers.n),
    ];
    gpu.launch("fill_pattern", buffers.n, &args)?;
    gpu.launch("verify_pattern", buffers.n, &args)
}

/// Median, minimum and maximum of some samples.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    /// The median (mean of the middle two for an even count).
    pub median: f64,
    /// The smallest.
    pub min: f64,
    /// The largest.
    pub max: f64,
    /// How many.
    pub samples: usize,
}

impl Summary {
    /// Summarises `samples` (empty gives all zeros).
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 {
            s[n / 2]
        } else {
            (s[n / 2 - 1] + s[n / 2]) / 2.0
        };
        Summary {
            median,
            min: s[0],
            max: s[n - 1],
            samples: n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]).median, 2.0);
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        let s = Summary::of(&[5.0, 1.0]);
        assert_eq!((s.min, s.max, s.samples), (1.0, 5.0, 2));
        assert_eq!(Summary::of(&[]).samples, 0);
    }
}
