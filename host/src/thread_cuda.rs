//! `CallScope`: the calling thread's CUDA state (current context and
//! stream-capture mode) kept as it was across a call into the library, at
//! no cost when the call makes no driver call.
//!
//! A library entry point (the PyTorch pool's C ABI) opens a scope with
//! [`CallScope::open`]. Nothing is read then. The first time code inside
//! the scope is about to call the driver, it calls [`before_driver_call`]:
//! that reads the current context and switches the thread to relaxed
//! capture mode (so `cuMemCreate` is not refused while another thread
//! captures a CUDA graph in global mode, as PyTorch's own allocator does).
//! When the scope closes, the mode and the context are put back. An
//! allocation served from cache therefore costs no driver call at all: the
//! eager save and restore this replaces cost 2.3-2.8 µs per call on an H100
//! host, seven times the pool's own work (`torch-alloc/tests/call_cost.rs`).
//!
//! Outside any scope `before_driver_call` does nothing (the lake's own
//! tests and programs manage their threads themselves). Scopes nest: an
//! inner one leaves the state to the outermost.
//!
//! Concurrency: all state is thread-local; nothing is shared.

use std::cell::RefCell;

use cudarc::driver::sys;

/// What a scope has saved so far.
enum Saved {
    /// Open, no driver call yet: nothing saved.
    Nothing,
    /// The context current at the first driver call, and the capture mode
    /// it replaced (`None` if the exchange failed).
    State {
        context: sys::CUcontext,
        mode: Option<sys::CUstreamCaptureMode>,
    },
}

thread_local! {
    /// `None` outside any scope.
    static SCOPE: RefCell<Option<Saved>> = const { RefCell::new(None) };
}

/// An open scope; closing it (drop) restores what was saved.
pub struct CallScope {
    /// Whether this is the outermost scope of the thread (only it restores).
    outermost: bool,
}

impl CallScope {
    /// Opens a scope on this thread (reads nothing yet).
    pub fn open() -> CallScope {
        let outermost = SCOPE.with(|s| {
            let mut s = s.borrow_mut();
            if s.is_some() {
                return false;
            }
            *s = Some(Saved::Nothing);
            true
        });
        CallScope { outermost }
    }
}

/// Saves the thread's CUDA state if a scope is open and has not saved it
/// yet; call before any driver call that may bind a context or that the
/// capture mode may refuse.
pub fn before_driver_call() {
    SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        if !matches!(*s, Some(Saved::Nothing)) {
            return;
        }
        // SAFETY: only asks whether libcuda could be loaded.
        if !unsafe { sys::is_culib_present() } {
            return;
        }
        let mut context: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        if unsafe { sys::cuCtxGetCurrent(&mut context) } != sys::CUresult::CUDA_SUCCESS {
            context = std::ptr::null_mut();
        }
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: exchanges the thread's mode with `mode`; valid pointer.
        let swapped = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        *s = Some(Saved::State {
            context,
            mode: (swapped == sys::CUresult::CUDA_SUCCESS).then_some(mode),
        });
    });
}

impl Drop for CallScope {
    fn drop(&mut self) {
        if !self.outermost {
            return;
        }
        let saved = SCOPE.with(|s| s.borrow_mut().take());
        let Some(Saved::State { context, mode }) = saved else {
            return;
        };
        if let Some(mut mode) = mode {
            // SAFETY: puts back the mode exchanged in `before_driver_call`.
            let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        }
        let mut now: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        let got = unsafe { sys::cuCtxGetCurrent(&mut now) };
        if got != sys::CUresult::CUDA_SUCCESS || now != context {
            // SAFETY: `context` was current on this thread when saved (or
            // null, which unbinds); errors cannot be reported from drop.
            let _ = unsafe { sys::cuCtxSetCurrent(context) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved_nothing() -> bool {
        SCOPE.with(|s| matches!(*s.borrow(), Some(Saved::Nothing)))
    }

    #[test]
    fn a_scope_without_driver_calls_saves_nothing_and_closes() {
        {
            let _scope = CallScope::open();
            assert!(saved_nothing());
            {
                let inner = CallScope::open();
                assert!(!inner.outermost);
            }
            assert!(saved_nothing(), "an inner scope leaves the outer one open");
        }
        assert!(SCOPE.with(|s| s.borrow().is_none()));
    }

    #[test]
    fn before_driver_call_outside_a_scope_does_nothing() {
        before_driver_call();
        assert!(SCOPE.with(|s| s.borrow().is_none()));
    }
}
