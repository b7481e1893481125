//! Runs the architecture self-test kernel (`gpumalloc_selftest`) and checks
//! every value it wrote against what the PTX semantics promise.

use std::collections::HashSet;

use gpu_kernels::selftest::SELFTEST_WORDS;

use crate::error::{Error, Result};
use crate::gpu::{Arg, Gpu};

/// What the self-test saw.
#[derive(Clone, Debug)]
pub struct SelfTestReport {
    /// Threads launched.
    pub threads: u64,
    /// Warps whose active mask held every launched lane.
    pub converged_warps: u64,
    /// Warps in all.
    pub warps: u64,
    /// CAS retries summed over threads (contention seen).
    pub cas_retries: u64,
}

/// Runs the self-test with `threads` threads (not a multiple of 32, so the
/// last warp is partial) and checks the results.
pub fn run(gpu: &Gpu, threads: u64) -> Result<SelfTestReport> {
    let n = threads;
    let out = gpu.zeros(n as usize * SELFTEST_WORDS)?;
    let w64 = gpu.zeros(2 + n.div_ceil(64) as usize)?;
    let w32 = gpu.zeros(1)?;
    gpu.launch(
        "gpumalloc_selftest",
        n,
        &[
            Arg::U64(gpu.address(&out)),
            Arg::U64(gpu.address(&w64)),
            Arg::U64(gpu.address(&w32)),
            Arg::U64(n),
        ],
    )?;
    gpu.sync()?;
    let out = gpu.download(&out)?;
    let w64 = gpu.download(&w64)?;
    let w32 = gpu.download(&w32)?;
    check(n, &out, &w64, &w32)
}

/// Checks the self-test's output (pure, so it is tested without a GPU).
pub fn check(n: u64, out: &[u64], w64: &[u64], w32: &[u64]) -> Result<SelfTestReport> {
    let fail = |what: String| Err(Error::Check(what));
    let row = |t: u64| &out[t as usize * SELFTEST_WORDS..][..SELFTEST_WORDS];
    let mut converged = 0;
    let warps = n.div_ceil(32);
    let mut retries = 0;
    for t in 0..n {
        let r = row(t);
        let mask = r[7] as u32;
        let lane = ((r[7] >> 32) & 0xff) as u32;
        retries += r[7] >> 40;
        let warp_base = t - t % 32;
        let launched = if n - warp_base >= 32 {
            u32::MAX
        } else {
            (1u32 << (n - warp_base)) - 1
        };
        if lane as u64 != t % 32 {
            return fail(format!("thread {t}: lane id {lane}"));
        }
        if mask & (1 << lane) == 0 || mask & !launched != 0 {
            return fail(format!(
                "thread {t}: active mask {mask:#x} (launched {launched:#x})"
            ));
        }
        if lane == 0 && mask == launched {
            converged += 1;
        }
        if r[0] as u32 != mask & 0x5555_5555 {
            return fail(format!("thread {t}: ballot {:#x}, mask {mask:#x}", r[0]));
        }
        if r[1] as u32 != mask & (0xf << (lane / 4 * 4)) {
            return fail(format!("thread {t}: match_any {:#x}, mask {mask:#x}", r[1]));
        }
        let next = (lane + 1) % 32;
        let src = if mask & (1 << next) != 0 {
            next
        } else {
            mask.trailing_zeros()
        };
        let want = warp_base + src as u64;
        if r[2] != want << 32 | want {
            return fail(format!("thread {t}: shuffle {:#x}, want {want}", r[2]));
        }
        if r[5] & (1 << (t % 64)) != 0 {
            return fail(format!("thread {t}: or saw its own bit already set"));
        }
    }
    let unique = |col: usize, what: &str, want: HashSet<u64>| -> Result<()> {
        let got: HashSet<u64> = (0..n).map(|t| row(t)[col]).collect();
        if got != want {
            return Err(Error::Check(format!(
                "{what}: old values are not a permutation"
            )));
        }
        Ok(())
    };
    unique(3, "64-bit add", (0..n).collect())?;
    unique(4, "32-bit add", (0..n).collect())?;
    if w64[0] != n || w32[0] as u32 != n as u32 {
        return fail(format!(
            "add totals {} / {} for {n} threads",
            w64[0], w32[0] as u32
        ));
    }
    if (w32[0] >> 32) as u32 != n as u32 {
        return fail(format!("CAS counter {} for {n} threads", w32[0] >> 32));
    }
    for t in 0..n {
        if w64[1 + (t / 64) as usize] & (1 << (t % 64)) == 0 {
            return fail(format!("or: bit of thread {t} not set"));
        }
    }
    let swap_word = w64[1 + n.div_ceil(64) as usize];
    let mut seen: HashSet<u64> = (0..n).map(|t| row(t)[6]).collect();
    seen.insert(swap_word);
    if seen != (0..=n).collect() {
        return fail("exchange: values lost or duplicated".into());
    }
    Ok(SelfTestReport {
        threads: n,
        converged_warps: converged,
        warps,
        cas_retries: retries,
    })
}
