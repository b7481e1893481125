//! Heaps that start small and grow (issue 13): how a test brings one to
//! what it needs before timing it, and the records of what that took.
//!
//! The route, the same on the GPU and on the CPU: a warm-up round; while a
//! round gets nulls, the heap grows by one step (host wall clock around the
//! call: the driver calls and the publishing, which waits for its kernel),
//! is reset, and the warm-up runs again. Once a round is served whole, one
//! step more is mapped as headroom: how requests spread over segments
//! varies a little from round to round, and a timed round must not meet
//! the edge. Then the timed rounds run on the grown heap, as they run on a
//! fixed one. A heap that cannot grow (a fixed heap, or one at its limit)
//! keeps its last warm-up round, nulls and all.
//!
//! No kernel runs during a growth step here: what growing costs while
//! kernels allocate is measured by `tests/gpu_vmm_heap.rs`.

use std::time::Instant;

use host::Result;

use super::GIB;
use super::measure::Summary;
use super::report::Record;

/// What bringing a heap to a test's need took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Growth {
    /// Milliseconds per GiB of each growth step.
    pub ms_per_gib: Vec<f64>,
    /// Bytes the steps mapped (headroom included).
    pub bytes: u64,
    /// Warm-up rounds run (1 when the heap did not grow).
    pub warm_ups: usize,
    /// Nulls of the warm-up rounds after which the heap grew.
    pub nulls_before: u64,
}

/// Runs warm-up rounds on `target`, growing it after each that got nulls
/// (see the module docs); returns the last round and what growing took.
/// `warm_up` returns a round and its nulls; `grow` maps one step and
/// returns the bytes added (0: it cannot grow); `reset` makes the heap
/// fresh again before the next warm-up.
pub fn until_served<A: ?Sized, R>(
    target: &mut A,
    mut warm_up: impl FnMut(&mut A) -> Result<(R, u64)>,
    mut grow: impl FnMut(&mut A) -> Result<u64>,
    mut reset: impl FnMut(&mut A) -> Result<()>,
) -> Result<(R, Growth)> {
    let mut growth = Growth::default();
    let mut step = |target: &mut A, growth: &mut Growth| -> Result<bool> {
        let start = Instant::now();
        let added = grow(target)?;
        if added > 0 {
            let ms = start.elapsed().as_secs_f64() * 1e3;
            growth.ms_per_gib.push(ms * GIB as f64 / added as f64);
            growth.bytes += added;
        }
        Ok(added > 0)
    };
    loop {
        let (round, nulls) = warm_up(target)?;
        growth.warm_ups += 1;
        if nulls == 0 {
            if growth.bytes > 0 {
                step(target, &mut growth)?;
            }
            return Ok((round, growth));
        }
        if !step(target, &mut growth)? {
            return Ok((round, growth));
        }
        growth.nulls_before += nulls;
        reset(target)?;
    }
}

impl Growth {
    /// The records of one test's growth: `mapped_mib` (what the heap had
    /// mapped when the timed rounds ran) always, and `grow_ms_per_gib`
    /// (one sample per step) when it grew.
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
        let mut out = vec![Record::new(
            test,
            allocator,
            size,
            label,
            threads,
            "mapped_mib",
            Summary::of(&[mib(mapped) as f64]),
            true,
            "mapped when the timed rounds ran".into(),
        )];
        if !self.ms_per_gib.is_empty() {
            out.push(Record::new(
                test,
                allocator,
                size,
                label,
                threads,
                "grow_ms_per_gib",
                Summary::of(&self.ms_per_gib),
                true,
                format!(
                    "grew {} MiB in {} steps (one of them headroom) after {} warm-up rounds \
                     with {} nulls in all; host wall clock, no kernel running",
                    mib(self.bytes),
                    self.ms_per_gib.len(),
                    self.warm_ups - 1,
                    self.nulls_before
                ),
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::until_served;

    /// A heap that serves `need` bytes once it has mapped them.
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
            |f| {
                let nulls = need.saturating_sub(f.mapped);
                Ok((f.mapped, nulls))
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
    fn grows_until_served_then_one_step_of_headroom() {
        let mut f = Fake {
            mapped: 100,
            limit: 1000,
            need: 350,
            resets: 0,
        };
        let (served_at, g) = run(&mut f);
        assert_eq!(served_at, 400, "the warm-up served at 400");
        assert_eq!(f.mapped, 500, "one step of headroom");
        assert_eq!((g.bytes, g.ms_per_gib.len(), g.warm_ups), (400, 4, 4));
        assert_eq!(g.nulls_before, 250 + 150 + 50);
        assert_eq!(f.resets, 3, "reset before each repeated warm-up");
    }

    #[test]
    fn a_heap_that_needs_nothing_more_does_not_grow() {
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
    }
}
