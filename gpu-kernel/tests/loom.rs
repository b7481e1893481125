//! Model checks of the small protocols with loom: every interleaving (up to
//! a preemption bound) of two threads. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p gpu-kernel --test loom --release`;
//! without `--cfg loom` this file is empty.
//!
//! - A tree's hint bits: a remove that empties a word racing an insert into
//!   the same word must leave the id findable (the re-check RMW of `veb`).
//! - Claiming: two claims of the lowest id never get the same id.
//! - Trimming: withdrawing the top free segment racing an allocation's
//!   claim of the lowest gives the one free segment to exactly one of them.
//! - Block counters: of a free and a slot retire racing to complete a block,
//!   exactly one completes it.
//! - Segment return: a reservation racing the return of a segment's last
//!   block ends in one of the two consistent orders; two returns of the last
//!   blocks retire the segment exactly once.
//! - Block-class reservations by one subtract
//!   (`SegmentTable::reserve_blocks_add`): racing the return of a segment's
//!   last block out, two reservations that together want more than the
//!   segment has (the overdraw is given back, the counts add up to what was
//!   free, and no overdraw is left in the word), one racing the retiring
//!   return and one racing `retire_idle` (exactly one retirement, never
//!   with a block reserved), a stale one on another class's segment
//!   racing that class's last return (exactly one retirement), a stale
//!   one that does not hide another class's free block from that class's
//!   claimer (the check before the subtract), and one whose segment is
//!   retired and formatted for another class between that check and its
//!   subtract (the give-back retires it if it comes last). Through the
//!   real `malloc`: a two-lane team (a claim of two) on a segment of the 1 MiB class with one block free overdraws it
//!   while the other block comes back; the lanes get different blocks and
//!   both segments come back after the frees.
//! - The slot protocol through the real `malloc`/`free` on a one-segment
//!   heap: two installs racing for one slot, an install racing a flush, an
//!   allocation racing a reclaim. Each ends with every slice back and the
//!   segment free.
//! - Runs: two claims of two segments racing on a four-segment heap both
//!   succeed (each takes its own stretch below the run cursor) and the heap
//!   comes back whole; a run whose optimistic stretch a class claim took
//!   part of falls back to the run lock and still finds the free stretch,
//!   however the two interleave; a run claim racing a trim (which holds the
//!   run lock) gets the run the trim leaves; a trim racing a run claim that
//!   must fail still finds the free segment the claim held for a moment
//!   (the lock holder waits for optimistic claims in flight).
//! - A team of two lanes (a two-lane host warp, `arch::HostWarp`) allocates,
//!   writes and frees its slices while a third thread flushes the slot and
//!   allocates again: the slices' memory is a loom cell, so a recycled slice
//!   whose last writes are not ordered before its next owner's (the team
//!   free's `bar.warp.sync`) fails the model.
//! - Block claims (`Heap::claim_blocks`): two claimers of a class with two
//!   blocks per segment on a one-segment heap share the segment one of them
//!   formats; on a two-segment heap where a third claimer's demand is
//!   counted, whichever of two racing claimers takes the format lock
//!   formats both segments in one batch, the other gets a block of it, and
//!   both segments come back when the blocks are freed and the heap is
//!   flushed (a segment of the batch no claim used is retired idle). A
//!   two-lane team racing a lone claimer of three blocks on two segments
//!   (ignored: slow at bound 2). Three claimers of one block on a
//!   one-segment heap: a claim's last try never answers null while a
//!   drop has the segment out of the class tree (the out-of-tree window
//!   word, `Heap::claim_blocks_settled`).
//! - Class stripes (`stripe`): on a one-segment heap (a stripe of the
//!   256 B class's two 1 MiB blocks), two draws from an empty stripe take
//!   different blocks (one refills, the other draws its second block,
//!   waiting for the refill if its add came first); a draw racing a drain
//!   (as a flush or a reclaim does) loses no block; on a full heap two
//!   draws both come back empty (the refill closes the stripe, and the
//!   waiter sees it) and a draw reopens it once a segment is free; a
//!   refill that takes a held segment's free block races an ordinary
//!   claim for it, and exactly one gets it. Each ends with the drawn
//!   blocks given back and the segment free.
//! - Run requests (`request`): a thread that posted, looks once for the
//!   answer and then gives up, racing the service that takes, "stitches"
//!   (writes a loom cell standing for the run's published states) and
//!   answers: the run goes to exactly one of them (the thread, which then
//!   reads the cell's value, or the service, which frees it), or is never
//!   made if the thread withdrew first; the slot ends free. Two threads
//!   racing to post into one slot: exactly one gets it.

#![cfg(loom)]

use gpu_kernel::Heap;
use gpu_kernel::arch::{HostWarp, Word, join_host_warp};
use gpu_kernel::block;
use gpu_kernel::class::{MIN_SEGMENT_SHIFT, Request, SLICE_CLASSES, SLICES_PER_BLOCK, SizeClass};

/// The models' heaps have the smallest segments (2 MiB).
const SHIFT: u32 = MIN_SEGMENT_SHIFT;
const SEGMENT_BYTES: u64 = 1 << SHIFT;
use gpu_kernel::layout::NO_SPARES;
use gpu_kernel::segment::{Grab, Reservation, Return, SegmentState, SegmentTable};
use gpu_kernel::veb::{TreeShape, VebTree};
use loom::sync::Arc;
use loom::thread;

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.check(f);
}

/// For models that run the real allocator: its scans of every slot make
/// long executions, so more branches.
fn model_long(f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(3);
    b.max_branches = 100_000;
    b.check(f);
}

fn words(n: u32) -> Arc<Vec<Word>> {
    Arc::new((0..n).map(|_| Word::new(0)).collect())
}

/// 128 ids: two leaf words under one top word.
const SHAPE: TreeShape = TreeShape::new(128);

#[test]
fn remove_and_insert_in_one_word_keep_the_hint() {
    model(|| {
        let w = words(SHAPE.words);
        VebTree::new(&w, &SHAPE).insert(0);
        let w1 = w.clone();
        let t = thread::spawn(move || {
            VebTree::new(&w1, &SHAPE).remove(0);
        });
        VebTree::new(&w, &SHAPE).insert(1);
        t.join().unwrap();
        let tree = VebTree::new(&w, &SHAPE);
        assert_eq!(
            tree.successor(0),
            Some(1),
            "id 1 lost behind a cleared hint"
        );
    });
}

#[test]
fn two_claims_get_different_ids() {
    model(|| {
        let w = words(SHAPE.words);
        let tree = VebTree::new(&w, &SHAPE);
        tree.insert(5);
        tree.insert(70);
        let w1 = w.clone();
        let t = thread::spawn(move || VebTree::new(&w1, &SHAPE).claim_lowest());
        let mine = VebTree::new(&w, &SHAPE).claim_lowest();
        let theirs = t.join().unwrap();
        let mut got = [mine.unwrap(), theirs.unwrap()];
        got.sort();
        assert_eq!(got, [5, 70]);
        assert_eq!(VebTree::new(&w, &SHAPE).successor(0), None);
    });
}

/// Two claimers of several ids aim at the same lowest ids of one word: one
/// takes them, the other retries on the word its `fetch_and` read and takes
/// the rest; then the emptied word's hint is cleared, so an id inserted
/// afterwards is found.
#[test]
fn two_multi_claims_split_a_word() {
    model(|| {
        let w = words(SHAPE.words);
        let tree = VebTree::new(&w, &SHAPE);
        for i in [1, 2, 3] {
            tree.insert(i);
        }
        let w1 = w.clone();
        let t = thread::spawn(move || VebTree::new(&w1, &SHAPE).claim_lowest_many(2));
        let (mine_at, mine) = VebTree::new(&w, &SHAPE).claim_lowest_many(2).unwrap();
        let (theirs_at, theirs) = t.join().unwrap().unwrap();
        assert_eq!((mine_at, theirs_at), (0, 0));
        assert_eq!(mine & theirs, 0);
        assert_eq!(mine | theirs, 0b1110);
        let tree = VebTree::new(&w, &SHAPE);
        assert_eq!(tree.successor(0), None);
        tree.insert(9);
        assert_eq!(tree.successor(0), Some(9));
    });
}

#[test]
fn a_withdrawal_and_a_claim_never_share_a_segment() {
    model(|| {
        let w = words(SHAPE.words);
        VebTree::new(&w, &SHAPE).insert(70);
        let w1 = w.clone();
        let t = thread::spawn(move || VebTree::new(&w1, &SHAPE).claim_run_from_top(1));
        let claimed = VebTree::new(&w, &SHAPE).claim_lowest();
        let withdrawn = t.join().unwrap();
        assert!(
            claimed.is_some() ^ withdrawn.is_some(),
            "{claimed:?} {withdrawn:?}"
        );
        assert_eq!(claimed.or(withdrawn), Some(70));
    });
}

#[test]
fn exactly_one_thread_completes_a_block() {
    model(|| {
        let per = SLICES_PER_BLOCK as u32;
        let counter = Arc::new(Word::new(SLICES_PER_BLOCK - 3));
        let c1 = counter.clone();
        let t = thread::spawn(move || block::count_freed_slices(&c1, 1, per));
        let retire = block::count_dead_slices(&counter, 2, per);
        let free = t.join().unwrap();
        assert!(
            retire ^ free,
            "completed by both or neither: {retire} {free}"
        );
    });
}

/// A claim's run taken at its ticket bits (`BlockBitmap::take_bits`, one
/// RMW for blocks 1 and 2) races a reserver that lost its own bit and
/// scans (`take`): each block goes to one of them, the run gets the bits it
/// reports and the scanner a block outside them (one of the run's when it
/// got there first), and the blocks neither took are still free.
#[test]
fn a_ticket_run_and_a_scan_take_distinct_blocks() {
    model(|| {
        // Blocks 1, 2 and 3 of a four-block segment are free.
        let bits = words(1);
        gpu_kernel::arch::store_relaxed(&bits[0], 0b1110);
        let other = bits.clone();
        let t = thread::spawn(move || block::BlockBitmap::new(&other).take(4, 0));
        let run = block::BlockBitmap::new(&bits).take_bits(0, 0b0110);
        let scanned = t.join().unwrap();
        assert_eq!(
            run & 1 << scanned,
            0,
            "block {scanned} taken twice ({run:b})"
        );
        let left = gpu_kernel::arch::load_relaxed(&bits[0]);
        assert_eq!(left & (run | 1 << scanned), 0, "left {left:b}, run {run:b}");
        assert_eq!(left | run | 1 << scanned, 0b1110, "a block lost");
    });
}

/// A slice class with two blocks per segment.
fn two_block_class() -> SizeClass {
    (0..SLICE_CLASSES)
        .filter_map(SizeClass::new)
        .find(|c| c.blocks_per_segment(SHIFT) == 2)
        .expect("a slice class with two blocks per segment")
}

/// One segment's state word, active for `class` with `free` blocks free.
fn active_segment(class: SizeClass, free: u32) -> Arc<Vec<Word>> {
    Arc::new(vec![Word::new(
        SegmentState::Active { class, free }.encode(),
    )])
}

#[test]
fn reservation_racing_the_last_return() {
    model(|| {
        let class = two_block_class();
        let states = active_segment(class, 1);
        let s1 = states.clone();
        let t = thread::spawn(move || SegmentTable::new(&s1).reserve_blocks(0, class, 1));
        let returned = SegmentTable::new(&states).return_blocks(0, class, 1, 2);
        let reserved = t.join().unwrap();
        let end = SegmentTable::new(&states).load(0);
        match (reserved, returned) {
            (
                Reservation::Reserved {
                    count: 1,
                    last: true,
                },
                Return::FirstFree,
            ) => {
                assert_eq!(end, SegmentState::Active { class, free: 1 })
            }
            (Reservation::Stale, Return::Retired) => assert_eq!(end, SegmentState::Free),
            // The return's add came first, the reservation before its
            // retiring CAS: the segment stays active for the reserver.
            (
                Reservation::Reserved {
                    count: 1,
                    last: false,
                },
                Return::Partial,
            ) => assert_eq!(end, SegmentState::Active { class, free: 1 }),
            other => panic!("inconsistent outcome {other:?}, state {end:?}"),
        }
    });
}

#[test]
fn the_last_two_returns_retire_once() {
    model(|| {
        let class = two_block_class();
        let states = active_segment(class, 0);
        let s1 = states.clone();
        let t = thread::spawn(move || SegmentTable::new(&s1).return_blocks(0, class, 1, 2));
        let mine = SegmentTable::new(&states).return_blocks(0, class, 1, 2);
        let theirs = t.join().unwrap();
        let retired = [mine, theirs]
            .iter()
            .filter(|r| **r == Return::Retired)
            .count();
        assert_eq!(retired, 1, "{mine:?} {theirs:?}");
        assert_eq!(SegmentTable::new(&states).load(0), SegmentState::Free);
    });
}

/// A one-segment heap whose metadata is loom atomics.
struct Tiny {
    heap: Heap,
    _metadata: Vec<Word>,
    _data: Vec<u64>,
}

impl Tiny {
    fn new() -> Arc<Tiny> {
        Tiny::with_segments(1)
    }

    fn with_segments(segments: u64) -> Arc<Tiny> {
        let layout = Heap::layout(segments, SHIFT, NO_SPARES).unwrap();
        let mut image = vec![0u64; layout.metadata_words() as usize];
        layout.write_initial_metadata(&mut image);
        let metadata: Vec<Word> = image.into_iter().map(Word::new).collect();
        let data: Vec<u64> = Vec::with_capacity((segments * SEGMENT_BYTES / 8) as usize + 512);
        let base = (data.as_ptr() as u64).next_multiple_of(4096);
        // SAFETY: `data` reserves the segments past the 4 KiB alignment and
        // `metadata` holds the initial image; both live in `Tiny` beside the
        // handle, which is only lent out as `&Heap`. The allocator never
        // touches the data bytes, and the model never writes them.
        let heap = unsafe { layout.bind(base, metadata.as_ptr() as u64) };
        Arc::new(Tiny {
            heap,
            _metadata: metadata,
            _data: data,
        })
    }

    /// A snapshot of the heap's statistics (relaxed loads of its words).
    fn stats(&self) -> gpu_kernel::stats::HeapStats {
        let words: Vec<u64> = self
            ._metadata
            .iter()
            .map(gpu_kernel::arch::load_relaxed)
            .collect();
        gpu_kernel::stats::HeapStats::from_snapshot(&self.heap, &words)
    }

    /// Every slot empty, every block back, the segment free.
    fn assert_whole(&self) {
        self.heap.flush_slots();
        let stats = self.stats();
        assert_eq!(
            self.heap.withdraw_free_segment(),
            Some(0),
            "segment not free: {stats:?}"
        );
        assert!(self.heap.add_segment(0));
    }
}

/// `malloc(size)` on `tiny` in a second model thread and in this one, at
/// once: (this thread's address, the other's), 0 for a null.
fn malloc_in_two_threads(tiny: &Arc<Tiny>, size: u64) -> (u64, u64) {
    let other = tiny.clone();
    let t = thread::spawn(move || other.heap.malloc(size) as u64);
    let mine = tiny.heap.malloc(size) as u64;
    (mine, t.join().unwrap())
}

/// Two `malloc(size)` at once (`malloc_in_two_threads`) both succeed at
/// different addresses, and freeing both leaves the heap whole.
fn two_mallocs_come_back_whole(tiny: &Arc<Tiny>, size: u64) {
    let (mine, theirs) = malloc_in_two_threads(tiny, size);
    assert!(
        mine != 0 && theirs != 0 && mine != theirs,
        "{mine:x} {theirs:x}"
    );
    tiny.heap.free(mine as *mut u8);
    tiny.heap.free(theirs as *mut u8);
    tiny.assert_whole();
}

fn class_4k() -> SizeClass {
    match Request::for_size(4096, SHIFT) {
        Request::Class(c) => c,
        r => panic!("{r:?}"),
    }
}

#[test]
fn two_installs_race_for_one_slot() {
    model_long(|| {
        let tiny = Tiny::new();
        two_mallocs_come_back_whole(&tiny, 4096);
    });
}

#[test]
fn an_install_races_a_flush() {
    model_long(|| {
        let tiny = Tiny::new();
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.flush_slot(class_4k(), 0));
        let p = tiny.heap.malloc(4096);
        assert!(!p.is_null());
        tiny.heap.free(p);
        t.join().unwrap();
        tiny.assert_whole();
    });
}

#[test]
fn an_allocation_races_a_reclaim() {
    model_long(|| {
        let tiny = Tiny::new();
        let first = tiny.heap.malloc(4096);
        assert!(!first.is_null());
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.reclaim());
        tiny.heap.free(first);
        let p = tiny.heap.malloc(4096);
        assert!(!p.is_null());
        t.join().unwrap();
        tiny.heap.free(p);
        tiny.assert_whole();
    });
}

/// A slot run (`slot.rs`) of two blocks with one slice handed out: a
/// reclaim's trim (which gives back the block the version has not reached)
/// races a second allocation from the run. That and a third allocation
/// after it succeed at different addresses, nothing is counted as misuse,
/// and after the frees and a flush every segment is free: the trim's CAS
/// and the allocation's add never both count the second block, and the
/// trim never drops a reservation. Runs exist only in builds with `GPUMALLOC_SLOT_RUN` above
/// 1 (the default).
#[test]
fn a_run_is_trimmed_while_a_team_allocates() {
    if gpu_kernel::slot::SLOT_RUN_MAX < 2 {
        return;
    }
    model_long(|| {
        let segments = 4;
        let tiny = Tiny::with_segments(segments);
        let class = class_4k();
        tiny.heap.loom_install_run(class, 0, 2);
        let first = tiny.heap.malloc(4096) as u64;
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.reclaim());
        let second = tiny.heap.malloc(4096) as u64;
        t.join().unwrap();
        // After the race, the word still knows what it handed out.
        let third = tiny.heap.malloc(4096) as u64;
        let all = [first, second, third];
        assert!(
            all.iter().all(|&p| p != 0) && first != second && second != third && first != third,
            "{all:x?}"
        );
        for p in all {
            tiny.heap.free(p as *mut u8);
        }
        tiny.heap.flush_slots();
        let stats = tiny.stats();
        assert_eq!(stats.double_frees + stats.invalid_frees, 0, "{stats:?}");
        assert_eq!(tiny.heap.free_segments(), segments as u32, "{stats:?}");
    });
}

#[test]
fn two_runs_race_for_the_top() {
    model_long(|| {
        // Four segments hold both runs of two exactly: whichever claims
        // second must find the other two segments, however the claims
        // interleave (each takes its own stretch below the run cursor; a
        // claim that fails takes the run lock and searches).
        let tiny = Tiny::with_segments(4);
        let (mine, theirs) = malloc_in_two_threads(&tiny, 2 * SEGMENT_BYTES);
        assert!(
            mine != 0 && theirs != 0 && mine.abs_diff(theirs) == 2 * SEGMENT_BYTES,
            "{mine:x} {theirs:x}"
        );
        tiny.heap.free(mine as *mut u8);
        tiny.heap.free(theirs as *mut u8);
        let whole = tiny.heap.malloc(4 * SEGMENT_BYTES);
        assert!(!whole.is_null(), "the runs did not come back whole");
        tiny.heap.free(whole);
    });
}

#[test]
fn a_run_falls_back_to_the_lock_when_a_class_takes_its_stretch() {
    model_long(|| {
        // A run of two claimed and freed leaves the run cursor two segments
        // down: the next optimistic stretch is segments 0-1, where a class
        // claim (4 KiB slices fill a 2 MiB segment) takes the lowest free
        // segment. Whichever wins segment 0, the run must succeed: with the
        // optimistic stretch, or under the lock with segments 2-3.
        let tiny = Tiny::with_segments(4);
        let first = tiny.heap.malloc(2 * SEGMENT_BYTES);
        assert!(!first.is_null());
        tiny.heap.free(first);
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.malloc(4096) as u64);
        let run = tiny.heap.malloc(2 * SEGMENT_BYTES) as u64;
        let slice = t.join().unwrap();
        assert!(run != 0 && slice != 0, "{run:x} {slice:x}");
        let base = tiny.heap.data();
        assert!(
            slice - base >= run - base + 2 * SEGMENT_BYTES || run - base >= slice - base + 4096,
            "the run overlaps the slice: {run:x} {slice:x}"
        );
        tiny.heap.free(run as *mut u8);
        tiny.heap.free(slice as *mut u8);
        tiny.heap.flush_slots();
        let whole = tiny.heap.malloc(4 * SEGMENT_BYTES);
        assert!(!whole.is_null(), "the heap did not come back whole");
        tiny.heap.free(whole);
    });
}

#[test]
fn a_run_races_a_trim() {
    model_long(|| {
        // Three segments: a trim withdraws the highest free segment under
        // the run lock while a run of two claims optimistically (segments
        // 1-2). Either the run gets 1-2 and the trim 0, or the trim gets
        // 2 first and the run, failing, finds 0-1 under the lock.
        let tiny = Tiny::with_segments(3);
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.withdraw_free_segment());
        let run = tiny.heap.malloc(2 * SEGMENT_BYTES) as u64;
        let trimmed = t.join().unwrap();
        assert!(run != 0, "a run of two failed next to one trim");
        let trimmed = trimmed.expect("a trim found no free segment");
        let head = ((run - tiny.heap.data()) / SEGMENT_BYTES) as u32;
        assert!(
            trimmed < head || trimmed >= head + 2,
            "segment {trimmed} both trimmed and in the run at {head}"
        );
        tiny.heap.free(run as *mut u8);
        assert!(tiny.heap.add_segment(trimmed));
        let whole = tiny.heap.malloc(3 * SEGMENT_BYTES);
        assert!(!whole.is_null(), "the heap did not come back whole");
        tiny.heap.free(whole);
    });
}

#[test]
fn a_trim_waits_for_a_failing_optimistic_run_claim() {
    model_long(|| {
        // Two segments, segment 1 in use: a run of two can only fail, but
        // its optimistic claim (stretch 0-1) holds segment 0 for a moment
        // before it gives it back. A trim (under the run lock) that
        // searched just then would find no free segment; it must wait for
        // the claims in flight and find segment 0.
        let tiny = Tiny::with_segments(2);
        let first = tiny.heap.malloc(SEGMENT_BYTES);
        let second = tiny.heap.malloc(SEGMENT_BYTES);
        assert!(!first.is_null() && !second.is_null());
        let (first, second) = if first < second {
            (first, second)
        } else {
            (second, first)
        };
        tiny.heap.free(first);
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.malloc(2 * SEGMENT_BYTES) as u64);
        let trimmed = tiny.heap.withdraw_free_segment();
        let run = t.join().unwrap();
        assert_eq!(run, 0, "a run of two on a heap with one free segment");
        assert_eq!(trimmed, Some(0), "the trim missed the free segment");
        assert!(tiny.heap.add_segment(0));
        tiny.heap.free(second);
        let whole = tiny.heap.malloc(2 * SEGMENT_BYTES);
        assert!(!whole.is_null(), "the heap did not come back whole");
        tiny.heap.free(whole);
    });
}

#[test]
fn a_two_lane_team_frees_then_its_block_is_recycled() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b.check(|| {
        let tiny = Tiny::new();
        let cells: Arc<Vec<loom::cell::UnsafeCell<u64>>> =
            Arc::new((0..4).map(|_| loom::cell::UnsafeCell::new(0)).collect());
        let warp = HostWarp::new();
        let lanes: Vec<_> = (0..2u32)
            .map(|lane| {
                let (tiny, cells, warp) = (tiny.clone(), cells.clone(), warp.clone());
                thread::spawn(move || {
                    join_host_warp(warp, lane);
                    // Null is possible for lane 1 while lane 0's flush is
                    // giving the one segment back (a free in flight).
                    let p = tiny.heap.malloc(4096);
                    if !p.is_null() {
                        write(&tiny, &cells, p, lane as u64 + 1);
                        tiny.heap.free(p);
                    }
                    if lane == 0 {
                        // Recycle: retire the slot (which completes the block
                        // once lane 1 has freed too) and allocate again; the
                        // slice may be lane 1's, whose write must be ordered
                        // before this one by the team free.
                        tiny.heap.flush_slot(class_4k(), 0);
                        let q = tiny.heap.malloc(4096);
                        if !q.is_null() {
                            write(&tiny, &cells, q, 9);
                            tiny.heap.free(q);
                        }
                    }
                })
            })
            .collect();
        for l in lanes {
            l.join().unwrap();
        }
        tiny.assert_whole();
    });
}

/// Writes `value` into the model cell of the 4 KiB slice at `p`.
fn write(tiny: &Tiny, cells: &[loom::cell::UnsafeCell<u64>], p: *mut u8, value: u64) {
    let slice = ((p as u64 - tiny.heap.data()) / 4096) as usize;
    // SAFETY: the model's stand-in for writing the slice's memory; loom
    // reports a write not ordered after the previous one.
    cells[slice].with_mut(|c| unsafe { *c = value });
}

/// What the service did with a request in the model below.
#[derive(Debug, PartialEq, Eq)]
enum Served {
    /// The thread had withdrawn it: nothing made.
    NotTaken,
    /// The thread got the run.
    Delivered,
    /// The thread had given up: the service freed the run.
    Freed,
}

#[test]
fn a_run_request_is_answered_to_one_owner() {
    use gpu_kernel::request::{Poll, RequestSlot};
    const RUN: u64 = 1 << 21;
    model(|| {
        let slot = Arc::new(Word::new(0));
        // Stands for the run's segment states that `adopt_run` writes
        // before the answer.
        let states = Arc::new(loom::cell::UnsafeCell::new(0u64));
        assert!(RequestSlot::new(&slot).post(4));
        let service = {
            let (slot, states) = (slot.clone(), states.clone());
            thread::spawn(move || {
                let s = RequestSlot::new(&slot);
                let Some(n) = s.take() else {
                    return Served::NotTaken;
                };
                assert_eq!(n, 4);
                // SAFETY: only the service writes, before its answer.
                states.with_mut(|c| unsafe { *c = 7 });
                if s.answer(RUN) {
                    Served::Delivered
                } else {
                    Served::Freed
                }
            })
        };
        let s = RequestSlot::new(&slot);
        let got = match s.poll() {
            Poll::Answered(a) => Some(a),
            Poll::Waiting => s.give_up(),
        };
        if let Some(a) = got {
            assert_eq!(a, RUN);
            // SAFETY: the answer's release orders the write before this.
            states.with(|c| assert_eq!(unsafe { *c }, 7));
        }
        let served = service.join().unwrap();
        match served {
            Served::Delivered => assert!(got.is_some()),
            Served::NotTaken | Served::Freed => assert!(got.is_none()),
        }
        assert_eq!(RequestSlot::new(&slot).value(), 0, "the slot ends free");
    });
}

#[test]
fn two_posts_race_for_one_slot() {
    use gpu_kernel::request::RequestSlot;
    model(|| {
        let slot = Arc::new(Word::new(0));
        let other = {
            let slot = slot.clone();
            thread::spawn(move || RequestSlot::new(&slot).post(2))
        };
        let mine = RequestSlot::new(&slot).post(3);
        let theirs = other.join().unwrap();
        assert!(mine ^ theirs, "exactly one posts");
        let s = RequestSlot::new(&slot);
        assert_eq!(s.take(), Some(if mine { 3 } else { 2 }));
    });
}

/// The retiring CAS of `return_blocks` against a claimer that reserves a
/// block and returns it again in between (the word comes back to the same
/// value): the segment is retired exactly once, and only when every block
/// is back.
#[test]
fn a_reserve_and_return_between_the_add_and_the_retire() {
    model(|| {
        let class = two_block_class();
        let states = active_segment(class, 1);
        let s1 = states.clone();
        let t = thread::spawn(move || {
            let table = SegmentTable::new(&s1);
            match table.reserve_blocks(0, class, 1) {
                Reservation::Reserved { count: 1, .. } => Some(table.return_blocks(0, class, 1, 2)),
                _ => None,
            }
        });
        let mine = SegmentTable::new(&states).return_blocks(0, class, 1, 2);
        let theirs = t.join().unwrap();
        let retired = [Some(mine), theirs]
            .iter()
            .filter(|r| **r == Some(Return::Retired))
            .count();
        assert_eq!(retired, 1, "{mine:?} {theirs:?}");
        assert_eq!(SegmentTable::new(&states).load(0), SegmentState::Free);
    });
}

/// Bytes of the block class with two blocks per 2 MiB segment.
const TWO_PER_SEGMENT: u64 = SEGMENT_BYTES / 2;

#[test]
fn two_block_claims_share_a_formatted_segment() {
    model_long(|| {
        // One segment of two blocks: one claimer formats it under the
        // class's format lock and takes a block, the other reserves the
        // other block (first try at the lowest segment, then, if it lost a
        // race there, a pick in the same tree word), or both race the
        // lock and the loser waits for the format.
        let tiny = Tiny::new();
        two_mallocs_come_back_whole(&tiny, TWO_PER_SEGMENT);
    });
}

/// The class's format-lock word in `tiny`'s metadata (the handle's
/// `locks_at` field, found through the C layout, plus the class index).
fn format_lock_word(tiny: &Tiny, class: SizeClass) -> &Word {
    let field = gpu_kernel::c_layout::HEAP_FIELDS
        .iter()
        .find(|f| f.name == "locks_at")
        .expect("the handle has a locks_at field");
    // SAFETY: `locks_at` is a u64 field of the handle at that offset.
    let locks_at = unsafe {
        ((&tiny.heap as *const Heap as *const u8).add(field.offset) as *const u64).read_unaligned()
    };
    &tiny._metadata[(locks_at + class.index() as u64) as usize]
}

#[test]
fn a_batch_format_serves_the_waiting_claimers() {
    model_long(|| {
        // Two segments of two blocks. A claimer that never leaves counts
        // two blocks of demand (its bit 0 clear: it does not hold the
        // lock), so whichever of the two racing one-block claimers takes
        // the format lock sees three blocks wanted and formats both
        // segments in one batch (one fence publishes both bitmaps, one RMW
        // inserts both into the class tree); the other reserves from the
        // batch (first try at the lowest, then a pick if it lost a race
        // there) or waits for the lock and finds the tree filled. Each gets
        // its own block, whose bitmap bit it finds (a bitmap not published
        // with its state word would leave a reserver spinning), the frees
        // and a flush give both segments back, and only the phantom's
        // demand is left.
        let tiny = Tiny::with_segments(2);
        let class = match Request::for_size(TWO_PER_SEGMENT, SHIFT) {
            Request::Class(c) => c,
            r => panic!("{r:?}"),
        };
        let phantom = 2 << 1;
        gpu_kernel::arch::fetch_add_relaxed(format_lock_word(&tiny, class), phantom);
        let (mine, theirs) = malloc_in_two_threads(&tiny, TWO_PER_SEGMENT);
        assert!(
            mine != 0 && theirs != 0 && mine != theirs,
            "{mine:x} {theirs:x}"
        );
        // Both segments were formatted at once: neither is in the segment
        // tree. If both blocks came from one segment, the other was never
        // used, and only the flush's `retire_idle_segments` gives it back.
        assert_eq!(tiny.heap.free_segments(), 0);
        tiny.heap.free(mine as *mut u8);
        tiny.heap.free(theirs as *mut u8);
        tiny.heap.flush_slots();
        assert_eq!(tiny.heap.free_segments(), 2);
        assert_eq!(
            gpu_kernel::arch::load_relaxed(format_lock_word(&tiny, class)),
            phantom
        );
    });
}

#[test]
fn two_counted_formats_serve_two_claimers() {
    model_long(|| {
        // Two slot installers of the smallest slice class (16 blocks per
        // segment) on two segments, each claiming one block with its
        // demand counted: one formats a segment while the other, seeing
        // that format in flight cover both demands, waits and picks from
        // the class tree; or both format, if one read the word before the
        // other's format was counted or after it was taken back. Either
        // way each gets its own block, nobody waits forever, and the lock
        // word ends with no demand and no format counted.
        let tiny = Tiny::with_segments(2);
        let class = match Request::for_size(16, SHIFT) {
            Request::Class(c) if c.is_slice() => c,
            r => panic!("{r:?}"),
        };
        let other = tiny.clone();
        let t = thread::spawn(move || other.heap.loom_claim_one_slice_block(16));
        let mine = tiny.heap.loom_claim_one_slice_block(16);
        let theirs = t.join().unwrap();
        assert!(
            mine.is_some() && theirs.is_some() && mine != theirs,
            "{mine:?} {theirs:?}"
        );
        assert_eq!(
            gpu_kernel::arch::load_relaxed(format_lock_word(&tiny, class)),
            0
        );
    });
}

/// The block class with two blocks per 2 MiB segment (1 MiB blocks).
fn two_block_block_class() -> SizeClass {
    match Request::for_size(TWO_PER_SEGMENT, SHIFT) {
        Request::Class(c) if !c.is_slice() => c,
        r => panic!("{r:?}"),
    }
}

/// The smallest block class other than `class`: the owner of a segment a
/// stale claimer of `class` reserves on.
fn another_block_class(class: SizeClass) -> SizeClass {
    (0..gpu_kernel::class::CLASSES)
        .filter_map(SizeClass::new)
        .find(|c| !c.is_slice() && *c != class)
        .unwrap()
}

/// `reserve_blocks_add` of `want` blocks of `class` on segment 0 of
/// `states` in a second model thread.
fn grab_in_a_thread(
    states: &Arc<Vec<Word>>,
    class: SizeClass,
    want: u32,
) -> thread::JoinHandle<Grab> {
    let s1 = states.clone();
    thread::spawn(move || {
        SegmentTable::new(&s1).reserve_blocks_add(
            0,
            class,
            want,
            class.blocks_per_segment(SHIFT),
            SHIFT,
        )
    })
}

/// The count a grab got (0 for a miss).
fn got(grab: Grab) -> u32 {
    match grab {
        Grab::Reserved { count, .. } => count,
        Grab::Missed { .. } => 0,
    }
}

#[test]
fn an_add_reservation_racing_the_last_return() {
    model(|| {
        let class = two_block_block_class();
        let states = active_segment(class, 1);
        let t = grab_in_a_thread(&states, class, 1);
        let returned = SegmentTable::new(&states).return_blocks(0, class, 1, 2);
        let grab = t.join().unwrap();
        let end = SegmentTable::new(&states).load(0);
        match grab {
            // Before the return's retiring CAS (which then fails) or
            // before its add: the segment stays active with one block out.
            Grab::Reserved { count: 1, .. } => {
                assert_ne!(returned, Return::Retired);
                assert_eq!(end, SegmentState::Active { class, free: 1 });
            }
            // After the retirement: a subtract on the free word.
            Grab::Missed { gave_back: None } => {
                assert_eq!(returned, Return::Retired);
                assert_eq!(end, SegmentState::Free);
            }
            other => panic!("inconsistent outcome {other:?} {returned:?}, state {end:?}"),
        }
    });
}

#[test]
fn two_add_reservations_overdraw_the_segment() {
    model(|| {
        let class = two_block_block_class();
        let states = active_segment(class, 2);
        let t = grab_in_a_thread(&states, class, 1);
        let mine = SegmentTable::new(&states).reserve_blocks_add(0, class, 2, 2, SHIFT);
        let theirs = t.join().unwrap();
        assert_eq!(got(mine) + got(theirs), 2, "{mine:?} {theirs:?}");
        // Their tickets name different blocks.
        if let (
            Grab::Reserved { ticket: a, .. },
            Grab::Reserved {
                ticket: b,
                count: 1,
                ..
            },
        ) = (mine, theirs)
        {
            assert_ne!(a, b);
        }
        // No overdraw left: nothing free, both blocks out, and the two
        // returns retire the segment once.
        let table = SegmentTable::new(&states);
        assert_eq!(table.load(0), SegmentState::Active { class, free: 0 });
        assert_eq!(table.return_blocks(0, class, 1, 2), Return::FirstFree);
        assert_eq!(table.return_blocks(0, class, 1, 2), Return::Retired);
    });
}

#[test]
fn an_overdrawing_reservation_racing_the_retiring_return() {
    model(|| {
        let class = two_block_block_class();
        let states = active_segment(class, 1);
        // Wants two where one is free: takes one and gives one back, or
        // comes after the return (takes both, or finds the segment free).
        let t = grab_in_a_thread(&states, class, 2);
        let returned = SegmentTable::new(&states).return_blocks(0, class, 1, 2);
        let grab = t.join().unwrap();
        let end = SegmentTable::new(&states).load(0);
        let out = got(grab);
        if out == 0 {
            assert_eq!(grab, Grab::Missed { gave_back: None });
            assert_eq!(returned, Return::Retired);
            assert_eq!(end, SegmentState::Free);
        } else {
            assert_ne!(returned, Return::Retired, "{grab:?}");
            assert_eq!(
                end,
                SegmentState::Active {
                    class,
                    free: 2 - out
                }
            );
        }
    });
}

#[test]
fn an_add_reservation_racing_retire_idle() {
    model(|| {
        let class = two_block_block_class();
        let states = active_segment(class, 2);
        let t = grab_in_a_thread(&states, class, 1);
        let retired = SegmentTable::new(&states).retire_idle(0, class, 2);
        let grab = t.join().unwrap();
        let end = SegmentTable::new(&states).load(0);
        match grab {
            Grab::Reserved { count: 1, .. } if !retired => {
                assert_eq!(end, SegmentState::Active { class, free: 1 })
            }
            Grab::Missed { gave_back: None } if retired => assert_eq!(end, SegmentState::Free),
            other => panic!("inconsistent outcome {other:?} {retired}, state {end:?}"),
        }
    });
}

#[test]
fn a_stale_reservation_racing_the_other_class_last_return() {
    model(|| {
        // The segment is the other class's (two blocks, one out); a
        // claimer of the 1 MiB class whose hint is stale subtracts from it.
        let class = two_block_block_class();
        let other = another_block_class(class);
        let total = other.blocks_per_segment(SHIFT);
        let states = active_segment(other, total - 1);
        let t = grab_in_a_thread(&states, class, 1);
        let returned = SegmentTable::new(&states).return_blocks(0, other, 1, total);
        let grab = t.join().unwrap();
        let retirements = [
            returned == Return::Retired,
            grab == Grab::Missed {
                gave_back: Some((other, Return::Retired)),
            },
        ];
        assert_eq!(
            retirements.iter().filter(|r| **r).count(),
            1,
            "{grab:?} {returned:?}"
        );
        assert_eq!(SegmentTable::new(&states).load(0), SegmentState::Free);
    });
}

#[test]
fn a_stale_reservation_hides_nothing_from_the_owner() {
    model(|| {
        // Segment 0 is the other class's, with one block free; a claimer of
        // the 1 MiB class whose hint is stale reserves there while the
        // owner's class reserves that block. The owner must get it: were it
        // to miss, it would drop the segment from its class tree and, on a
        // full heap, answer null with the block free.
        let class = two_block_block_class();
        let other = another_block_class(class);
        let total = other.blocks_per_segment(SHIFT);
        let states = active_segment(other, 1);
        let t = grab_in_a_thread(&states, class, 1);
        let owner = SegmentTable::new(&states).reserve_blocks_add(0, other, 1, total, SHIFT);
        let stale = t.join().unwrap();
        assert!(matches!(stale, Grab::Missed { .. }), "{stale:?}");
        assert_eq!(got(owner), 1, "the owner missed its free block: {owner:?}");
        assert_eq!(
            SegmentTable::new(&states).load(0),
            SegmentState::Active {
                class: other,
                free: 0
            }
        );
    });
}

#[test]
fn a_segment_changes_class_between_the_check_and_the_subtract() {
    model(|| {
        // Segment 0 of the 1 MiB class is idle (both blocks free). A
        // claimer of that class checks it and subtracts, while this thread
        // retires it idle, formats it for the other class with one block
        // taken, and returns that block (the segment's last out). Whatever
        // the claimer's check saw, either it reserved before the
        // retirement (which then fails) or the segment is retired exactly
        // once, by the return or by the claimer's give-back.
        let class = two_block_block_class();
        let other = another_block_class(class);
        let total = other.blocks_per_segment(SHIFT);
        let states = active_segment(class, 2);
        let t = grab_in_a_thread(&states, class, 1);
        let table = SegmentTable::new(&states);
        let mut returned = None;
        if table.retire_idle(0, class, 2) {
            table.publish_active(0, other, total - 1);
            returned = Some(table.return_blocks(0, other, 1, total));
        }
        let grab = t.join().unwrap();
        let end = table.load(0);
        match (grab, returned) {
            (Grab::Reserved { count: 1, .. }, None) => {
                assert_eq!(end, SegmentState::Active { class, free: 1 })
            }
            (Grab::Missed { gave_back }, Some(returned)) => {
                let retirements = [
                    returned == Return::Retired,
                    gave_back == Some((other, Return::Retired)),
                ];
                assert_eq!(
                    retirements.iter().filter(|r| **r).count(),
                    1,
                    "{gave_back:?} {returned:?}"
                );
                assert_eq!(end, SegmentState::Free);
            }
            other => panic!("inconsistent outcome {other:?}, state {end:?}"),
        }
    });
}

#[test]
fn a_team_overdraws_a_segment_while_its_block_comes_back() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(1);
    b.max_branches = 100_000;
    b.check(|| {
        // Segment 0 of two 1 MiB blocks has one out (this thread's). A
        // two-lane team wants two: its subtract takes the free one and
        // gives one back (or, after the free below, takes both), the other
        // lane claims again. This thread frees its block meanwhile.
        let tiny = Tiny::with_segments(2);
        let first = tiny.heap.malloc(TWO_PER_SEGMENT) as u64;
        assert_ne!(first, 0);
        let warp = HostWarp::new();
        let lanes: Vec<_> = (0..2u32)
            .map(|lane| {
                let (tiny, warp) = (tiny.clone(), warp.clone());
                thread::spawn(move || {
                    join_host_warp(warp, lane);
                    tiny.heap.malloc(TWO_PER_SEGMENT) as u64
                })
            })
            .collect();
        tiny.heap.free(first as *mut u8);
        let mut got: Vec<u64> = lanes.into_iter().map(|t| t.join().unwrap()).collect();
        assert!(got.iter().all(|&p| p != 0), "{got:x?}");
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), 2, "a block handed out twice");
        for p in got {
            tiny.heap.free(p as *mut u8);
        }
        tiny.heap.flush_slots();
        let stats = tiny.stats();
        assert_eq!(tiny.heap.free_segments(), 2, "{stats:?}");
    });
}

/// A quarter of a 2 MiB segment: a block class of four blocks per segment.
const FOUR_PER_SEGMENT: u64 = SEGMENT_BYTES / 4;

/// Ignored: slow. At preemption bound 2 it failed before the out-of-tree
/// window word (a lone claimer's third block null while both segments
/// show two free blocks and are back in the class tree at the end: a
/// claim that found the class tree transiently empty, between another
/// claimer's drop and its re-check's re-insert, with the segment tree
/// exhausted; `docs/PERF.md`, "The null beside free blocks"). With the
/// window word it ran over 12 minutes without a failure and was stopped
/// unfinished; `a_drop_in_flight_hides_no_block_from_a_last_try` is the
/// smaller model of that window that runs with the suite. At bound 1 it
/// passes but never reaches the team format.
#[test]
#[ignore = "slow at bound 2 with the fix (over 12 min); see a_drop_in_flight_hides_no_block_from_a_last_try"]
fn a_team_formats_a_batch_for_a_lone_claimer() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(2);
    b.max_branches = 100_000;
    b.check(|| {
        // Two segments of four 512 KiB blocks; a phantom claimer counts
        // four blocks of demand, so a batch is both segments. A two-lane
        // team (fewer than a segment's blocks: the locked path) mallocs
        // one block per lane while a lone thread mallocs three. If the
        // team's leader wins the lock, the team formats the batch
        // (`format_batch_team`): lane 0 segment 0 with the team's two
        // blocks taken, lane 1 segment 1, then `bar.warp.sync` and the
        // leader's insert; the lone thread's third block must come from
        // segment 1, whose bitmap lane 1 wrote (a bitmap not ordered before
        // the leader's insert would leave it spinning). If the lone thread
        // wins, it formats alone and the team reserves. Either way five
        // different blocks, both segments back after the frees and a
        // flush, and only the phantom's demand left on the lock.
        let tiny = Tiny::with_segments(2);
        let class = match Request::for_size(FOUR_PER_SEGMENT, SHIFT) {
            Request::Class(c) if !c.is_slice() => c,
            r => panic!("{r:?}"),
        };
        let phantom = 4 << 1;
        gpu_kernel::arch::fetch_add_relaxed(format_lock_word(&tiny, class), phantom);
        let warp = HostWarp::new();
        let lanes: Vec<_> = (0..2u32)
            .map(|lane| {
                let (tiny, warp) = (tiny.clone(), warp.clone());
                thread::spawn(move || {
                    join_host_warp(warp, lane);
                    tiny.heap.malloc(FOUR_PER_SEGMENT) as u64
                })
            })
            .collect();
        let mut got: Vec<u64> = (0..3)
            .map(|_| tiny.heap.malloc(FOUR_PER_SEGMENT) as u64)
            .collect();
        got.extend(lanes.into_iter().map(|t| t.join().unwrap()));
        assert!(got.iter().all(|&p| p != 0), "{got:x?}");
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), 5, "a block handed out twice");
        for p in got {
            tiny.heap.free(p as *mut u8);
        }
        tiny.heap.flush_slots();
        assert_eq!(tiny.heap.free_segments(), 2);
        assert_eq!(
            gpu_kernel::arch::load_relaxed(format_lock_word(&tiny, class)),
            phantom
        );
    });
}

/// A drop's window (`Heap::drop_from_class_tree`: remove, re-load, re-insert)
/// on a heap with no free segment left: three threads `malloc` a 512 KiB
/// block each (four per segment) on a one-segment heap. One formats the
/// segment; another may find it in the class tree with a stale state (its
/// load is relaxed), drop it and put it back; a claim that looked in
/// between found the class tree empty and the segment tree exhausted, and
/// its last try (`reclaim_and_claim`) could meet the same window: a null
/// beside free blocks (`docs/PERF.md`, "The null beside free blocks").
/// The last try waits for the class's windows, so all three get different
/// blocks and the segment comes back whole. Bound 1 finds the null
/// without the window word (the smaller reproducer of
/// `a_team_formats_a_batch_for_a_lone_claimer`) and passes with it in
/// about 2 s.
#[test]
fn a_drop_in_flight_hides_no_block_from_a_last_try() {
    let mut b = loom::model::Builder::new();
    b.preemption_bound = Some(1);
    b.max_branches = 100_000;
    b.check(|| {
        let tiny = Tiny::with_segments(1);
        let others: Vec<_> = (0..2)
            .map(|_| {
                let tiny = tiny.clone();
                thread::spawn(move || tiny.heap.malloc(FOUR_PER_SEGMENT) as u64)
            })
            .collect();
        let mut got = vec![tiny.heap.malloc(FOUR_PER_SEGMENT) as u64];
        got.extend(others.into_iter().map(|t| t.join().unwrap()));
        assert!(got.iter().all(|&p| p != 0), "{got:x?}");
        got.sort_unstable();
        got.dedup();
        assert_eq!(got.len(), 3, "a block handed out twice");
        for p in got {
            tiny.heap.free(p as *mut u8);
        }
        tiny.heap.flush_slots();
        assert_eq!(tiny.heap.free_segments(), 1);
    });
}

/// Two draws from the 256 B class's empty stripe on a one-segment heap:
/// the first add refills (claims the segment, publishes its two blocks
/// with one drawn); the other gets the second block, waiting for the
/// refill's exchange if its add came first. Never the same block; the
/// segment comes back whole once the drawn blocks are given back.
#[test]
fn two_draws_from_a_stripe_take_different_blocks() {
    model_long(|| {
        let tiny = Tiny::new();
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.loom_draw_from_stripe(256));
        let mine = tiny.heap.loom_draw_from_stripe(256);
        let theirs = t.join().unwrap();
        let (Some(a), Some(b)) = (mine, theirs) else {
            panic!("a draw came back empty: {mine:?} {theirs:?}");
        };
        assert_ne!(a, b);
        tiny.heap.loom_release_drawn(256, a);
        tiny.heap.loom_release_drawn(256, b);
        tiny.assert_whole();
    });
}

/// A draw on a one-segment heap whose segment is taken: the refill finds
/// none and closes the stripe, and a second draw racing it gets none too
/// (it waits for the refill, then sees the closed word) instead of
/// waiting for ever; once the segment is back, a draw reopens the word
/// and refills.
#[test]
fn draws_on_a_full_heap_close_the_stripe() {
    model_long(|| {
        let tiny = Tiny::new();
        assert_eq!(tiny.heap.withdraw_free_segment(), Some(0));
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.loom_draw_from_stripe(256));
        let mine = tiny.heap.loom_draw_from_stripe(256);
        assert_eq!((mine, t.join().unwrap()), (None, None));
        assert!(tiny.heap.add_segment(0));
        let g = tiny.heap.loom_draw_from_stripe(256).expect("reopened");
        tiny.heap.loom_release_drawn(256, g);
        tiny.assert_whole();
    });
}

/// A draw racing a drain of the same stripe: whichever order, the drawn
/// block is the drawer's alone and every other block of the stripe goes
/// back (the drain retires what it displaces, and so does a refill that
/// displaces the drain's empty word).
#[test]
fn a_draw_races_a_drain_of_its_stripe() {
    model_long(|| {
        let tiny = Tiny::new();
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.loom_drain_stripe(256));
        let mine = tiny.heap.loom_draw_from_stripe(256);
        t.join().unwrap();
        if let Some(g) = mine {
            tiny.heap.loom_release_drawn(256, g);
        }
        tiny.assert_whole();
    });
}

/// A refill that takes a held segment's free blocks (`STRIPE_REUSE`)
/// races an ordinary claim of one block of the same class, on a
/// one-segment heap of four 64 B blocks of which a drawer still holds two:
/// the refill reserves the run of the other two and takes its bits while
/// the claim reserves and scans, so the claim may take a bit of the run
/// first (the refill must then find the bit its reservation still holds
/// elsewhere) and the refill must never take more bits than it reserved
/// (the claim's scan would never end). The draw always gets a block, the
/// claim one unless the refill's run took both, never the same one, and
/// everything comes back, none of it twice.
#[test]
fn a_refill_from_a_held_segment_races_a_claim() {
    model_long(|| {
        let tiny = Tiny::new();
        let drawn: Vec<u64> = (0..4)
            .map(|_| tiny.heap.loom_draw_from_stripe(64).expect("a block"))
            .collect();
        tiny.heap.loom_release_drawn(64, drawn[0]);
        tiny.heap.loom_release_drawn(64, drawn[1]);
        let t1 = tiny.clone();
        let t = thread::spawn(move || t1.heap.loom_claim_one_slice_block(64));
        let mine = tiny.heap.loom_draw_from_stripe(64).expect("a free block");
        let claimed = t.join().unwrap();
        assert!(mine == drawn[0] || mine == drawn[1], "{mine} {drawn:?}");
        tiny.heap.loom_release_drawn(64, mine);
        if let Some(b) = claimed {
            tiny.heap.loom_release_claimed(64, b);
        }
        tiny.heap.loom_release_drawn(64, drawn[2]);
        tiny.heap.loom_release_drawn(64, drawn[3]);
        tiny.assert_whole();
        // A block the claim and the stripe both held would come back twice.
        let stats = tiny.stats();
        assert_eq!((stats.double_frees, stats.invalid_frees), (0, 0));
    });
}
