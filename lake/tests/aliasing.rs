//! Aliasing and remapping stress of the pluggable pool
//! (`lake::pluggable::StreamPool`) on the CPU model driver: no two live
//! allocations may share memory, neither by virtual address nor by
//! physical chunk (a stitched view maps chunks that also sit at home, so
//! two different virtual ranges can be the same memory), and no address
//! may be unmapped while GPU work may still use it.
//!
//! Workload: the recorded GPT-2 batch-16 trace (six steps, 2 MiB chunks),
//! its requests over 1 MiB scaled by 7 and by 7.5 to stand for batches 112
//! and 120 (but not the parameters, nor requests of a parameter's size:
//! gradients, AdamW states), replayed on 16 MiB chunks and a 79 GiB device
//! (the H100's setting; the model hands out freed address ranges again, as
//! CUDA does), with the reuse cache at `SUGGESTED_ENTRIES` (torch-alloc's
//! default) and off, under three event timings. The logits then take
//! 8.4-9 GiB, over 512 chunks. Also synthetic GPT-2 traces at batches 64,
//! 112 and 120, a direct test of a 9 GiB request among many smaller ones,
//! and seeded random requests of every scale. Deterministic.
//!
//! The checker: at every alloc it looks up, through the model driver,
//! which chunk backs every granule of the new range; the range must not
//! overlap a live range (itself included) in virtual addresses nor in
//! (chunk, offset) bytes, and every granule must be mapped with access. At
//! every free the chunks behind the range must be those it had at its
//! alloc (nothing remapped under a live tensor). After every pool call, no
//! granule may have been unmapped under a live range, nor under a range
//! freed since the device was last waited for (a step's end, or the pool's
//! own wait): PyTorch frees a tensor when its last reference goes, while
//! the kernels that read it are still queued, and `cuMemUnmap` does not
//! wait for them: they fault (an illegal address, which cuBLAS reports as
//! `CUBLAS_STATUS_INTERNAL_ERROR`) or, once another chunk is mapped there,
//! read and write the wrong memory.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use lake::driver::VmmResult;
use lake::pluggable::replay::{self, EventTiming, ReplayEvents};
use lake::pluggable::reuse::SUGGESTED_ENTRIES;
use lake::pluggable::{EventFailure, EventId, EventSource, PoolError, StreamId, StreamPool};
use lake::{
    ChunkHandle, ChunkOptions, DriverCounters, Lake, LakeConfig, ModelVmm, Trace, VmmDriver,
};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// torch-alloc's lake chunk.
const CHUNK: u64 = 16 * MIB;
/// The H100's memory as the run saw it.
const DEVICE: u64 = 79 * GIB;

type Pool = StreamPool<Watch, Syncs>;

/// The model driver, noting every address unmapped (a mapping changed
/// under whatever GPU work may still use it).
struct Watch {
    vmm: ModelVmm,
    unmapped: Mutex<Vec<u64>>,
}

impl Watch {
    fn chunk_at(&self, addr: u64) -> Option<(ChunkHandle, bool)> {
        self.vmm.chunk_at(addr)
    }

    fn take_unmapped(&self) -> Vec<u64> {
        std::mem::take(&mut *self.unmapped.lock().unwrap())
    }
}

impl VmmDriver for Watch {
    fn granularity(&self) -> u64 {
        self.vmm.granularity()
    }
    fn options(&self) -> &ChunkOptions {
        self.vmm.options()
    }
    fn reserve(&self, size: u64) -> VmmResult<u64> {
        self.vmm.reserve(size)
    }
    fn free_address(&self, addr: u64, size: u64) -> VmmResult<()> {
        self.vmm.free_address(addr, size)
    }
    fn create(&self) -> VmmResult<ChunkHandle> {
        self.vmm.create()
    }
    fn create_on_host(&self) -> VmmResult<ChunkHandle> {
        self.vmm.create_on_host()
    }
    fn release(&self, chunk: ChunkHandle) -> VmmResult<()> {
        self.vmm.release(chunk)
    }
    fn map(&self, addr: u64, chunk: ChunkHandle) -> VmmResult<()> {
        self.vmm.map(addr, chunk)
    }
    fn unmap(&self, addr: u64) -> VmmResult<()> {
        self.unmapped.lock().unwrap().push(addr);
        self.vmm.unmap(addr)
    }
    fn set_access(&self, addr: u64, size: u64) -> VmmResult<()> {
        self.vmm.set_access(addr, size)
    }
    fn set_access_for(&self, addr: u64, size: u64, peers: &[i32]) -> VmmResult<()> {
        self.vmm.set_access_for(addr, size, peers)
    }
    fn device_ordinal(&self) -> i32 {
        self.vmm.device_ordinal()
    }
    fn peer_can_access(&self, peer: i32) -> host::Result<bool> {
        self.vmm.peer_can_access(peer)
    }
    fn counters(&self) -> DriverCounters {
        self.vmm.counters()
    }
}

/// Replay events, counting the pool's waits for the device and noting
/// which recorded events the pool has seen complete (or waited for): the
/// work before such an event's free is done, so its range may be unmapped.
struct Syncs {
    events: ReplayEvents,
    syncs: AtomicU64,
    log: Mutex<EventLog>,
}

/// Events by record order, per stream.
#[derive(Default)]
struct EventLog {
    /// Every record so far: (stream, its index on that stream).
    records: Vec<(u64, u64)>,
    /// Records so far per stream (the next index).
    per_stream: HashMap<u64, u64>,
    /// Live events: (stream, index).
    live: HashMap<EventId, (u64, u64)>,
    /// Per stream, the highest index seen complete (events of a stream
    /// complete in order).
    done: HashMap<u64, u64>,
}

impl EventLog {
    fn seen_complete(&mut self, event: EventId) {
        if let Some(&(stream, index)) = self.live.get(&event) {
            let d = self.done.entry(stream).or_default();
            *d = (*d).max(index + 1);
        }
    }
}

impl Syncs {
    fn tick(&self, stream: StreamId) {
        self.events.tick(stream)
    }
    fn set_step(&self, step: u64) {
        self.events.set_step(step)
    }
}

impl EventSource for Syncs {
    fn record(&self, stream: StreamId) -> Result<EventId, EventFailure> {
        let event = self.events.record(stream)?;
        let mut log = self.log.lock().unwrap();
        let next = log.per_stream.entry(stream.0).or_default();
        let index = *next;
        *next += 1;
        log.records.push((stream.0, index));
        log.live.insert(event, (stream.0, index));
        Ok(event)
    }
    fn is_complete(&self, event: EventId) -> Result<bool, EventFailure> {
        let complete = self.events.is_complete(event)?;
        if complete {
            self.log.lock().unwrap().seen_complete(event);
        }
        Ok(complete)
    }
    fn synchronize(&self, event: EventId) -> Result<(), EventFailure> {
        // Counted as that event only: the checker keeps later frees in
        // flight, whatever the replay's events do meanwhile.
        self.events.synchronize(event)?;
        self.log.lock().unwrap().seen_complete(event);
        Ok(())
    }
    fn destroy(&self, event: EventId) {
        self.events.destroy(event)
    }
    fn synchronize_all(&self) -> Result<(), EventFailure> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.events.synchronize_all()
    }
    fn calls(&self) -> u64 {
        self.events.calls()
    }
}

fn pool(reuse: usize, limit: u64) -> Pool {
    pool_with(reuse, limit, EventTiming::AtOnce)
}

fn pool_with(reuse: usize, limit: u64, timing: EventTiming) -> Pool {
    let vmm = ModelVmm::without_data(CHUNK, ChunkOptions::default());
    vmm.set_device_bytes(Some(limit));
    vmm.set_reuse_addresses(true);
    let watch = Watch {
        vmm,
        unmapped: Mutex::new(Vec::new()),
    };
    let lake = Lake::new(watch, LakeConfig::with_limit(limit));
    let events = Syncs {
        events: ReplayEvents::new(timing),
        syncs: AtomicU64::new(0),
        log: Mutex::new(EventLog::default()),
    };
    let p = StreamPool::new(lake, events);
    p.set_reuse_entries(reuse).unwrap();
    p
}

/// Live ranges by virtual address and by physical bytes.
#[derive(Default)]
struct Checker {
    /// Virtual start -> end.
    virt: BTreeMap<u64, u64>,
    /// (chunk, offset in it) -> (end offset, virtual start of its owner).
    phys: BTreeMap<(ChunkHandle, u64), (u64, u64)>,
    /// Virtual start -> the physical pieces it took at its alloc.
    pieces: HashMap<u64, Vec<(ChunkHandle, u64, u64)>>,
    /// Ranges freed since the device was last waited for: GPU work
    /// submitted before their free may still read or write them through
    /// their virtual addresses (PyTorch frees a tensor when its last
    /// Python reference goes, while the kernels that use it are queued).
    in_flight: Vec<InFlight>,
    /// The pool's waits for the device seen so far.
    syncs: u64,
    /// Event records seen so far (`EventLog::records`).
    records: usize,
}

/// A freed range whose work may still be queued, with the events that
/// mark its free (stream, index): those recorded by the free itself, or
/// else the next event its stream records. Events of a stream complete in
/// order, so once the pool has seen them complete the work is done.
struct InFlight {
    range: (u64, u64),
    stream: u64,
    events: Vec<(u64, u64)>,
    /// Freed in the pool call now being checked (its events are those
    /// that call recorded).
    fresh: bool,
}

impl Checker {
    /// The physical pieces behind `[addr, addr + len)`: per granule, its
    /// chunk and the offsets touched.
    fn pieces_of(p: &Pool, addr: u64, len: u64) -> Result<Vec<(ChunkHandle, u64, u64)>, String> {
        let mut out = Vec::new();
        let mut at = addr;
        while at < addr + len {
            let granule = at & !(CHUNK - 1);
            let end = (granule + CHUNK).min(addr + len);
            let (chunk, accessible) = p
                .lake()
                .driver()
                .chunk_at(at)
                .ok_or_else(|| format!("{at:#x} of live range {addr:#x} is not mapped"))?;
            if !accessible {
                return Err(format!(
                    "{at:#x} of live range {addr:#x} is mapped without access"
                ));
            }
            out.push((chunk, at - granule, end - granule));
            at = end;
        }
        Ok(out)
    }

    fn alloc(&mut self, p: &Pool, addr: u64, len: u64, what: &str) -> Result<(), String> {
        if let Some((&start, &end)) = self.virt.range(..addr + len).next_back()
            && end > addr
        {
            return Err(format!(
                "{what}: [{addr:#x}, +{len}) overlaps live [{start:#x}, {end:#x}) in virtual addresses"
            ));
        }
        let pieces = Self::pieces_of(p, addr, len)?;
        // Piece by piece, each entered before the next is looked up: a
        // range that maps one chunk twice aliases itself.
        for &(chunk, from, to) in &pieces {
            if let Some((&(c, s), &(e, owner))) = self.phys.range(..(chunk, to)).next_back()
                && c == chunk
                && e > from
            {
                return Err(format!(
                    "{what}: [{addr:#x}, +{len}) shares chunk {} bytes [{from:#x}, {to:#x}) with \
                     live {owner:#x} (its bytes [{s:#x}, {e:#x}))",
                    chunk.0
                ));
            }
            self.phys.insert((chunk, from), (to, addr));
        }
        self.virt.insert(addr, addr + len);
        self.pieces.insert(addr, pieces);
        Ok(())
    }

    /// The device finished everything submitted (the training loop's
    /// `loss.item()` at the end of a step).
    fn device_idle(&mut self) {
        self.in_flight.clear();
    }

    /// After a pool call: no address was unmapped under a live range, nor
    /// under a freed range whose work may still be in flight (the GPU would
    /// fault there, or read and write other memory once it is mapped
    /// again). A wait for the device by the pool settles what was freed.
    fn after_call(&mut self, p: &Pool, what: &str) -> Result<(), String> {
        let syncs = p.events().syncs.load(Ordering::Relaxed);
        if syncs != self.syncs {
            self.syncs = syncs;
            self.in_flight.clear();
        }
        {
            let log = p.events().log.lock().unwrap();
            let recorded = &log.records[self.records..];
            self.records = log.records.len();
            for f in self.in_flight.iter_mut().filter(|f| f.fresh) {
                f.events = recorded.to_vec();
                if f.events.is_empty() {
                    // No event of its own: the next one on its stream.
                    let next = log.per_stream.get(&f.stream).copied().unwrap_or(0);
                    f.events.push((f.stream, next));
                }
                f.fresh = false;
            }
            let done =
                |&(stream, index): &(u64, u64)| log.done.get(&stream).is_some_and(|&d| index < d);
            self.in_flight.retain(|f| !f.events.iter().all(done));
        }
        for a in p.lake().driver().take_unmapped() {
            let hit = |&(start, end): &(u64, u64)| a < end && a + CHUNK > start;
            if let Some(r) = self.virt.iter().map(|(&s, &e)| (s, e)).find(hit) {
                return Err(format!(
                    "{what}: granule {a:#x} unmapped under live [{:#x}, {:#x})",
                    r.0, r.1
                ));
            }
            if let Some(r) = self.in_flight.iter().map(|f| f.range).find(hit) {
                return Err(format!(
                    "{what}: granule {a:#x} unmapped under [{:#x}, +{}), freed since the \
                     device was last waited for: work queued before that free may still use \
                     it (cuMemUnmap does not wait for the stream)",
                    r.0,
                    r.1 - r.0
                ));
            }
        }
        Ok(())
    }

    fn free(
        &mut self,
        p: &Pool,
        stream: StreamId,
        addr: u64,
        len: u64,
        what: &str,
    ) -> Result<(), String> {
        self.in_flight.push(InFlight {
            range: (addr, addr + len),
            stream: stream.0,
            events: Vec::new(),
            fresh: true,
        });
        let pieces = self
            .pieces
            .remove(&addr)
            .expect("freed ranges were allocated");
        if Self::pieces_of(p, addr, len)? != pieces {
            return Err(format!(
                "{what}: the chunks behind live [{addr:#x}, +{len}) changed while it was live"
            ));
        }
        self.virt.remove(&addr);
        for (chunk, from, _) in pieces {
            self.phys.remove(&(chunk, from));
        }
        Ok(())
    }
}

/// How a replay ended: every record replayed, or a clean out-of-memory.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Done,
    OutOfMemory { record: usize },
}

/// Replays `trace` through `p` (requests over 1 MiB scaled by
/// `scale_num / scale_den`, rounded to 512 bytes), checking every alloc
/// and free; `Err` at the first alias.
fn replay_checked(p: &Pool, trace: &Trace, scale_num: u64, scale_den: u64) -> Result<End, String> {
    // Parameters (allocated before the first step and kept) do not grow
    // with the batch, nor do requests of their sizes (gradients, AdamW
    // states, the optimizer's temporaries).
    let first = trace.events.first().map_or(0, |e| e.site.phase);
    let mut kept: HashMap<u64, u64> = HashMap::new();
    for e in trace.events.iter().take_while(|e| e.site.phase == first) {
        match e.kind {
            lake::EventKind::Alloc => {
                kept.insert(e.addr, e.size);
            }
            lake::EventKind::Free => {
                kept.remove(&e.addr);
            }
        }
    }
    let params: std::collections::HashSet<u64> = kept.values().copied().collect();
    let scale = |size: u64| {
        if size > MIB && !params.contains(&size) {
            (size * scale_num / scale_den).div_ceil(512) * 512
        } else {
            size
        }
    };
    let mut checker = Checker::default();
    // Trace address -> (ours, size).
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut step = None;
    for (i, e) in trace.events.iter().enumerate() {
        if step != Some(e.site.phase) {
            step = Some(e.site.phase);
            p.events().set_step(u64::from(e.site.phase));
            checker.device_idle();
        }
        let stream = StreamId(u64::from(e.site.stream));
        p.events().tick(stream);
        let what = format!("record {i} (step {})", e.site.phase);
        match e.kind {
            lake::EventKind::Alloc => {
                let size = scale(e.size);
                let ours = match p.alloc(size, stream) {
                    Ok(a) => a,
                    Err(PoolError::OutOfMemory { .. }) => {
                        return Ok(End::OutOfMemory { record: i });
                    }
                    Err(err) => return Err(format!("{what}: alloc of {size} failed: {err}")),
                };
                checker.after_call(p, &what)?;
                checker.alloc(p, ours, size, &what)?;
                live.insert(e.addr, (ours, size));
            }
            lake::EventKind::Free => {
                let Some((ours, size)) = live.remove(&e.addr) else {
                    continue;
                };
                checker.free(p, stream, ours, size, &what)?;
                p.free(ours, stream)
                    .map_err(|err| format!("{what}: free failed: {err}"))?;
                checker.after_call(p, &what)?;
            }
        }
    }
    p.check()?;
    Ok(End::Done)
}

fn gpt2_b16() -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-b16-6steps.trace.gz");
    replay::load(&path).expect("the recorded GPT-2 trace loads")
}

fn run(reuse: usize, num: u64, den: u64) {
    for timing in [
        EventTiming::AtOnce,
        EventTiming::AfterOps(2000),
        EventTiming::AtStepEnd,
    ] {
        run_with(reuse, num, den, timing);
    }
}

fn run_with(reuse: usize, num: u64, den: u64, timing: EventTiming) {
    let trace = gpt2_b16();
    let streams: std::collections::HashSet<u32> =
        trace.events.iter().map(|e| e.site.stream).collect();
    println!("streams {streams:?}");
    let p = pool_with(reuse, DEVICE, timing);
    let end = replay_checked(&p, &trace, num, den).unwrap_or_else(|e| {
        panic!("batch 16 x {num}/{den}, reuse {reuse}: memory handed out or remapped unsafely: {e}")
    });
    println!(
        "batch 16 x {num}/{den}, reuse {reuse}: {end:?}, peak reserved {:.3} GiB, {:?}",
        p.stats().peak_reserved_bytes as f64 / GIB as f64,
        p.lake().stats().outcomes
    );
}

#[test]
fn gpt2_batch_112_with_the_reuse_cache_never_aliases() {
    run(SUGGESTED_ENTRIES, 7, 1);
}

#[test]
fn gpt2_batch_120_with_the_reuse_cache_never_aliases() {
    run(SUGGESTED_ENTRIES, 15, 2);
}

#[test]
fn gpt2_batch_112_without_the_reuse_cache_never_aliases() {
    run(0, 7, 1);
}

#[test]
fn gpt2_batch_120_without_the_reuse_cache_never_aliases() {
    run(0, 15, 2);
}

#[test]
fn gpt2_batch_16_with_the_reuse_cache_never_aliases() {
    run(SUGGESTED_ENTRIES, 1, 1);
}

/// The logits of the evidence (95,880 x 50,257 bf16, 8.98 GiB) and their
/// gradient-sized neighbours among many activation-sized requests, freed
/// and asked again in a pattern like a step's: large blocks go through the
/// reuse cache while the lake places, stitches and patches the big ones.
#[test]
fn a_9_gib_request_among_many_smaller_ones_never_aliases() {
    let p = pool(SUGGESTED_ENTRIES, DEVICE);
    let mut checker = Checker::default();
    let logits = 95_880u64 * 50_257 * 2;
    let mut live: Vec<(u64, u64)> = Vec::new();
    let s = StreamId(1);
    let mut seq = 0u64;
    let mut alloc = |p: &Pool, checker: &mut Checker, live: &mut Vec<(u64, u64)>, size: u64| {
        seq += 1;
        let a = p.alloc(size, s).unwrap();
        let what = format!("request {seq} of {size}");
        checker.after_call(p, &what).unwrap();
        checker.alloc(p, a, size, &what).unwrap();
        live.push((a, size));
    };
    for round in 0..6u64 {
        // Each round is a step: the loop waits for the device at its end.
        checker.device_idle();
        // Activations: a few sizes, kept across the step.
        let mut acts = Vec::new();
        for i in 0..300u64 {
            let size = [3 * MIB + 512, 21 * MIB, 84 * MIB, 337 * MIB, 700 * 1024][(i % 5) as usize];
            alloc(&p, &mut checker, &mut acts, size + round * 4096);
        }
        // Free every third: holes the cache and the lake fill.
        let mut kept = Vec::new();
        for (i, (a, size)) in acts.drain(..).enumerate() {
            if i % 3 == 0 {
                checker.free(&p, s, a, size, "activation").unwrap();
                p.free(a, s).unwrap();
                checker.after_call(&p, "activation").unwrap();
            } else {
                kept.push((a, size));
            }
        }
        // The logits, a sequence length that varies by step, and their
        // gradient.
        let l = logits - (round % 3) * 37 * MIB;
        alloc(&p, &mut checker, &mut live, l);
        alloc(&p, &mut checker, &mut live, 21 * MIB);
        alloc(&p, &mut checker, &mut live, l);
        for (a, size) in live.drain(..) {
            checker.free(&p, s, a, size, "logits").unwrap();
            p.free(a, s).unwrap();
            checker.after_call(&p, "logits").unwrap();
        }
        // The backward: sizes freed above come back.
        for i in 0..100u64 {
            let size = [21 * MIB, 84 * MIB, 3 * MIB + 512][(i % 3) as usize];
            alloc(&p, &mut checker, &mut live, size + round * 4096);
        }
        for (a, size) in live.drain(..).chain(kept) {
            checker.free(&p, s, a, size, "backward").unwrap();
            p.free(a, s).unwrap();
            checker.after_call(&p, "backward").unwrap();
        }
        p.check().unwrap();
    }
}

fn run_synthetic(reuse: usize, batch: u64) {
    use lake::synthetic::{Gpt2Shape, gpt2_trace};
    let trace = gpt2_trace(Gpt2Shape {
        batch,
        steps: 4,
        seed: 7,
    });
    let p = pool(reuse, DEVICE);
    let end = replay_checked(&p, &trace, 1, 1).unwrap_or_else(|e| {
        panic!(
            "synthetic batch {batch}, reuse {reuse}: memory handed out or remapped unsafely: {e}"
        )
    });
    println!(
        "synthetic batch {batch}, reuse {reuse}: {end:?}, peak reserved {:.3} GiB, {:?}",
        p.stats().peak_reserved_bytes as f64 / GIB as f64,
        p.lake().stats().outcomes
    );
}

#[test]
fn synthetic_gpt2_batches_112_and_120_never_alias() {
    for batch in [64, 112, 120] {
        for reuse in [SUGGESTED_ENTRIES, 0] {
            run_synthetic(reuse, batch);
        }
    }
}

/// Random requests (fixed seed) of every scale: pieces, blocks the reuse
/// cache keeps, blocks over its bound and logits-sized ranges over 512
/// chunks, freed in random order, one stream.
#[test]
fn random_requests_of_every_scale_never_alias() {
    for seed in 1..=40u64 {
        let p = pool(SUGGESTED_ENTRIES, DEVICE);
        let mut rng = gpu_kernels::workload::SplitMix64(seed);
        let mut checker = Checker::default();
        let mut live: Vec<(u64, u64)> = Vec::new();
        let s = StreamId(0);
        for op in 0..3000u64 {
            let what = format!("seed {seed} op {op}");
            if !live.is_empty() && rng.below(100) < 45 {
                let i = rng.below(live.len() as u64) as usize;
                let (a, size) = live.swap_remove(i);
                checker.free(&p, s, a, size, &what).unwrap();
                p.free(a, s).unwrap();
                checker.after_call(&p, &what).unwrap();
                continue;
            }
            let size = match rng.below(100) {
                0..=49 => 1 + rng.below(CHUNK),
                50..=89 => CHUNK + rng.below(64 * CHUNK),
                90..=96 => 64 * CHUNK + rng.below(200 * CHUNK),
                _ => 400 * CHUNK + rng.below(200 * CHUNK),
            };
            match p.alloc(size, s) {
                Ok(a) => {
                    checker.after_call(&p, &what).unwrap();
                    checker.alloc(&p, a, size, &what).unwrap();
                    live.push((a, size));
                }
                Err(PoolError::OutOfMemory { .. }) => checker.after_call(&p, &what).unwrap(),
                Err(e) => panic!("{what}: {e}"),
            }
        }
        p.check().unwrap();
    }
}
