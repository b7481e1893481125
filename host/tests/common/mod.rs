//! Helpers shared by the VMM heap's CPU tests (`vmm_heap.rs`,
//! `vmm_heap_large.rs`): a data pattern and the ledger/model agreement.

use host::vmm::{ModelVmm, VmmDriver};
use host::vmm_heap::ModelVmmHeap;

/// A byte pattern unique to (tag, position); never all zeros.
pub fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8 | 1)
        .collect()
}

/// Mapped bytes are exactly the present and stranded segments, the model
/// maps what the heap's ledger says, and every live chunk is mapped once.
pub fn assert_mapping_consistent(h: &ModelVmmHeap, vmm: &ModelVmm) {
    let s = h.stats().unwrap();
    assert_eq!(
        s.mapped_bytes,
        (s.present_segments + s.stranded_segments) as u64 * s.segment_bytes,
        "{s:?}"
    );
    let census = vmm.census();
    assert_eq!(
        census.mappings as u64 * vmm.granularity(),
        s.mapped_bytes,
        "the model maps what the heap's ledger says: {s:?}"
    );
    assert_eq!(census.mappings, census.chunks, "one mapping per chunk");
}

/// Polls `poll` every millisecond until it answers `Some`, for at most 10
/// seconds (then fails the test, saying what never came): how the tests
/// wait for the growth service, which works on its own thread.
#[allow(dead_code)] // not every test file that includes this module waits
pub fn wait_for<T>(what: &str, mut poll: impl FnMut() -> Option<T>) -> T {
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = poll() {
            return v;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "{what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}
