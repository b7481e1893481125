//! `Pending`: freed blocks that wait for events before another stream may
//! have them (the stream rule), and `Home`, where a block goes once it is
//! free for everyone.
//!
//! A block freed on stream S that some stream may still be using gets one
//! event per such stream (S itself and every stream added with
//! `record_stream`). It is free once all of its events have completed.
//! Until then, S alone may take it back at once, and only when S is its
//! only stream (S's later work is ordered after its own free).
//!
//! Events of one stream complete in the order they were recorded, so each
//! stream keeps a queue and [`Pending::poll`] stops at the first event of a
//! queue that has not completed.
//!
//! Concurrency: not synchronised; the pool keeps it behind its own lock and
//! calls the event source while holding that lock.

use std::collections::{HashMap, VecDeque};

use super::block::{Block, Home};
use super::error::EventFailure;
use super::event::{EventId, EventSource, StreamId};

/// A freed block and how many of its events are still outstanding.
#[derive(Debug)]
struct Waiting {
    block: Block,
    home: Home,
    /// The stream the block was freed on.
    freed_on: StreamId,
    /// Events recorded at the free that have not been seen complete.
    events_left: usize,
}

/// Blocks waiting for events, by address, and each stream's events.
#[derive(Debug, Default)]
pub struct Pending {
    blocks: HashMap<u64, Waiting>,
    queues: HashMap<StreamId, VecDeque<(u64, EventId)>>,
}

impl Pending {
    /// Adds `block`, freed on `freed_on`, with the events recorded for it
    /// (one per stream that may still use it; at least one).
    pub fn insert(
        &mut self,
        block: Block,
        home: Home,
        freed_on: StreamId,
        events: Vec<(StreamId, EventId)>,
    ) {
        debug_assert!(!events.is_empty(), "a waiting block has an event");
        for &(stream, event) in &events {
            self.queues
                .entry(stream)
                .or_default()
                .push_back((block.addr, event));
        }
        self.blocks.insert(
            block.addr,
            Waiting {
                block,
                home,
                freed_on,
                events_left: events.len(),
            },
        );
    }

    /// A general block that `stream` freed, that only `stream` may still be
    /// using, with `capacity` bytes of the given kind: `stream` may take it
    /// back at once. Its event is given back to `events`.
    pub fn take_own(
        &mut self,
        stream: StreamId,
        capacity: u64,
        small: bool,
        events: &dyn EventSource,
    ) -> Option<Block> {
        let queue = self.queues.get_mut(&stream)?;
        let blocks = &self.blocks;
        let i = queue.iter().position(|(addr, _)| {
            blocks.get(addr).is_some_and(|w| {
                w.home == Home::General
                    && w.freed_on == stream
                    && w.events_left == 1
                    && w.block.capacity == capacity
                    && w.block.is_small() == small
            })
        })?;
        let (addr, event) = queue.remove(i).expect("position is in the queue");
        events.destroy(event);
        self.blocks.remove(&addr).map(|w| w.block)
    }

    /// Blocks whose events have all completed, taken out with their homes.
    pub fn poll(&mut self, events: &dyn EventSource) -> Result<Vec<(Block, Home)>, EventFailure> {
        let mut done = Vec::new();
        for queue in self.queues.values_mut() {
            while let Some(&(addr, event)) = queue.front() {
                if !events.is_complete(event)? {
                    break;
                }
                queue.pop_front();
                events.destroy(event);
                let w = self
                    .blocks
                    .get_mut(&addr)
                    .expect("a queued event has a block");
                w.events_left -= 1;
                if w.events_left == 0 {
                    let w = self.blocks.remove(&addr).expect("just seen");
                    done.push((w.block, w.home));
                }
            }
        }
        self.queues.retain(|_, q| !q.is_empty());
        Ok(done)
    }

    /// Capacity of the blocks waiting.
    pub fn bytes(&self) -> u64 {
        self.blocks.values().map(|w| w.block.capacity).sum()
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Gives every event back to `events` and forgets every block (the
    /// pool is going away).
    pub fn clear(&mut self, events: &dyn EventSource) {
        for (_, event) in self.queues.drain().flat_map(|(_, q)| q) {
            events.destroy(event);
        }
        self.blocks.clear();
    }
}
