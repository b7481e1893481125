//! Host time of each `StreamPool` call on a recorded training trace, with
//! warm caches (a tight loop) and with cold ones (other memory streamed
//! through the caches between calls, as PyTorch and Python do between two
//! allocator calls in training). Issue 11: the pool's calls cost 2.2–2.8 µs
//! each inside a GPT-2 training step but 0.4–0.8 µs in a loop.
//!
//! Workload: the trace replayed through a fresh pool on the data-less model
//! driver (as `replay`), at the chunk size `torch-alloc` uses (16 MiB),
//! reuse cache off (`lake`'s default; `--reuse N` keeps N blocks, as
//! `torch-alloc` does by default). The first `--warmup` steps (growth) are
//! run but not timed. In cold mode only every `--every`-th call of the
//! timed steps is preceded by the eviction and timed (the eviction costs
//! milliseconds; the others run untimed, so the pool's state is the same).
//!
//! ```text
//! cargo run -p lake --release --example pool_call_cost -- [OPTIONS] [TRACE[.gz]]
//!   TRACE            default: lake/tests/data/gpt2-b16-6steps.trace.gz
//!   --chunk-mib N    the lake's chunk size (16)
//!   --evict-mib N    bytes read between timed calls in the cold mode (48)
//!   --every N        cold mode: time one call in N (4)
//!   --warmup N       steps run before timing (2)
//!   --rounds N       warm mode: replays of the trace, each on a fresh pool (3)
//!   --mode M         warm, cold or both (both)
//!   --reuse N        blocks the pool's reuse cache keeps (0: off)
//! ```

#[path = "common/usage.rs"]
mod usage;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use lake::pluggable::StreamId;
use lake::pluggable::replay::{self, ReplayConfig};
use lake::{EventKind, Trace};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pool_call_cost: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    trace: PathBuf,
    chunk_mib: u64,
    evict_mib: usize,
    every: usize,
    warmup: u32,
    rounds: usize,
    reuse: usize,
    warm: bool,
    cold: bool,
}

fn parse() -> Result<Options, String> {
    let mut o = Options {
        trace: PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/gpt2-b16-6steps.trace.gz"
        )),
        chunk_mib: 16,
        evict_mib: 48,
        every: 4,
        warmup: 2,
        rounds: 3,
        reuse: 0,
        warm: true,
        cold: true,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut number = |what: &str| -> Result<u64, String> {
            args.next()
                .ok_or(format!("{a} needs {what}"))?
                .parse()
                .map_err(|e| format!("{a}: {e}"))
        };
        match a.as_str() {
            "--chunk-mib" => o.chunk_mib = number("MiB")?,
            "--evict-mib" => o.evict_mib = number("MiB")? as usize,
            "--every" => o.every = number("a count")?.max(1) as usize,
            "--warmup" => o.warmup = number("steps")? as u32,
            "--rounds" => o.rounds = number("a count")?.max(1) as usize,
            "--reuse" => o.reuse = number("a count")? as usize,
            "--mode" => {
                let m = args.next().ok_or("--mode needs warm, cold or both")?;
                (o.warm, o.cold) = match m.as_str() {
                    "warm" => (true, false),
                    "cold" => (false, true),
                    "both" => (true, true),
                    _ => return Err(format!("unknown mode {m}")),
                };
            }
            "-h" | "--help" => {
                println!(
                    "{}",
                    usage::from_module_doc(include_str!("pool_call_cost.rs"))
                );
                std::process::exit(0);
            }
            _ if a.starts_with('-') => return Err(format!("unknown option {a}")),
            _ => o.trace = PathBuf::from(a),
        }
    }
    Ok(o)
}

/// Nanoseconds of the timed calls, by kind and size class.
#[derive(Default)]
struct Times {
    small_alloc: Vec<u64>,
    large_alloc: Vec<u64>,
    small_free: Vec<u64>,
    large_free: Vec<u64>,
}

impl Times {
    fn render(&mut self, mode: &str) -> String {
        let mut all_alloc = [self.small_alloc.clone(), self.large_alloc.clone()].concat();
        let mut all_free = [self.small_free.clone(), self.large_free.clone()].concat();
        let mut out = format!(
            "{mode:<5} {:<12} {:>6} {:>8} {:>8} {:>8} {:>8} {:>10} {:>6}\n",
            "call", "n", "mean µs", "p50", "p90", "p99", "mean≤10µs", ">10µs"
        );
        for (name, v) in [
            ("alloc", &mut all_alloc),
            ("free", &mut all_free),
            ("alloc small", &mut self.small_alloc),
            ("alloc large", &mut self.large_alloc),
            ("free small", &mut self.small_free),
            ("free large", &mut self.large_free),
        ] {
            out += &format!("{mode:<5} {name:<12} {}\n", summary(v));
        }
        out
    }
}

fn summary(v: &mut [u64]) -> String {
    if v.is_empty() {
        return format!("{:>6}", 0);
    }
    v.sort_unstable();
    let us = |ns: u64| ns as f64 / 1000.0;
    let at = |q: f64| us(v[((v.len() - 1) as f64 * q) as usize]);
    let mean = us(v.iter().sum::<u64>()) / v.len() as f64;
    let short: Vec<u64> = v.iter().copied().filter(|&n| n <= 10_000).collect();
    let short_mean = us(short.iter().sum::<u64>()) / short.len().max(1) as f64;
    format!(
        "{:>6} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>10.3} {:>6}",
        v.len(),
        mean,
        at(0.5),
        at(0.9),
        at(0.99),
        short_mean,
        v.len() - short.len()
    )
}

/// Replays `trace` through a fresh pool; times the calls of steps from
/// `o.warmup` on (every `every`-th one, after reading `evict`, when
/// `evict` is not empty).
fn replay_timed(
    trace: &Trace,
    o: &Options,
    evict: &[u8],
    every: usize,
    times: &mut Times,
) -> Result<(), String> {
    let chunk = o.chunk_mib << 20;
    let config = ReplayConfig {
        chunk_bytes: Some(chunk),
        reuse_entries: o.reuse,
        ..ReplayConfig::default()
    };
    let pool = replay::replay_pool(chunk, &config);
    // Trace address -> (our address, size).
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut phases = 0u32;
    let mut phase = None;
    let mut timed = 0usize;
    let mut sink = 0u8;
    for e in &trace.events {
        if phase != Some(e.site.phase) {
            phase = Some(e.site.phase);
            phases += 1;
        }
        let stream = StreamId(u64::from(e.site.stream));
        pool.events().tick(stream);
        let time = phases > o.warmup && {
            timed += 1;
            timed.is_multiple_of(every)
        };
        if time && !evict.is_empty() {
            // Reads only: no dirty lines to write back inside the call.
            for line in evict.chunks(64) {
                sink = sink.wrapping_add(line[0]);
            }
            sink = std::hint::black_box(sink);
        }
        match e.kind {
            EventKind::Alloc => {
                let t0 = Instant::now();
                let ours = pool.alloc(e.size, stream).map_err(|e| e.to_string())?;
                let ns = t0.elapsed().as_nanos() as u64;
                if time {
                    if e.size < chunk {
                        times.small_alloc.push(ns);
                    } else {
                        times.large_alloc.push(ns);
                    }
                }
                live.insert(e.addr, (ours, e.size));
            }
            EventKind::Free => {
                let Some((ours, size)) = live.remove(&e.addr) else {
                    continue;
                };
                let t0 = Instant::now();
                pool.free(ours, stream).map_err(|e| e.to_string())?;
                let ns = t0.elapsed().as_nanos() as u64;
                if time {
                    if size < chunk {
                        times.small_free.push(ns);
                    } else {
                        times.large_free.push(ns);
                    }
                }
            }
        }
    }
    pool.check()?;
    let st = pool.stats();
    println!(
        "# replay done: peak reserved {:.3} GiB, peak active {:.3} GiB, reuse cache: {} hits \
         of {} allocs, {} blocks handed back",
        st.peak_reserved_bytes as f64 / (1u64 << 30) as f64,
        st.peak_active_bytes as f64 / (1u64 << 30) as f64,
        st.reuse_hits,
        st.allocs,
        st.reuse_returned
    );
    Ok(())
}

fn run() -> Result<(), String> {
    let o = parse()?;
    let trace = replay::load(&o.trace).map_err(|e| format!("{}: {e}", o.trace.display()))?;
    println!(
        "# {}: {} calls, chunk {} MiB, steps from {} timed",
        o.trace.display(),
        trace.events.len(),
        o.chunk_mib,
        o.warmup
    );
    if o.warm {
        let mut times = Times::default();
        for _ in 0..o.rounds {
            replay_timed(&trace, &o, &[], 1, &mut times)?;
        }
        print!("{}", times.render("warm"));
    }
    if o.cold {
        let evict = vec![1u8; o.evict_mib << 20];
        let mut times = Times::default();
        let t0 = Instant::now();
        replay_timed(&trace, &o, &evict, o.every, &mut times)?;
        println!(
            "# cold: {} MiB read before each timed call, one call in {} ({:.1} s)",
            o.evict_mib,
            o.every,
            t0.elapsed().as_secs_f64()
        );
        print!("{}", times.render("cold"));
    }
    Ok(())
}
