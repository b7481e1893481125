//! `ModelVmm`: a faithful CPU model of the CUDA VMM calls, so the lake's
//! logic is tested without a GPU.
//!
//! It tracks reserved ranges, live chunks, which chunk backs each mapped
//! granule and which granules have access granted, and refuses every call
//! that breaks a precondition of [`VmmDriver`] (mapping over a mapping or
//! outside a reservation, releasing a mapped chunk, freeing a reservation
//! with something mapped, …). It is stricter than CUDA in one place: CUDA
//! lets a mapped chunk be released (the memory goes when the last mapping
//! does); the model refuses, because the lake never needs that.
//!
//! Chunks are backed by host memory, so bytes written through one mapping
//! read back through every other mapping of the same chunk
//! ([`ModelVmm::write`], [`ModelVmm::read`]). Faults can be injected: the
//! n-th next call of a kind fails ([`ModelVmm::fail_nth`]), and the device
//! can be made to run out of memory ([`ModelVmm::set_device_bytes`]):
//! then `create` fails as CUDA does, while `create_on_host` (the lake's
//! spill) still succeeds, its chunks counted apart and never against the
//! device. A model made
//! with [`ModelVmm::without_data`] keeps no bytes (for replaying traces of
//! tens of GiB): it checks every call the same way but refuses reads and
//! writes.
//!
//! Devices: the model is device 0 ([`MODEL_DEVICE`]) of a machine of
//! [`DEFAULT_DEVICES`] GPUs, every one of which can access the others'
//! memory unless told otherwise ([`ModelVmm::set_devices`],
//! [`ModelVmm::set_peer_capable`]). Each mapped granule records the devices
//! granted access ([`ModelVmm::access_at`]); [`ModelVmm::read_on`] reads as
//! one device would, refused where that device has no access.
//!
//! Concurrency: all state sits behind one mutex, taken for the length of a
//! call; the call meter is atomics.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, MutexGuard};

use super::driver::{
    CallMeter, ChunkHandle, ChunkOptions, DriverCounters, DriverFailure, FailureCause, VmmCall,
    VmmDriver, VmmResult,
};

/// Where the model's reservations start (any non-zero, aligned value; kept
/// away from 0 so a zero address is never handed out).
const ADDRESS_BASE: u64 = 0x7f00_0000_0000;

/// The H100's VMM granularity, the model's default.
pub const H100_GRANULARITY: u64 = 2 << 20;

/// The ordinal of the model's own device.
pub const MODEL_DEVICE: i32 = 0;

/// GPUs the model's machine has unless told otherwise (a node of eight).
pub const DEFAULT_DEVICES: i32 = 8;

/// The most GPUs a model machine may have: one bit each in a granule's
/// access mask.
pub const MAX_DEVICES: i32 = 64;

/// A live chunk of the model.
struct Chunk {
    /// Host memory standing in for the chunk.
    bytes: Vec<u8>,
    /// Granules where it is mapped now.
    mappings: usize,
    /// Whether it was created RDMA-capable.
    rdma_capable: bool,
    /// Whether it lives in host memory (`create_on_host`).
    on_host: bool,
}

/// One mapped granule.
struct Mapping {
    chunk: ChunkHandle,
    /// Devices granted access since it was mapped: bit `d` for device `d`.
    access: u64,
}

/// The bit of device `d` in [`Mapping::access`].
fn device_bit(d: i32) -> u64 {
    1 << d
}

#[derive(Default)]
struct State {
    /// Reservations: start → size.
    reservations: BTreeMap<u64, u64>,
    /// Next reservation address (reservations are never reused unless
    /// `reuse_addresses`).
    next_address: u64,
    /// Freed reservations, start -> size, to hand out again first
    /// ([`ModelVmm::set_reuse_addresses`]).
    freed_addresses: BTreeMap<u64, u64>,
    /// Whether a reservation may get the addresses of a freed one, as
    /// CUDA's `cuMemAddressReserve` does.
    reuse_addresses: bool,
    chunks: HashMap<ChunkHandle, Chunk>,
    next_handle: u64,
    /// Mapped granules: granule address → mapping.
    mapped: BTreeMap<u64, Mapping>,
    /// Fault injection: call → how many more calls succeed before one fails.
    faults: HashMap<VmmCall, u64>,
    /// Modelled device memory in chunks (`None`: unlimited).
    device_chunks: Option<u64>,
    /// Live chunks in host memory (the others are on the device).
    host_chunks: usize,
    /// GPUs of the modelled machine (ordinals `0..devices`).
    devices: i32,
    /// Devices that cannot access the model's memory (no peer capability).
    no_peer: u64,
}

/// The CPU model of the VMM driver.
pub struct ModelVmm {
    granularity: u64,
    /// Whether chunks are backed by host memory.
    with_data: bool,
    options: ChunkOptions,
    state: Mutex<State>,
    meter: CallMeter,
}

/// A snapshot of what the model holds, for tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelCensus {
    /// Live reservations.
    pub reservations: usize,
    /// Live chunks.
    pub chunks: usize,
    /// Mapped granules.
    pub mappings: usize,
    /// Live chunks created RDMA-capable.
    pub rdma_chunks: usize,
    /// Live chunks in host memory (`create_on_host`), part of `chunks`.
    pub host_chunks: usize,
}

fn refuse<T>(call: VmmCall, why: String) -> VmmResult<T> {
    Err(DriverFailure {
        call,
        cause: FailureCause::Model(why),
    })
}

impl ModelVmm {
    /// A model with chunks of `granularity` bytes (a power of two) and the
    /// given chunk options.
    pub fn new(granularity: u64, options: ChunkOptions) -> ModelVmm {
        assert!(
            granularity.is_power_of_two(),
            "granularity must be a power of two"
        );
        ModelVmm {
            granularity,
            with_data: true,
            options,
            state: Mutex::new(State {
                next_address: ADDRESS_BASE,
                next_handle: 1,
                devices: DEFAULT_DEVICES,
                ..State::default()
            }),
            meter: CallMeter::default(),
        }
    }

    /// A model with the H100's granularity and default options.
    pub fn h100() -> ModelVmm {
        ModelVmm::new(H100_GRANULARITY, ChunkOptions::default())
    }

    /// A model like [`ModelVmm::new`] whose chunks hold no bytes: every
    /// call is checked as usual, [`ModelVmm::read`] and
    /// [`ModelVmm::write`] are refused. For replaying large traces.
    pub fn without_data(granularity: u64, options: ChunkOptions) -> ModelVmm {
        ModelVmm {
            with_data: false,
            ..ModelVmm::new(granularity, options)
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock left the model as it was before the
        // call that panicked (every call checks before it changes anything).
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the `n`-th next call of kind `call` (1 = the very next one)
    /// fail with [`FailureCause::Injected`]; later calls succeed again.
    pub fn fail_nth(&self, call: VmmCall, n: u64) {
        assert!(n >= 1, "n counts from 1");
        self.state().faults.insert(call, n - 1);
    }

    /// Models a device of `bytes` physical memory (rounded down to whole
    /// chunks): a `create` beyond it fails with
    /// [`FailureCause::OutOfMemory`], as CUDA does when the GPU is full
    /// whatever the lake's own limit says. `None` (the default) never runs
    /// out.
    pub fn set_device_bytes(&self, bytes: Option<u64>) {
        self.state().device_chunks = bytes.map(|b| b / self.granularity);
    }

    /// Models a machine of `devices` GPUs (1 to [`MAX_DEVICES`]): a peer
    /// ordinal beyond them does not exist (`cuDeviceGet` fails, and so does
    /// a grant naming it).
    pub fn set_devices(&self, devices: i32) {
        assert!(
            (1..=MAX_DEVICES).contains(&devices),
            "a model machine has 1 to {MAX_DEVICES} GPUs"
        );
        self.state().devices = devices;
    }

    /// Says whether device `peer` can access the model's memory
    /// (`cuDeviceCanAccessPeer`; all can by default). A grant naming a peer
    /// that cannot is refused, as CUDA refuses it.
    pub fn set_peer_capable(&self, peer: i32, capable: bool) {
        assert!((0..MAX_DEVICES).contains(&peer), "no such device {peer}");
        let mut s = self.state();
        if capable {
            s.no_peer &= !device_bit(peer);
        } else {
            s.no_peer |= device_bit(peer);
        }
    }

    /// The devices with access to the granule holding `addr` (ascending),
    /// or `None` where nothing is mapped.
    pub fn access_at(&self, addr: u64) -> Option<Vec<i32>> {
        let granule = addr & !(self.granularity - 1);
        let access = self.state().mapped.get(&granule)?.access;
        Some(
            (0..MAX_DEVICES)
                .filter(|&d| access & device_bit(d) != 0)
                .collect(),
        )
    }

    /// What the model holds now.
    pub fn census(&self) -> ModelCensus {
        let s = self.state();
        ModelCensus {
            reservations: s.reservations.len(),
            chunks: s.chunks.len(),
            mappings: s.mapped.len(),
            rdma_chunks: s.chunks.values().filter(|c| c.rdma_capable).count(),
            host_chunks: s.host_chunks,
        }
    }

    /// Makes later reservations take the addresses of freed ones first
    /// (lowest first fit), as CUDA may: a stale address kept anywhere then
    /// names live memory of another reservation. Off by default (every
    /// reservation gets fresh addresses).
    pub fn set_reuse_addresses(&self, on: bool) {
        self.state().reuse_addresses = on;
    }

    /// The chunk mapped at the granule holding `addr` and whether access
    /// to it was granted, or `None` where nothing is mapped: which physical
    /// memory backs a virtual address, so tests can tell two live ranges
    /// that share memory through different mappings (a stitched view and a
    /// home view of the same chunk). Works without data too.
    pub fn chunk_at(&self, addr: u64) -> Option<(ChunkHandle, bool)> {
        let granule = addr & !(self.granularity - 1);
        self.state()
            .mapped
            .get(&granule)
            .map(|m| (m.chunk, m.access & device_bit(MODEL_DEVICE) != 0))
    }

    /// Writes `bytes` at device address `addr`, through whatever chunks are
    /// mapped there. Every granule touched must be mapped with access.
    pub fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), String> {
        self.has_data()?;
        let mut s = self.state();
        let mut done = 0;
        while done < bytes.len() {
            let (chunk, offset, n) =
                self.locate(&s, MODEL_DEVICE, addr + done as u64, bytes.len() - done)?;
            let target = &mut s
                .chunks
                .get_mut(&chunk)
                .expect("mapped chunks are live")
                .bytes;
            target[offset..offset + n].copy_from_slice(&bytes[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Reads `len` bytes at device address `addr`. Every granule touched
    /// must be mapped with access.
    pub fn read(&self, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        self.read_on(MODEL_DEVICE, addr, len)
    }

    /// Reads `len` bytes at device address `addr` as a kernel on `device`
    /// would: every granule touched must be mapped with access granted to
    /// `device` (a peer reading the model's memory).
    pub fn read_on(&self, device: i32, addr: u64, len: usize) -> Result<Vec<u8>, String> {
        self.has_data()?;
        let s = self.state();
        let mut out = Vec::with_capacity(len);
        while out.len() < len {
            let (chunk, offset, n) =
                self.locate(&s, device, addr + out.len() as u64, len - out.len())?;
            out.extend_from_slice(&s.chunks[&chunk].bytes[offset..offset + n]);
        }
        Ok(out)
    }

    fn has_data(&self) -> Result<(), String> {
        if self.with_data {
            Ok(())
        } else {
            Err("this model keeps no bytes (made with ModelVmm::without_data)".into())
        }
    }

    /// The chunk behind `addr`, the offset in it, and how many of `want`
    /// bytes lie in that granule, for an access from `device`.
    fn locate(
        &self,
        s: &State,
        device: i32,
        addr: u64,
        want: usize,
    ) -> Result<(ChunkHandle, usize, usize), String> {
        let granule = addr & !(self.granularity - 1);
        let m = s
            .mapped
            .get(&granule)
            .ok_or_else(|| format!("address {addr:#x} is not mapped"))?;
        if !(0..MAX_DEVICES).contains(&device) || m.access & device_bit(device) == 0 {
            return Err(format!(
                "address {addr:#x} is mapped but access was never granted to device {device}"
            ));
        }
        let offset = (addr - granule) as usize;
        let n = want.min(self.granularity as usize - offset);
        Ok((m.chunk, offset, n))
    }

    /// Makes a live chunk (on the device, or in host memory).
    fn new_chunk(&self, s: &mut State, on_host: bool) -> ChunkHandle {
        let handle = ChunkHandle(s.next_handle);
        s.next_handle += 1;
        let chunk = Chunk {
            bytes: if self.with_data {
                vec![0; self.granularity as usize]
            } else {
                Vec::new()
            },
            mappings: 0,
            // The option is about device memory (as in `CudaVmm`).
            rdma_capable: self.options.rdma_capable && !on_host,
            on_host,
        };
        s.chunks.insert(handle, chunk);
        handle
    }

    /// Runs one metered call: checks for an injected fault, then `f`.
    fn call<T>(&self, call: VmmCall, f: impl FnOnce(&mut State) -> VmmResult<T>) -> VmmResult<T> {
        self.meter.time(call, || {
            let mut s = self.state();
            if let Some(left) = s.faults.get_mut(&call) {
                if *left == 0 {
                    s.faults.remove(&call);
                    return Err(DriverFailure {
                        call,
                        cause: FailureCause::Injected,
                    });
                }
                *left -= 1;
            }
            f(&mut s)
        })
    }

    fn aligned(&self, v: u64) -> bool {
        v & (self.granularity - 1) == 0
    }

    /// The reservation holding `[addr, addr + size)`, if one does.
    fn reservation_of(s: &State, addr: u64, size: u64) -> Option<(u64, u64)> {
        let (&start, &len) = s.reservations.range(..=addr).next_back()?;
        (addr + size <= start + len).then_some((start, len))
    }
}

impl VmmDriver for ModelVmm {
    fn granularity(&self) -> u64 {
        self.granularity
    }

    fn options(&self) -> &ChunkOptions {
        &self.options
    }

    fn reserve(&self, size: u64) -> VmmResult<u64> {
        self.meter.covers(VmmCall::Reserve, size / self.granularity);
        self.call(VmmCall::Reserve, |s| {
            if size == 0 || !self.aligned(size) {
                return refuse(
                    VmmCall::Reserve,
                    format!("size {size} is not a positive multiple of the granularity"),
                );
            }
            let again = s
                .reuse_addresses
                .then(|| s.freed_addresses.iter().find(|&(_, &l)| l >= size))
                .flatten()
                .map(|(&a, &l)| (a, l));
            let addr = match again {
                Some((a, l)) => {
                    s.freed_addresses.remove(&a);
                    if l > size {
                        s.freed_addresses.insert(a + size, l - size);
                    }
                    a
                }
                None => {
                    let a = s.next_address;
                    s.next_address += size;
                    a
                }
            };
            s.reservations.insert(addr, size);
            Ok(addr)
        })
    }

    fn free_address(&self, addr: u64, size: u64) -> VmmResult<()> {
        self.meter
            .covers(VmmCall::FreeAddress, size / self.granularity);
        self.call(VmmCall::FreeAddress, |s| {
            if s.reservations.get(&addr) != Some(&size) {
                return refuse(
                    VmmCall::FreeAddress,
                    format!("[{addr:#x}, +{size}) is not a reservation"),
                );
            }
            if let Some((&g, _)) = s.mapped.range(addr..addr + size).next() {
                return refuse(
                    VmmCall::FreeAddress,
                    format!("granule {g:#x} inside it is still mapped"),
                );
            }
            s.reservations.remove(&addr);
            if s.reuse_addresses {
                s.freed_addresses.insert(addr, size);
            }
            Ok(())
        })
    }

    fn create(&self) -> VmmResult<ChunkHandle> {
        self.call(VmmCall::Create, |s| {
            let on_device = (s.chunks.len() - s.host_chunks) as u64;
            if s.device_chunks.is_some_and(|cap| on_device >= cap) {
                return Err(DriverFailure {
                    call: VmmCall::Create,
                    cause: FailureCause::OutOfMemory,
                });
            }
            Ok(self.new_chunk(s, false))
        })
    }

    fn create_on_host(&self) -> VmmResult<ChunkHandle> {
        self.call(VmmCall::Create, |s| {
            s.host_chunks += 1;
            Ok(self.new_chunk(s, true))
        })
    }

    fn release(&self, chunk: ChunkHandle) -> VmmResult<()> {
        self.call(VmmCall::Release, |s| {
            match s.chunks.get(&chunk) {
                None => return refuse(VmmCall::Release, format!("chunk {} is not live", chunk.0)),
                Some(c) if c.mappings > 0 => {
                    return refuse(
                        VmmCall::Release,
                        format!(
                            "chunk {} is still mapped at {} granules",
                            chunk.0, c.mappings
                        ),
                    );
                }
                Some(_) => {}
            }
            if s.chunks.remove(&chunk).is_some_and(|c| c.on_host) {
                s.host_chunks -= 1;
            }
            Ok(())
        })
    }

    fn map(&self, addr: u64, chunk: ChunkHandle) -> VmmResult<()> {
        self.call(VmmCall::Map, |s| {
            if !self.aligned(addr) {
                return refuse(
                    VmmCall::Map,
                    format!("address {addr:#x} is not aligned to the granularity"),
                );
            }
            if Self::reservation_of(s, addr, self.granularity).is_none() {
                return refuse(
                    VmmCall::Map,
                    format!("address {addr:#x} is outside every reservation"),
                );
            }
            if s.mapped.contains_key(&addr) {
                return refuse(VmmCall::Map, format!("address {addr:#x} is already mapped"));
            }
            let Some(c) = s.chunks.get_mut(&chunk) else {
                return refuse(VmmCall::Map, format!("chunk {} is not live", chunk.0));
            };
            c.mappings += 1;
            s.mapped.insert(addr, Mapping { chunk, access: 0 });
            Ok(())
        })
    }

    fn unmap(&self, addr: u64) -> VmmResult<()> {
        self.call(VmmCall::Unmap, |s| {
            let Some(m) = s.mapped.remove(&addr) else {
                return refuse(VmmCall::Unmap, format!("nothing is mapped at {addr:#x}"));
            };
            s.chunks
                .get_mut(&m.chunk)
                .expect("mapped chunks are live")
                .mappings -= 1;
            Ok(())
        })
    }

    fn set_access_for(&self, addr: u64, size: u64, peers: &[i32]) -> VmmResult<()> {
        self.meter
            .covers(VmmCall::SetAccess, size / self.granularity);
        self.call(VmmCall::SetAccess, |s| {
            let mut grant = device_bit(MODEL_DEVICE);
            for &p in peers {
                if !(0..s.devices).contains(&p) {
                    return refuse(
                        VmmCall::SetAccess,
                        format!("device {p} does not exist (the machine has {})", s.devices),
                    );
                }
                if grant & device_bit(p) != 0 {
                    return refuse(
                        VmmCall::SetAccess,
                        format!("device {p} is named twice (the own device is {MODEL_DEVICE})"),
                    );
                }
                if s.no_peer & device_bit(p) != 0 {
                    return refuse(
                        VmmCall::SetAccess,
                        format!("device {p} cannot access memory of device {MODEL_DEVICE}"),
                    );
                }
                grant |= device_bit(p);
            }
            if size == 0 || !self.aligned(addr) || !self.aligned(size) {
                return refuse(
                    VmmCall::SetAccess,
                    format!("[{addr:#x}, +{size}) is not whole granules"),
                );
            }
            let granules = size / self.granularity;
            if (s.mapped.range(addr..addr + size).count() as u64) < granules {
                return refuse(
                    VmmCall::SetAccess,
                    format!("[{addr:#x}, +{size}) is not wholly mapped"),
                );
            }
            // Devices not named keep what they had, as with CUDA.
            for (_, m) in s.mapped.range_mut(addr..addr + size) {
                m.access |= grant;
            }
            Ok(())
        })
    }

    fn device_ordinal(&self) -> i32 {
        MODEL_DEVICE
    }

    fn peer_can_access(&self, peer: i32) -> crate::Result<bool> {
        let s = self.state();
        if !(0..s.devices).contains(&peer) {
            // Where CUDA's `cuDeviceGet` answers CUDA_ERROR_INVALID_DEVICE
            // (not built as a cudarc error: printing one asks libcuda).
            return Err(crate::Error::Config(format!(
                "cuDeviceGet failed: no device {peer} (the CPU model's machine has {} GPUs)",
                s.devices
            )));
        }
        Ok(peer != MODEL_DEVICE && s.no_peer & device_bit(peer) == 0)
    }

    fn counters(&self) -> DriverCounters {
        self.meter.snapshot()
    }
}
