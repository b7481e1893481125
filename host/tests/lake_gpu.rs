//! GPU tests of `host::lake` on a real device through `CudaVmm`: real chunks,
//! data written through primitive ranges read back through a stitched
//! range. Without a GPU each test prints one `skipped: no GPU (<reason>)`
//! line and returns.

use host::Gpu;
use host::lake::{ChunkOptions, CudaVmm, DeviceRange, Lake, LakeConfig, VmmCall, VmmDriver};

/// Opens device 0, or says why the test is skipped.
fn open() -> Option<CudaVmm> {
    if let Err(e) = Gpu::available() {
        println!("skipped: no GPU ({e})");
        return None;
    }
    Some(CudaVmm::open(0, ChunkOptions::default()).expect("open device 0"))
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
    let Some(vmm) = open() else { return };
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
    if Gpu::available().is_err() {
        println!("skipped: no GPU ({})", Gpu::available().unwrap_err());
        return;
    }
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
