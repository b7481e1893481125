//! `VmmDriver`: the one narrow boundary between the lake and CUDA's virtual
//! memory management (VMM) calls, with its written preconditions, and the
//! accounting of how many calls were made and how long they took.
//!
//! Everything the pool does to the address space goes through this trait, so
//! the pool runs unchanged on a GPU ([`super::CudaVmm`]) and on the CPU model
//! ([`super::ModelVmm`]).
//!
//! Concurrency: implementations are `Send + Sync` and may be called from any
//! thread. The lake calls them while holding its own state lock, so one lake
//! never issues two driver calls at once; the [`CallMeter`] uses relaxed
//! atomics because its counters are independent statistics, read only for
//! reporting.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A physical allocation made by [`VmmDriver::create`]
/// (`CUmemGenericAllocationHandle`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkHandle(pub u64);

/// Options of every physical chunk a driver creates and maps.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChunkOptions {
    /// Create chunks with `gpuDirectRDMACapable` set, so the memory can be
    /// registered with NCCL or an RDMA NIC.
    pub rdma_capable: bool,
    /// Other GPUs (device ordinals) granted read-write access on every
    /// [`VmmDriver::set_access`], besides the driver's own device (the
    /// lake's setting; a `VmmHeap` names its peers in its own
    /// configuration, `VmmHeapConfig::peer_access`).
    pub peers: Vec<i32>,
}

/// The VMM calls, for accounting and fault injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VmmCall {
    /// `cuMemAddressReserve`.
    Reserve,
    /// `cuMemAddressFree`.
    FreeAddress,
    /// `cuMemCreate`.
    Create,
    /// `cuMemRelease`.
    Release,
    /// `cuMemMap`.
    Map,
    /// `cuMemUnmap`.
    Unmap,
    /// `cuMemSetAccess`.
    SetAccess,
}

impl VmmCall {
    /// Every call, in the order of [`VmmCall::index`].
    pub const ALL: [VmmCall; 7] = [
        VmmCall::Reserve,
        VmmCall::FreeAddress,
        VmmCall::Create,
        VmmCall::Release,
        VmmCall::Map,
        VmmCall::Unmap,
        VmmCall::SetAccess,
    ];

    /// The driver's name of the call.
    pub fn name(self) -> &'static str {
        match self {
            VmmCall::Reserve => "cuMemAddressReserve",
            VmmCall::FreeAddress => "cuMemAddressFree",
            VmmCall::Create => "cuMemCreate",
            VmmCall::Release => "cuMemRelease",
            VmmCall::Map => "cuMemMap",
            VmmCall::Unmap => "cuMemUnmap",
            VmmCall::SetAccess => "cuMemSetAccess",
        }
    }

    /// Position in [`VmmCall::ALL`] and in [`DriverCounters::per_call`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why a driver call failed.
#[derive(Debug)]
pub enum FailureCause {
    /// The CUDA driver's own error.
    Cuda(cudarc::driver::DriverError),
    /// The CPU model refused the call: a precondition of [`VmmDriver`] did
    /// not hold (what, in words).
    Model(String),
    /// The CPU model was told to fail this call (fault injection).
    Injected,
    /// The CPU model's device is full (see `ModelVmm::set_device_bytes`).
    OutOfMemory,
    /// The device or its driver cannot do what was asked (what, in words),
    /// e.g. host chunks through the VMM API on a driver older than CUDA
    /// 12.2.
    Unsupported(String),
}

/// A failed driver call: which call, and why.
#[derive(Debug)]
pub struct DriverFailure {
    /// The call that failed.
    pub call: VmmCall,
    /// The driver's reason.
    pub cause: FailureCause,
}

impl fmt::Display for DriverFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let call = self.call.name();
        match &self.cause {
            FailureCause::Cuda(e) => write!(f, "{call} failed: {e}"),
            FailureCause::Model(why) => write!(f, "{call} failed: refused by the CPU model: {why}"),
            FailureCause::Injected => write!(f, "{call} failed: injected fault (CPU model)"),
            FailureCause::OutOfMemory => {
                write!(f, "{call} failed: the CPU model's device memory is full")
            }
            FailureCause::Unsupported(why) => write!(f, "{call} failed: not supported: {why}"),
        }
    }
}

impl DriverFailure {
    /// Whether the driver refused for lack of device memory
    /// (`CUDA_ERROR_OUT_OF_MEMORY`, or the model's full device).
    pub fn is_out_of_memory(&self) -> bool {
        match &self.cause {
            FailureCause::Cuda(e) => e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            FailureCause::OutOfMemory => true,
            _ => false,
        }
    }
}

impl std::error::Error for DriverFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.cause {
            FailureCause::Cuda(e) => Some(e),
            _ => None,
        }
    }
}

/// Result of a driver call.
pub type VmmResult<T> = Result<T, DriverFailure>;

/// The CUDA VMM operations the lake needs. All sizes and addresses are in
/// bytes and, unless said otherwise, multiples of [`VmmDriver::granularity`].
///
/// Preconditions are the driver's: an implementation may refuse a call that
/// breaks one (the model always does; CUDA usually does), and must never
/// leave a half-done effect behind when it refuses.
pub trait VmmDriver: Send + Sync {
    /// The allocation granularity: the size of one chunk (2 MiB on H100).
    fn granularity(&self) -> u64;

    /// Options every chunk is created and mapped with.
    fn options(&self) -> &ChunkOptions;

    /// Reserves `size` bytes of virtual address space, aligned to the
    /// granularity, with nothing mapped. `size > 0`.
    fn reserve(&self, size: u64) -> VmmResult<u64>;

    /// Frees a reservation. `(addr, size)` is exactly a range returned by
    /// [`VmmDriver::reserve`]; nothing is mapped inside it.
    fn free_address(&self, addr: u64, size: u64) -> VmmResult<()>;

    /// Creates one physical chunk of one granule with
    /// [`VmmDriver::options`].
    fn create(&self) -> VmmResult<ChunkHandle>;

    /// Creates one chunk of one granule in *host* memory (pinned, on the
    /// device's nearest host NUMA node) that [`VmmDriver::map`] and
    /// [`VmmDriver::set_access`] treat like any other: mapped in device
    /// address space and granted to the device, kernels read and write it
    /// over the bus (correct, only slower). The lake's spill
    /// (`lake::LakeConfig::spill_to_host` in the `lake` crate) makes these when
    /// [`VmmDriver::create`] runs out of device memory. Counted as a
    /// [`VmmCall::Create`]; released with [`VmmDriver::release`]. Host
    /// chunks take no device memory (`cuMemGetInfo` does not see them).
    fn create_on_host(&self) -> VmmResult<ChunkHandle>;

    /// Releases a chunk. The chunk is live and mapped nowhere.
    fn release(&self, chunk: ChunkHandle) -> VmmResult<()>;

    /// Maps all of `chunk` (one granule) at `addr`. `chunk` is live; the
    /// granule at `addr` lies inside a reservation and nothing is mapped
    /// there. A chunk may be mapped at several addresses at once.
    fn map(&self, addr: u64, chunk: ChunkHandle) -> VmmResult<()>;

    /// Unmaps the one-granule mapping made by [`VmmDriver::map`] at `addr`.
    fn unmap(&self, addr: u64) -> VmmResult<()>;

    /// Grants read-write access to `[addr, addr + size)` to the driver's own
    /// device and to [`ChunkOptions::peers`]: [`VmmDriver::set_access_for`]
    /// with those peers (what the lake grants).
    fn set_access(&self, addr: u64, size: u64) -> VmmResult<()> {
        self.set_access_for(addr, size, &self.options().peers)
    }

    /// Grants read-write access to `[addr, addr + size)` to the driver's own
    /// device and to each device of `peers` (ordinals; one
    /// `CUmemAccessDesc` per device in one `cuMemSetAccess`). Every byte of
    /// the range is mapped; no peer is the driver's own device or listed
    /// twice, and each can access it ([`VmmDriver::peer_can_access`]).
    /// Access is lost when a mapping is unmapped.
    fn set_access_for(&self, addr: u64, size: u64, peers: &[i32]) -> VmmResult<()>;

    /// The ordinal of the device whose memory the driver creates and whose
    /// access every [`VmmDriver::set_access_for`] grants.
    fn device_ordinal(&self) -> i32;

    /// Whether device `peer` can be granted access to this driver's memory
    /// (`cuDeviceCanAccessPeer(peer, own device)`: the peer capability that
    /// `cuMemSetAccess` needs for a device-located allocation). An error
    /// names the call (e.g. `cuDeviceGet` of an ordinal that does not
    /// exist).
    fn peer_can_access(&self, peer: i32) -> crate::Result<bool>;

    /// Calls made so far and the time spent in them.
    fn counters(&self) -> DriverCounters;
}

/// Number and total duration of calls of one kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallCount {
    /// Calls made (failed ones included).
    pub calls: u64,
    /// Nanoseconds spent in them.
    pub nanos: u64,
    /// Granules they covered (one per call, except `cuMemAddressReserve`,
    /// `cuMemAddressFree` and `cuMemSetAccess`, which cover their size;
    /// `cuMemSetAccess` costs about 37 µs per granule on an H100).
    pub granules: u64,
}

/// Driver calls made so far, per kind (indexed by [`VmmCall::index`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DriverCounters {
    /// One entry per [`VmmCall`].
    pub per_call: [CallCount; VmmCall::ALL.len()],
}

impl DriverCounters {
    /// The counts of one call.
    pub fn of(&self, call: VmmCall) -> CallCount {
        self.per_call[call.index()]
    }

    /// All calls together.
    pub fn total(&self) -> CallCount {
        self.per_call
            .iter()
            .fold(CallCount::default(), |a, c| CallCount {
                calls: a.calls + c.calls,
                nanos: a.nanos + c.nanos,
                granules: a.granules + c.granules,
            })
    }
}

/// Counts and times driver calls; each implementation owns one.
#[derive(Debug, Default)]
pub struct CallMeter {
    calls: [AtomicU64; VmmCall::ALL.len()],
    nanos: [AtomicU64; VmmCall::ALL.len()],
    /// Granules covered beyond one per call.
    extra_granules: [AtomicU64; VmmCall::ALL.len()],
}

impl CallMeter {
    /// Runs `f` as one call of kind `call`, counting it and its time.
    pub fn time<T>(&self, call: VmmCall, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let out = f();
        let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        // Relaxed: independent counters, read only for reporting.
        self.calls[call.index()].fetch_add(1, Ordering::Relaxed);
        self.nanos[call.index()].fetch_add(nanos, Ordering::Relaxed);
        out
    }

    /// Counts a call of kind `call` as covering `granules` granules (the
    /// call itself is counted by [`CallMeter::time`]).
    pub fn covers(&self, call: VmmCall, granules: u64) {
        // Relaxed: independent counters, read only for reporting.
        self.extra_granules[call.index()].fetch_add(granules.saturating_sub(1), Ordering::Relaxed);
    }

    /// A snapshot of the counters.
    pub fn snapshot(&self) -> DriverCounters {
        let mut out = DriverCounters::default();
        for call in VmmCall::ALL {
            let calls = self.calls[call.index()].load(Ordering::Relaxed);
            out.per_call[call.index()] = CallCount {
                calls,
                nanos: self.nanos[call.index()].load(Ordering::Relaxed),
                granules: calls + self.extra_granules[call.index()].load(Ordering::Relaxed),
            };
        }
        out
    }
}

/// A shared driver: lets a caller keep a handle on the driver a lake owns
/// (e.g. to look at the CPU model after the lake is dropped).
impl<D: VmmDriver> VmmDriver for std::sync::Arc<D> {
    fn granularity(&self) -> u64 {
        (**self).granularity()
    }
    fn options(&self) -> &ChunkOptions {
        (**self).options()
    }
    fn reserve(&self, size: u64) -> VmmResult<u64> {
        (**self).reserve(size)
    }
    fn free_address(&self, addr: u64, size: u64) -> VmmResult<()> {
        (**self).free_address(addr, size)
    }
    fn create(&self) -> VmmResult<ChunkHandle> {
        (**self).create()
    }
    fn create_on_host(&self) -> VmmResult<ChunkHandle> {
        (**self).create_on_host()
    }
    fn release(&self, chunk: ChunkHandle) -> VmmResult<()> {
        (**self).release(chunk)
    }
    fn map(&self, addr: u64, chunk: ChunkHandle) -> VmmResult<()> {
        (**self).map(addr, chunk)
    }
    fn unmap(&self, addr: u64) -> VmmResult<()> {
        (**self).unmap(addr)
    }
    fn set_access(&self, addr: u64, size: u64) -> VmmResult<()> {
        (**self).set_access(addr, size)
    }
    fn set_access_for(&self, addr: u64, size: u64, peers: &[i32]) -> VmmResult<()> {
        (**self).set_access_for(addr, size, peers)
    }
    fn device_ordinal(&self) -> i32 {
        (**self).device_ordinal()
    }
    fn peer_can_access(&self, peer: i32) -> crate::Result<bool> {
        (**self).peer_can_access(peer)
    }
    fn counters(&self) -> DriverCounters {
        (**self).counters()
    }
}
