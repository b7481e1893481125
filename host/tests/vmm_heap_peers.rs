//! CPU tests of a VMM heap's peer access (issue 13, multi-GPU) on the model
//! driver: every mapping the heap makes (the initial one, `grow`, the
//! growth service, `alloc_large`'s stitched and new segments) grants
//! read-write access to the heap's device and to each device of
//! `VmmHeapConfig::peer_access`, and to no other; a refused grant is undone
//! with nothing mapped or leaked; configurations that cannot work are
//! refused before anything is reserved.
//!
//! The model is device 0 of an 8-GPU machine. It records the devices with
//! access per mapped granule (`ModelVmm::access_at`) and reads as a peer
//! would (`ModelVmm::read_on`), refusing a device without access, where a
//! GPU would fault.
//!
//! Workload: a 128 MiB reservation of 2 MiB segments on 512 KiB chunks (4
//! per segment) with 4 segments mapped, peers 1 and 3.

use std::sync::Arc;
use std::time::Duration;

use host::vmm::{ChunkOptions, ModelCensus, ModelVmm, VmmCall, VmmDriver};
use host::vmm_heap::{GrowthPolicy, ModelVmmHeap, VmmHeapConfig};

mod common;
use common::{assert_mapping_consistent, pattern};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Segments mapped at creation.
const INITIAL: u64 = 4;
/// The peers of the workload's heap.
const PEERS: [usize; 2] = [1, 3];
/// The devices that must have access: the model's own and the peers.
const GRANTED: [i32; 3] = [0, 1, 3];

fn model() -> Arc<ModelVmm> {
    Arc::new(ModelVmm::new(512 * KIB, ChunkOptions::default()))
}

fn config(peers: &[usize]) -> VmmHeapConfig {
    let mut c = VmmHeapConfig::new(128 * MIB, INITIAL * 2 * MIB);
    c.peer_access = peers.to_vec();
    c
}

/// Every granule the heap maps grants exactly `devices`; returns how many
/// granules are mapped (checked against the heap's own count).
fn assert_every_mapping_grants(h: &ModelVmmHeap, vmm: &ModelVmm, devices: &[i32]) -> u64 {
    let s = h.stats().unwrap();
    let g = vmm.granularity();
    let mut mapped = 0;
    for a in (h.data_address()..h.data_address() + s.virtual_bytes).step_by(g as usize) {
        if let Some(access) = vmm.access_at(a) {
            assert_eq!(access, devices, "devices with access at {a:#x}");
            mapped += 1;
        }
    }
    assert_eq!(mapped * g, s.mapped_bytes, "{s:?}");
    mapped
}

#[test]
fn every_mapping_grants_the_configured_peers() {
    let vmm = model();
    let mut h = ModelVmmHeap::on_model(vmm.clone(), config(&PEERS)).unwrap();
    let s = h.stats().unwrap();
    assert_eq!((s.device, s.peer_access.clone()), (0, PEERS.to_vec()));

    // The initial mapping.
    assert_eq!(assert_every_mapping_grants(&h, &vmm, &GRANTED), 16);
    // Data the heap's device writes, a peer reads; a device that is not a
    // peer is refused (where a GPU would fault).
    let p = h.heap().malloc(64 * KIB) as u64;
    assert_ne!(p, 0);
    let data = pattern(p, 64 * KIB as usize);
    vmm.write(p, &data).unwrap();
    for peer in [1, 3] {
        assert_eq!(vmm.read_on(peer, p, data.len()).unwrap(), data);
    }
    let e = vmm.read_on(2, p, 8).unwrap_err();
    assert!(e.contains("device 2"), "{e}");

    // `grow`.
    assert_eq!(h.grow(3 * 2 * MIB).unwrap(), 3 * 2 * MIB);
    assert_eq!(assert_every_mapping_grants(&h, &vmm, &GRANTED), 28);

    // The growth service.
    h.start_growth(GrowthPolicy {
        low_free_segments: 16,
        step_segments: 4,
        poll: Duration::from_micros(100),
    })
    .unwrap();
    common::wait_for("the service never grew", || {
        (h.stats().unwrap().free_segments >= 16).then_some(())
    });
    assert_eq!(h.stop_growth(), None, "the service met no error");
    let by_service = h.stats().unwrap().present_segments as u64;
    assert!(by_service > 7, "the service mapped segments");
    assert_eq!(
        assert_every_mapping_grants(&h, &vmm, &GRANTED),
        by_service * 4
    );

    // `alloc_large`: more than the free segments, so both its paths run:
    // free segments' chunks mapped again under the range, and new ones.
    h.flush().unwrap();
    let free = h.stats().unwrap().free_segments as u64;
    let r = h.alloc_large((free + 2) * 2 * MIB).unwrap();
    assert_eq!(
        (r.stitched_segments as u64, r.new_segments),
        (free, 2),
        "{r:?}"
    );
    assert_every_mapping_grants(&h, &vmm, &GRANTED);
    let big = pattern(r.address, r.bytes as usize);
    vmm.write(r.address, &big).unwrap();
    assert_eq!(vmm.read_on(3, r.address, big.len()).unwrap(), big);
    assert_mapping_consistent(&h, &vmm);

    h.free_large(r.address).unwrap();
    h.heap().free(p as *mut u8);
    h.trim().unwrap();
    assert_eq!(assert_every_mapping_grants(&h, &vmm, &GRANTED), 0);
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// Without peers the heap's device alone gets access: a peer's read is
/// refused.
#[test]
fn without_peers_only_the_heap_device_has_access() {
    let vmm = model();
    let h = ModelVmmHeap::on_model(vmm.clone(), config(&[])).unwrap();
    assert!(h.stats().unwrap().peer_access.is_empty());
    assert_eq!(assert_every_mapping_grants(&h, &vmm, &[0]), 16);
    let p = h.heap().malloc(4 * KIB) as u64;
    vmm.write(p, &[7; 8]).unwrap();
    assert!(vmm.read_on(1, p, 8).is_err(), "device 1 was never granted");
}

#[test]
fn a_refused_grant_is_rolled_back_with_nothing_mapped() {
    let vmm = model();
    let mut h = ModelVmmHeap::on_model(vmm.clone(), config(&PEERS)).unwrap();
    let census = vmm.census();
    let before = h.stats().unwrap();

    // `grow`: an injected failure of the grant, then a peer the driver
    // refuses (its capability gone since creation).
    vmm.fail_nth(VmmCall::SetAccess, 1);
    let e = h.grow(2 * MIB).unwrap_err().to_string();
    println!("{e}");
    assert!(
        e.contains("cuMemSetAccess") && e.contains("devices [0, 1, 3]"),
        "{e}"
    );
    assert_eq!(vmm.census(), census, "the segment's chunks are undone");
    vmm.set_peer_capable(3, false);
    let e = h.grow(2 * MIB).unwrap_err().to_string();
    println!("{e}");
    assert!(
        e.contains("cuMemSetAccess") && e.contains("device 3 cannot access"),
        "{e}"
    );
    assert_eq!(vmm.census(), census);
    let s = h.stats().unwrap();
    assert_eq!(
        (s.present_segments, s.stranded_segments, s.mapped_bytes),
        (before.present_segments, 0, before.mapped_bytes)
    );

    // The growth service: it reports the refusal and maps nothing.
    h.start_growth(GrowthPolicy {
        low_free_segments: 8,
        step_segments: 4,
        poll: Duration::from_micros(100),
    })
    .unwrap();
    let e = common::wait_for("no error came", || h.growth_error());
    assert!(e.contains("cuMemSetAccess"), "{e}");
    // Stopped first: the service keeps trying after an error, and a census
    // taken during a try (before its rollback) counts its chunks.
    assert!(h.stop_growth().is_some(), "stopping returns the error");
    assert_eq!(vmm.census(), census, "the service leaked nothing");

    // `alloc_large`: the stitched segments go back to the tree, untouched.
    let data: Vec<u64> = (0..INITIAL)
        .map(|i| h.data_address() + i * 2 * MIB)
        .collect();
    let e = h.alloc_large(3 * 2 * MIB).unwrap_err().to_string();
    assert!(
        e.contains("alloc_large") && e.contains("cuMemSetAccess"),
        "{e}"
    );
    assert_eq!(vmm.census(), census);
    let s = h.stats().unwrap();
    assert_eq!(
        (s.present_segments, s.free_segments, s.stranded_segments),
        (before.present_segments, before.free_segments, 0),
        "{s:?}"
    );
    for a in data {
        assert_eq!(vmm.access_at(a), Some(GRANTED.to_vec()), "kept at {a:#x}");
    }
    assert_mapping_consistent(&h, &vmm);

    // The peer back, everything works again.
    vmm.set_peer_capable(3, true);
    assert_eq!(h.grow(2 * MIB).unwrap(), 2 * MIB);
    let r = h.alloc_large(3 * 2 * MIB).unwrap();
    assert_eq!(r.stitched_segments, 3);
    assert_every_mapping_grants(&h, &vmm, &GRANTED);
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());

    // At creation: nothing is left behind.
    let vmm = model();
    vmm.fail_nth(VmmCall::SetAccess, 2);
    let e = ModelVmmHeap::on_model(vmm.clone(), config(&PEERS))
        .err()
        .expect("creation fails")
        .to_string();
    assert!(e.contains("cuMemSetAccess"), "{e}");
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// Each bad configuration is refused before anything is reserved, with an
/// error naming the device pair (and the call, where one answered).
#[test]
fn bad_peer_configurations_are_refused() {
    let refused = |vmm: Arc<ModelVmm>, peers: &[usize]| -> String {
        let e = ModelVmmHeap::on_model(vmm.clone(), config(peers))
            .err()
            .unwrap_or_else(|| panic!("peers {peers:?} accepted"))
            .to_string();
        println!("{peers:?}: {e}");
        assert!(e.starts_with("bad setting"), "{e}");
        assert_eq!(vmm.census(), ModelCensus::default(), "nothing reserved");
        e
    };
    let e = refused(model(), &[1, 0]);
    assert!(e.contains("device 0, the heap's own device"), "{e}");
    let e = refused(model(), &[1, 2, 1]);
    assert!(e.contains("device 1 twice"), "{e}");

    let vmm = model();
    vmm.set_devices(2);
    let e = refused(vmm, &[2]);
    assert!(
        e.contains("cuDeviceGet") && e.contains("device 2") && e.contains("device 0"),
        "{e}"
    );

    let vmm = model();
    vmm.set_peer_capable(1, false);
    let e = refused(vmm, &[3, 1]);
    assert!(
        e.contains("cuDeviceCanAccessPeer")
            && e.contains("device 1 cannot access memory of device 0"),
        "{e}"
    );

    let with_peers = Arc::new(ModelVmm::new(
        512 * KIB,
        ChunkOptions {
            peers: vec![1],
            ..ChunkOptions::default()
        },
    ));
    let e = refused(with_peers, &[1]);
    assert!(e.contains("ChunkOptions::peers"), "{e}");
}

/// The lake grants the driver's `ChunkOptions::peers` through the same
/// driver call the heap uses (`set_access` is `set_access_for` with those
/// peers), so one descriptor list serves both.
#[test]
fn the_lake_grant_goes_through_the_same_call() {
    let vmm = ModelVmm::new(
        512 * KIB,
        ChunkOptions {
            peers: vec![2],
            ..ChunkOptions::default()
        },
    );
    let base = vmm.reserve(2 * 512 * KIB).unwrap();
    let (a, b) = (vmm.create().unwrap(), vmm.create().unwrap());
    vmm.map(base, a).unwrap();
    vmm.map(base + 512 * KIB, b).unwrap();
    vmm.set_access(base, 512 * KIB).unwrap();
    vmm.set_access_for(base + 512 * KIB, 512 * KIB, &[1, 3])
        .unwrap();
    assert_eq!(vmm.access_at(base), Some(vec![0, 2]));
    assert_eq!(vmm.access_at(base + 512 * KIB), Some(vec![0, 1, 3]));
    assert!(vmm.set_access_for(base, 512 * KIB, &[0]).is_err(), "own");
    assert!(vmm.set_access_for(base, 512 * KIB, &[9]).is_err(), "none");
    for addr in [base, base + 512 * KIB] {
        vmm.unmap(addr).unwrap();
    }
    for c in [a, b] {
        vmm.release(c).unwrap();
    }
    vmm.free_address(base, 2 * 512 * KIB).unwrap();
    assert_eq!(vmm.counters().of(VmmCall::SetAccess).calls, 4);
}
