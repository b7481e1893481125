//! GPU tests of `lake` on a real device through `CudaVmm`: real chunks,
//! data written through primitive ranges read back through a stitched
//! range; chunks spilled to host memory (`LakeConfig::spill_to_host`), made
//! by filling the device, that hold data and take no device memory. The
//! tests are `#[ignore]`d; run with `--include-ignored` on a machine
//! without a GPU each fails, saying so, rather than passing unchecked.
//! The tests take [`gpu_lock`] in turn: one fills the whole device.

use std::sync::{Mutex, MutexGuard};

use host::Gpu;
use lake::{ChunkOptions, CudaVmm, DeviceRange, Lake, LakeConfig, VmmCall, VmmDriver};

/// One test on the device at a time (the spill test fills it).
fn gpu_lock() -> MutexGuard<'static, ()> {
    static GPU: Mutex<()> = Mutex::new(());
    GPU.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens device 0.
fn open() -> CudaVmm {
    Gpu::require_for_test();
    CudaVmm::open(0, ChunkOptions::default()).expect("open device 0")
}

/// A byte pattern unique to (tag, position); never all zeros.
fn pattern(tag: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| tag.wrapping_mul(37).wrapping_add((i % 251) as u8) | 1)
        .collect()
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn primitive_writes_read_back_through_a_stitched_range() {
    let _gpu = gpu_lock();
    let vmm = open();
    let g = vmm.granularity();
    println!("granularity {g} bytes");
    let lake = Lake::new(vmm, LakeConfig::with_limit(64 * g));
    let blocks: Vec<DeviceRange> = (0..4).map(|_| lake.alloc(g).unwrap()).collect();
    for (i, r) in blocks.iter().enumerate() {
        lake.driver()
            .write(r.addr, &pattern(i as u8, g as usize))
            .unwrap();
    }
    // Free two blocks that are not adjacent; a 2-chunk request stitches them.
    lake.free(blocks[0]).unwrap();
    lake.free(blocks[2]).unwrap();
    let big = lake.alloc(2 * g).unwrap();
    assert!(lake.is_stitched(big), "expected a stitched range");
    let homes = lake.chunk_homes(big).unwrap();
    let mut want = Vec::new();
    for &h in &homes {
        want.extend(lake.driver().read(h, g as usize).unwrap());
    }
    let got = lake.driver().read(big.addr, 2 * g as usize).unwrap();
    assert!(
        got == want,
        "stitched range differs from its chunks' primitive ranges"
    );
    // Written through the stitch, read at home.
    let fresh = pattern(99, 4096);
    lake.driver().write(big.addr + g, &fresh).unwrap();
    assert_eq!(lake.driver().read(homes[1], fresh.len()).unwrap(), fresh);
    let st = lake.stats();
    println!(
        "driver calls {} ({} µs), maps {}, set-access {}",
        st.driver.total().calls,
        st.driver.total().nanos / 1000,
        st.driver.of(VmmCall::Map).calls,
        st.driver.of(VmmCall::SetAccess).calls
    );
    lake.free(big).unwrap();
    lake.free(blocks[1]).unwrap();
    lake.free(blocks[3]).unwrap();
    assert_eq!(lake.trim().unwrap(), 4 * g);
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn rdma_capable_chunks_map_and_hold_data() {
    let _gpu = gpu_lock();
    Gpu::require_for_test();
    let options = ChunkOptions {
        rdma_capable: true,
        peers: vec![],
    };
    let vmm = match CudaVmm::open(0, options) {
        Ok(v) => v,
        Err(e) => panic!("open device 0 with RDMA-capable chunks: {e}"),
    };
    let g = vmm.granularity();
    let lake = Lake::new(vmm, LakeConfig::with_limit(8 * g));
    match lake.alloc(3 * g) {
        Ok(r) => {
            let data = pattern(5, 3 * g as usize);
            lake.driver().write(r.addr, &data).unwrap();
            assert!(lake.driver().read(r.addr, data.len()).unwrap() == data);
            lake.free(r).unwrap();
        }
        // Some GPUs do not support GPUDirect RDMA: the error must name the call.
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains("cuMemCreate failed"), "{text}");
            println!("RDMA-capable chunks not supported here: {text}");
        }
    }
}

/// Chunk size of the spill tests: large, so filling an 80 GB device takes
/// about 1,300 chunks.
const SPILL_CHUNK: u64 = 64 << 20;

/// Opens device 0 with [`SPILL_CHUNK`] chunks.
fn open_for_spill() -> CudaVmm {
    Gpu::require_for_test();
    CudaVmm::open_with_chunk(0, ChunkOptions::default(), Some(SPILL_CHUNK))
        .expect("open device 0 with 64 MiB chunks")
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn host_chunks_hold_data_and_take_no_device_memory() {
    let _gpu = gpu_lock();
    let vmm = open_for_spill();
    let g = vmm.granularity();
    let n = 4u64;
    let base = vmm.reserve(2 * n * g).unwrap();
    let (free_before, total) = vmm.mem_info().unwrap();
    // Host chunks, mapped and granted to the device like device chunks.
    let host: Vec<_> = (0..n)
        .map(|_| {
            vmm.create_on_host()
                .unwrap_or_else(|e| panic!("host chunk through the VMM API: {e}"))
        })
        .collect();
    for (i, &h) in host.iter().enumerate() {
        vmm.map(base + i as u64 * g, h).unwrap();
    }
    vmm.set_access(base, n * g).unwrap();
    let (free_host, _) = vmm.mem_info().unwrap();
    // Device chunks after them, for contrast.
    let device: Vec<_> = (0..n).map(|_| vmm.create().unwrap()).collect();
    for (i, &h) in device.iter().enumerate() {
        vmm.map(base + (n + i as u64) * g, h).unwrap();
    }
    vmm.set_access(base + n * g, n * g).unwrap();
    let (free_device, _) = vmm.mem_info().unwrap();
    println!(
        "total {total}, free {free_before} -> {free_host} after {n} host chunks -> \
         {free_device} after {n} device chunks"
    );
    assert!(
        free_before.saturating_sub(free_host) < g,
        "host chunks took device memory: free {free_before} -> {free_host}"
    );
    assert!(
        free_host - free_device >= n * g,
        "device chunks should take device memory: free {free_host} -> {free_device}"
    );
    // A round trip (cuMemcpyHtoD, cuMemcpyDtoH) across host and device
    // chunks, one range.
    let data = pattern(11, (2 * n * g) as usize);
    vmm.write(base, &data).unwrap();
    assert!(vmm.read(base, data.len()).unwrap() == data);
    for i in 0..2 * n {
        vmm.unmap(base + i * g).unwrap();
    }
    for h in host.into_iter().chain(device) {
        vmm.release(h).unwrap();
    }
    vmm.free_address(base, 2 * n * g).unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn a_full_device_spills_to_host_and_the_bytes_round_trip() {
    let _gpu = gpu_lock();
    let vmm = open_for_spill();
    let g = vmm.granularity();
    let (free0, total) = vmm.mem_info().unwrap();
    let config = LakeConfig {
        spill_to_host: true,
        ..LakeConfig::with_limit(total)
    };
    let lake = Lake::new(vmm, config);
    // Fill the device one chunk at a time until the first spill.
    let most = total / g + 8;
    let mut ranges: Vec<DeviceRange> = Vec::new();
    while lake.stats().spills == 0 {
        assert!(
            (ranges.len() as u64) < most,
            "{} chunks made and no spill: the device never ran out",
            ranges.len()
        );
        let r = lake
            .alloc(g)
            .unwrap_or_else(|e| panic!("after {} chunks: {e}", ranges.len()));
        ranges.push(r);
    }
    let device_chunks = ranges.len() as u64 - 1;
    let (free_full, _) = lake.driver().mem_info().unwrap();
    println!(
        "device full after {device_chunks} chunks of {g} bytes (free {free0} -> {free_full} \
         of {total})"
    );
    assert!(
        device_chunks * g + free_full <= free0 + g,
        "the device chunks account for the free memory"
    );
    // More spilled chunks take no device memory.
    for _ in 0..4 {
        ranges.push(lake.alloc(g).unwrap());
    }
    let (free_more, _) = lake.driver().mem_info().unwrap();
    let st = lake.stats();
    assert_eq!(st.spilled_chunks, 5);
    assert_eq!(
        (st.spilled_bytes, st.reserved_bytes),
        (5 * g, device_chunks * g)
    );
    assert!(
        free_full.saturating_sub(free_more) < g,
        "spilled chunks took device memory: free {free_full} -> {free_more}"
    );
    // Bytes round trip through a spilled chunk ...
    let spilled = ranges[ranges.len() - 1];
    let data = pattern(21, g as usize);
    lake.driver().write(spilled.addr, &data).unwrap();
    assert!(lake.driver().read(spilled.addr, data.len()).unwrap() == data);
    // ... and through a stitched range over a device chunk and a host one.
    let device_range = ranges[0];
    lake.free(device_range).unwrap();
    lake.free(spilled).unwrap();
    let both = lake.alloc(2 * g).unwrap();
    assert!(lake.is_stitched(both), "expected a stitched range");
    assert_eq!(
        lake.stats().spills,
        5,
        "no new chunk for the stitched range"
    );
    let data = pattern(22, 2 * g as usize);
    lake.driver().write(both.addr, &data).unwrap();
    assert!(lake.driver().read(both.addr, data.len()).unwrap() == data);
    let homes = lake.chunk_homes(both).unwrap();
    for (i, &h) in homes.iter().enumerate() {
        let part = &data[i * g as usize..(i + 1) * g as usize];
        assert!(lake.driver().read(h, g as usize).unwrap() == part);
    }
    // Everything goes back, host chunks included.
    lake.free(both).unwrap();
    for r in ranges.into_iter().skip(1).filter(|r| *r != spilled) {
        lake.free(r).unwrap();
    }
    lake.trim().unwrap();
    let st = lake.stats();
    assert_eq!((st.reserved_bytes, st.spilled_bytes), (0, 0));
    let (free_end, _) = lake.driver().mem_info().unwrap();
    assert!(
        free_end + g >= free0,
        "device memory came back: {free0} -> {free_end}"
    );
}
