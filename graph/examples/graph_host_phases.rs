//! Times the host side of one scale of `gpumalloc bench graph` on the CPU
//! (no GPU needed): R-MAT generation (sequential, and in chunks on all
//! threads as the sweep does), the host model of the load, grouping the load
//! batch, one round's batches and model update per batch size, and the check
//! of an exported graph, with the sweep's `EdgeSet` and, for comparison, the
//! per-vertex B-tree `Reference` the sweep used before (built once, cloned
//! per group, its fingerprint recomputed per check).
//!
//! `cargo run -p graph --release --example graph_host_phases -- [SCALE]...`
//! (default 16 18).

use std::time::Instant;

use graph::batch::GroupedBatch;
use graph::edge_set::EdgeSet;
use graph::reference::Reference;
use graph::rmat::{Rmat, SplitMix64};

fn seconds(clock: Instant) -> f64 {
    clock.elapsed().as_secs_f64()
}

fn main() {
    let scales: Vec<u32> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("a scale"))
        .collect();
    let scales = if scales.is_empty() {
        vec![16, 18]
    } else {
        scales
    };
    for scale in scales {
        let clock = Instant::now();
        let stream = Rmat::new(scale, 16, 0x5eed).generate().expect("R-MAT");
        let generate = seconds(clock);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let clock = Instant::now();
        let chunked = Rmat::new(scale, 16, 0x5eed)
            .generate_chunked(stream.edges.len() as u64, threads)
            .expect("R-MAT");
        let generate_chunked = seconds(clock);
        drop(chunked);
        let (load, rest) = stream.edges.split_at(stream.edges.len() / 2);

        let clock = Instant::now();
        let mut set = EdgeSet::new(stream.vertices);
        set.insert(load).expect("ids in range");
        let set_build = seconds(clock);
        let clock = Instant::now();
        let mut reference = Reference::new(stream.vertices);
        reference.insert(load).expect("ids in range");
        let reference_build = seconds(clock);
        let clock = Instant::now();
        let _copy = reference.clone();
        let reference_clone = seconds(clock);
        let clock = Instant::now();
        let _copy = set.clone();
        let set_clone = seconds(clock);

        let clock = Instant::now();
        let _grouped = GroupedBatch::new(load);
        let group_load = seconds(clock);

        // An export as the device gives it: degrees, then edges vertex by
        // vertex.
        let degrees: Vec<u64> = (0..stream.vertices)
            .map(|v| reference.degree(v) as u64)
            .collect();
        let edges: Vec<u64> = (0..stream.vertices)
            .flat_map(|v| reference.edges(v).map(u64::from))
            .collect();
        let clock = Instant::now();
        assert_eq!(set.difference(&degrees, &edges), None);
        let set_check = seconds(clock);
        let clock = Instant::now();
        let adjacency = graph::split_by_degrees(&degrees, &edges);
        assert_eq!(reference.quick_difference(&adjacency), None);
        let reference_check = seconds(clock);
        println!(
            "scale {scale}: {} edges generated in {generate:.2} s ({generate_chunked:.2} s in chunks on {threads} threads); load of {} edges: grouped {group_load:.2} s; \
             model: EdgeSet build {set_build:.2} s, clone {set_clone:.3} s, check {set_check:.2} s; \
             Reference build {reference_build:.2} s, clone {reference_clone:.2} s, check {reference_check:.2} s",
            stream.edges.len(),
            load.len(),
        );
        let mut picker = SplitMix64(1);
        for batch in [10_000usize, 100_000, 1_000_000] {
            let inserts = &rest[..batch.min(rest.len())];
            let clock = Instant::now();
            let deletes: Vec<(u32, u32)> = (0..batch)
                .map(|_| stream.edges[picker.below(stream.edges.len() as u64) as usize])
                .collect();
            let _i = GroupedBatch::new(inserts);
            let _d = GroupedBatch::new(&deletes);
            let batches = seconds(clock);
            let clock = Instant::now();
            set.insert(inserts).expect("ids in range");
            set.delete(&deletes).expect("ids in range");
            let set_round = seconds(clock);
            let clock = Instant::now();
            reference.insert(inserts).expect("ids in range");
            reference.delete(&deletes).expect("ids in range");
            let reference_round = seconds(clock);
            println!(
                "  batch {batch}: one update round's batches grouped {batches:.3} s; model update EdgeSet {set_round:.3} s, Reference {reference_round:.3} s",
            );
        }
    }
}
