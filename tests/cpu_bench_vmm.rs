//! `gpumalloc bench --cpu --allocators ours,ours-vmm` as a library call: the
//! heap on the model VMM driver (2 MiB segments) starts with 40 MiB
//! mapped of 256 MiB and is grown in 40 MiB steps while a warm-up round
//! gets nulls or leaves fewer than 16 segments (32 MiB) free at its peak,
//! the growth service's low-water mark (issue 13). Workload: 2^14 threads,
//! 64 B, 2 KiB and 4 KiB each (1, 32 and 64 MiB in all), then mixed
//! 16 B–4 KiB (about 40 MiB); three timed rounds each. Checks that both
//! heaps run the same rounds with no null and no wrong word, that the VMM
//! heap grew only where the test needed more room than it had, also where
//! a round was served whole but filled the mapping (2 KiB: 32 of 40 MiB),
//! and that the growth is reported.

use gpumalloc::bench::cpu;
use gpumalloc::bench::report::Record;
use gpumalloc::bench::suite::Options;

const MIB: u64 = 1 << 20;

fn options() -> Options {
    Options {
        threads: 1 << 14,
        iters: 3,
        heap: 256 * MIB,
        sizes: vec![64, 2048, 4096],
        allocators: vec!["ours".into(), "ours-vmm".into()],
        vmm_initial: 40 * MIB,
        ..Options::default()
    }
}

fn find<'a>(records: &'a [Record], allocator: &str, label: &str, metric: &str) -> &'a Record {
    records
        .iter()
        .find(|r| r.allocator == allocator && r.size_label == label && r.metric == metric)
        .unwrap_or_else(|| panic!("no {allocator} {label} {metric} record in {records:#?}"))
}

#[test]
fn the_vmm_heap_grows_to_what_single_and_mixed_need() {
    let records = cpu::run("single", &options()).unwrap();
    for label in ["64", "2048", "4096", "16-4096"] {
        for allocator in ["ours (cpu)", "ours-vmm (cpu)"] {
            for metric in ["alloc_ms", "free_ms"] {
                let r = find(&records, allocator, label, metric);
                assert!(r.valid && r.samples == 3, "{r:?}");
            }
        }
        let fixed = find(&records, "ours (cpu)", label, "alloc_ms");
        let vmm = find(&records, "ours-vmm (cpu)", label, "alloc_ms");
        assert_eq!(fixed.threads, vmm.threads, "the same rounds");
        let peak = find(&records, "ours-vmm (cpu)", label, "peak_free_segments");
        println!(
            "{label}: alloc ms fixed {:.3}, vmm {:.3}; mapped {} MiB, {} segments free at \
             the peak",
            fixed.median,
            vmm.median,
            find(&records, "ours-vmm (cpu)", label, "mapped_mib").median,
            peak.median
        );
        assert!(
            peak.median >= 16.0,
            "the timed rounds keep the mark: {peak:?}"
        );
    }
    let mapped = |label| find(&records, "ours-vmm (cpu)", label, "mapped_mib").median as u64;
    let grew = |label| {
        records
            .iter()
            .find(|r| r.size_label == label && r.metric == "grow_ms_per_gib")
    };
    // 1 MiB of 64 B requests leaves 19 of 20 segments free: no growth.
    assert_eq!(mapped("64"), 40);
    assert!(grew("64").is_none(), "nothing grew for 64 B");
    // 32 MiB of 2 KiB requests fit in 40 MiB with no null but leave 4
    // segments free: grown once, for room alone.
    let grown = grew("2048").expect("2 KiB grew the heap");
    assert!(
        grown
            .note
            .contains("(0 nulls in all; 1 served whole but too full)"),
        "{grown:?}"
    );
    assert_eq!(mapped("2048"), 80);
    // 64 MiB of 4 KiB requests: grown again, within the reservation.
    let grown = grew("4096").expect("4 KiB grew the heap");
    assert!(grown.samples >= 1 && grown.median > 0.0, "{grown:?}");
    assert!(
        (80 + 40..=256).contains(&mapped("4096")),
        "mapped {} MiB",
        mapped("4096")
    );
    // Mixed runs on the heap grown so far: it needs no more.
    assert_eq!(mapped("16-4096"), mapped("4096"));
    // Records of the fixed heap are as before: no growth records.
    assert!(!records.iter().any(|r| r.allocator == "ours (cpu)"
        && (r.metric.contains("mapped") || r.metric.contains("segments"))),);
}

#[test]
fn without_ours_vmm_the_cpu_bench_runs_only_ours() {
    let opts = Options {
        allocators: vec!["ours".into()],
        ..options()
    };
    let records = cpu::run("mixed", &opts).unwrap();
    assert!(records.iter().all(|r| r.allocator == "ours (cpu)"));
    assert_eq!(records.len(), 2, "{records:#?}");
}
