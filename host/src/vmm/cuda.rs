//! `CudaVmm`: [`VmmDriver`] on a real GPU, a thin result layer over
//! cudarc's raw `sys` VMM functions (cudarc wraps none of them). Every error
//! names the driver call, e.g. "cuMemMap failed: CUDA_ERROR_INVALID_VALUE".
//!
//! Host chunks ([`VmmDriver::create_on_host`], the lake's spill) are made
//! with the same `cuMemCreate` at a host location: the host NUMA node
//! nearest the device (`CU_MEM_LOCATION_TYPE_HOST_NUMA`, CUDA 12.2+), else
//! `CU_MEM_LOCATION_TYPE_HOST` where the driver takes that instead; the
//! first spill finds which (the driver's granularity of each, then one
//! chunk made and released) and keeps it.
//!
//! Concurrency: holds no mutable state besides its [`CallMeter`] (atomics)
//! and the host location, set once ([`OnceLock`]); each call binds the
//! device's primary context to the calling thread first, so it may be used
//! from any thread.

use std::sync::{Arc, OnceLock};

use cudarc::driver::{CudaContext, DriverError, sys};

use super::driver::{
    CallMeter, ChunkHandle, ChunkOptions, DriverCounters, DriverFailure, FailureCause, VmmCall,
    VmmDriver, VmmResult,
};

/// The CUDA VMM calls of one device.
pub struct CudaVmm {
    ctx: Arc<CudaContext>,
    options: ChunkOptions,
    granularity: u64,
    meter: CallMeter,
    /// Where host chunks are made, found on the first spill.
    host_location: OnceLock<sys::CUmemLocation>,
}

/// Attaches the call to a cudarc result.
fn named<T>(call: VmmCall, r: Result<T, DriverError>) -> VmmResult<T> {
    r.map_err(|e| DriverFailure {
        call,
        cause: FailureCause::Cuda(e),
    })
}

impl CudaVmm {
    /// Opens device `ordinal` (its primary context) with chunks of the
    /// driver's minimum granularity for `options` (2 MiB on H100).
    pub fn open(ordinal: usize, options: ChunkOptions) -> crate::Result<CudaVmm> {
        CudaVmm::open_with_chunk(ordinal, options, None)
    }

    /// Opens device `ordinal` with chunks of `chunk_bytes` each (`None`: the
    /// driver's minimum granularity). Every chunk is one physical handle,
    /// and the driver's `cuMemSetAccess` and `cuMemUnmap` cost per mapping,
    /// not per byte (H100: 20 µs for a 2 MiB handle, 37 µs for 32 MiB), so
    /// larger chunks make growing and stitching cheaper at the price of
    /// rounding large requests to the larger chunk. `chunk_bytes` must be
    /// a power of two and a multiple of the minimum granularity.
    pub fn open_with_chunk(
        ordinal: usize,
        options: ChunkOptions,
        chunk_bytes: Option<u64>,
    ) -> crate::Result<CudaVmm> {
        use crate::error::DriverCall;
        crate::thread_cuda::before_driver_call();
        let ctx = CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?;
        let mut vmm = CudaVmm {
            ctx,
            options,
            granularity: 0,
            meter: CallMeter::default(),
            host_location: OnceLock::new(),
        };
        let prop = vmm.properties();
        let mut granularity: usize = 0;
        vmm.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: `granularity` and `prop` are valid for the call; `prop` is
        // fully initialised.
        unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut granularity,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .result()
        .call("cuMemGetAllocationGranularity")?;
        let minimum = granularity as u64;
        vmm.granularity = match chunk_bytes {
            None => minimum,
            Some(c) if c.is_power_of_two() && c % minimum == 0 => c,
            Some(c) => {
                return Err(crate::Error::Config(format!(
                    "chunk size {c} bytes: must be a power of two and a multiple of the \
                     driver's minimum granularity ({minimum} bytes) on device {ordinal}"
                )));
            }
        };
        Ok(vmm)
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    fn device(&self) -> i32 {
        self.ctx.cu_device()
    }

    fn properties(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.device(),
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: u8::from(self.options.rdma_capable),
                usage: 0,
                reserved: [0; 4],
            },
        }
    }

    /// The properties of a host chunk at `location` (never RDMA-capable:
    /// the option is about device memory).
    fn host_properties(&self, location: sys::CUmemLocation) -> sys::CUmemAllocationProp {
        let mut prop = self.properties();
        prop.location = location;
        prop.allocFlags.gpuDirectRDMACapable = 0;
        prop
    }

    /// A device attribute, or the driver's error.
    fn attribute(&self, attr: sys::CUdevice_attribute) -> Result<i32, DriverError> {
        let mut value: i32 = 0;
        // SAFETY: writes one int; the device ordinal is valid (opened).
        unsafe { sys::cuDeviceGetAttribute(&mut value, attr, self.device()) }.result()?;
        Ok(value)
    }

    /// Where host chunks are made: the first host location whose
    /// granularity the driver tells and divides the chunk size, and where
    /// `cuMemCreate` makes a chunk (one is made and released to check).
    /// Found once.
    fn host_location(&self) -> VmmResult<sys::CUmemLocation> {
        if let Some(&l) = self.host_location.get() {
            return Ok(l);
        }
        crate::thread_cuda::before_driver_call();
        named(VmmCall::Create, self.ctx.bind_to_thread())?;
        // -1 (or an old driver that does not know the attribute): no NUMA,
        // and node 0 is what cuMemCreate then wants.
        let numa = self
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID)
            .unwrap_or(-1)
            .max(0);
        let candidates = [
            (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST_NUMA, numa),
            (sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST, 0),
        ];
        let mut refused = Vec::new();
        for (type_, id) in candidates {
            let location = sys::CUmemLocation { type_, id };
            let prop = self.host_properties(location);
            let mut minimum: usize = 0;
            // SAFETY: `minimum` and `prop` are valid for the call; `prop`
            // is fully initialised.
            let asked = unsafe {
                sys::cuMemGetAllocationGranularity(
                    &mut minimum,
                    &prop,
                    sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
                )
            }
            .result();
            match asked {
                Ok(()) if minimum > 0 && self.granularity.is_multiple_of(minimum as u64) => {
                    // The granularity query may accept a location that
                    // cuMemCreate then refuses: one chunk, made and
                    // released, settles it.
                    let mut probe: sys::CUmemGenericAllocationHandle = 0;
                    // SAFETY: as in `create`.
                    let made = unsafe {
                        sys::cuMemCreate(&mut probe, self.granularity as usize, &prop, 0)
                    }
                    .result();
                    match made {
                        Ok(()) => {
                            // SAFETY: the probe was just made and is mapped
                            // nowhere; released once.
                            let _ = unsafe { sys::cuMemRelease(probe) }.result();
                            return Ok(*self.host_location.get_or_init(|| location));
                        }
                        // No host memory now: the spill's answer, not the
                        // location's (nothing is kept; tried again later).
                        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                            return named(VmmCall::Create, Err(e));
                        }
                        Err(e) => {
                            refused.push(format!("{type_:?} (id {id}): cuMemCreate failed: {e}"))
                        }
                    }
                }
                Ok(()) => refused.push(format!(
                    "{type_:?} (id {id}): granularity {minimum} bytes does not divide the \
                     chunk size {}",
                    self.granularity
                )),
                Err(e) => refused.push(format!(
                    "{type_:?} (id {id}): cuMemGetAllocationGranularity failed: {e}"
                )),
            }
        }
        Err(DriverFailure {
            call: VmmCall::Create,
            cause: FailureCause::Unsupported(format!(
                "no host location for VMM chunks of device {}: {}",
                self.ordinal(),
                refused.join("; ")
            )),
        })
    }

    /// Free and total device memory (`cuMemGetInfo`), in bytes. Host chunks
    /// do not count.
    pub fn mem_info(&self) -> crate::Result<(u64, u64)> {
        use crate::error::DriverCall;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes; the context is current.
        unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) }
            .result()
            .call("cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    /// Binds the context, then runs one metered driver call.
    fn call<T>(&self, call: VmmCall, f: impl FnOnce() -> Result<T, DriverError>) -> VmmResult<T> {
        crate::thread_cuda::before_driver_call();
        named(call, self.ctx.bind_to_thread())?;
        named(call, self.meter.time(call, f))
    }

    /// Copies `bytes` to device address `addr` (`cuMemcpyHtoD`, synchronous).
    pub fn write(&self, addr: u64, bytes: &[u8]) -> crate::Result<()> {
        use crate::error::DriverCall;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: `bytes` is valid for reads of its length; the caller names
        // a device range it mapped with access granted.
        unsafe { sys::cuMemcpyHtoD_v2(addr, bytes.as_ptr().cast(), bytes.len()) }
            .result()
            .call("cuMemcpyHtoD")
    }

    /// Copies `len` bytes from device address `addr` (`cuMemcpyDtoH`,
    /// synchronous).
    pub fn read(&self, addr: u64, len: usize) -> crate::Result<Vec<u8>> {
        use crate::error::DriverCall;
        self.ctx.bind_to_thread().call("cuCtxSetCurrent")?;
        let mut out = vec![0u8; len];
        // SAFETY: `out` is valid for writes of `len` bytes; the caller names
        // a device range it mapped with access granted.
        unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), addr, len) }
            .result()
            .call("cuMemcpyDtoH")?;
        Ok(out)
    }
}

impl VmmDriver for CudaVmm {
    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn options(&self) -> &ChunkOptions {
        &self.options
    }

    fn reserve(&self, size: u64) -> VmmResult<u64> {
        self.meter.covers(VmmCall::Reserve, size / self.granularity);
        let mut addr: sys::CUdeviceptr = 0;
        self.call(VmmCall::Reserve, || {
            // SAFETY: writes one pointer; no fixed address is requested (0),
            // alignment is the granularity.
            unsafe {
                sys::cuMemAddressReserve(&mut addr, size as usize, self.granularity as usize, 0, 0)
            }
            .result()
        })?;
        Ok(addr)
    }

    fn free_address(&self, addr: u64, size: u64) -> VmmResult<()> {
        self.meter
            .covers(VmmCall::FreeAddress, size / self.granularity);
        self.call(VmmCall::FreeAddress, || {
            // SAFETY: the caller passes a whole reservation with nothing
            // mapped (trait precondition); the driver checks it too.
            unsafe { sys::cuMemAddressFree(addr, size as usize) }.result()
        })
    }

    fn create(&self) -> VmmResult<ChunkHandle> {
        let size = self.granularity;
        let prop = self.properties();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        self.call(VmmCall::Create, || {
            // SAFETY: `handle` and `prop` are valid for the call; `prop` is
            // fully initialised; flags must be 0.
            unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) }.result()
        })?;
        Ok(ChunkHandle(handle))
    }

    fn create_on_host(&self) -> VmmResult<ChunkHandle> {
        let size = self.granularity;
        let prop = self.host_properties(self.host_location()?);
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        self.call(VmmCall::Create, || {
            // SAFETY: as in `create`; the location is one the driver
            // accepted in `host_location`.
            unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) }.result()
        })?;
        Ok(ChunkHandle(handle))
    }

    fn release(&self, chunk: ChunkHandle) -> VmmResult<()> {
        self.call(VmmCall::Release, || {
            // SAFETY: the handle came from `create` and is released once
            // (the lake forgets it afterwards).
            unsafe { sys::cuMemRelease(chunk.0) }.result()
        })
    }

    fn map(&self, addr: u64, chunk: ChunkHandle) -> VmmResult<()> {
        // Every chunk the lake makes is one granule.
        let size = self.granularity;
        self.call(VmmCall::Map, || {
            // SAFETY: maps a live handle into reserved, unmapped space
            // (trait precondition); offset and flags must be 0.
            unsafe { sys::cuMemMap(addr, size as usize, 0, chunk.0, 0) }.result()
        })
    }

    fn unmap(&self, addr: u64) -> VmmResult<()> {
        let size = self.granularity;
        self.call(VmmCall::Unmap, || {
            // SAFETY: unmaps one whole earlier mapping (trait precondition);
            // the lake makes sure no live allocation uses it.
            unsafe { sys::cuMemUnmap(addr, size as usize) }.result()
        })
    }

    fn set_access_for(&self, addr: u64, size: u64, peers: &[i32]) -> VmmResult<()> {
        self.meter
            .covers(VmmCall::SetAccess, size / self.granularity);
        let grant = |id: i32| sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        let descs: Vec<sys::CUmemAccessDesc> = std::iter::once(self.device())
            .chain(peers.iter().copied())
            .map(grant)
            .collect();
        self.call(VmmCall::SetAccess, || {
            // SAFETY: `descs` is valid for `descs.len()` entries; the range
            // is wholly mapped (trait precondition).
            unsafe { sys::cuMemSetAccess(addr, size as usize, descs.as_ptr(), descs.len()) }
                .result()
        })
    }

    fn device_ordinal(&self) -> i32 {
        self.ordinal() as i32
    }

    fn peer_can_access(&self, peer: i32) -> crate::Result<bool> {
        use crate::error::DriverCall;
        crate::thread_cuda::before_driver_call();
        let mut device: sys::CUdevice = 0;
        // SAFETY: writes one device handle; an ordinal that does not exist
        // is refused by the driver (CUDA_ERROR_INVALID_DEVICE).
        unsafe { sys::cuDeviceGet(&mut device, peer) }
            .result()
            .call("cuDeviceGet")?;
        let mut can: i32 = 0;
        // SAFETY: writes one int; both devices are valid handles. Asks
        // whether `device` (the peer) can access memory of our device.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, device, self.device()) }
            .result()
            .call("cuDeviceCanAccessPeer")?;
        Ok(can != 0)
    }

    fn counters(&self) -> DriverCounters {
        self.meter.snapshot()
    }
}
