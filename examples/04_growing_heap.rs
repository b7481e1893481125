//! Example 04: a heap that grows while your kernel allocates.
//!
//! A heap on CUDA virtual memory (`CudaVmmHeap`) reserves a large range of
//! addresses (64 GiB here) but maps physical memory only for a part of it
//! (256 MiB at first). Its growth service, a host thread the heap owns,
//! maps more segments whenever the free ones run low (up to a limit, 4 GiB
//! here). Your kernel (`user_grow_fill`) asks for 2 GiB in all, 8 times what
//! is mapped, with `Heap::malloc_waiting`: a request the heap cannot meet
//! yet waits (up to a bound) for the service instead of returning null. A
//! second kernel (`user_grow_check_free`) checks every word and frees;
//! `trim` then gives the memory back to the driver. The host prints what was
//! mapped before, after the kernel and after the trim.
//!
//! One handle, opened with your crate's PTX only: the heap's own kernels
//! (`heap_grow`, `heap_trim`, `heap_flush`, which the service and `trim`
//! launch on a stream of their own) come from the host crate, which loads
//! them into the same context the first time the heap needs them.
//!
//! Run: `cargo run --release --example 04_growing_heap`

use std::time::{Duration, Instant};

use gpumalloc::gpu::Arg;
use gpumalloc::lake::{ChunkOptions, CudaVmm};
use gpumalloc::vmm_heap::{CudaVmmHeap, VmmHeapConfig};
use gpumalloc::{Gpu, GrowthPolicy};

/// The user crate's PTX: its own kernels only.
const USER_PTX: &str = include_str!(env!("GPUMALLOC_USER_KERNEL_PTX_PATH"));

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Virtual bytes the heap reserves (16 MiB segments at this size).
const RESERVE: u64 = 64 * GIB;
/// Bytes mapped when the heap is created.
const INITIAL: u64 = 256 * MIB;
/// The most the growth service may map.
const LIMIT: u64 = 4 * GIB;
/// Threads of the kernel, each taking `BYTES`: 2 GiB in all.
const THREADS: u64 = 2048;
const BYTES: u64 = MIB;
/// How long a request waits for the service before it gives up (null).
const WAIT_NS: u64 = 2_000_000_000;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(e) = Gpu::available() {
        println!("skipped: no GPU ({e})");
        return Ok(());
    }
    let gpu = Gpu::open(0, USER_PTX)?;
    // One physical chunk per 16 MiB segment: one create and one map per
    // segment the heap grows by.
    let vmm = CudaVmm::open_with_chunk(0, ChunkOptions::default(), Some(16 * MIB))?;
    let mut config = VmmHeapConfig::new(RESERVE, INITIAL);
    config.max_mapped_bytes = Some(LIMIT);
    let mut heap = CudaVmmHeap::on_gpu(&gpu, vmm, config)?;
    let before = heap.stats()?;
    println!(
        "04_growing_heap on {}: reserved {} GiB of addresses, mapped {} MiB \
         ({} segments of {} MiB), may grow to {} GiB",
        gpu.name()?,
        before.virtual_bytes / GIB,
        before.mapped_bytes / MIB,
        before.present_segments,
        before.segment_bytes / MIB,
        LIMIT / GIB
    );

    // Keep 16 segments (256 MiB) free: map 16 more whenever fewer are left.
    heap.start_growth(GrowthPolicy {
        low_free_segments: 16,
        step_segments: 16,
        poll: Duration::from_micros(100),
    })?;
    let ptrs = gpu.zeros(THREADS as usize)?;
    let start = Instant::now();
    gpu.launch(
        "user_grow_fill",
        THREADS,
        &[
            heap.arg(),
            Arg::U64(BYTES),
            Arg::U64(WAIT_NS),
            Arg::U64(gpu.address(&ptrs)),
            Arg::U64(THREADS),
        ],
    )?;
    gpu.sync()?;
    let ms = start.elapsed().as_secs_f64() * 1e3;
    let nulls = gpu.download(&ptrs)?.iter().filter(|&&p| p == 0).count();
    let grown = heap.stats()?;
    println!(
        "  {THREADS} threads took {} MiB each ({} GiB) and filled it in {ms:.1} ms: {nulls} nulls; \
         the service grew the heap {} times, {} segments in {:.1} ms: mapped {} MiB",
        BYTES / MIB,
        THREADS * BYTES / GIB,
        grown.grows,
        grown.segments_grown,
        grown.grow_nanos as f64 / 1e6,
        grown.mapped_bytes / MIB
    );

    let wrong = gpu.zeros(THREADS as usize)?;
    gpu.launch(
        "user_grow_check_free",
        THREADS,
        &[
            heap.arg(),
            Arg::U64(BYTES),
            Arg::U64(gpu.address(&ptrs)),
            Arg::U64(gpu.address(&wrong)),
            Arg::U64(THREADS),
        ],
    )?;
    let wrong_words: u64 = gpu.download(&wrong)?.iter().sum();
    let service_error = heap.stop_growth();
    let live = heap.heap_stats()?.live_bytes;
    let released = heap.trim()?;
    let after = heap.stats()?;
    println!(
        "  checked and freed: {wrong_words} wrong words, live bytes {live}; \
         trim gave {} MiB back to the driver: mapped {} MiB",
        released / MIB,
        after.mapped_bytes / MIB
    );

    if let Some(e) = service_error {
        return Err(format!("the growth service failed: {e}").into());
    }
    if nulls != 0 || wrong_words != 0 {
        return Err(format!("{nulls} requests got null, {wrong_words} words were wrong").into());
    }
    if grown.mapped_bytes < THREADS * BYTES {
        let mapped = grown.mapped_bytes / MIB;
        return Err(format!("the heap did not grow enough: {mapped} MiB mapped").into());
    }
    if live != 0 {
        return Err("memory left allocated".into());
    }
    if after.mapped_bytes >= grown.mapped_bytes {
        return Err("trim gave nothing back".into());
    }
    Ok(())
}
