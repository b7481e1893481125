//! Heaps that start small and grow (issue 13): how a test brings one to
//! what it needs before timing it, and the records of what that took.
//!
//! The route, the same on the GPU and on the CPU, follows the rule a user's
//! growth service follows ([`host::GrowthPolicy`]: map more before fewer
//! than `low_free_segments` wholly free segments are left): a warm-up
//! round; the heap's wholly free segments are counted at the round's peak
//! (after the allocations, before the frees). While a round got nulls, or
//! its peak left fewer free segments than the policy's low-water mark
//! (`GrowthPolicy::default().low_free_segments`, 16), the heap grows by one
//! step (host wall clock around the call: the driver calls and the
//! publishing, which waits for its kernel), is reset, and the warm-up runs
//! again. So a round that is served whole but fills the mapping (2^20 ×
//! 1 KiB in 1 GiB) still grows the heap: a nearly full heap makes
//! allocations hunt, and a service would have mapped more. The mark is the
//! headroom: no step beyond it is mapped. Then the timed rounds run on the
//! grown heap, as they run on a fixed one. A heap that cannot grow (a fixed
//! heap, or one at its limit) keeps its last warm-up round, nulls and all.
//!
//! The fair comparison is a fixed heap of the size the VMM heap grew to;
//! the bench compares it with a fixed heap of `--heap` bytes, which has
//! more free segments at every peak (`docs/vmm-heap.md`).
//!
//! No kernel runs during a growth step here: what growing costs while
//! kernels allocate is measured by `tests/gpu_vmm_heap.rs`.

use std::time::Instant;

use host::{GrowthPolicy, Result};

use super::GIB;
use super::measure::Summary;
use super::report::Record;

/// The low-water mark the route grows to: the growth service's default.
pub fn low_free_segments() -> u32 {
    GrowthPolicy::default().low_free_segments
}

/// What a warm-up round tells about the heap it ran on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Peak {
    /// Threads that got null.
    pub nulls: u64,
    /// Wholly free segments after the allocations, before the frees
    /// (`None`: a heap that does not say, a fixed one).
    pub free_segments: Option<u32>,
}

impl Peak {
    /// Whether a heap with this peak needs more: nulls, or fewer free
    /// segments than `low` left.
    pub fn short(&self, low: u32) -> bool {
        self.nulls > 0 || self.free_segments.is_some_and(|f| f < low)
    }
}

/// What bringing a heap to a test's need took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Growth {
    /// Milliseconds per GiB of each growth step.
    pub ms_per_gib: Vec<f64>,
    /// Bytes the steps mapped.
    pub bytes: u64,
    /// Warm-up rounds run (1 when the heap did not grow).
    pub warm_ups: usize,
    /// Nulls of the warm-up rounds after which the heap grew.
    pub nulls_before: u64,
    /// Warm-up rounds served whole after which the heap grew because
    /// their peak left too few free segments.
    pub full_before: usize,
    /// The last warm-up round's peak (the one the timed rounds follow).
    pub last: Peak,
    /// The low-water mark used.
    pub low_free_segments: u32,
}

/// Runs warm-up rounds on `target`, growing it after each whose peak is
/// short of `low_free_segments` (see the module docs); returns the last
/// round and what growing took. `warm_up` returns a round and its peak;
/// `grow` maps one step and returns the bytes added (0: it cannot grow);
/// `reset` makes the heap fresh again before the next warm-up.
pub fn until_served<A: ?Sized, R>(
    target: &mut A,
    low_free_segments: u32,
    mut warm_up: impl FnMut(&mut A) -> Result<(R, Peak)>,
    mut grow: impl FnMut(&mut A) -> Result<u64>,
    mut reset: impl FnMut(&mut A) -> Result<()>,
) -> Result<(R, Growth)> {
    let mut growth = Growth {
        low_free_segments,
        ..Growth::default()
    };
    loop {
        let (round, peak) = warm_up(target)?;
        growth.warm_ups += 1;
        growth.last = peak;
        if !peak.short(low_free_segments) {
            return Ok((round, growth));
        }
        let start = Instant::now();
        let added = grow(target)?;
        if added == 0 {
            return Ok((round, growth));
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        growth.ms_per_gib.push(ms * GIB as f64 / added as f64);
        growth.bytes += added;
        growth.nulls_before += peak.nulls;
        if peak.nulls == 0 {
            growth.full_before += 1;
        }
        reset(target)?;
    }
}

impl Growth {
    /// The records of one test's growth: `mapped_mib` (what the heap had
    /// mapped when the timed rounds ran) and `peak_free_segments` (free
    /// segments at the last warm-up's peak) always, and `grow_ms_per_gib`
    /// (one sample per step) when it grew. Their notes state the rule.
    pub fn records(
        &self,
        test: &str,
        allocator: &str,
        size: u64,
        label: &str,
        threads: u64,
        mapped: u64,
    ) -> Vec<Record> {
        let mib = |b: u64| b >> 20;
        let rule = format!(
            "grown while a warm-up round got nulls or left fewer than {} free segments at its \
             peak (the growth service's low-water mark)",
            self.low_free_segments
        );
        let record = |metric: &str, samples: &[f64], note: String| {
            Record::new(
                test,
                allocator,
                size,
                label,
                threads,
                metric,
                Summary::of(samples),
                true,
                note,
            )
        };
        let mut out = vec![record(
            "mapped_mib",
            &[mib(mapped) as f64],
            format!("mapped when the timed rounds ran; {rule}"),
        )];
        if let Some(free) = self.last.free_segments {
            out.push(record(
                "peak_free_segments",
                &[free as f64],
                format!(
                    "wholly free segments after the last warm-up's allocations ({} nulls)",
                    self.last.nulls
                ),
            ));
        }
        if !self.ms_per_gib.is_empty() {
            out.push(record(
                "grow_ms_per_gib",
                &self.ms_per_gib,
                format!(
                    "grew {} MiB in {} steps after {} warm-up rounds ({} nulls in all; {} \
                     served whole but too full); {rule}; host wall clock, no kernel running",
                    mib(self.bytes),
                    self.ms_per_gib.len(),
                    self.warm_ups - 1,
                    self.nulls_before,
                    self.full_before
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Peak, until_served};

    /// Free segments the fake heap must keep at a round's peak.
    const LOW: u32 = 2;

    /// A heap of 10-byte segments that serves `need` bytes once it has
    /// mapped them.
    struct Fake {
        mapped: u64,
        limit: u64,
        need: u64,
        resets: usize,
    }

    fn run(f: &mut Fake) -> (u64, super::Growth) {
        let need = f.need;
        until_served(
            f,
            LOW,
            |f| {
                let peak = Peak {
                    nulls: need.saturating_sub(f.mapped),
                    free_segments: Some((f.mapped.saturating_sub(need) / 10) as u32),
                };
                Ok((f.mapped, peak))
            },
            |f| {
                let add = 100.min(f.limit - f.mapped);
                f.mapped += add;
                Ok(add)
            },
            |f| {
                f.resets += 1;
                Ok(())
            },
        )
        .unwrap()
    }

    #[test]
    fn grows_until_served_with_the_low_water_mark_free() {
        let mut f = Fake {
            mapped: 100,
            limit: 1000,
            need: 350,
            resets: 0,
        };
        let (served_at, g) = run(&mut f);
        assert_eq!(
            served_at, 400,
            "served at 400 with 5 segments free at the peak"
        );
        assert_eq!(f.mapped, 400, "the mark is the headroom: no step more");
        assert_eq!((g.bytes, g.ms_per_gib.len(), g.warm_ups), (300, 3, 4));
        assert_eq!(g.nulls_before, 250 + 150 + 50);
        assert_eq!(g.full_before, 0);
        assert_eq!(
            g.last,
            Peak {
                nulls: 0,
                free_segments: Some(5)
            }
        );
        assert_eq!(f.resets, 3, "reset before each repeated warm-up");
    }

    #[test]
    fn a_round_served_whole_on_a_nearly_full_heap_grows_it() {
        // 395 of 400 bytes used: no null, but 0 segments free at the peak
        // (as 2^20 × 1 KiB in 1 GiB on the H100).
        let mut f = Fake {
            mapped: 400,
            limit: 1000,
            need: 395,
            resets: 0,
        };
        let (served_at, g) = run(&mut f);
        assert_eq!((served_at, f.mapped), (500, 500));
        assert_eq!(
            (g.bytes, g.warm_ups, g.nulls_before, g.full_before),
            (100, 2, 0, 1)
        );
        assert_eq!(g.last.free_segments, Some(10));
        assert_eq!(f.resets, 1);
    }

    #[test]
    fn a_heap_with_the_mark_free_does_not_grow() {
        let mut f = Fake {
            mapped: 100,
            limit: 1000,
            need: 80,
            resets: 0,
        };
        let (_, g) = run(&mut f);
        assert_eq!((f.mapped, g.bytes, g.warm_ups, f.resets), (100, 0, 1, 0));
    }

    #[test]
    fn a_heap_at_its_limit_keeps_its_last_round() {
        let mut f = Fake {
            mapped: 100,
            limit: 300,
            need: 1000,
            resets: 0,
        };
        let (served_at, g) = run(&mut f);
        assert_eq!((served_at, f.mapped), (300, 300));
        assert_eq!((g.bytes, g.warm_ups), (200, 3));
        assert_eq!(g.last.nulls, 700);
    }

    #[test]
    fn a_fixed_heap_is_judged_by_its_nulls_alone() {
        let peak = |nulls, free_segments| Peak {
            nulls,
            free_segments,
        };
        assert!(!peak(0, None).short(LOW));
        assert!(peak(1, None).short(LOW));
        assert!(peak(0, Some(LOW - 1)).short(LOW));
        assert!(!peak(0, Some(LOW)).short(LOW));
    }
}
