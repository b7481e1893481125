//! CPU tests of the lake's spill to host memory (`LakeConfig::spill_to_host`)
//! on the model driver, whose device is made small with
//! `ModelVmm::set_device_bytes` so that `cuMemCreate` runs out of memory.
//!
//! Workloads: a full device with and without the spill (host chunks made,
//! counted apart from reserved, data round trips through them, released by
//! trim; without the spill the same request is out of memory); the same
//! alloc/free sequence on a small spilling device and on a large one
//! (identical addresses, outcomes and trace: the spill changes where bytes
//! live, not the allocation trace); a stitched view over device and host
//! chunks; the limit with the spill on; an injected failure of a host
//! chunk's creation (rolled back); a seeded random sequence checked after
//! every step; the pool's statistics.

use gpu_kernels::workload::SplitMix64;

use lake::pluggable::{ModelEvents, StreamId, StreamPool};
use lake::{
    ChunkOptions, DeviceRange, EventKind, Lake, LakeConfig, LakeError, ModelCensus, ModelVmm, Site,
    Trace, VmmCall,
};

/// Model granularity: small, so host backing is cheap.
const G: u64 = 64 << 10;

/// A lake of at most `limit_chunks` chunks on a model device of
/// `device_chunks` (`None`: unlimited), spilling or not.
fn lake(limit_chunks: u64, device_chunks: Option<u64>, spill: bool) -> Lake<ModelVmm> {
    let vmm = ModelVmm::new(G, ChunkOptions::default());
    vmm.set_device_bytes(device_chunks.map(|c| c * G));
    let config = LakeConfig {
        spill_to_host: spill,
        ..LakeConfig::with_limit(limit_chunks * G)
    };
    Lake::new(vmm, config)
}

/// A byte pattern unique to (tag, position).
fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8 | 1)
        .collect()
}

/// Writes a tag pattern through the range and reads it back, whole and
/// chunk by chunk at each chunk's home mapping.
fn round_trip(lake: &Lake<ModelVmm>, r: DeviceRange, tag: u64) {
    let len = (r.len.div_ceil(G) * G) as usize;
    let data = pattern(tag, len);
    lake.driver().write(r.addr, &data).unwrap();
    assert_eq!(lake.driver().read(r.addr, len).unwrap(), data);
    for (i, &h) in lake.chunk_homes(r).unwrap().iter().enumerate() {
        let part = &data[i * G as usize..(i + 1) * G as usize];
        assert_eq!(lake.driver().read(h, G as usize).unwrap(), part);
    }
}

fn census(chunks: usize, host_chunks: usize) -> (usize, usize) {
    (chunks, host_chunks)
}

fn chunks_of(c: ModelCensus) -> (usize, usize) {
    (c.chunks, c.host_chunks)
}

#[test]
fn a_full_device_spills_to_host_and_trim_gives_it_back() {
    let l = lake(64, Some(4), true);
    let a = l.alloc(3 * G).unwrap();
    assert_eq!(l.stats().spilled_bytes, 0);
    // One chunk fits on the device, the other two go to host memory.
    let b = l.alloc(3 * G).unwrap();
    assert_eq!(chunks_of(l.driver().census()), census(6, 2));
    let st = l.stats();
    assert_eq!(
        (
            st.reserved_bytes,
            st.spilled_bytes,
            st.spilled_chunks,
            st.spills
        ),
        (4 * G, 2 * G, 2, 2),
        "spilled bytes are counted apart from reserved"
    );
    assert_eq!(
        (st.peak_reserved_bytes, st.peak_spilled_bytes),
        (4 * G, 2 * G)
    );
    assert_eq!(
        st.breakdown.total(),
        st.reserved_bytes + st.spilled_bytes,
        "the breakdown covers device and host chunks"
    );
    round_trip(&l, a, 1);
    round_trip(&l, b, 2);
    assert_eq!(
        l.driver().read(a.addr, 3 * G as usize).unwrap(),
        pattern(1, 3 * G as usize),
        "writing the spilled range left the other alone"
    );
    l.check().unwrap();
    l.free(a).unwrap();
    l.free(b).unwrap();
    assert_eq!(l.trim().unwrap(), 6 * G, "trim releases host chunks too");
    assert_eq!(l.driver().census(), ModelCensus::default());
    let st = l.stats();
    assert_eq!(
        (st.reserved_bytes, st.spilled_bytes, st.spilled_chunks),
        (0, 0, 0)
    );
    assert_eq!(
        (st.peak_spilled_bytes, st.spills),
        (2 * G, 2),
        "history stays"
    );
    // The device has room again: it is asked first.
    let c = l.alloc(4 * G).unwrap();
    assert_eq!(chunks_of(l.driver().census()), census(4, 0));
    l.free(c).unwrap();
    l.check().unwrap();
}

#[test]
fn without_the_spill_a_full_device_is_out_of_memory() {
    let l = lake(64, Some(4), false);
    let a = l.alloc(3 * G).unwrap();
    let err = l.alloc(3 * G).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("cuMemCreate failed"), "{err}");
    assert_eq!(chunks_of(l.driver().census()), census(3, 0), "rolled back");
    assert_eq!(l.stats().spills, 0);
    l.free(a).unwrap();
    l.check().unwrap();
}

/// The events of a trace without their times: (kind, size, address, site).
type Requests = Vec<(EventKind, u64, u64, Site)>;

fn requests(t: &Trace) -> Requests {
    t.events
        .iter()
        .map(|e| (e.kind, e.size, e.addr, e.site))
        .collect()
}

/// Runs a fixed alloc/free sequence (forward grows, backward shrinks, three
/// steps with a long temporary that stitches) and returns the addresses
/// handed out, the outcomes and the trace's requests.
fn training_steps(l: &Lake<ModelVmm>) -> (Vec<u64>, lake::Outcomes, Requests) {
    l.start_trace();
    let mut addrs = Vec::new();
    let mut keep: Vec<DeviceRange> = Vec::new();
    for step in 0..3u64 {
        for layer in 0..6u64 {
            let r = l.alloc((1 + (layer + step) % 3) * G - 100).unwrap();
            addrs.push(r.addr);
            keep.push(r);
            if layer % 2 == 1 {
                let t = l.alloc(5 * G).unwrap();
                addrs.push(t.addr);
                l.free(t).unwrap();
            }
        }
        let logits = l.alloc((7 + step) * G).unwrap();
        addrs.push(logits.addr);
        while let Some(r) = keep.pop() {
            l.free(r).unwrap();
        }
        l.free(logits).unwrap();
    }
    l.check().unwrap();
    (
        addrs,
        l.stats().outcomes,
        requests(&l.take_trace().unwrap()),
    )
}

#[test]
fn spilling_keeps_the_addresses_outcomes_and_trace_of_a_larger_device() {
    let large = lake(1024, None, false);
    let small = lake(1024, Some(8), true);
    let (want, want_outcomes, want_trace) = training_steps(&large);
    let (got, got_outcomes, got_trace) = training_steps(&small);
    assert!(small.stats().spills > 0, "the small device spilled");
    assert_eq!(large.stats().spills, 0);
    assert_eq!(got, want, "the same addresses");
    assert_eq!(got_outcomes, want_outcomes, "the same placements");
    assert!(!got_trace.is_empty());
    assert_eq!(got_trace, want_trace, "the same trace");
    assert_eq!(
        small.stats().reserved_bytes + small.stats().spilled_bytes,
        large.stats().reserved_bytes
    );
}

#[test]
fn a_stitched_view_maps_device_and_host_chunks_together() {
    let l = lake(64, Some(2), true);
    let parts: Vec<DeviceRange> = (0..4).map(|_| l.alloc(G).unwrap()).collect();
    assert_eq!(chunks_of(l.driver().census()), census(4, 2));
    // A device chunk (0) and a host chunk (2), not adjacent: stitched.
    l.free(parts[0]).unwrap();
    l.free(parts[2]).unwrap();
    let both = l.alloc(2 * G).unwrap();
    assert!(l.is_stitched(both));
    assert_eq!(l.stats().spills, 2, "no new chunk");
    round_trip(&l, both, 7);
    l.check().unwrap();
}

#[test]
fn with_the_spill_chunks_past_the_limit_go_to_host_memory() {
    // The limit caps device memory: without the spill it refuses, with it
    // the chunks past it are host memory.
    let strict = lake(4, None, false);
    assert!(matches!(
        strict.alloc(6 * G),
        Err(LakeError::OutOfMemory { .. })
    ));
    let l = lake(4, None, true);
    let r = l.alloc(6 * G).unwrap();
    let st = l.stats();
    assert_eq!((st.reserved_bytes, st.spilled_bytes), (4 * G, 2 * G));
    round_trip(&l, r, 3);
    l.free(r).unwrap();
    l.check().unwrap();
}

#[test]
fn a_failed_host_chunk_rolls_the_request_back() {
    let l = lake(64, Some(1), true);
    let a = l.alloc(G).unwrap();
    // Call 1: the device create (out of memory); call 2: the host create.
    l.driver().fail_nth(VmmCall::Create, 2);
    let err = l.alloc(3 * G).unwrap_err();
    assert!(err.to_string().contains("cuMemCreate failed"), "{err}");
    assert!(!err.is_out_of_memory(), "an injected fault: {err}");
    assert_eq!(chunks_of(l.driver().census()), census(1, 0));
    let st = l.stats();
    assert_eq!((st.spilled_bytes, st.spills), (0, 0));
    l.check().unwrap();
    let b = l.alloc(3 * G).unwrap();
    assert_eq!(chunks_of(l.driver().census()), census(4, 3));
    round_trip(&l, b, 4);
    l.free(a).unwrap();
    l.free(b).unwrap();
    l.check().unwrap();
}

#[test]
fn random_sequences_on_a_spilling_device_keep_every_invariant() {
    for seed in [5, 6, 0xfeed] {
        let l = lake(256, Some(24), true);
        let mut rng = SplitMix64(seed);
        let mut live: Vec<(DeviceRange, u64)> = Vec::new();
        for step in 0..400u64 {
            if live.is_empty() || rng.next_u64().is_multiple_of(2) {
                let size = 1 + rng.next_u64() % (10 * G);
                let r = l.alloc(size).unwrap();
                let data = pattern(step, size as usize);
                l.driver().write(r.addr, &data).unwrap();
                live.push((r, step));
            } else {
                let i = (rng.next_u64() % live.len() as u64) as usize;
                let (r, tag) = live.swap_remove(i);
                assert_eq!(
                    l.driver().read(r.addr, r.len as usize).unwrap(),
                    pattern(tag, r.len as usize),
                    "seed {seed} step {step}: allocation {:#x} kept its bytes",
                    r.addr
                );
                l.free(r).unwrap();
            }
            if step % 50 == 49 {
                l.trim().unwrap();
            }
            l.check()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            let c = l.driver().census();
            assert!(
                c.chunks - c.host_chunks <= 24,
                "the device holds at most 24"
            );
            let st = l.stats();
            assert_eq!(st.spilled_bytes, c.host_chunks as u64 * G);
            assert_eq!(st.reserved_bytes, (c.chunks - c.host_chunks) as u64 * G);
        }
        assert!(l.stats().spills > 0, "seed {seed}: the device filled up");
        for (r, _) in live.drain(..) {
            l.free(r).unwrap();
        }
        l.trim().unwrap();
        assert_eq!(l.driver().census(), ModelCensus::default(), "seed {seed}");
    }
}

#[test]
fn the_pool_reports_spilled_bytes_apart_from_reserved() {
    let vmm = ModelVmm::new(G, ChunkOptions::default());
    vmm.set_device_bytes(Some(4 * G));
    let config = LakeConfig {
        spill_to_host: true,
        ..LakeConfig::with_limit(64 * G)
    };
    let p = StreamPool::new(Lake::new(vmm, config), ModelEvents::completing());
    let s = StreamId(1);
    let a = p.alloc(6 * G, s).unwrap();
    let st = p.stats();
    assert_eq!(
        (
            st.reserved_bytes,
            st.spilled_bytes,
            st.spilled_chunks,
            st.spills
        ),
        (4 * G, 2 * G, 2, 2)
    );
    assert_eq!(
        (st.peak_reserved_bytes, st.peak_spilled_bytes),
        (4 * G, 2 * G)
    );
    assert_eq!(st.breakdown.total(), st.reserved_bytes + st.spilled_bytes);
    assert_eq!(st.ooms, 0, "no out of memory: the request spilled");
    p.free(a, s).unwrap();
    p.empty_cache().unwrap();
    let st = p.stats();
    assert_eq!((st.spilled_bytes, st.peak_spilled_bytes), (0, 2 * G));
    p.reset_peaks();
    assert_eq!(p.stats().peak_spilled_bytes, 0);
    p.check().unwrap();
}
