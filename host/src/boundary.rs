//! What every call into one of the C libraries (`torch-alloc`'s PyTorch
//! pool, `capi`'s heap API) goes through (`enter`): panics are caught, the
//! calling thread's CUDA context is restored, driver calls run in relaxed
//! stream-capture mode, a forked child is refused, and failures are kept as
//! the thread's last error for the caller to raise (`write_last_error`
//! copies it into the caller's buffer).
//!
//! - **context**: cudarc binds a device's primary context to the calling
//!   thread before each driver call and leaves it bound. A free of a
//!   `cuda:1` tensor from a thread working on `cuda:0` would move that
//!   thread to GPU 1. `enter` opens a [`crate::thread_cuda::CallScope`]:
//!   the current context is read before the call's first driver call, if
//!   it makes one (code that reaches the driver calls
//!   [`crate::thread_cuda::before_driver_call`] first), and put back
//!   afterwards (a call served from cache touches no driver state and pays
//!   nothing).
//! - **capture mode**: while a CUDA graph is captured in the default
//!   (global) mode, the driver refuses "unsafe" calls such as `cuMemCreate`
//!   from any thread. Like PyTorch's own allocator, the library switches the
//!   calling thread to relaxed mode for its own driver calls (in the same
//!   scope) and back afterwards.
//! - **fork**: CUDA does not survive `fork`. A child process (a DataLoader
//!   worker) that frees an inherited tensor must not touch the driver:
//!   frees are ignored there and allocations refused with a message.
//!
//! Each C library links its own copy of this module, so each has its own
//! last error per thread.
//!
//! Concurrency: the fork flag is a process-wide atomic set by the
//! `pthread_atfork` child handler (which runs in the child's only thread);
//! the last error is thread-local.

use std::cell::RefCell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};

/// Kinds of failure the caller may tell apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum ErrorKind {
    /// No failure.
    None = 0,
    /// Out of memory: PyTorch raises `torch.cuda.OutOfMemoryError`.
    OutOfMemory = 1,
    /// Any other failure.
    Other = 2,
}

thread_local! {
    static LAST_ERROR: RefCell<(ErrorKind, String)> =
        const { RefCell::new((ErrorKind::None, String::new())) };
}

/// Keeps `msg` as this thread's last error (replacing any before it).
pub fn set_error(kind: ErrorKind, msg: String) {
    LAST_ERROR.with(|e| *e.borrow_mut() = (kind, msg));
}

/// This thread's last error (kind and message), leaving none behind.
pub fn take_error() -> (ErrorKind, String) {
    LAST_ERROR.with(|e| std::mem::replace(&mut *e.borrow_mut(), (ErrorKind::None, String::new())))
}

static FORKED: AtomicBool = AtomicBool::new(false);
static AT_FORK: Once = Once::new();

extern "C" fn in_child_after_fork() {
    // Relaxed: the child has one thread at this point; later reads are on
    // it or on threads it starts, which are ordered after this store.
    FORKED.store(true, Ordering::Relaxed);
}

/// Whether this process is a child forked after the library was used.
pub fn forked() -> bool {
    AT_FORK.call_once(|| {
        // SAFETY: registers a handler that only stores to an atomic, which
        // is async-signal-safe as `pthread_atfork` requires of a child
        // handler. A failed registration (ENOMEM) leaves fork detection
        // off; nothing else depends on it.
        unsafe { libc::pthread_atfork(None, None, Some(in_child_after_fork)) };
    });
    // Relaxed: see `in_child_after_fork`.
    FORKED.load(Ordering::Relaxed)
}

/// Runs `f` as a library call: in a forked child `f` does not run and
/// `fallback` is answered with `in_child` as the error; a panic is caught
/// and answered with `fallback`; the thread's context and capture mode are
/// restored whatever happens.
pub fn enter<T>(fallback: T, in_child: Option<&str>, f: impl FnOnce() -> T) -> T {
    if forked() {
        if let Some(msg) = in_child {
            set_error(ErrorKind::Other, msg.to_string());
        }
        return fallback;
    }
    let scope = crate::thread_cuda::CallScope::open();
    let out = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        set_error(
            ErrorKind::Other,
            "gpumalloc: internal panic caught at the C boundary (a bug: please report it)"
                .to_string(),
        );
        fallback
    });
    drop(scope);
    out
}

/// Copies this thread's last error message into `buf` (`len` bytes, NUL
/// terminated, cut to fit) and returns its kind and the message's full
/// length in bytes (more than `len - 1`: it was cut); the error is cleared.
/// What the C libraries' `*_last_error` functions do.
///
/// # Safety
/// `buf` is null (the message is dropped) or points to `len` writable
/// bytes.
pub unsafe fn write_last_error(buf: *mut std::ffi::c_char, len: usize) -> (ErrorKind, usize) {
    let (kind, msg) = take_error();
    if !buf.is_null() && len > 0 {
        let n = msg.len().min(len - 1);
        // SAFETY: `buf` has `len` writable bytes and `n + 1 <= len`; the
        // message is a distinct allocation, so the ranges do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(msg.as_ptr(), buf.cast::<u8>(), n);
            buf.add(n).write(0);
        }
    }
    (kind, msg.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_last_error_is_taken_once_and_cut_to_the_buffer() {
        set_error(ErrorKind::OutOfMemory, "x".repeat(100));
        let mut buf = [1 as std::ffi::c_char; 8];
        // SAFETY: `buf` has 8 writable bytes.
        let out = unsafe { write_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(out, (ErrorKind::OutOfMemory, 100));
        assert_eq!(buf[7], 0);
        assert!(buf[..7].iter().all(|&c| c == b'x' as std::ffi::c_char));
        // SAFETY: a null buffer is allowed.
        assert_eq!(
            unsafe { write_last_error(std::ptr::null_mut(), 0) },
            (ErrorKind::None, 0)
        );
    }

    #[test]
    fn a_panic_is_answered_with_the_fallback_and_a_message() {
        let out = enter(-1, None, || -> i32 { panic!("boom") });
        assert_eq!(out, -1);
        let (kind, msg) = take_error();
        assert_eq!(kind, ErrorKind::Other);
        assert!(msg.contains("internal panic"), "{msg}");
    }
}
