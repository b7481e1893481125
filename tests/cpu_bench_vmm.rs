//! `gpumalloc bench --cpu --allocators ours,ours-vmm` as a library call: the
//! heap on the model VMM driver starts with 16 MiB mapped of 256 MiB and is
//! grown until the rounds are served (issue 13). Workload: 2^14 threads,
//! 64 B and 4 KiB each (1 MiB and 64 MiB in all), then mixed 16 B–4 KiB
//! (about 32 MiB); three timed rounds each. Checks that both heaps run the
//! same rounds with no null and no wrong word, that the VMM heap grew only
//! where the test needed more than it had, and that the growth is reported.

use gpumalloc::bench::cpu;
use gpumalloc::bench::report::Record;
use gpumalloc::bench::suite::Options;

const MIB: u64 = 1 << 20;

fn options() -> Options {
    Options {
        threads: 1 << 14,
        iters: 3,
        heap: 256 * MIB,
        sizes: vec![64, 4096],
        allocators: vec!["ours".into(), "ours-vmm".into()],
        vmm_initial: 16 * MIB,
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
    for label in ["64", "4096", "16-4096"] {
        for allocator in ["ours (cpu)", "ours-vmm (cpu)"] {
            for metric in ["alloc_ms", "free_ms"] {
                let r = find(&records, allocator, label, metric);
                assert!(r.valid && r.samples == 3, "{r:?}");
            }
        }
        let fixed = find(&records, "ours (cpu)", label, "alloc_ms");
        let vmm = find(&records, "ours-vmm (cpu)", label, "alloc_ms");
        assert_eq!(fixed.threads, vmm.threads, "the same rounds");
        println!(
            "{label}: alloc ms fixed {:.3}, vmm {:.3}; mapped {} MiB",
            fixed.median,
            vmm.median,
            find(&records, "ours-vmm (cpu)", label, "mapped_mib").median
        );
    }
    // 1 MiB of 64 B requests fits in the first 16 MiB: no growth.
    let mapped = |label| find(&records, "ours-vmm (cpu)", label, "mapped_mib").median as u64;
    assert_eq!(mapped("64"), 16);
    assert!(
        !records
            .iter()
            .any(|r| r.size_label == "64" && r.metric == "grow_ms_per_gib"),
        "nothing grew for 64 B"
    );
    // 64 MiB of 4 KiB requests: grown in 16 MiB steps, one of headroom.
    let grown = find(&records, "ours-vmm (cpu)", "4096", "grow_ms_per_gib");
    assert!(grown.samples >= 4 && grown.median > 0.0, "{grown:?}");
    assert!(
        (64 + 16..=256).contains(&mapped("4096")),
        "mapped {} MiB",
        mapped("4096")
    );
    // Mixed runs on the heap grown so far: it needs no more.
    assert_eq!(mapped("16-4096"), mapped("4096"));
    // Records of the fixed heap are as before: no growth records.
    assert!(
        !records
            .iter()
            .any(|r| r.allocator == "ours (cpu)" && r.metric.contains("mapped")),
    );
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
