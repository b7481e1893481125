//! `VmmHeap`: a device heap whose memory comes from CUDA virtual memory
//! management. The heap's whole virtual range (up to 1 TiB, the most
//! segments a heap can name) is reserved when it is created; physical
//! chunks are created and mapped one segment at a time, only when the heap
//! grows, and unmapped and released when it trims.
//!
//! The protocol, in the order a segment lives it:
//! 1. *absent*: in no tree, nothing mapped at its address;
//! 2. grow: `cuMemCreate` + `cuMemMap` for each chunk of the segment, then
//!    one `cuMemSetAccess` over the segment for the heap's device and its
//!    peers ([`VmmHeapConfig::peer_access`]); a failure undoes what this
//!    segment had done (unmap, release) and the call names the driver call;
//! 3. publish: [`SegmentTree::add`] inserts it into the segment tree (an
//!    acq_rel RMW, after the mapping; on the GPU a kernel launched after
//!    the driver calls returned), where allocations find it;
//! 4. trim: [`SegmentTree::flush`] returns what slots hold, then
//!    [`SegmentTree::withdraw`] takes wholly free segments out of the tree
//!    with the same claim an allocation makes (a segment is withdrawn or
//!    allocated, never both), so nothing can reach it; only then
//!    `cuMemUnmap` and `cuMemRelease` give the memory back to the driver.
//!
//! [`VmmHeap::alloc_large`] (module `large`) moves the chunks of withdrawn free
//! segments under a stretch of absent ones and publishes it as a live run,
//! so present segments need not be a prefix: the ledger keeps absence per
//! segment, grow maps the lowest absent ids and trim takes the highest free.
//!
//! Everything runs over the [`VmmDriver`] trait, so the same code runs on
//! the CPU model ([`ModelVmm`], host threads allocating through
//! [`HostMetadata`]) and on a GPU ([`CudaVmm`], kernels allocating through
//! [`GpuMetadata`]). What the driver holds is recorded in a ledger (mapped
//! granules and their chunks, chunks created but not mapped), so a failure
//! half-way leaves nothing unaccounted for, and `Drop` gives back
//! everything that is left without panicking.
//!
//! Growth on demand: [`VmmHeap::start_growth`] starts a thread the heap
//! owns ([`service`]) that watches the count of free segments and maps more
//! before they run out, up to the heap's limit. `malloc` that finds the
//! heap empty returns null at once; kernels that would rather wait for the
//! service call `Heap::malloc_waiting` (a bound in nanoseconds; kernel
//! `heap_alloc_waiting`), which retries while the service publishes.
//!
//! Concurrency: `grow`, `trim` and the service serialise on the ledger
//! mutex; `malloc` and `free` never take it. Counters are relaxed atomics
//! (independent statistics).

mod gpu_metadata;
mod large;
mod metadata;
mod service;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use gpu_kernel::stats::HeapStats;

pub use gpu_metadata::GpuMetadata;
pub use large::LargeRange;
pub use metadata::{HostMetadata, SegmentTree};
pub use service::GrowthPolicy;

use crate::config::HeapConfig;
use crate::error::{Error, Result};
use crate::gpu::Gpu;
use crate::vmm::{ChunkHandle, CudaVmm, DriverCounters, DriverFailure, ModelVmm, VmmDriver};

/// A VMM heap on the CPU model: host threads allocate.
pub type ModelVmmHeap = VmmHeap<Arc<ModelVmm>, HostMetadata>;
/// A VMM heap on a GPU: kernels allocate.
pub type CudaVmmHeap = VmmHeap<CudaVmm, GpuMetadata>;

/// What a user chooses when creating a VMM heap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmmHeapConfig {
    /// The heap: `heap.bytes` is the virtual size reserved (required;
    /// rounded down to whole segments and to the largest heap the allocator
    /// can name: 2^24 − 1 slice blocks, 1 TiB less one segment); the segment
    /// size is chosen from it as for any heap unless `heap.segment_shift`
    /// names one.
    pub heap: HeapConfig,
    /// Bytes mapped at creation (rounded up to whole segments).
    pub initial_bytes: u64,
    /// The most physical bytes the heap may map (rounded down to whole
    /// segments); `grow` and the growth service stop there. `None`: the
    /// whole reservation.
    pub max_mapped_bytes: Option<u64>,
    /// Other GPUs (device ordinals) granted read-write access, besides the
    /// heap's own device, on every mapping the heap makes (initial mapping,
    /// `grow`, the growth service, `alloc_large`), so their kernels can
    /// read and write the heap's allocations. Creation checks that each can
    /// access the heap's device (`cuDeviceCanAccessPeer`) and refuses the
    /// heap's own device or a device listed twice. Empty: the heap's device
    /// alone. The driver's own `ChunkOptions::peers` must be empty (the
    /// heap grants what this names).
    pub peer_access: Vec<usize>,
}

impl VmmHeapConfig {
    /// A heap reserving `reserve` bytes of virtual address space, with
    /// `initial` bytes mapped at creation and no limit below the
    /// reservation; checks off (as benchmarks run it).
    pub fn new(reserve: u64, initial: u64) -> VmmHeapConfig {
        VmmHeapConfig {
            heap: HeapConfig::unchecked(reserve),
            initial_bytes: initial,
            max_mapped_bytes: None,
            peer_access: Vec::new(),
        }
    }
}

/// What a VMM heap holds and has done.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmmHeapStats {
    /// Virtual bytes reserved (the heap's data plus alignment slack).
    pub reserved_bytes: u64,
    /// Bytes of heap data the reservation can hold (whole segments).
    pub virtual_bytes: u64,
    /// Physical bytes mapped now.
    pub mapped_bytes: u64,
    /// Bytes of one segment.
    pub segment_bytes: u64,
    /// Segments mapped and published (in use or free).
    pub present_segments: u32,
    /// Of those, wholly free in the segment tree (a snapshot; segments
    /// slots hold as spares count as in use).
    pub free_segments: u32,
    /// Segments that a failed unmap or publish left mapped but unusable;
    /// given back when the heap is dropped.
    pub stranded_segments: u32,
    /// The most segments the heap may map.
    pub limit_segments: u32,
    /// Bytes of metadata (device or host memory, allocated at creation: it
    /// grows with the virtual size, not with what is mapped).
    pub metadata_bytes: u64,
    /// Calls to grow that mapped at least one segment.
    pub grows: u64,
    /// Segments mapped by them.
    pub segments_grown: u64,
    /// Nanoseconds spent growing (driver calls and publishing).
    pub grow_nanos: u64,
    /// Calls to trim that unmapped at least one segment.
    pub trims: u64,
    /// Segments unmapped by them.
    pub segments_trimmed: u64,
    /// Nanoseconds spent trimming (flush, withdraw and driver calls).
    pub trim_nanos: u64,
    /// Calls to `alloc_large` that succeeded.
    pub large_allocs: u64,
    /// Segments they took from free segments elsewhere in the heap (their
    /// chunks moved under the new range).
    pub segments_stitched: u64,
    /// Nanoseconds spent in `alloc_large` (successful calls).
    pub large_nanos: u64,
    /// Device run requests the growth service answered with a stitched
    /// run (`Heap::malloc_waiting` of a run no free run could meet); their
    /// stitching counts in `large_allocs` too.
    pub run_requests_served: u64,
    /// Device run requests answered with none (stitching failed; the
    /// reason is the service's `growth_error`).
    pub run_requests_refused: u64,
    /// Stitched runs whose thread had given up before the answer: freed
    /// by the service (back to the segment tree).
    pub run_requests_abandoned: u64,
    /// The heap's own device (ordinal).
    pub device: usize,
    /// The other devices granted access to every mapping
    /// ([`VmmHeapConfig::peer_access`], in that order).
    pub peer_access: Vec<usize>,
    /// Driver calls made so far (all of the driver's users).
    pub driver: DriverCounters,
}

impl VmmHeapStats {
    /// Segments allocations hold now (present and not wholly free).
    pub fn segments_in_use(&self) -> u32 {
        self.present_segments.saturating_sub(self.free_segments)
    }
}

/// What the driver holds for the heap. Under the ledger mutex.
#[derive(Default)]
struct Ledger {
    /// Segments in no tree with nothing mapped: what `grow` may map.
    absent: BTreeSet<u32>,
    /// Segments mapped and published.
    present: u32,
    /// Segments mapped (wholly or partly) that may not be used: a failed
    /// unmap left chunks there, or a failed publish may have published it.
    stranded: BTreeSet<u32>,
    /// Mapped granules: address → chunk (each chunk once: its owner).
    mapped: BTreeMap<u64, ChunkHandle>,
    /// Second mappings of chunks that `mapped` owns at another address,
    /// made by `alloc_large` while it moves chunks (module `large`):
    /// unmapped, never released. Empty between calls unless an unmap
    /// failed.
    aliases: BTreeMap<u64, ChunkHandle>,
    /// Chunks created and mapped nowhere, waiting for `cuMemRelease`.
    unmapped: Vec<ChunkHandle>,
}

/// The locked ledger ([`Shared::ledger`]): sets the heap's budget when
/// released.
struct LockedLedger<'a, M: SegmentTree> {
    guard: MutexGuard<'a, Ledger>,
    tree: &'a M,
}

impl<M: SegmentTree> std::ops::Deref for LockedLedger<'_, M> {
    type Target = Ledger;

    fn deref(&self) -> &Ledger {
        &self.guard
    }
}

impl<M: SegmentTree> std::ops::DerefMut for LockedLedger<'_, M> {
    fn deref_mut(&mut self) -> &mut Ledger {
        &mut self.guard
    }
}

impl<M: SegmentTree> Drop for LockedLedger<'_, M> {
    /// The budget is the present segments: mapped and published, stranded
    /// ones left out (set while the lock is still held, so budgets are set
    /// in the order the ledger changed).
    fn drop(&mut self) {
        self.tree.set_budget(self.guard.present);
    }
}

/// Relaxed counters: independent statistics, read only for reporting.
#[derive(Default)]
struct Counters {
    grows: AtomicU64,
    segments_grown: AtomicU64,
    grow_nanos: AtomicU64,
    trims: AtomicU64,
    segments_trimmed: AtomicU64,
    trim_nanos: AtomicU64,
    large_allocs: AtomicU64,
    segments_stitched: AtomicU64,
    large_nanos: AtomicU64,
    run_requests_served: AtomicU64,
    run_requests_refused: AtomicU64,
    run_requests_abandoned: AtomicU64,
}

/// What the heap and its growth service share.
struct Shared<D: VmmDriver, M: SegmentTree> {
    driver: D,
    tree: M,
    /// The reservation: (address, bytes).
    reservation: (u64, u64),
    /// Address of segment 0 (the reservation's first segment boundary).
    data: u64,
    segment_shift: u32,
    segments: u32,
    limit_segments: u32,
    metadata_bytes: u64,
    /// Devices granted access besides the driver's own, on every mapping.
    peers: Vec<i32>,
    ledger: Mutex<Ledger>,
    counters: Counters,
}

/// A device heap on CUDA virtual memory (or its CPU model).
pub struct VmmHeap<D: VmmDriver, M: SegmentTree> {
    shared: Arc<Shared<D, M>>,
    service: Option<service::Service>,
}

fn vmm(doing: String) -> impl FnOnce(DriverFailure) -> Error {
    move |source| Error::Vmm { doing, source }
}

/// The peers of `wanted` as driver ordinals, after checking that none is
/// the driver's own device or listed twice, that the driver names no peers
/// of its own, and that each can access the driver's device.
fn checked_peers<D: VmmDriver>(driver: &D, wanted: &[usize]) -> Result<Vec<i32>> {
    let own = driver.device_ordinal();
    if !driver.options().peers.is_empty() {
        return Err(Error::Config(format!(
            "the driver was opened with ChunkOptions::peers {:?}: a VMM heap grants access to \
             the devices of VmmHeapConfig::peer_access; name them there and open the driver \
             without peers",
            driver.options().peers
        )));
    }
    let mut peers: Vec<i32> = Vec::with_capacity(wanted.len());
    for &p in wanted {
        let peer = i32::try_from(p)
            .map_err(|_| Error::Config(format!("peer_access: no device has ordinal {p}")))?;
        if peer == own {
            return Err(Error::Config(format!(
                "peer_access lists device {p}, the heap's own device"
            )));
        }
        if peers.contains(&peer) {
            return Err(Error::Config(format!("peer_access lists device {p} twice")));
        }
        match driver.peer_can_access(peer) {
            Ok(true) => peers.push(peer),
            Ok(false) => {
                return Err(Error::Config(format!(
                    "peer_access: cuDeviceCanAccessPeer says device {p} cannot access memory \
                     of device {own} (the heap's device): leave it out"
                )));
            }
            Err(e) => {
                let why = match e {
                    Error::Config(why) => why,
                    e => e.to_string(),
                };
                return Err(Error::Config(format!(
                    "peer_access: checking whether device {p} can access memory of device \
                     {own} (the heap's device): {why}"
                )));
            }
        }
    }
    Ok(peers)
}

fn nanos_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

impl ModelVmmHeap {
    /// A heap on the CPU model `driver`: metadata in host memory, data at
    /// the model's addresses (read and write them with `ModelVmm::read` /
    /// `write`). A model made with `ModelVmm::without_data` keeps no bytes
    /// per chunk, so terabyte reservations with many segments mapped cost
    /// only the model's bookkeeping.
    pub fn on_model(driver: Arc<ModelVmm>, config: VmmHeapConfig) -> Result<ModelVmmHeap> {
        VmmHeap::create(driver, config, |layout, data| {
            // SAFETY: `create` passes the start of the reservation's
            // segment-aligned data range, which the heap owns until after
            // this metadata is dropped, and publishes only mapped segments.
            Ok(unsafe { HostMetadata::new(layout, data) })
        })
    }

    /// The heap handle host threads call `malloc` and `free` on, with the
    /// rules of a heap of the segments mapped now (its budget; see
    /// `gpu_kernel::Heap::with_budget`). A handle kept while the heap grows
    /// or trims stays correct with the rules of the size it was made at:
    /// call this again to follow.
    pub fn heap(&self) -> gpu_kernel::layout::BudgetedHeap<'_> {
        self.shared.tree.heap()
    }
}

impl CudaVmmHeap {
    /// A heap on `gpu` whose memory comes from `driver` (the same device):
    /// metadata in device memory, data in the reservation. Kernels on
    /// `gpu`'s stream allocate with [`CudaVmmHeap::arg`].
    pub fn on_gpu(gpu: &Gpu, driver: CudaVmm, config: VmmHeapConfig) -> Result<CudaVmmHeap> {
        // The metadata goes to `gpu`, the data to the driver's device: they
        // must be one device (with peers, a mismatch could even seem to work).
        if gpu.ordinal() as i64 != driver.device_ordinal() as i64 {
            return Err(Error::Config(format!(
                "CudaVmmHeap::on_gpu: the Gpu is device {} but the VMM driver maps memory of \
                 device {}: open both on the same device",
                gpu.ordinal(),
                driver.device_ordinal()
            )));
        }
        VmmHeap::create(driver, config, |layout, data| {
            // SAFETY: as in `on_model`: the reservation outlives the
            // metadata, and only mapped segments are published.
            unsafe { GpuMetadata::new(gpu, layout, data) }
        })
    }

    /// The heap handle as a kernel argument, with the rules of a heap of
    /// the segments mapped now (see [`ModelVmmHeap::heap`]): take a fresh
    /// one for each launch. A kernel launched with an older one stays
    /// correct, with the rules of the size the heap had then.
    pub fn arg(&self) -> crate::gpu::Arg {
        self.shared.tree.arg()
    }
}

impl<D: VmmDriver + 'static, M: SegmentTree + 'static> VmmHeap<D, M> {
    /// Reserves the virtual range, lays out the metadata with `make_tree`
    /// (given the layout and the data address), then maps the initial
    /// segments. Everything made is given back if a step fails.
    pub fn create(
        driver: D,
        config: VmmHeapConfig,
        make_tree: impl FnOnce(gpu_kernel::layout::HeapLayout, u64) -> Result<M>,
    ) -> Result<VmmHeap<D, M>> {
        let bytes = config.heap.bytes.ok_or_else(|| {
            Error::Config("a VMM heap needs its virtual size in `heap.bytes`".into())
        })?;
        let peers = checked_peers(&driver, &config.peer_access)?;
        // The largest heap the allocator can name is 2^24 slice blocks less
        // one (1 TiB less one segment): a larger virtual size is rounded
        // down to it, as any size is rounded down to whole segments.
        let shift = config
            .heap
            .segment_shift
            .unwrap_or(gpu_kernel::class::segment_shift_for(bytes));
        // (A shift outside 21..=24 is left to `layout` to refuse.)
        let largest = if gpu_kernel::class::is_segment_shift(shift) {
            gpu_kernel::Heap::max_segments(shift) << shift
        } else {
            bytes
        };
        let heap_config = HeapConfig {
            segment_shift: Some(shift),
            ..config.heap
        };
        let layout = heap_config.layout(bytes.min(largest))?;
        let segment_bytes = 1u64 << layout.segment_shift();
        let granularity = driver.granularity();
        if !segment_bytes.is_multiple_of(granularity) {
            return Err(Error::Config(format!(
                "segments of {segment_bytes} bytes are not whole chunks of the driver's \
                 {granularity}-byte granularity: choose a larger `segment_shift` or smaller chunks"
            )));
        }
        let segments = layout.segments();
        let limit_segments = match config.max_mapped_bytes {
            Some(b) => (b / segment_bytes).min(segments as u64) as u32,
            None => segments,
        };
        let initial = config.initial_bytes.div_ceil(segment_bytes);
        if initial > limit_segments as u64 {
            return Err(Error::Config(format!(
                "initial_bytes {} is more than the {limit_segments} segments max_mapped_bytes allows",
                config.initial_bytes
            )));
        }
        // One segment of slack so segment 0 can start on a segment boundary
        // (blocks and runs are aligned to theirs); virtual space only.
        let reserve = layout.data_bytes() + segment_bytes;
        let base = driver
            .reserve(reserve)
            .map_err(vmm(format!("reserving {reserve} bytes for the heap")))?;
        let data = base.next_multiple_of(segment_bytes);
        let metadata_bytes = layout.metadata_bytes();
        let tree = match make_tree(layout, data) {
            Ok(t) => t,
            Err(e) => {
                // Nothing is mapped: the reservation is all there is.
                let _ = driver.free_address(base, reserve);
                return Err(e);
            }
        };
        let heap = VmmHeap {
            shared: Arc::new(Shared {
                driver,
                tree,
                reservation: (base, reserve),
                data,
                segment_shift: segment_bytes.trailing_zeros(),
                segments,
                limit_segments,
                metadata_bytes,
                peers,
                ledger: Mutex::new(Ledger {
                    absent: (0..segments).collect(),
                    ..Ledger::default()
                }),
                counters: Counters::default(),
            }),
            service: None,
        };
        // On failure `heap` is dropped here, which gives back what the
        // initial growth mapped and the reservation.
        heap.shared.grow_segments(initial as u32)?;
        Ok(heap)
    }

    /// Maps and publishes segments for at least `bytes` more (rounded up to
    /// whole segments) while others allocate; returns the bytes added, which
    /// are fewer than asked (down to 0) where the limit or the reservation
    /// ends. If a driver call fails, the segment it was making is undone,
    /// segments completed before it stay mapped and published, and the
    /// error names the call.
    pub fn grow(&self, bytes: u64) -> Result<u64> {
        let segment_bytes = self.shared.segment_bytes();
        let want = bytes.div_ceil(segment_bytes).min(u32::MAX as u64) as u32;
        Ok(self.shared.grow_segments(want)? as u64 * segment_bytes)
    }

    /// Withdraws every wholly free segment, unmaps it and releases its
    /// physical memory to the driver; returns the bytes released. Safe while
    /// others allocate (they then find less free memory, or none).
    pub fn trim(&self) -> Result<u64> {
        self.trim_keeping(0)
    }

    /// Like [`VmmHeap::trim`], but leaves about `keep` free segments mapped
    /// (the count is a snapshot taken before the withdrawal).
    pub fn trim_keeping(&self, keep: u32) -> Result<u64> {
        Ok(self.shared.trim_segments(keep)? as u64 * self.shared.segment_bytes())
    }

    /// One contiguous range of `bytes` (rounded up to whole segments),
    /// stitched from free segments wherever they lie in the heap: their
    /// physical chunks are moved, in order, under a stretch of absent
    /// segments (the lowest one long enough), and the stretch is published
    /// in the device metadata as a live run, so device code frees it with
    /// `free` like any allocation (the host with [`VmmHeap::free_large`]).
    /// Segments short of what is free are created and mapped as `grow`
    /// maps them, within the limit. Works where `malloc` of the same size
    /// finds no contiguous free run; see `docs/vmm-heap-large.md`.
    ///
    /// Errors: [`Error::NoRoom`] when the reservation has no stretch of
    /// absent segments that long, or free segments plus the room under the
    /// limit fall short (nothing changed); a driver call that fails is
    /// named and everything this call did is undone (what an undo could
    /// not undo is stranded, given back on drop).
    pub fn alloc_large(&self, bytes: u64) -> Result<LargeRange> {
        self.shared.alloc_large(bytes)
    }

    /// Frees, from the host, a range [`VmmHeap::alloc_large`] returned (or
    /// any allocation of the heap): `Heap::free` of `address`, on the GPU
    /// by the `heap_free` kernel on the heap's own stream. Its segments
    /// become free segments of the tree, mapped, which `trim` may give
    /// back. A pointer the heap did not hand out is counted as an invalid
    /// free, as device code's would be.
    pub fn free_large(&self, address: u64) -> Result<()> {
        self.shared.tree.free(address)
    }

    /// Forgets every allocation at once: the metadata goes back to its
    /// initial image with every mapped segment wholly free in the tree; the
    /// mapping is kept (a fresh heap of the size grown to, as a benchmark
    /// round wants it). Only when no kernel or thread uses the heap and no
    /// pointer into it is kept.
    pub fn reset(&mut self) -> Result<()> {
        let s = &self.shared;
        let ledger = s.ledger();
        s.tree.quiesce()?;
        let present: Vec<u32> = (0..s.segments)
            .filter(|id| !ledger.absent.contains(id) && !ledger.stranded.contains(id))
            .collect();
        // Grown segments are the lowest absent ids, so `present` is almost
        // always a prefix, which the initial image writes at once; any
        // others are published one by one.
        let prefix = present
            .iter()
            .zip(0u32..)
            .take_while(|&(&id, i)| id == i)
            .count();
        s.tree.reset(prefix as u32)?;
        let rest = &present[prefix..];
        let added = if rest.is_empty() {
            0
        } else {
            s.tree.add(rest)?
        };
        if added as usize != rest.len() {
            return Err(Error::Check(format!(
                "resetting the heap republished {added} of {} segments",
                rest.len()
            )));
        }
        Ok(())
    }

    /// Empties the per-class slots so partly used blocks go back to their
    /// segments (safe while others allocate). `trim` does it first.
    pub fn flush(&self) -> Result<()> {
        self.shared.tree.flush()
    }

    /// Starts the growth service (see [`GrowthPolicy`]); an error if it is
    /// running already or the policy cannot work.
    pub fn start_growth(&mut self, policy: GrowthPolicy) -> Result<()> {
        if self.service.is_some() {
            return Err(Error::Config(
                "the growth service is running already".into(),
            ));
        }
        self.service = Some(service::Service::start(self.shared.clone(), policy)?);
        Ok(())
    }

    /// Stops the growth service and waits for its thread; returns the last
    /// error it met, if any. Does nothing when it is not running.
    pub fn stop_growth(&mut self) -> Option<String> {
        self.service.take().and_then(service::Service::stop)
    }

    /// The last error the growth service met (it keeps running).
    pub fn growth_error(&self) -> Option<String> {
        self.service.as_ref().and_then(|s| s.last_error())
    }

    /// The driver.
    pub fn driver(&self) -> &D {
        &self.shared.driver
    }

    /// The segment tree's host handle.
    pub fn tree(&self) -> &M {
        &self.shared.tree
    }

    /// Bytes of one segment.
    pub fn segment_bytes(&self) -> u64 {
        self.shared.segment_bytes()
    }

    /// Address of segment 0.
    pub fn data_address(&self) -> u64 {
        self.shared.data
    }

    /// What the heap holds and has done (the allocator's own view:
    /// [`VmmHeap::heap_stats`]). Fails only where counting the free
    /// segments needs the GPU.
    pub fn stats(&self) -> Result<VmmHeapStats> {
        let s = &self.shared;
        let ledger = s.ledger();
        let free_segments = s.tree.free_segments()?;
        let c = &s.counters;
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Ok(VmmHeapStats {
            reserved_bytes: s.reservation.1,
            virtual_bytes: (s.segments as u64) << s.segment_shift,
            mapped_bytes: ledger.mapped.len() as u64 * s.driver.granularity(),
            segment_bytes: s.segment_bytes(),
            present_segments: ledger.present,
            free_segments,
            stranded_segments: ledger.stranded.len() as u32,
            limit_segments: s.limit_segments,
            metadata_bytes: s.metadata_bytes,
            grows: load(&c.grows),
            segments_grown: load(&c.segments_grown),
            grow_nanos: load(&c.grow_nanos),
            trims: load(&c.trims),
            segments_trimmed: load(&c.segments_trimmed),
            trim_nanos: load(&c.trim_nanos),
            large_allocs: load(&c.large_allocs),
            segments_stitched: load(&c.segments_stitched),
            large_nanos: load(&c.large_nanos),
            run_requests_served: load(&c.run_requests_served),
            run_requests_refused: load(&c.run_requests_refused),
            run_requests_abandoned: load(&c.run_requests_abandoned),
            device: s.driver.device_ordinal() as usize,
            peer_access: s.peers.iter().map(|&p| p as usize).collect(),
            driver: s.driver.counters(),
        })
    }

    /// What the allocator holds (exact when no one is using the heap).
    pub fn heap_stats(&self) -> Result<HeapStats> {
        self.shared.tree.stats()
    }
}

impl<D: VmmDriver, M: SegmentTree> Shared<D, M> {
    fn segment_bytes(&self) -> u64 {
        1 << self.segment_shift
    }

    fn segment_address(&self, id: u32) -> u64 {
        self.data + ((id as u64) << self.segment_shift)
    }

    /// What a failed `cuMemSetAccess` was doing, naming the devices.
    fn granting(&self) -> String {
        let own = self.driver.device_ordinal();
        if self.peers.is_empty() {
            format!("granting access (device {own})")
        } else {
            let mut all = vec![own];
            all.extend(&self.peers);
            format!("granting access (devices {all:?})")
        }
    }

    /// The ledger, locked. Releasing it sets the heap's budget to the
    /// segments present ([`SegmentTree::set_budget`]): every change to what
    /// is mapped is made under this lock, so the handles made after it
    /// (each launch's, each `heap()`) count what is mapped, whatever path
    /// (an early return included) changed it.
    fn ledger(&self) -> LockedLedger<'_, M> {
        LockedLedger {
            // Every change to the ledger is made right after the driver call
            // it records, so a panic elsewhere leaves it true.
            guard: self.ledger.lock().unwrap_or_else(|e| e.into_inner()),
            tree: &self.tree,
        }
    }

    /// Maps and publishes up to `want` absent segments (lowest ids first),
    /// within the limit; returns how many.
    fn grow_segments(&self, want: u32) -> Result<u32> {
        let start = Instant::now();
        let mut ledger = self.ledger();
        let room = self
            .limit_segments
            .saturating_sub(ledger.present + ledger.stranded.len() as u32);
        let ids: Vec<u32> = ledger
            .absent
            .iter()
            .copied()
            .take(want.min(room) as usize)
            .collect();
        let mut mapped = Vec::with_capacity(ids.len());
        let mut failure = None;
        for &id in &ids {
            match self.map_segment(&mut ledger, id) {
                Ok(()) => mapped.push(id),
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        for id in &mapped {
            ledger.absent.remove(id);
        }
        let published = if mapped.is_empty() {
            Ok(0)
        } else {
            self.tree.add(&mapped)
        };
        match published {
            Ok(n) if n as usize == mapped.len() => ledger.present += n,
            other => {
                // The tree may hold some of them: never unmap those.
                ledger.stranded.extend(&mapped);
                mapped.clear();
                let e = match other {
                    Err(e) => e,
                    Ok(n) => Error::Check(format!(
                        "publishing {} grown segments added only {n}: one was not absent",
                        ids.len()
                    )),
                };
                failure.get_or_insert(e);
            }
        }
        if !mapped.is_empty() {
            let c = &self.counters;
            c.grows.fetch_add(1, Ordering::Relaxed);
            c.segments_grown
                .fetch_add(mapped.len() as u64, Ordering::Relaxed);
            c.grow_nanos
                .fetch_add(nanos_since(start), Ordering::Relaxed);
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(mapped.len() as u32),
        }
    }

    /// Creates and maps every chunk of segment `id` and grants access to
    /// it; on failure undoes what it did (what the undo could not undo
    /// stays in the ledger, given back on drop) and names the call.
    fn map_segment(&self, ledger: &mut Ledger, id: u32) -> Result<()> {
        let base = self.segment_address(id);
        let g = self.driver.granularity();
        let doing = |what: &str| format!("growing the heap: {what} of segment {id} at {base:#x}");
        let mut failed = None;
        for addr in (base..base + self.segment_bytes()).step_by(g as usize) {
            let chunk = match self.driver.create() {
                Ok(c) => c,
                Err(e) => {
                    failed = Some(vmm(doing("creating a chunk"))(e));
                    break;
                }
            };
            if let Err(e) = self.driver.map(addr, chunk) {
                ledger.unmapped.push(chunk);
                failed = Some(vmm(doing("mapping a chunk"))(e));
                break;
            }
            ledger.mapped.insert(addr, chunk);
        }
        if failed.is_none()
            && let Err(e) = self
                .driver
                .set_access_for(base, self.segment_bytes(), &self.peers)
        {
            failed = Some(vmm(doing(&self.granting()))(e));
        }
        let Some(e) = failed else { return Ok(()) };
        if self.unmap_range(ledger, base).is_err() {
            // Chunks stay mapped here: never map this segment again.
            ledger.absent.remove(&id);
            ledger.stranded.insert(id);
        }
        Err(e)
    }

    /// Unmaps every granule of the segment at `base` that the ledger holds
    /// (second mappings first: their chunks are owned elsewhere and stay),
    /// then releases every chunk waiting for release.
    fn unmap_range(
        &self,
        ledger: &mut Ledger,
        base: u64,
    ) -> std::result::Result<(), DriverFailure> {
        let range = base..base + self.segment_bytes();
        let aliases: Vec<u64> = ledger
            .aliases
            .range(range.clone())
            .map(|(&a, _)| a)
            .collect();
        for addr in aliases {
            self.driver.unmap(addr)?;
            ledger.aliases.remove(&addr);
        }
        let granules: Vec<(u64, ChunkHandle)> =
            ledger.mapped.range(range).map(|(&a, &c)| (a, c)).collect();
        for (addr, chunk) in granules {
            self.driver.unmap(addr)?;
            ledger.mapped.remove(&addr);
            ledger.unmapped.push(chunk);
        }
        while let Some(&chunk) = ledger.unmapped.last() {
            self.driver.release(chunk)?;
            ledger.unmapped.pop();
        }
        Ok(())
    }

    /// Flushes, withdraws wholly free segments beyond `keep`, unmaps and
    /// releases them; returns how many were released.
    fn trim_segments(&self, keep: u32) -> Result<u32> {
        let start = Instant::now();
        let mut ledger = self.ledger();
        self.tree.flush()?;
        let free = self.tree.free_segments()?;
        let withdrawn = self.tree.withdraw(free.saturating_sub(keep))?;
        let mut released = 0;
        let mut failure = None;
        for &id in &withdrawn {
            // A segment whose publish failed may have reached the tree: out
            // of it now, it is safe to unmap like any other.
            if !ledger.stranded.remove(&id) {
                ledger.present -= 1;
            }
            match self.unmap_range(&mut ledger, self.segment_address(id)) {
                Ok(()) => {
                    ledger.absent.insert(id);
                    released += 1;
                }
                Err(e) => {
                    ledger.stranded.insert(id);
                    failure.get_or_insert(vmm(format!(
                        "trimming the heap: unmapping segment {id} at {:#x}",
                        self.segment_address(id)
                    ))(e));
                }
            }
        }
        if released > 0 {
            let c = &self.counters;
            c.trims.fetch_add(1, Ordering::Relaxed);
            c.segments_trimmed
                .fetch_add(released as u64, Ordering::Relaxed);
            c.trim_nanos
                .fetch_add(nanos_since(start), Ordering::Relaxed);
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(released),
        }
    }
}

impl<D: VmmDriver, M: SegmentTree> Drop for Shared<D, M> {
    /// Waits for the heap's users the tree can see, then unmaps and releases
    /// everything still mapped and frees the reservation. Never panics: a
    /// failure is reported on stderr and what it concerned is left to the
    /// driver (CUDA frees it with the context).
    fn drop(&mut self) {
        if let Err(e) = self.tree.quiesce() {
            eprintln!("gpumalloc: dropping a VMM heap: waiting for its kernels: {e}");
        }
        let ledger = self.ledger.get_mut().unwrap_or_else(|e| e.into_inner());
        let mut first: Option<DriverFailure> = None;
        // Second mappings first: their chunks are released once, through
        // their owners in `mapped`.
        for &addr in ledger.aliases.keys() {
            if let Err(e) = self.driver.unmap(addr) {
                first.get_or_insert(e);
            }
        }
        ledger.aliases.clear();
        for (&addr, &chunk) in &ledger.mapped {
            match self.driver.unmap(addr) {
                Ok(()) => ledger.unmapped.push(chunk),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        let all_unmapped = first.is_none();
        ledger.mapped.clear();
        for chunk in ledger.unmapped.drain(..) {
            if let Err(e) = self.driver.release(chunk) {
                first.get_or_insert(e);
            }
        }
        if all_unmapped {
            let (base, bytes) = self.reservation;
            if let Err(e) = self.driver.free_address(base, bytes) {
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            eprintln!("gpumalloc: dropping a VMM heap: {e}");
        }
    }
}

impl<D: VmmDriver, M: SegmentTree> Drop for VmmHeap<D, M> {
    /// Stops the growth service (joins its thread; a panic in it is
    /// reported, not propagated); the memory goes with the last `Shared`.
    fn drop(&mut self) {
        if let Some(s) = self.service.take()
            && let Some(e) = s.stop()
        {
            eprintln!("gpumalloc: the VMM heap's growth service had failed: {e}");
        }
    }
}
