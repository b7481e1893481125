//! Issue 13's fragmentation benchmark: the periodic training-like trace
//! (`lake::periodic`: forward allocations that grow, backward that shrink,
//! irregular temporaries) replayed through the lake and through a best-fit
//! caching pool (`lake::caching`) over the same chunks, on the CPU model
//! driver (no data) or on GPU 0 with `--cuda`.
//!
//! Reported per allocator: peak live bytes (as requested), peak reserved
//! (mapped) bytes, fragmentation = 1 − peak live / peak reserved (GMLake's
//! ratio), and the median and 99th percentile of each alloc's and free's
//! wall time over the periods after the warm-up; then one verdict line for
//! the criterion: the lake under 5%, the caching pool over 20%, the lake's
//! median alloc within 2× the caching pool's.
//!
//! ```text
//! cargo run -p lake --release --example periodic -- [OPTIONS]
//!   --cuda          run on GPU 0 (prints `skipped: no GPU (...)` without one)
//!   --periods N     periods replayed (20)
//!   --warm-up N     first periods left untimed (3)
//!   --seed S        seed of the per-layer sizes (42)
//!   --layers N      layers per period (12)
//!   --unit-mib N    size unit of the trace (32: about 2 GiB live at the peak)
//!   --chunk-mib N   chunk size (model: 2; GPU: the driver's granularity)
//!   --limit-gib G   limit of both allocators (64)
//!   --out DIR       also write DIR/periodic.csv
//! ```

#[path = "common/usage.rs"]
mod usage;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use lake::periodic::{self, Measured, PeriodShape, Verdict};
use lake::{CachingPool, ChunkOptions, CudaVmm, Lake, LakeConfig, ModelVmm, VmmDriver};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("periodic: {e}");
            ExitCode::FAILURE
        }
    }
}

struct Options {
    cuda: bool,
    periods: usize,
    warm_up: usize,
    shape: PeriodShape,
    chunk_mib: Option<u64>,
    limit: u64,
    out: Option<PathBuf>,
}

fn parse() -> Result<Option<Options>, String> {
    let mut o = Options {
        cuda: false,
        periods: 20,
        warm_up: 3,
        shape: PeriodShape::gpu_like(42),
        chunk_mib: None,
        limit: 64 << 30,
        out: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{a} {v}: {e}"));
        match a.as_str() {
            "--cuda" => o.cuda = true,
            "--periods" => o.periods = number(value("a count")?)? as usize,
            "--warm-up" => o.warm_up = number(value("a count")?)? as usize,
            "--seed" => o.shape.seed = number(value("a seed")?)?,
            "--layers" => o.shape.layers = number(value("a count")?)?,
            "--unit-mib" => o.shape.unit = number(value("MiB")?)? << 20,
            "--chunk-mib" => o.chunk_mib = Some(number(value("MiB")?)?),
            "--limit-gib" => o.limit = number(value("GiB")?)? << 30,
            "--out" => o.out = Some(PathBuf::from(value("a directory")?)),
            "-h" | "--help" => {
                println!("{}", usage::from_module_doc(include_str!("periodic.rs")));
                return Ok(None);
            }
            _ => return Err(format!("unknown option {a}; --help lists them")),
        }
    }
    if o.periods <= o.warm_up {
        return Err(format!(
            "--periods {} leaves nothing after a warm-up of {}",
            o.periods, o.warm_up
        ));
    }
    if o.shape.layers == 0 || o.shape.unit < 2 {
        return Err("--layers and --unit-mib must be positive".into());
    }
    Ok(Some(o))
}

fn run() -> Result<(), String> {
    let Some(o) = parse()? else {
        return Ok(());
    };
    if o.cuda {
        if let Err(e) = host::Gpu::available() {
            println!("skipped: no GPU ({e})");
            return Ok(());
        }
        let chunk = o.chunk_mib.map(|m| m << 20);
        let open = || {
            CudaVmm::open_with_chunk(0, ChunkOptions::default(), chunk)
                .map_err(|e| format!("open GPU 0: {e}"))
        };
        compare(&o, "cuda", open)
    } else {
        let chunk = o.chunk_mib.unwrap_or(2) << 20;
        if !chunk.is_power_of_two() {
            return Err(format!("--chunk-mib {}: not a power of two", chunk >> 20));
        }
        compare(&o, "model", || {
            Ok(ModelVmm::without_data(chunk, ChunkOptions::default()))
        })
    }
}

/// One allocator's row.
struct Row {
    name: &'static str,
    measured: Measured,
}

/// Runs the trace through a lake, then (the lake gone) a caching pool, each
/// on a driver of its own from `open`, and reports both.
fn compare<D: VmmDriver>(
    o: &Options,
    driver_name: &str,
    open: impl Fn() -> Result<D, String>,
) -> Result<(), String> {
    let fail = |who: &str, e: lake::LakeError| format!("{who}: {e}");
    let lake_driver = open()?;
    let chunk = lake_driver.granularity();
    println!(
        "periodic trace on the {driver_name} driver: {} layers, {} MiB units, chunks of {} MiB, \
         {} periods ({} warm-up), seed {}",
        o.shape.layers,
        o.shape.unit >> 20,
        chunk >> 20,
        o.periods,
        o.warm_up,
        o.shape.seed
    );
    let rows = {
        let lake = Lake::new(lake_driver, LakeConfig::with_limit(o.limit));
        let m = periodic::measure(&lake, &o.shape, o.periods, o.warm_up)
            .map_err(|e| fail("lake", e))?;
        let st = lake.stats();
        println!(
            "lake: {} home views, {} stitched views mapping {} chunks of {} \
             (an alloc or free updates the runs of its home stretches only; \
             best fit probes the stitched views of a fitting size)",
            st.home_views,
            st.stitched_views,
            st.stitched_chunks,
            st.reserved_bytes / chunk,
        );
        let lake_row = Row {
            name: "lake",
            measured: m,
        };
        drop(lake);
        let pool = CachingPool::new(open()?, o.limit);
        let m = periodic::measure(&pool, &o.shape, o.periods, o.warm_up)
            .map_err(|e| fail("caching", e))?;
        let caching_row = Row {
            name: "caching",
            measured: m,
        };
        [lake_row, caching_row]
    };
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut csv = String::from(
        "allocator,driver,chunk_bytes,unit_bytes,layers,periods,warm_up,seed,\
         peak_live_bytes,peak_reserved_bytes,fragmentation,timed_allocs,\
         alloc_median_ns,alloc_p99_ns,free_median_ns,free_p99_ns,warm_up_driver_calls,driver_calls\n",
    );
    for r in &rows {
        let m = &r.measured;
        println!(
            "{:<8} peak live {:>9.1} MiB  peak reserved {:>9.1} MiB  fragmentation {:>5.2}%  \
             alloc median {:>6} ns p99 {:>6} ns  free median {:>6} ns p99 {:>6} ns  \
             ({} timed allocs; driver calls {} in the warm-up, {} after)",
            r.name,
            mib(m.peaks.live),
            mib(m.peaks.reserved),
            m.fragmentation() * 100.0,
            m.alloc.median(),
            m.alloc.p99(),
            m.free.median(),
            m.free.p99(),
            m.alloc.count(),
            m.warm_up_driver_calls,
            m.driver_calls,
        );
        writeln!(
            csv,
            "{},{driver_name},{chunk},{},{},{},{},{},{},{},{:.6},{},{},{},{},{},{},{}",
            r.name,
            o.shape.unit,
            o.shape.layers,
            o.periods,
            o.warm_up,
            o.shape.seed,
            m.peaks.live,
            m.peaks.reserved,
            m.fragmentation(),
            m.alloc.count(),
            m.alloc.median(),
            m.alloc.p99(),
            m.free.median(),
            m.free.p99(),
            m.warm_up_driver_calls,
            m.driver_calls,
        )
        .expect("writing to a String");
    }
    println!("{}", Verdict::new(&rows[0].measured, &rows[1].measured));
    if let Some(dir) = &o.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let path = dir.join("periodic.csv");
        std::fs::write(&path, csv).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
