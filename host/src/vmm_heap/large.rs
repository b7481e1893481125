//! `alloc_large`: one contiguous range stitched from free segments that
//! need not be adjacent (GMLake's stitching, on the device heap's own
//! segments), published as a live run that device code frees like any
//! allocation. `docs/vmm-heap-large.md` gives the reasons; in short:
//!
//! 1. *target*: the lowest stretch of `n` absent segments (no tree holds
//!    them, nothing is mapped there, no allocation can reach them);
//! 2. *sources*: `flush`, then up to `n` wholly free segments withdrawn
//!    from the tree (the claim `trim` makes: withdrawn or allocated, never
//!    both), wherever they lie: the present segments need not be a prefix,
//!    the ledger keeps absence per segment;
//! 3. *map*: each source's chunks are mapped a second time, in order,
//!    under a target segment (a chunk may be mapped at several addresses),
//!    then access is granted over it; targets no source covers are created
//!    and mapped fresh, as `grow` maps, within the limit;
//! 4. *publish*: `Heap::adopt_run` writes the run's head and tail states
//!    into the segment table, as a run claim does (kernel `heap_adopt_run`
//!    on the GPU);
//! 5. *move*: only then are the sources' first mappings unmapped; their
//!    chunks now belong to the target addresses, and the sources are
//!    absent (`grow` maps them again first: they are the lowest).
//!
//! Until step 5 every source keeps its own mapping, so a failure in steps
//! 3 or 4 is undone by unmapping the second mappings (the `aliases` of the
//! ledger, never released) and republishing the sources, whose memory was
//! never touched. A failed publish call (an `Err`, not a refusal) may have
//! published the run: then targets and sources are stranded, mapped,
//! until drop. A failed unmap in step 5 leaves that source stranded; the
//! range is returned all the same (it is mapped and published).
//!
//! A device `free` of the run ends it (`end_run`) and puts its segments in
//! the segment tree: they are present, mapped segments like any other, so
//! allocations use them and `trim` withdraws and unmaps them.
//!
//! Concurrency: under the ledger lock, like `grow` and `trim`; device
//! allocations and frees go on meanwhile (none can reach an absent or a
//! withdrawn segment).

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Ledger, SegmentTree, Shared, nanos_since, vmm};
use crate::error::{Error, Result};
use crate::vmm::VmmDriver;

/// What [`super::VmmHeap::alloc_large`] handed out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LargeRange {
    /// Device address of the range (a segment boundary): pass it to device
    /// `free` or to [`super::VmmHeap::free_large`].
    pub address: u64,
    /// Bytes of the range (whole segments).
    pub bytes: u64,
    /// Segments whose chunks came from free segments elsewhere in the heap.
    pub stitched_segments: u32,
    /// Segments mapped with newly created chunks (the free ones fell short).
    pub new_segments: u32,
}

impl<D: VmmDriver, M: SegmentTree> Shared<D, M> {
    /// See [`super::VmmHeap::alloc_large`] and the module docs.
    pub(super) fn alloc_large(&self, bytes: u64) -> Result<LargeRange> {
        let start = Instant::now();
        if bytes == 0 {
            return Err(Error::Config("alloc_large of 0 bytes".into()));
        }
        let count = bytes.div_ceil(self.segment_bytes());
        if count > self.segments as u64 {
            return Err(Error::NoRoom(format!(
                "alloc_large of {bytes} bytes: more than the {} segments the heap reserves",
                self.segments
            )));
        }
        let count = count as u32;
        let mut ledger = self.ledger();
        let head = lowest_absent_stretch(&ledger, count).ok_or_else(|| {
            Error::NoRoom(format!(
                "alloc_large of {count} segments: no stretch of {count} absent segments \
                 is left in the reservation (reserve more address space)"
            ))
        })?;

        self.tree.flush()?;
        let withdrawn = self.tree.withdraw(count)?;
        // A stranded segment that reached the tree stays stranded (its
        // chunks may be partly mapped): out of the tree now, it is safe.
        let mut sources: Vec<u32> = withdrawn
            .into_iter()
            .filter(|id| !ledger.stranded.contains(id))
            .collect();
        sources.sort_unstable();
        ledger.present -= sources.len() as u32;
        let fresh = count - sources.len() as u32;
        let room = self
            .limit_segments
            .saturating_sub(ledger.present + ledger.stranded.len() as u32 + sources.len() as u32);
        if fresh > room {
            let free = sources.len();
            self.republish(&mut ledger, &sources)?;
            return Err(Error::NoRoom(format!(
                "alloc_large of {count} segments: {free} free segments and room for {room} \
                 more under the mapping limit"
            )));
        }

        // Step 3: map every target segment.
        let mut made: Vec<u32> = Vec::with_capacity(count as usize);
        let mut failure = None;
        for i in 0..count {
            let target = head + i;
            let step = match sources.get(i as usize) {
                Some(&source) => self.alias_segment(&mut ledger, source, target),
                None => self.map_segment(&mut ledger, target),
            };
            match step {
                Ok(()) => {
                    ledger.absent.remove(&target);
                    made.push(target);
                }
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failure {
            self.undo_targets(&mut ledger, &made);
            // The error reported is the one that caused the undo; a failed
            // republish strands the sources (the stats show them).
            let _ = self.republish(&mut ledger, &sources);
            return Err(e);
        }

        // Step 4: publish the run.
        match self.tree.adopt_run(head, count) {
            Ok(true) => {}
            Ok(false) => {
                self.undo_targets(&mut ledger, &made);
                let _ = self.republish(&mut ledger, &sources);
                return Err(Error::Check(format!(
                    "publishing the stitched run {head}..{} was refused: a segment was not absent",
                    head + count
                )));
            }
            Err(e) => {
                // The run may be live: keep everything mapped, use nothing.
                ledger.stranded.extend(head..head + count);
                ledger.stranded.extend(&sources);
                return Err(e);
            }
        }
        ledger.present += count;

        // Step 5: the chunks now belong to the target addresses.
        for (i, &source) in sources.iter().enumerate() {
            if self.move_segment(&mut ledger, source, head + i as u32) {
                ledger.absent.insert(source);
            } else {
                ledger.stranded.insert(source);
            }
        }
        let c = &self.counters;
        c.large_allocs.fetch_add(1, Ordering::Relaxed);
        c.segments_stitched
            .fetch_add(sources.len() as u64, Ordering::Relaxed);
        c.large_nanos
            .fetch_add(nanos_since(start), Ordering::Relaxed);
        Ok(LargeRange {
            address: self.segment_address(head),
            bytes: (count as u64) << self.segment_shift,
            stitched_segments: sources.len() as u32,
            new_segments: fresh,
        })
    }

    /// Maps every chunk of present segment `source` a second time under
    /// absent segment `target`, in order, and grants access to it; on
    /// failure unmaps what it mapped (a second mapping that will not unmap
    /// strands `target`) and names the call.
    fn alias_segment(&self, ledger: &mut Ledger, source: u32, target: u32) -> Result<()> {
        let from = self.segment_address(source);
        let to = self.segment_address(target);
        let doing = |what: &str| {
            format!(
                "alloc_large: {what} of segment {source} at {from:#x} under segment {target} \
                 at {to:#x}"
            )
        };
        let chunks: Vec<_> = ledger
            .mapped
            .range(from..from + self.segment_bytes())
            .map(|(&a, &c)| (a - from, c))
            .collect();
        let mut failed = None;
        if chunks.len() as u64 * self.driver.granularity() != self.segment_bytes() {
            failed = Some(Error::Check(doing("finding every chunk")));
        }
        for &(offset, chunk) in &chunks {
            if failed.is_some() {
                break;
            }
            match self.driver.map(to + offset, chunk) {
                Ok(()) => {
                    ledger.aliases.insert(to + offset, chunk);
                }
                Err(e) => failed = Some(vmm(doing("mapping a chunk"))(e)),
            }
        }
        if failed.is_none()
            && let Err(e) = self
                .driver
                .set_access_for(to, self.segment_bytes(), &self.peers)
        {
            failed = Some(vmm(doing(&self.granting()))(e));
        }
        let Some(e) = failed else { return Ok(()) };
        if self.unmap_range(ledger, to).is_err() {
            ledger.absent.remove(&target);
            ledger.stranded.insert(target);
        }
        Err(e)
    }

    /// Unmaps `source`'s own mappings, whose chunks are mapped under
    /// `target` too, and hands the chunks to the target addresses. False
    /// if an unmap failed: what was not moved stays as it was.
    fn move_segment(&self, ledger: &mut Ledger, source: u32, target: u32) -> bool {
        let from = self.segment_address(source);
        let to = self.segment_address(target);
        let granules: Vec<u64> = ledger
            .mapped
            .range(from..from + self.segment_bytes())
            .map(|(&a, _)| a)
            .collect();
        for addr in granules {
            if self.driver.unmap(addr).is_err() {
                return false;
            }
            let chunk = ledger.mapped.remove(&addr).expect("listed above");
            let alias = to + (addr - from);
            ledger.aliases.remove(&alias);
            ledger.mapped.insert(alias, chunk);
        }
        true
    }

    /// Unmaps the targets made so far (second mappings unmapped, new
    /// chunks released); a target that will not unmap is stranded.
    fn undo_targets(&self, ledger: &mut Ledger, made: &[u32]) {
        for &target in made {
            if self
                .unmap_range(ledger, self.segment_address(target))
                .is_ok()
            {
                ledger.absent.insert(target);
            } else {
                ledger.stranded.insert(target);
            }
        }
    }

    /// Puts withdrawn `sources` (still mapped, untouched) back in the tree.
    fn republish(&self, ledger: &mut Ledger, sources: &[u32]) -> Result<()> {
        if sources.is_empty() {
            return Ok(());
        }
        match self.tree.add(sources) {
            Ok(n) if n as usize == sources.len() => {
                ledger.present += n;
                Ok(())
            }
            other => {
                ledger.stranded.extend(sources);
                Err(match other {
                    Err(e) => e,
                    Ok(n) => Error::Check(format!(
                        "alloc_large: republishing {} withdrawn segments added only {n}",
                        sources.len()
                    )),
                })
            }
        }
    }
}

/// The lowest id starting `count` consecutive absent segments.
fn lowest_absent_stretch(ledger: &Ledger, count: u32) -> Option<u32> {
    let mut start = 0;
    let mut len = 0;
    let mut next = None;
    for &id in &ledger.absent {
        if next == Some(id) {
            len += 1;
        } else {
            start = id;
            len = 1;
        }
        if len == count {
            return Some(start);
        }
        next = id.checked_add(1);
    }
    None
}
