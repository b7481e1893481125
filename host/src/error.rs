//! Errors of the host API. Each names what failed and, for driver calls, the
//! call and the driver's own message.

use std::fmt;

/// Result of host calls.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong.
#[derive(Debug)]
pub enum Error {
    /// `libcuda` could not be loaded: no NVIDIA driver on this machine.
    NoDriver,
    /// The driver loaded but reports no GPU.
    NoDevice,
    /// A driver call failed.
    Driver {
        /// The call, e.g. `cuModuleLoadData`.
        call: &'static str,
        /// The driver's error.
        source: cudarc::driver::DriverError,
    },
    /// The heap size cannot be laid out.
    HeapSize {
        /// Bytes asked for.
        bytes: u64,
        /// Why not.
        why: &'static str,
    },
    /// A self-test or check found a wrong value.
    Check(String),
    /// A setting the caller chose cannot be used; the text says which and why.
    Config(String),
    /// The heap cannot hold what was asked within its limits (free
    /// memory, room under its mapping limit, or address space); nothing
    /// was changed. The text says what was short.
    NoRoom(String),
    /// A wait gave up: the work it waited for had not completed within the
    /// limit (a kernel may be hung). The work was not cancelled: it still
    /// runs, and the stream stays busy until it ends.
    Timeout {
        /// What was waited for, e.g. "the stream's work".
        what: &'static str,
        /// How long the wait lasted.
        waited: std::time::Duration,
    },
    /// A CUDA virtual memory call failed (or the CPU model refused it) while
    /// the heap was doing something; whatever was half done was undone.
    Vmm {
        /// What the heap was doing, e.g. "growing the heap by segment 12".
        doing: String,
        /// The call and the driver's reason.
        source: crate::vmm::DriverFailure,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NoDriver => write!(
                f,
                "no NVIDIA driver: libcuda could not be loaded (is this a machine with a GPU?)"
            ),
            Error::NoDevice => write!(f, "the NVIDIA driver reports no GPU"),
            Error::Driver { call, source } => write!(f, "{call} failed: {source}"),
            Error::HeapSize { bytes, why } => {
                write!(f, "cannot make a heap of {bytes} bytes: {why}")
            }
            Error::Check(what) => write!(f, "check failed: {what}"),
            Error::Config(what) => write!(f, "bad setting: {what}"),
            Error::NoRoom(what) => write!(f, "no room in the heap: {what}"),
            Error::Vmm { doing, source } => write!(f, "{doing}: {source}"),
            Error::Timeout { what, waited } => write!(
                f,
                "{what} did not complete within {} ms (a kernel may be hung; it keeps running)",
                waited.as_millis()
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Driver { source, .. } => Some(source),
            Error::Vmm { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Attaches the name of the driver call to a cudarc result.
pub trait DriverCall<T> {
    /// Names the call that produced this result.
    fn call(self, call: &'static str) -> Result<T>;
}

impl<T> DriverCall<T> for std::result::Result<T, cudarc::driver::DriverError> {
    fn call(self, call: &'static str) -> Result<T> {
        self.map_err(|source| Error::Driver { call, source })
    }
}
