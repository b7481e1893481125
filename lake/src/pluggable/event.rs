//! `EventSource`: the narrow boundary between the pool's stream rule and
//! CUDA events, and `ModelEvents`, its CPU model for tests.
//!
//! The pool records an event on the freeing stream at every free and later
//! asks whether it has completed; that is all it needs of events.
//!
//! Concurrency: implementations are `Send + Sync`. The pool calls them
//! while holding its own lock; the model keeps its state behind one mutex
//! and counts calls with relaxed atomics (independent statistics).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::error::EventFailure;

/// A stream, as the raw `cudaStream_t` / `CUstream` value (0 is the legacy
/// default stream).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// An event recorded by an [`EventSource`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// Events recorded on streams.
pub trait EventSource: Send + Sync {
    /// Records a new event on `stream`: it completes once all work
    /// submitted to `stream` so far has completed.
    fn record(&self, stream: StreamId) -> Result<EventId, EventFailure>;

    /// Whether `event` has completed. `event` came from
    /// [`EventSource::record`] and was not destroyed.
    fn is_complete(&self, event: EventId) -> Result<bool, EventFailure>;

    /// Gives `event` back; it is not used again. Makes no driver call (a
    /// source may keep the event for a later record).
    fn destroy(&self, event: EventId);

    /// Waits until all work submitted to the device so far has completed
    /// (every event recorded so far completes). Used before out of memory
    /// is declared and before a graph's memory returns to general use.
    fn synchronize_all(&self) -> Result<(), EventFailure>;

    /// Waits until `event` has completed (the work submitted to its stream
    /// before it), not for later work. `event` came from
    /// [`EventSource::record`] and was not destroyed. By default the whole
    /// device, which is correct and slower.
    fn synchronize(&self, event: EventId) -> Result<(), EventFailure> {
        let _ = event;
        self.synchronize_all()
    }

    /// Driver calls made so far (creations, records, queries and
    /// synchronisations).
    fn calls(&self) -> u64;
}

/// CPU model of events: an event completes when the test says so
/// ([`ModelEvents::complete`], [`ModelEvents::complete_stream`]), or at once
/// when built with [`ModelEvents::completing`].
#[derive(Debug, Default)]
pub struct ModelEvents {
    state: Mutex<ModelState>,
    calls: AtomicU64,
}

#[derive(Debug, Default)]
struct ModelState {
    next: u64,
    /// Live events: their stream and whether they completed.
    live: HashMap<EventId, (StreamId, bool)>,
    /// Complete every event as soon as it is recorded.
    at_once: bool,
}

impl ModelEvents {
    /// Events that complete only when told.
    pub fn new() -> ModelEvents {
        ModelEvents::default()
    }

    /// Events that complete as soon as they are recorded (idle streams).
    pub fn completing() -> ModelEvents {
        let m = ModelEvents::default();
        m.state().at_once = true;
        m
    }

    fn state(&self) -> MutexGuard<'_, ModelState> {
        // Each update is a single insert or flag write: a poisoned lock
        // still guards consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn count(&self) {
        // Relaxed: an independent counter, read only for reporting.
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Completes one event (its stream's work is done).
    pub fn complete(&self, event: EventId) {
        if let Some(e) = self.state().live.get_mut(&event) {
            e.1 = true;
        }
    }

    /// Completes every live event recorded on `stream`.
    pub fn complete_stream(&self, stream: StreamId) {
        for (s, done) in self.state().live.values_mut() {
            if *s == stream {
                *done = true;
            }
        }
    }

    /// Live (recorded, not destroyed) events.
    pub fn live(&self) -> usize {
        self.state().live.len()
    }
}

impl EventSource for ModelEvents {
    fn record(&self, stream: StreamId) -> Result<EventId, EventFailure> {
        self.count();
        let mut s = self.state();
        s.next += 1;
        let id = EventId(s.next);
        let done = s.at_once;
        s.live.insert(id, (stream, done));
        Ok(id)
    }

    fn is_complete(&self, event: EventId) -> Result<bool, EventFailure> {
        self.count();
        match self.state().live.get(&event) {
            Some(&(_, done)) => Ok(done),
            None => Err(EventFailure {
                call: "cuEventQuery",
                cause: format!("refused by the CPU model: event {} is not live", event.0),
            }),
        }
    }

    fn destroy(&self, event: EventId) {
        self.state().live.remove(&event);
    }

    fn synchronize_all(&self) -> Result<(), EventFailure> {
        self.count();
        for (_, done) in self.state().live.values_mut() {
            *done = true;
        }
        Ok(())
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}
