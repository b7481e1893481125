//! Example 01, the first to run: a kernel of your own allocates from a
//! gpumalloc heap.
//!
//! The path: your kernel crate (`examples/user-kernel`, which depends on
//! the allocator crate `gpu-kernel`) → `ptx_builder` in `build.rs` → PTX,
//! embedded here with `include_str!` → this host program, which opens the
//! GPU with that PTX, sets up a heap and passes it to the kernel by value.
//! In the kernel (`user_first_alloc`) each thread takes 64 bytes with
//! `heap.malloc`, writes them, reads them back and frees them. The host
//! checks every thread's answer and prints the heap's statistics.
//!
//! Run: `cargo run --release --example 01_first_alloc`

use gpumalloc::gpu::Arg;
use gpumalloc::{DeviceHeap, Gpu, HeapConfig};

/// The user crate's PTX: its own kernels only (the allocator is inlined
/// into them).
const USER_PTX: &str = include_str!(env!("GPUMALLOC_USER_KERNEL_PTX_PATH"));

/// What the kernel stores for a thread whose `malloc` returned null.
const NULL: u64 = u64::MAX;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(e) = Gpu::available() {
        println!("skipped: no GPU ({e})");
        return Ok(());
    }
    let gpu = Gpu::open(0, USER_PTX)?;
    let heap = DeviceHeap::new(&gpu, HeapConfig::with_bytes(256 << 20))?;
    let (threads, words) = (65_536u64, 8u64);
    let out = gpu.zeros(threads as usize)?;
    let args = [
        heap.arg(),
        Arg::U64(words),
        Arg::U64(gpu.address(&out)),
        Arg::U64(threads),
    ];
    gpu.launch("user_first_alloc", threads, &args)?;
    // Per thread: how many words read back right, or NULL.
    let right = gpu.download(&out)?;
    let nulls = right.iter().filter(|&&r| r == NULL).count();
    let wrong = right.iter().filter(|&&r| r != NULL && r != words).count();
    let stats = heap.stats()?;
    println!(
        "01_first_alloc on {}: {threads} threads each took {} B, wrote, read back and freed it: \
         {nulls} nulls, {wrong} with wrong words; heap after: live bytes {}, failed mallocs {}, \
         {} of {} segments free",
        gpu.name()?,
        words * size_of::<u64>() as u64,
        stats.live_bytes,
        stats.failed_mallocs,
        stats.free_segments,
        stats.segments
    );
    if nulls != 0 || wrong != 0 {
        return Err(format!("{nulls} threads got null, {wrong} read back wrong words").into());
    }
    if stats.live_bytes != 0 {
        return Err("memory left allocated".into());
    }
    Ok(())
}
