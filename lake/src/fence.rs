//! Fences: who may reuse freed memory, and when.
//!
//! The stream rule (memory freed on stream S is reused at once by S, by any
//! other stream only after the work S submitted before the free has
//! completed) is kept where the memory lies, not in a waiting list beside
//! it: a free chunk of the lake, or a free piece of the split cache,
//! carries a [`Fence`], the streams that used it with the number of the
//! free on each (per-stream sequence numbers, increasing). [`Progress`]
//! records, per stream, the highest number whose event was seen complete.
//! A [`Requester`] on stream T may take memory whose every fence entry is
//! T's own or complete. Events of one stream complete in order, so one
//! number per stream says everything; a fence with several entries (a
//! block used on several streams, or pieces merged after frees on several
//! streams) keeps the highest number per stream.
//!
//! So a single-stream program reuses everything at once, whatever its
//! GPU lags behind, and idle memory flows between streams as events
//! complete, with no driver call and no copy.
//!
//! Concurrency: plain values; the owners (the lake's and the pool's state)
//! keep them behind their locks.

use std::collections::HashMap;
use std::sync::Arc;

/// Streams that used freed memory, each with the number of the free on it;
/// empty: anyone may reuse it. Cloning is cheap: a fence of one stream
/// (every free of a one-stream program, and most of any other) is held
/// inline, with no allocation and no reference count to touch; several
/// streams' entries are shared. A freed range gives its fence to each of
/// its chunks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fence {
    entries: Entries,
}

/// (stream, free number), sorted by stream, one entry per stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum Entries {
    /// Anyone may reuse.
    #[default]
    Empty,
    /// One stream, inline.
    One([(u64, u64); 1]),
    /// Two streams or more, shared.
    Many(Arc<[(u64, u64)]>),
}

impl Fence {
    /// No fence: anyone may reuse.
    pub fn none() -> Fence {
        Fence::default()
    }

    /// Freed on `stream` as its free number `seq`.
    pub fn single(stream: u64, seq: u64) -> Fence {
        Fence {
            entries: Entries::One([(stream, seq)]),
        }
    }

    fn entries(&self) -> &[(u64, u64)] {
        match &self.entries {
            Entries::Empty => &[],
            Entries::One(one) => one,
            Entries::Many(many) => many,
        }
    }

    /// (stream, free number) for each stream it names.
    pub fn numbers(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.entries().iter().copied()
    }

    /// The streams it names.
    pub fn streams(&self) -> impl Iterator<Item = u64> + '_ {
        self.entries().iter().map(|&(s, _)| s)
    }

    /// Whether nobody is kept out.
    pub fn is_none(&self) -> bool {
        matches!(self.entries, Entries::Empty)
    }

    /// Adds `other`'s entries, keeping the highest number per stream (the
    /// memory now holds what both fences guarded).
    pub fn join(&mut self, other: &Fence) {
        if other.is_none() || self == other {
            return;
        }
        match (&mut self.entries, &other.entries) {
            (Entries::Empty, _) => {
                self.entries = other.entries.clone();
                return;
            }
            (Entries::One([(s, q)]), Entries::One([(t, r)])) if s == t => {
                *q = (*q).max(*r);
                return;
            }
            _ => {}
        }
        let mut entries = self.entries().to_vec();
        for &(stream, seq) in other.entries() {
            match entries.binary_search_by_key(&stream, |&(s, _)| s) {
                Ok(i) => entries[i].1 = entries[i].1.max(seq),
                Err(i) => entries.insert(i, (stream, seq)),
            }
        }
        self.entries = match entries[..] {
            [one] => Entries::One([one]),
            _ => Entries::Many(entries.into()),
        };
    }

    /// Whether `req` may reuse the memory now.
    pub fn admits(&self, req: &Requester<'_>) -> bool {
        self.entries()
            .iter()
            .all(|&(s, q)| s == req.stream || req.progress.done(s) >= q)
    }

    /// Whether `self` and `other` guard the same streams (joining them
    /// delays nobody new).
    pub fn same_streams(&self, other: &Fence) -> bool {
        self.entries().len() == other.entries().len()
            && self
                .entries()
                .iter()
                .zip(other.entries())
                .all(|(a, b)| a.0 == b.0)
    }

    /// The fence with what `progress` settles dropped: none once every
    /// stream's work is complete.
    pub fn settled(&self, progress: &Progress) -> Fence {
        if self.pending(progress) {
            self.clone()
        } else {
            Fence::none()
        }
    }

    /// Whether two free neighbours may become one piece: both unfenced, or
    /// both fenced by the same streams. Anything else would make memory
    /// free for some stream wait for another's event.
    pub fn mergeable(&self, other: &Fence) -> bool {
        self.same_streams(other)
    }

    /// Whether some stream's work on the memory may still be pending (not
    /// every stream may reuse it yet).
    pub fn pending(&self, progress: &Progress) -> bool {
        self.entries().iter().any(|&(s, q)| progress.done(s) < q)
    }
}

/// Per stream, the highest free number whose event was seen complete.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    done: HashMap<u64, u64>,
}

impl Progress {
    /// Nothing seen complete.
    pub fn new() -> Progress {
        Progress::default()
    }

    /// The highest complete free number of `stream` (0: none).
    pub fn done(&self, stream: u64) -> u64 {
        self.done.get(&stream).copied().unwrap_or(0)
    }

    /// Records that `stream`'s frees up to `seq` are complete.
    pub fn advance(&mut self, stream: u64, seq: u64) {
        let d = self.done.entry(stream).or_default();
        *d = (*d).max(seq);
    }
}

/// Who asks for memory: a stream, and what is known complete.
#[derive(Clone, Copy, Debug)]
pub struct Requester<'a> {
    /// The asking stream.
    pub stream: u64,
    /// Streams' completed frees.
    pub progress: &'a Progress,
}

/// The progress of a caller that knows no events: only unfenced memory is
/// admitted to it.
static NO_PROGRESS: std::sync::LazyLock<Progress> = std::sync::LazyLock::new(Progress::new);

impl Requester<'static> {
    /// A caller outside any stream bookkeeping (plain [`super::Lake::alloc`]):
    /// it may take only unfenced memory.
    pub fn unfenced() -> Requester<'static> {
        Requester {
            stream: u64::MAX,
            progress: &NO_PROGRESS,
        }
    }
}
