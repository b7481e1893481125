//! Run requests: how a device thread whose run of segments cannot be
//! claimed asks the host's growth service to stitch one (issue 13), and
//! how the answer comes back. `Heap::malloc_waiting` posts; the service
//! (`host::vmm_heap`) takes, stitches with `alloc_large`'s code, answers.
//!
//! The area is [`REQUEST_SLOTS`] metadata words after the run cursor
//! (`Heap::request_words`). Each word is one slot, a small state machine
//! whose low [`TAG_BITS`] bits say who owns it:
//!
//! | state | value | owner |
//! |---|---|---|
//! | `FREE` | 0 | nobody: any thread may post |
//! | `POSTED(n)` | `n << 3 \| 1` | the posting thread; waits for the service |
//! | `SERVING(n)` | `n << 3 \| 2` | the service, stitching `n` segments |
//! | `ABANDONED(n)` | `n << 3 \| 3` | the service: the thread gave up |
//! | `ANSWERED(a)` | `a \| 4` | the thread: `a` is the run (0: none) |
//!
//! A run's address is a segment boundary (at least 1 MiB aligned), so the
//! tag fits under it. Transitions, each one atomic on the slot word:
//!
//! - thread, post: CAS `FREE → POSTED(n)`. Only the word carries data;
//!   acq_rel anyway (the arch helper), which orders the thread after the
//!   previous owner's release of the slot.
//! - service, take: CAS `POSTED(n) → SERVING(n)`. From here the thread
//!   cannot withdraw; it may only abandon.
//! - service, answer: CAS `SERVING(n) → ANSWERED(a)`, **release**: the
//!   run's segment states (`adopt_run`'s stores, made before) and, on the
//!   GPU, the kernel boundary before it, happen before the thread's
//!   acquire load that sees `ANSWERED`, so the thread's writes and its
//!   `free` of the run see it published.
//! - thread, take the answer: **acquire** load sees `ANSWERED(a)`, then a
//!   release store of `FREE` (the thread has read the slot before anyone
//!   reuses it).
//! - thread, give up at its deadline: CAS `POSTED → FREE` (the service
//!   never saw it: nothing was made), or CAS `SERVING → ABANDONED` (the
//!   service owns the slot and the coming run). If the answer came first
//!   (`ANSWERED`), the thread takes it after all.
//! - service, answer an abandoned slot: the CAS above fails and reads
//!   `ABANDONED` (acquire); the service frees the run itself (`Heap::free`,
//!   so it goes back to the segment tree like any freed run) and stores
//!   `FREE` (release). So a late answer never leaks.
//!
//! A CAS that loses a race re-reads and retries; no step waits for
//! another party except the thread's bounded wait for the answer. If the
//! service is stopped (or never started), posted requests stay `POSTED`
//! until their thread's deadline withdraws them: nothing hangs, nothing is
//! made. Many threads at once: at most [`REQUEST_SLOTS`] requests are in
//! flight; a thread that finds no free slot retries `malloc` and the post
//! each round until its deadline (then null). A `POSTED(n)` that another
//! thread withdrew and a third reposted with the same `n` may be taken
//! by the service: harmless, the answer goes to whoever owns the slot and
//! has the size it asked for.

use crate::arch::{self, Word};

/// Request slots: requests in flight at once.
pub const REQUEST_SLOTS: u32 = 8;

/// How often a thread waiting for its run request tries to claim a run
/// itself (nanoseconds): rarely enough to leave the run lock to the
/// service's withdrawals, often enough to see segments freed meanwhile.
const RETRY_NS: u64 = 20_000;

/// Low bits of a slot word that hold its state.
pub const TAG_BITS: u32 = 3;
const TAG_MASK: u64 = (1 << TAG_BITS) - 1;

const FREE: u64 = 0;
const POSTED: u64 = 1;
const SERVING: u64 = 2;
const ABANDONED: u64 = 3;
const ANSWERED: u64 = 4;

/// The largest run a request can name.
pub const MAX_REQUEST_SEGMENTS: u64 = u64::MAX >> TAG_BITS;

/// What a thread sees when it looks at its posted slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poll {
    /// No answer yet.
    Waiting,
    /// The service answered: the run's address, or 0 (it could not
    /// stitch one). The slot is free again.
    Answered(u64),
}

/// One request slot word (see the module docs for its states).
#[derive(Clone, Copy)]
pub struct RequestSlot<'a>(&'a Word);

impl<'a> RequestSlot<'a> {
    /// The slot held in `word` (a word of the request area, or any word
    /// starting at zero: the loom tests use bare words).
    pub fn new(word: &'a Word) -> RequestSlot<'a> {
        RequestSlot(word)
    }

    /// Thread: posts a request for `count` segments (`FREE → POSTED`);
    /// false if the slot is taken.
    pub fn post(self, count: u64) -> bool {
        debug_assert!(count > 0 && count <= MAX_REQUEST_SEGMENTS);
        arch::compare_exchange_acq_rel(self.0, FREE, count << TAG_BITS | POSTED).is_ok()
    }

    /// Thread, owning a posted slot: one look for the answer. Acquire:
    /// pairs with the service's release in [`RequestSlot::answer`].
    pub fn poll(self) -> Poll {
        let v = arch::load_acquire(self.0);
        if v & TAG_MASK != ANSWERED {
            return Poll::Waiting;
        }
        // Release: this thread's read of the answer comes before the next
        // owner's post.
        arch::store_release(self.0, FREE);
        Poll::Answered(v & !TAG_MASK)
    }

    /// Thread, owning a posted slot, at its deadline: withdraws the
    /// request, or abandons it to the service if it is being served.
    /// `Some(a)` if the answer came first after all (take it; 0: none).
    pub fn give_up(self) -> Option<u64> {
        let mut v = arch::load_acquire(self.0);
        loop {
            let next = match v & TAG_MASK {
                POSTED => FREE,
                SERVING => (v & !TAG_MASK) | ABANDONED,
                ANSWERED => {
                    arch::store_release(self.0, FREE);
                    return Some(v & !TAG_MASK);
                }
                // FREE or ABANDONED: not a slot this thread owns (a bug);
                // leave it alone.
                _ => return None,
            };
            match arch::compare_exchange_acq_rel(self.0, v, next) {
                Ok(_) => return None,
                Err(now) => v = now,
            }
        }
    }

    /// Service: takes a posted request (`POSTED(n) → SERVING(n)`) and
    /// returns `n`; `None` if the slot holds no posted request.
    pub fn take(self) -> Option<u64> {
        let v = arch::load_acquire(self.0);
        if v & TAG_MASK != POSTED {
            return None;
        }
        arch::compare_exchange_acq_rel(self.0, v, (v & !TAG_MASK) | SERVING)
            .ok()
            .map(|_| v >> TAG_BITS)
    }

    /// Service, having taken this slot: answers with run `address` (a
    /// segment boundary, or 0 for none). True if the thread will get it;
    /// false if it gave up meanwhile: the slot is free again and the
    /// caller must free the run itself.
    pub fn answer(self, address: u64) -> bool {
        debug_assert!(address & TAG_MASK == 0);
        let mut v = arch::load_acquire(self.0);
        loop {
            match v & TAG_MASK {
                // Release: publishes the run (its states, written before)
                // to the thread's acquire in `poll` / `give_up`.
                SERVING => match arch::compare_exchange_acq_rel(self.0, v, address | ANSWERED) {
                    Ok(_) => return true,
                    Err(now) => v = now,
                },
                ABANDONED => {
                    arch::store_release(self.0, FREE);
                    return false;
                }
                // Not a slot the service took (a bug): nobody else has the
                // run, so the caller frees it.
                _ => return false,
            }
        }
    }

    /// The raw word (for tests and the host's snapshot).
    pub fn value(self) -> u64 {
        arch::load_relaxed(self.0)
    }

    /// True if a raw slot value is a posted request (the host's
    /// snapshot test before it launches a take).
    pub fn is_posted(value: u64) -> bool {
        value & TAG_MASK == POSTED
    }
}

impl crate::Heap {
    /// Request slot `i < REQUEST_SLOTS`.
    #[inline(always)]
    fn request_slot(&self, i: u32) -> RequestSlot<'_> {
        RequestSlot::new(&self.region(self.request_words().start + i as u64, 1)[0])
    }

    /// The stitching part of [`crate::Heap::malloc_waiting`] for a run of
    /// `count` segments (out of line, only after the run claim failed):
    /// posts a request for it and waits for the answer until `deadline`
    /// (global timer); the run's address, or 0 (no answer in time, or the
    /// service could not stitch one). A thread that finds every slot
    /// taken tries again each round. Meanwhile, every [`RETRY_NS`] while
    /// the segment tree holds a free segment, it tries to claim a run
    /// itself (without the reclaim `malloc` adds: that was done before the
    /// wait), so a heap with no service behaves as before; if that
    /// succeeds the request is withdrawn (an answer that came first is
    /// freed).
    #[cold]
    #[inline(never)]
    pub(crate) fn request_stitched_run(&self, count: u64, deadline: u64) -> u64 {
        if count == 0 || count > self.segments as u64 {
            return 0;
        }
        let mut slot: Option<RequestSlot<'_>> = None;
        let mut next_try = 0;
        let mut round = 0;
        while arch::global_nanos() < deadline {
            match slot {
                None => {
                    slot = (0..REQUEST_SLOTS)
                        .map(|i| self.request_slot(i))
                        .find(|s| s.post(count));
                }
                Some(s) => {
                    if let Poll::Answered(address) = s.poll() {
                        return address;
                    }
                }
            }
            // A claim only, no reclaim (see `Heap::try_run`), and at most
            // every `RETRY_NS`: the run lock is what the service's
            // withdrawals take too.
            let now = arch::global_nanos();
            if now >= next_try && self.segment_tree().successor(0).is_some() {
                next_try = now.saturating_add(RETRY_NS);
                if let Some(p) = self.try_run(count as u32) {
                    if let Some(late) = slot.and_then(|s| s.give_up()) {
                        self.free(late as *mut u8);
                    }
                    return p;
                }
            }
            arch::backoff(round);
            round = round.saturating_add(1);
        }
        slot.and_then(|s| s.give_up()).unwrap_or(0)
    }

    /// Service (the host): takes one posted run request, if any: its slot
    /// and the segments it asks for. Answer it with
    /// [`crate::Heap::answer_run_request`].
    pub fn take_run_request(&self) -> Option<(u32, u64)> {
        (0..REQUEST_SLOTS).find_map(|i| self.request_slot(i).take().map(|n| (i, n)))
    }

    /// Service: answers the request taken from `slot` with run `address`
    /// (published live, e.g. by [`crate::Heap::adopt_run`]; 0: none). If
    /// the thread gave up meanwhile the run is freed here (back to the
    /// segment tree), so nothing leaks. True if the thread got it.
    pub fn answer_run_request(&self, slot: u32, address: u64) -> bool {
        if slot >= REQUEST_SLOTS {
            return false;
        }
        if self.request_slot(slot).answer(address) {
            return true;
        }
        self.free(address as *mut u8);
        false
    }

    /// The raw request slot words (a snapshot, for tests).
    pub fn request_slot_values(&self) -> [u64; REQUEST_SLOTS as usize] {
        core::array::from_fn(|i| self.request_slot(i as u32).value())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::Heap;
    use crate::class::MIN_SEGMENT_SHIFT;

    fn heap(present: u32) -> (Heap, Vec<Word>) {
        crate::layout::test_support::test_heap(64, present)
    }

    #[test]
    fn a_slot_goes_round_its_states() {
        let w = Word::new(0);
        let s = RequestSlot::new(&w);
        assert_eq!(s.take(), None, "nothing posted");
        assert!(s.post(5));
        assert!(!s.post(3), "taken");
        assert_eq!(s.poll(), Poll::Waiting);
        assert_eq!(s.take(), Some(5));
        assert_eq!(s.take(), None, "taken once");
        assert!(s.answer(1 << 21));
        assert_eq!(s.poll(), Poll::Answered(1 << 21));
        assert_eq!(s.value(), 0, "free again");

        // Withdrawn before the service looked: nothing to serve.
        assert!(s.post(2));
        assert_eq!(s.give_up(), None);
        assert_eq!(s.value(), 0);
        assert_eq!(s.take(), None);

        // Abandoned while served: the answer is refused, the slot freed.
        assert!(s.post(2));
        assert_eq!(s.take(), Some(2));
        assert_eq!(s.give_up(), None);
        assert!(!s.answer(1 << 22));
        assert_eq!(s.value(), 0);

        // Answered before the deadline's look: the thread takes it.
        assert!(s.post(2));
        assert_eq!(s.take(), Some(2));
        assert!(s.answer(0));
        assert_eq!(s.give_up(), Some(0), "answered with none");
        assert_eq!(s.value(), 0);
    }

    /// A run answered to a thread that gave up is freed into the segment
    /// tree by the answer.
    #[test]
    fn a_late_answer_is_freed() {
        let (h, _words) = heap(8);
        let seg = 1u64 << MIN_SEGMENT_SHIFT;
        let slot = h.request_slot(3);
        assert!(slot.post(4));
        assert_eq!(h.take_run_request(), Some((3, 4)));
        assert!(h.adopt_run(20, 4));
        assert_eq!(slot.give_up(), None);
        assert!(!h.answer_run_request(3, h.data + 20 * seg));
        assert_eq!(h.free_segments(), 12, "the run went back to the tree");
        assert_eq!(h.request_slot_values(), [0; REQUEST_SLOTS as usize]);
    }

    /// With no service, a waiting run request gets null at its deadline
    /// and leaves every slot free.
    #[test]
    fn an_unanswered_request_times_out() {
        let (h, _words) = heap(8);
        let seg = 1u64 << MIN_SEGMENT_SHIFT;
        let before = arch::global_nanos();
        assert!(h.malloc_waiting(16 * seg, 2_000_000).is_null());
        assert!(arch::global_nanos() - before >= 2_000_000);
        assert_eq!(h.request_slot_values(), [0; REQUEST_SLOTS as usize]);
    }
}
