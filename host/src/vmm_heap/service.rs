//! The growth service: a host thread a [`super::VmmHeap`] owns, which
//! watches the count of wholly free segments in the segment tree (the words
//! device code keeps current; on the GPU a copy of the tree's leaf words)
//! and maps more segments before they run out, up to the heap's limit.
//!
//! It also serves device run requests (`gpu_kernel::request`): a thread
//! in `Heap::malloc_waiting` whose run of segments no free run can meet
//! posts the request; the service stitches the run as `alloc_large` does
//! and hands the address to the thread (or "none" if stitching fails).
//!
//! It only grows; trimming stays the caller's decision. A request that
//! finds the heap empty before the service has caught up gets null at once
//! from `malloc`; `Heap::malloc_waiting` waits for the service up to a
//! bound instead.
//!
//! Concurrency: the thread grows under the heap's ledger lock like any
//! caller of `grow`. Stopping sets a flag under a mutex and wakes the
//! thread through a condition variable, so it ends within one growth step,
//! never after a whole poll period; `stop` joins it and reports a panic as
//! an error instead of propagating it (it runs in `Drop`).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{SegmentTree, Shared};
use crate::error::{Error, Result};
use crate::vmm::VmmDriver;

/// When and how much the growth service maps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrowthPolicy {
    /// Grow when fewer wholly free segments than this are left (at least 1).
    /// Set it above what the workload can take between two looks.
    pub low_free_segments: u32,
    /// Segments mapped per step, at least (at least 1); a step maps enough
    /// to reach `low_free_segments` if that is more.
    pub step_segments: u32,
    /// How long the service sleeps when the heap has enough free segments
    /// (or is at its limit) before it looks again.
    pub poll: Duration,
}

impl Default for GrowthPolicy {
    /// 16 free segments kept, 16 mapped per step, a look every 200 µs.
    fn default() -> GrowthPolicy {
        GrowthPolicy {
            low_free_segments: 16,
            step_segments: 16,
            poll: Duration::from_micros(200),
        }
    }
}

/// What the heap and the service thread share.
#[derive(Default)]
struct Control {
    /// Set when the service must end.
    stop: Mutex<bool>,
    /// Wakes the thread when `stop` is set.
    wake: Condvar,
    /// The last error a growth step met, in words.
    last_error: Mutex<Option<String>>,
}

impl Control {
    fn stop_flag(&self) -> MutexGuard<'_, bool> {
        self.stop.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, e: &Error) {
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e.to_string());
    }

    /// Sleeps up to `poll`; true if the service must end.
    fn wait(&self, poll: Duration) -> bool {
        let guard = self.stop_flag();
        let (guard, _) = self
            .wake
            .wait_timeout_while(guard, poll, |stop| !*stop)
            .unwrap_or_else(|e| e.into_inner());
        *guard
    }
}

/// A running growth service.
pub(super) struct Service {
    control: Arc<Control>,
    thread: JoinHandle<()>,
}

impl Service {
    /// Starts the thread.
    pub(super) fn start<D, M>(shared: Arc<Shared<D, M>>, policy: GrowthPolicy) -> Result<Service>
    where
        D: VmmDriver + 'static,
        M: SegmentTree + 'static,
    {
        if policy.low_free_segments == 0 || policy.step_segments == 0 {
            return Err(Error::Config(format!(
                "growth policy {policy:?}: low_free_segments and step_segments must be at least 1"
            )));
        }
        let control = Arc::new(Control::default());
        let c = control.clone();
        let thread = std::thread::Builder::new()
            .name("gpumalloc-grow".into())
            .spawn(move || run(&shared, &c, policy))
            .map_err(|e| Error::Config(format!("could not start the growth service: {e}")))?;
        Ok(Service { control, thread })
    }

    /// The last error a growth step met.
    pub(super) fn last_error(&self) -> Option<String> {
        self.control
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Ends the thread and waits for it; returns the last error it met (or
    /// that it panicked).
    pub(super) fn stop(self) -> Option<String> {
        *self.control.stop_flag() = true;
        self.control.wake.notify_all();
        let panicked = self.thread.join().is_err();
        let last = self
            .control
            .last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if panicked {
            Some(format!(
                "the growth service panicked (last error: {})",
                last.as_deref().unwrap_or("none")
            ))
        } else {
            last
        }
    }
}

/// Serves the run requests device threads posted (`gpu_kernel::request`):
/// each is stitched as `alloc_large` stitches and handed to its thread, or
/// answered with none if that fails (the error is recorded). A run whose
/// thread gave up meanwhile is freed by the answer (device code), so
/// nothing leaks. Returns how many requests it took.
fn serve_requests<D: VmmDriver, M: SegmentTree>(shared: &Shared<D, M>, control: &Control) -> u32 {
    let c = &shared.counters;
    let mut taken = 0;
    loop {
        let (slot, count) = match shared.tree.take_request() {
            Ok(Some(request)) => request,
            Ok(None) => return taken,
            Err(e) => {
                control.record(&e);
                return taken;
            }
        };
        taken += 1;
        let address = match count
            .checked_mul(shared.segment_bytes())
            .ok_or_else(|| Error::NoRoom(format!("a device request for {count} segments")))
            .and_then(|bytes| shared.alloc_large(bytes))
        {
            Ok(range) => range.address,
            Err(e) => {
                control.record(&e);
                0
            }
        };
        match shared.tree.answer_request(slot, address) {
            Ok(true) if address != 0 => c.run_requests_served.fetch_add(1, Ordering::Relaxed),
            Ok(true) => c.run_requests_refused.fetch_add(1, Ordering::Relaxed),
            Ok(false) if address != 0 => c.run_requests_abandoned.fetch_add(1, Ordering::Relaxed),
            Ok(false) => 0,
            Err(e) => {
                // The answer may not have been delivered: the slot stays
                // taken (its thread gets null at its deadline) and the
                // run, if any, is lost to this heap until a reset.
                control.record(&e);
                0
            }
        };
    }
}

/// The service loop: serve run requests, look, grow if short, sleep when
/// there is nothing to do.
fn run<D: VmmDriver, M: SegmentTree>(shared: &Shared<D, M>, control: &Control, p: GrowthPolicy) {
    loop {
        if *control.stop_flag() {
            return;
        }
        let served = serve_requests(shared, control);
        let grown = match shared.tree.free_segments() {
            Ok(free) if free < p.low_free_segments => {
                let want = p.step_segments.max(p.low_free_segments - free);
                shared
                    .grow_segments(want)
                    .inspect_err(|e| control.record(e))
            }
            Ok(_) => Ok(0),
            Err(e) => {
                control.record(&e);
                Err(e)
            }
        };
        // Grew: look again at once (the workload may have taken it all).
        // Nothing to do, at the limit, or failed: sleep first.
        if served == 0 && !matches!(grown, Ok(n) if n > 0) && control.wait(p.poll) {
            return;
        }
    }
}
