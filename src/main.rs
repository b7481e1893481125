//! `gpumalloc`: the benchmark program and the GPU self-test.
//!
//! ```text
//! gpumalloc bench all              # every test, each in its own process
//! gpumalloc bench single --threads 1048576 --iters 10
//! gpumalloc selftest               # the architecture self-test on the GPU
//! gpumalloc plot results           # PNG figures from a results folder
//! gpumalloc remat TRACE --budget 0.5 # DTR, DTE, Coop on a recorded step
//! gpumalloc remat TRACE --sweep      # ratios 0.9 down to the lowest: CSV, PNG
//! ```
//! With no GPU, `bench` runs our allocator on the CPU and says so.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{SystemTime, UNIX_EPOCH};

use clap::{Args, Parser, Subcommand};
use gpumalloc::bench::measure::Timing;
use gpumalloc::bench::report::{Results, RunInfo};
use gpumalloc::bench::suite::{self, Bench, Options};
use gpumalloc::bench::{GIB, cpu, plot};

#[derive(Parser)]
#[command(
    name = "gpumalloc",
    about = "A fast malloc/free for GPU kernels: benchmarks and self-test"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Runs a benchmark test (or `all`).
    Bench(BenchArgs),
    /// Runs the architecture self-test kernel on the GPU.
    Selftest {
        /// Threads (not a multiple of 32, so one warp is partial).
        #[arg(long, default_value_t = 100_003)]
        threads: u64,
    },
    /// Draws PNG figures from the JSON files in a results folder.
    Plot {
        /// The folder `bench` wrote.
        dir: PathBuf,
    },
    /// Replays a training step recorded by python/remat/record.py under a
    /// memory budget with DTR, DTE and Coop (rematerialization, issue 16).
    Remat(RematArgs),
}

#[derive(Args, Clone)]
struct RematArgs {
    /// Trace files (`.remat.gz`).
    #[arg(required = true)]
    traces: Vec<PathBuf>,
    /// Budget ratio of the step's peak live bytes (repeatable; 0.5 when
    /// neither --budget nor --sweep is given).
    #[arg(long)]
    budget: Vec<f64>,
    /// Each policy's minimum ratio (bisection) and steady minimum (it
    /// finishes at every 0.005 from 1.0 down to it), then every policy from
    /// 0.9 down to the lowest bisected minimum: NAME.sweep.csv, .sweep.txt,
    /// .overhead.png.
    #[arg(long)]
    sweep: bool,
    /// Ratio step of the sweep.
    #[arg(long, default_value_t = 0.05)]
    step: f64,
    /// Where the sweep's files go.
    #[arg(long, default_value = "results/remat")]
    out: PathBuf,
}

const TESTS: [&str; 8] = [
    "single", "mixed", "frag", "oom", "init", "warm", "scaling", "graph",
];

#[derive(Args, Clone)]
struct BenchArgs {
    /// single, mixed, scaling, frag, oom, init, warm, graph or all.
    test: String,
    /// Threads, one allocation each (default 2^20; 2^18 on the CPU).
    #[arg(long)]
    threads: Option<u64>,
    /// Timed rounds after one warm-up round.
    #[arg(long, default_value_t = 10)]
    iters: usize,
    /// Heap bytes for every allocator, e.g. 16GiB (default 16 GiB; 2 GiB
    /// for oom and on the CPU).
    #[arg(long, value_parser = parse_bytes)]
    heap: Option<u64>,
    /// Seed of mixed sizes.
    #[arg(long, default_value_t = 0x5eed)]
    seed: u64,
    /// Smallest mixed size.
    #[arg(long, default_value_t = 16)]
    lo: u64,
    /// Largest mixed size.
    #[arg(long, default_value_t = 4096)]
    hi: u64,
    /// Size of the scaling test.
    #[arg(long, default_value_t = 256)]
    scaling_size: u64,
    /// Allocators, comma-separated (ours, ours-nospares, ours-vmm,
    /// ours-sized, cuda-malloc, bump-bound). `ours-sized` (listed after
    /// ours-vmm; GPU only): ours on a fixed heap of the size ours-vmm grew
    /// to for each test, same segment size. `ours-vmm`: ours on CUDA virtual memory,
    /// reserving the heap size and mapping `--vmm-initial` at first, grown
    /// while the test's warm-up gets nulls or leaves fewer free segments at
    /// its peak than the growth service's low-water mark (single, mixed,
    /// warm, scaling; also with --cpu, on the model driver).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ours,cuda-malloc,bump-bound"
    )]
    allocators: Vec<String>,
    /// Bytes `ours-vmm` maps at first and grows by at a time, e.g. 1GiB.
    #[arg(long, value_parser = parse_bytes, default_value = "1GiB")]
    vmm_initial: u64,
    /// Time each kernel queued behind a 200 µs hold of the stream, so the
    /// host's launch latency is left out (GPU only; see `bench::measure::
    /// Timing`). For kernels of a few microseconds, such as runs of
    /// segments.
    #[arg(long)]
    queued: bool,
    /// Seconds after which the graph sweep starts nothing new (the rest is
    /// recorded as skipped).
    #[arg(long, default_value_t = gpumalloc::bench::graph::BUDGET_S)]
    graph_budget: f64,
    /// R-MAT scales of the graph sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = gpumalloc::bench::graph::SCALES)]
    graph_scales: Vec<u32>,
    /// Run the graph sweep's thread-per-vertex kernels in every group (by
    /// default only in the smallest: they take seconds per round at 10^6).
    #[arg(long)]
    graph_threads: bool,
    /// Seconds an allocator may spend in one test before the rest of its
    /// measurements are skipped and its timed rounds cut short (default
    /// 30; with `all`, a share of what remains of `--all-budget`).
    #[arg(long)]
    allocator_budget: Option<f64>,
    /// `all` only: seconds for every test together. Each test's allocators
    /// get a share of what remains as their budget, and the graph sweep
    /// (last) the rest, so the whole run ends in about this time.
    #[arg(long, default_value_t = 540.0)]
    all_budget: f64,
    /// Where CSV, JSON and PNG files go.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Run on the CPU even if a GPU is present.
    #[arg(long)]
    cpu: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (number, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = number.parse().map_err(|_| format!("not a size: {s:?}"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kib" => 10,
        "m" | "mib" => 20,
        "g" | "gib" => 30,
        _ => return Err(format!("unknown unit in {s:?} (use KiB, MiB or GiB)")),
    };
    Ok(n << shift)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Cmd::Bench(args) => bench(args),
        Cmd::Selftest { threads } => selftest(threads),
        Cmd::Plot { dir } => plot_dir(&dir),
        Cmd::Remat(args) => remat(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn remat(args: RematArgs) -> Result<(), String> {
    let budgets = if args.budget.is_empty() && !args.sweep {
        vec![0.5]
    } else {
        args.budget
    };
    for trace in args.traces {
        remat::sweep::run_command(&remat::sweep::Command {
            trace,
            budgets: budgets.clone(),
            sweep_dir: args.sweep.then(|| args.out.clone()),
            step: args.step,
        })?;
    }
    Ok(())
}

fn selftest(threads: u64) -> Result<(), String> {
    let gpu = gpumalloc::open_gpu(0).map_err(|e| format!("skipped: no GPU ({e})"))?;
    let report = host::selftest::run(&gpu, threads).map_err(|e| e.to_string())?;
    println!(
        "self-test passed on {}: {} threads, {}/{} warps fully converged, {} CAS retries",
        gpu.name().unwrap_or_default(),
        report.threads,
        report.converged_warps,
        report.warps,
        report.cas_retries
    );
    Ok(())
}

fn options(args: &BenchArgs, on_gpu: bool) -> Options {
    let default_heap = if args.test == "oom" || !on_gpu {
        2 * GIB
    } else {
        16 * GIB
    };
    let default_threads = if on_gpu { 1 << 20 } else { 1 << 18 };
    Options {
        threads: args.threads.unwrap_or(default_threads),
        iters: args.iters,
        heap: args.heap.unwrap_or(default_heap),
        seed: args.seed,
        lo: args.lo,
        hi: args.hi,
        scaling_size: args.scaling_size,
        allocators: args.allocators.clone(),
        vmm_initial: args.vmm_initial,
        graph_budget_s: args.graph_budget,
        graph_scales: args.graph_scales.clone(),
        graph_threads: args.graph_threads,
        allocator_budget_s: args
            .allocator_budget
            .unwrap_or(gpumalloc::bench::suite::ALLOCATOR_BUDGET_S),
        timing: if args.queued {
            Timing::Queued
        } else {
            Timing::Launch
        },
        ..Options::default()
    }
}

fn bench(args: BenchArgs) -> Result<(), String> {
    if args.test == "all" {
        return bench_all(&args);
    }
    if !TESTS.contains(&args.test.as_str()) {
        return Err(format!(
            "unknown test {:?}; one of {TESTS:?} or all",
            args.test
        ));
    }
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let gpu = match (args.cpu, host::Gpu::available()) {
        (false, Ok(())) => Some(gpumalloc::open_gpu(0).map_err(|e| e.to_string())?),
        (true, _) => None,
        (false, Err(e)) => {
            eprintln!(
                "no GPU ({e}): running our allocator on the CPU instead (labelled \"ours (cpu)\")"
            );
            None
        }
    };
    let opts = options(&args, gpu.is_some());
    let results = match &gpu {
        Some(gpu) => {
            let info = RunInfo {
                device: "gpu".into(),
                device_name: gpu.name().map_err(|e| e.to_string())?,
                driver: gpu.driver_version().map_err(|e| e.to_string())?,
                heap_bytes: opts.heap,
                command,
                started,
            };
            Results {
                info,
                records: run_gpu(gpu, &args.test, opts).map_err(|e| e.to_string())?,
            }
        }
        None => {
            if args.queued {
                eprintln!("--queued times GPU kernels; the CPU rounds are timed on the host");
            }
            let info = RunInfo {
                device: "cpu".into(),
                device_name: format!(
                    "{} host threads",
                    std::thread::available_parallelism().map_or(1, |p| p.get())
                ),
                driver: String::new(),
                heap_bytes: opts.heap,
                command,
                started,
            };
            Results {
                info,
                records: cpu::run(&args.test, &opts).map_err(|e| e.to_string())?,
            }
        }
    };
    results
        .write(&args.out, &args.test)
        .map_err(|e| format!("writing {}: {e}", args.out.display()))?;
    print!("{}", results.table());
    Ok(())
}

fn run_gpu(
    gpu: &host::Gpu,
    test: &str,
    opts: Options,
) -> host::Result<Vec<gpumalloc::bench::report::Record>> {
    if test == "init" {
        return suite::init(gpu, &opts);
    }
    if test == "graph" {
        return gpumalloc::bench::graph::run(gpu, &opts);
    }
    let mut b = Bench::new(gpu, opts)?;
    let records = match test {
        "single" => b.single(false)?,
        "mixed" => b.mixed(false)?,
        "warm" => {
            let mut r = b.single(true)?;
            r.extend(b.mixed(true)?);
            r
        }
        "scaling" => b.scaling()?,
        "frag" => b.frag()?,
        "oom" => b.oom()?,
        _ => Vec::new(),
    };
    b.finish();
    Ok(records)
}

/// Runs every test in its own process (each sets CUDA's malloc heap limit
/// once, and oom uses a smaller heap), then merges, tabulates and plots.
/// Time: each test's allocators may spend a share of what remains of
/// `--all-budget` (unless `--allocator-budget` fixes it), the graph sweep
/// runs last with the rest, and every test's seconds are printed. `oom`
/// runs each allocator in a process of its own, and a baseline's is killed
/// after its budget (CUDA's malloc can spend minutes on one batch near a
/// full heap): the table says it was cut off.
fn bench_all(args: &BenchArgs) -> Result<(), String> {
    let mut merged = Results::default();
    let began = std::time::Instant::now();
    for (i, test) in TESTS.iter().enumerate() {
        let remaining = (args.all_budget - began.elapsed().as_secs_f64()).max(0.0);
        let (allocator_budget, graph_budget) = all_budgets(args, remaining, TESTS.len() - i);
        eprintln!(
            "== {test} (at {:.0} s of {:.0}; each baseline {allocator_budget:.0} s)",
            began.elapsed().as_secs_f64(),
            args.all_budget
        );
        let started = std::time::Instant::now();
        // (On the CPU only ours runs: one process.)
        let groups: Vec<Vec<String>> = if *test == "oom" && !args.cpu {
            args.allocators.iter().map(|a| vec![a.clone()]).collect()
        } else {
            vec![args.allocators.clone()]
        };
        for allocators in groups {
            let cmd = all_child(args, test, &allocators, allocator_budget, graph_budget)?;
            // Only a lone baseline is killed: ours is always measured in full.
            let limit = (*test == "oom" && !allocators[0].starts_with("ours"))
                .then_some(allocator_budget + 20.0);
            let records = match run_child(cmd, limit, test)? {
                true => Results::read(&args.out, test)
                    .map_err(|e| format!("reading {test} results: {e}"))?,
                false => cut_off_oom(&allocators[0], limit.unwrap_or_default()),
            };
            if merged.info.device.is_empty() && !records.info.device.is_empty() {
                merged.info = records.info.clone();
                merged.info.command = std::env::args().collect::<Vec<_>>().join(" ");
            }
            merged.records.extend(records.records);
        }
        eprintln!("== {test} took {:.1} s", started.elapsed().as_secs_f64());
    }
    eprintln!("== all tests took {:.1} s", began.elapsed().as_secs_f64());
    merged
        .write(&args.out, "results")
        .map_err(|e| e.to_string())?;
    println!("{}", merged.table());
    plot_dir(&args.out)
}

/// The command that runs `test` for `allocators` as one test of `all`.
fn all_child(
    args: &BenchArgs,
    test: &str,
    allocators: &[String],
    allocator_budget: f64,
    graph_budget: f64,
) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut cmd = Command::new(exe);
    cmd.args(["bench", test, "--iters", &args.iters.to_string()])
        .args([
            "--seed",
            &args.seed.to_string(),
            "--lo",
            &args.lo.to_string(),
            "--hi",
            &args.hi.to_string(),
        ])
        .args(["--scaling-size", &args.scaling_size.to_string()])
        .args(["--graph-budget", &format!("{graph_budget:.0}")])
        .arg(format!(
            "--graph-scales={}",
            args.graph_scales
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ))
        .args(["--allocators", &allocators.join(",")])
        .args(["--vmm-initial", &args.vmm_initial.to_string()])
        .args(["--allocator-budget", &format!("{allocator_budget:.1}")])
        .arg("--out")
        .arg(&args.out);
    if let Some(t) = args.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    if let (Some(h), false) = (args.heap, test == "oom") {
        cmd.args(["--heap", &h.to_string()]);
    }
    if args.queued {
        cmd.arg("--queued");
    }
    if args.graph_threads {
        cmd.arg("--graph-threads");
    }
    if args.cpu {
        cmd.arg("--cpu");
    }
    Ok(cmd)
}

/// Runs `cmd`; with a `limit`, kills it after that many seconds. Returns
/// whether it finished (a failure is an error).
fn run_child(mut cmd: Command, limit: Option<f64>, test: &str) -> Result<bool, String> {
    let mut child = cmd.spawn().map_err(|e| format!("running {test}: {e}"))?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(|e| format!("waiting for {test}: {e}"))?
        {
            break status;
        }
        if limit.is_some_and(|l| started.elapsed().as_secs_f64() > l) {
            // Killing it is what the limit is for; if it ended meanwhile the
            // wait below reaps it all the same.
            let _ = child.kill();
            let _ = child.wait();
            eprintln!(
                "{test}: killed after {:.0} s",
                started.elapsed().as_secs_f64()
            );
            return Ok(false);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    if !status.success() {
        return Err(format!("test {test} failed ({status})"));
    }
    Ok(true)
}

/// The records of an `oom` run of `allocator` killed after `limit` seconds.
fn cut_off_oom(allocator: &str, limit: f64) -> Results {
    let mut r = Results::default();
    for size in Options::default().oom_sizes {
        r.records.push(gpumalloc::bench::report::Record::new(
            "oom",
            allocator,
            size,
            &size.to_string(),
            suite::OOM_BATCH,
            "utilization",
            Default::default(),
            false,
            format!("skipped: cut off after {limit:.0} s (no first null yet)"),
        ));
    }
    r
}

/// The budgets of `all`'s next test, with `remaining` seconds left for
/// `tests_left` tests (the graph sweep last): each allocator gets a third
/// of the test's even share (three allocators by default; at least 2 s,
/// at most the usual 30 s) unless `--allocator-budget` fixed it, and the
/// graph sweep everything that remains (at least 20 s, so it measures its
/// smallest scale), capped by `--graph-budget`.
fn all_budgets(args: &BenchArgs, remaining: f64, tests_left: usize) -> (f64, f64) {
    let share = remaining / tests_left.max(1) as f64;
    let allocator = args
        .allocator_budget
        .unwrap_or((share / 3.0).clamp(2.0, suite::ALLOCATOR_BUDGET_S));
    let graph = (remaining - 10.0).clamp(20.0, args.graph_budget);
    (allocator, graph)
}

fn plot_dir(dir: &Path) -> Result<(), String> {
    // results.json from `bench all`, else every per-test file merged.
    let results = match Results::read(dir, "results") {
        Ok(r) => r,
        Err(_) => {
            let mut merged = Results::default();
            for test in TESTS {
                if let Ok(r) = Results::read(dir, test) {
                    merged.info = r.info;
                    merged.records.extend(r.records);
                }
            }
            if merged.records.is_empty() {
                return Err(format!("no results in {}", dir.display()));
            }
            merged.write(dir, "results").map_err(|e| e.to_string())?;
            println!("{}", merged.table());
            merged
        }
    };
    match plot::plot_all(&results, dir) {
        Ok(files) => {
            println!("wrote {} figures to {}", files.len(), dir.display());
            Ok(())
        }
        Err(e) => {
            eprintln!("no figures: {e}");
            Ok(())
        }
    }
}
