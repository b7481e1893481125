//! `StitchedList`: the stitched views a chunk is mapped in, with its slot in
//! each. Most chunks are in at most two, kept inside the chunk's own table
//! entry; more go to a vector on the heap.
//!
//! Every take and give of a window reads this list for each of its chunks.
//! As a `Vec` of its own, each chunk's list sat at a random heap address:
//! one cache miss per chunk inside a training loop, where the allocator
//! runs with cold caches (`replay --evict-mib`). Inline, the list shares the
//! chunk's line, and the chunks of a window lie next to each other in the
//! slab.
//!
//! Concurrency: plain data inside the lake's state mutex.

use super::ViewId;

/// Views and slots fit in 32 bits each: view ids count views ever made,
/// slots are below a home view's 2^19.
type Packed = (u32, u32);

/// Mappings of one chunk in stitched views: (view, slot), in no order.
#[derive(Debug, Default)]
pub struct StitchedList {
    inline: [Packed; 2],
    len: u8,
    /// One pointer instead of a `Vec`'s three keeps the chunk's table
    /// entry small; a third mapping is rare.
    #[allow(clippy::box_collection)]
    more: Option<Box<Vec<Packed>>>,
}

fn pack((view, slot): (ViewId, usize)) -> Packed {
    (
        u32::try_from(view).expect("view ids fit in 32 bits"),
        u32::try_from(slot).expect("slots fit in 32 bits"),
    )
}

fn unpack((view, slot): Packed) -> (ViewId, usize) {
    (ViewId::from(view), slot as usize)
}

impl StitchedList {
    /// Adds a mapping.
    pub fn push(&mut self, mapping: (ViewId, usize)) {
        let p = pack(mapping);
        match usize::from(self.len) {
            n @ (0 | 1) => {
                self.inline[n] = p;
                self.len += 1;
            }
            _ => self.more.get_or_insert_with(Box::default).push(p),
        }
    }

    /// Keeps only the mappings `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&(ViewId, usize)) -> bool) {
        let all: Vec<(ViewId, usize)> = self.iter().filter(|m| keep(m)).collect();
        *self = StitchedList::default();
        for m in all {
            self.push(m);
        }
    }

    /// Every mapping.
    pub fn iter(&self) -> impl Iterator<Item = (ViewId, usize)> + '_ {
        self.inline[..usize::from(self.len)]
            .iter()
            .chain(self.more.iter().flat_map(|v| v.iter()))
            .map(|&p| unpack(p))
    }

    /// Whether the chunk is in no stitched view.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `mapping` is in the list.
    pub fn contains(&self, mapping: &(ViewId, usize)) -> bool {
        self.iter().any(|m| m == *mapping)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_beyond_two_spill_and_retain_keeps_the_rest() {
        let mut list = StitchedList::default();
        assert!(list.is_empty());
        for v in 1..=5u64 {
            list.push((v, v as usize * 10));
        }
        assert!(list.more.is_some());
        let mut all: Vec<_> = list.iter().collect();
        all.sort_unstable();
        assert_eq!(all, [(1, 10), (2, 20), (3, 30), (4, 40), (5, 50)]);
        assert!(list.contains(&(4, 40)) && !list.contains(&(4, 41)));
        list.retain(|&(v, _)| v % 2 == 1);
        let mut odd: Vec<_> = list.iter().collect();
        odd.sort_unstable();
        assert_eq!(odd, [(1, 10), (3, 30), (5, 50)]);
        list.retain(|_| false);
        assert!(list.is_empty() && list.more.is_none());
    }
}
