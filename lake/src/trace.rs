//! Allocation traces: every alloc and free of a lake with its size, address,
//! stream, time and a caller-supplied phase tag; recorded on request
//! ([`super::Lake::start_trace`]), written to and read from a compact binary
//! file, and replayed against a lake (on the CPU model, or any driver).
//! Later planning work (STWeaver) reads these traces.
//!
//! File format (version 1), all integers little-endian:
//!
//! ```text
//! header  magic "GMLKTRC\0" (8 bytes) | version u32 | record bytes u32
//!         | granularity u64 | record count u64
//! record  kind u8 (1 alloc, 2 free) | size u64 | addr u64 | stream u32
//!         | phase u32 | time ns since recording began u64
//! ```
//!
//! Concurrency: a recorder lives inside the lake's state mutex and is
//! written under it, so events are in the order the lake served them.
//! A finished [`Trace`] is a plain value.

use std::fmt;
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Instant;

use super::driver::VmmDriver;
use super::error::{LakeError, LakeResult};
use super::pool::{DeviceRange, Lake};
use super::stats::Outcomes;

/// The file's first eight bytes.
pub const MAGIC: [u8; 8] = *b"GMLKTRC\0";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
/// Bytes of one record.
pub const RECORD_BYTES: usize = 1 + 8 + 8 + 4 + 4 + 8;
/// Bytes of the header.
pub const HEADER_BYTES: usize = 8 + 4 + 4 + 8 + 8;

/// Where a call came from: caller-supplied tags kept in the trace.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Site {
    /// The stream the memory is used on.
    pub stream: u32,
    /// A phase tag (e.g. forward = 0, backward = 1, or a layer number).
    pub phase: u32,
}

/// Alloc or free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// An allocation.
    Alloc,
    /// A free.
    Free,
}

impl EventKind {
    fn code(self) -> u8 {
        match self {
            EventKind::Alloc => 1,
            EventKind::Free => 2,
        }
    }

    fn from_code(code: u8) -> Option<EventKind> {
        match code {
            1 => Some(EventKind::Alloc),
            2 => Some(EventKind::Free),
            _ => None,
        }
    }
}

/// One alloc or free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// Alloc or free.
    pub kind: EventKind,
    /// Bytes asked for (for a free, the allocation's size).
    pub size: u64,
    /// The range's address.
    pub addr: u64,
    /// Stream and phase.
    pub site: Site,
    /// Nanoseconds since recording began.
    pub time_ns: u64,
}

/// A recorded trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Chunk size of the lake that recorded it.
    pub granularity: u64,
    /// Events in the order they happened.
    pub events: Vec<Event>,
}

/// Why a trace could not be read or written.
#[derive(Debug)]
pub enum TraceError {
    /// The file could not be read or written.
    Io(io::Error),
    /// The bytes are not a trace of this version (what is wrong).
    Format(String),
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TraceError::Io(e) => write!(f, "trace file: {e}"),
            TraceError::Format(why) => write!(f, "not a lake trace (version {VERSION}): {why}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            TraceError::Io(e) => Some(e),
            TraceError::Format(_) => None,
        }
    }
}

impl From<io::Error> for TraceError {
    fn from(e: io::Error) -> TraceError {
        TraceError::Io(e)
    }
}

/// Records events as a lake serves them.
#[derive(Debug)]
pub struct TraceRecorder {
    start: Instant,
    trace: Trace,
}

impl TraceRecorder {
    /// An empty recording for a lake of `granularity`-byte chunks.
    pub fn new(granularity: u64) -> TraceRecorder {
        TraceRecorder {
            start: Instant::now(),
            trace: Trace {
                granularity,
                events: Vec::new(),
            },
        }
    }

    /// Appends one event, stamped now.
    pub fn record(&mut self, kind: EventKind, size: u64, addr: u64, site: Site) {
        let time_ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.trace.events.push(Event {
            kind,
            size,
            addr,
            site,
            time_ns,
        });
    }

    /// The trace recorded.
    pub fn finish(self) -> Trace {
        self.trace
    }
}

/// Reads `N` little-endian bytes at `at`.
fn take<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    bytes[at..at + N]
        .try_into()
        .expect("caller checked the length")
}

impl Trace {
    /// Writes the trace in the binary format.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut buf = Vec::with_capacity(HEADER_BYTES + RECORD_BYTES * self.events.len());
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&VERSION.to_le_bytes());
        buf.extend_from_slice(&(RECORD_BYTES as u32).to_le_bytes());
        buf.extend_from_slice(&self.granularity.to_le_bytes());
        buf.extend_from_slice(&(self.events.len() as u64).to_le_bytes());
        for e in &self.events {
            buf.push(e.kind.code());
            buf.extend_from_slice(&e.size.to_le_bytes());
            buf.extend_from_slice(&e.addr.to_le_bytes());
            buf.extend_from_slice(&e.site.stream.to_le_bytes());
            buf.extend_from_slice(&e.site.phase.to_le_bytes());
            buf.extend_from_slice(&e.time_ns.to_le_bytes());
        }
        w.write_all(&buf)
    }

    /// Reads a trace written by [`Trace::write_to`].
    pub fn read_from(r: &mut impl Read) -> Result<Trace, TraceError> {
        let mut bytes = Vec::new();
        r.read_to_end(&mut bytes)?;
        if bytes.len() < HEADER_BYTES {
            return Err(TraceError::Format(format!(
                "{} bytes, shorter than the header",
                bytes.len()
            )));
        }
        if take::<8>(&bytes, 0) != MAGIC {
            return Err(TraceError::Format("wrong magic".into()));
        }
        let version = u32::from_le_bytes(take(&bytes, 8));
        if version != VERSION {
            return Err(TraceError::Format(format!("version {version}")));
        }
        let record = u32::from_le_bytes(take(&bytes, 12)) as usize;
        if record != RECORD_BYTES {
            return Err(TraceError::Format(format!(
                "records of {record} bytes, expected {RECORD_BYTES}"
            )));
        }
        let granularity = u64::from_le_bytes(take(&bytes, 16));
        let count = u64::from_le_bytes(take(&bytes, 24));
        let body = bytes.len() - HEADER_BYTES;
        if body as u64 != count.saturating_mul(RECORD_BYTES as u64) {
            return Err(TraceError::Format(format!(
                "header says {count} records, body has {body} bytes"
            )));
        }
        let mut events = Vec::with_capacity(count as usize);
        for rec in bytes[HEADER_BYTES..].chunks_exact(RECORD_BYTES) {
            let kind = EventKind::from_code(rec[0]).ok_or_else(|| {
                TraceError::Format(format!("event kind {} at record {}", rec[0], events.len()))
            })?;
            events.push(Event {
                kind,
                size: u64::from_le_bytes(take(rec, 1)),
                addr: u64::from_le_bytes(take(rec, 9)),
                site: Site {
                    stream: u32::from_le_bytes(take(rec, 17)),
                    phase: u32::from_le_bytes(take(rec, 21)),
                },
                time_ns: u64::from_le_bytes(take(rec, 25)),
            });
        }
        Ok(Trace {
            granularity,
            events,
        })
    }

    /// Writes the trace to a file.
    pub fn save(&self, path: &Path) -> Result<(), TraceError> {
        let mut f = io::BufWriter::new(std::fs::File::create(path)?);
        self.write_to(&mut f)?;
        f.flush()?;
        Ok(())
    }

    /// Reads a trace from a file.
    pub fn load(path: &Path) -> Result<Trace, TraceError> {
        Trace::read_from(&mut io::BufReader::new(std::fs::File::open(path)?))
    }

    /// Replays the trace against `lake`: each alloc of the same size at the
    /// same site, each free of the range that replaced the recorded address.
    /// Returns how the lake served the replayed allocations. Ranges still
    /// live at the end of the trace stay allocated.
    pub fn replay<D: VmmDriver>(&self, lake: &Lake<D>) -> LakeResult<Outcomes> {
        let before = lake.stats().outcomes;
        let mut map: std::collections::HashMap<u64, DeviceRange> = std::collections::HashMap::new();
        for e in &self.events {
            match e.kind {
                EventKind::Alloc => {
                    let range = lake.alloc_at(e.size, e.site)?;
                    map.insert(e.addr, range);
                }
                EventKind::Free => {
                    let range = map.remove(&e.addr).ok_or(LakeError::NotOurs {
                        addr: e.addr,
                        len: e.size,
                        why: "the trace frees an address it did not allocate",
                    })?;
                    lake.free_at(range, e.site)?;
                }
            }
        }
        Ok(lake.stats().outcomes.since(&before))
    }
}
