//! Criterion benches of host-side hot paths: the vEB tree's operations, the
//! allocator's CPU build on one thread, and the VMM pool's best fit once a
//! periodic workload has converged (on the model driver).
//!
//! Run: `cargo bench --bench host_paths`.

// criterion_group! defines an undocumented public function.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use gpumalloc::gpu_kernel::arch::Word;
use gpumalloc::gpu_kernel::veb::{TreeShape, VebTree};
use gpumalloc::lake::{ChunkOptions, Lake, LakeConfig, ModelVmm};
use gpumalloc::{CpuHeap, HeapConfig};

/// Segments of an 80 GiB heap.
const SEGMENTS: u32 = 5120;

fn full_tree(shape: &TreeShape) -> Vec<Word> {
    let mut image = vec![0u64; shape.words as usize];
    shape.full_image(&mut image);
    image.into_iter().map(Word::new).collect()
}

fn tree(c: &mut Criterion) {
    let shape = TreeShape::new(SEGMENTS);
    let words = full_tree(&shape);
    let t = VebTree::new(&words, &shape);
    c.bench_function("veb claim_lowest + insert (5120 ids, full)", |b| {
        b.iter(|| {
            let i = t.claim_lowest().unwrap();
            t.insert(black_box(i));
        })
    });
    for i in (0..SEGMENTS).step_by(2) {
        t.remove(i);
    }
    let mut x = 0u32;
    c.bench_function("veb successor (5120 ids, half full)", |b| {
        b.iter(|| {
            x = (x + 977) % SEGMENTS;
            black_box(t.successor(x))
        })
    });
    let words = full_tree(&shape);
    let t = VebTree::new(&words, &shape);
    c.bench_function("veb claim_run_from_top(4) + release", |b| {
        b.iter(|| {
            let s = t.claim_run_from_top(4).unwrap();
            t.release_run(s, 4);
        })
    });
}

fn cpu_heap(c: &mut Criterion) {
    let h = CpuHeap::new(HeapConfig::unchecked(256 << 20)).unwrap();
    for size in [16u64, 4096, 65536] {
        c.bench_function(&format!("cpu heap malloc+free {size} B"), |b| {
            b.iter(|| {
                let p = h.heap().malloc(black_box(size));
                h.heap().free(p);
            })
        });
    }
}

fn lake(c: &mut Criterion) {
    const CHUNK: u64 = 64 << 10;
    let lake = Lake::new(
        ModelVmm::new(CHUNK, ChunkOptions::default()),
        LakeConfig::with_limit(512 * CHUNK),
    );
    let sizes = [3 * CHUNK, 7 * CHUNK + 100, CHUNK, 12 * CHUNK, 5 * CHUNK - 1];
    let mut period = || {
        let ranges: Vec<_> = sizes.iter().map(|&s| lake.alloc(s).unwrap()).collect();
        for r in ranges.into_iter().rev() {
            lake.free(r).unwrap();
        }
    };
    for _ in 0..4 {
        period();
    }
    c.bench_function(
        "lake periodic alloc/free of 5 (converged, model driver)",
        |b| b.iter(&mut period),
    );
}

criterion_group!(benches, tree, cpu_heap, lake);
criterion_main!(benches);
