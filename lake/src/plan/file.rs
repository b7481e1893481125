//! The plan file: versioned, line-based text, so a later run loads the plan
//! and starts planned, and a person can read what it holds.
//!
//! ```text
//! gpumalloc-plan 1
//! # summary lines (ignored when read)
//! small_below BYTES
//! prologue_steps N
//! iterations K
//! prologue_len P
//! template_len E
//! arena BYTES
//! trace_peak_live BYTES
//! unplanned N
//! stats GROUPS FUSIONS LAYERS LAYERED BLOCKS_ARENA REQUESTS_ARENA blocks|requests size|duration|area SECONDS
//! requests N
//! r p|t l|s ORDINAL STREAM s|d SIZE MIN_SIZE OFFSET|- START END [START END]
//! end
//! ```
//!
//! `p`/`t`: prologue or template; `l`/`s`: large or small ordinals; `s`/`d`: static or dynamic; `-`: no
//! offset (a dynamic request left to the runtime). Lines starting with `#`
//! and blank lines are ignored. A read checks the plan ([`Plan::check`]),
//! so a damaged file is refused rather than served.
//!
//! Concurrency: plain functions.

use std::fmt::{self, Write as _};
use std::io;
use std::path::Path;

use super::profile::{Lifetime, Part, Request};
use super::synth::{Plan, PlannedRequest, Strategy, SynthStats};

/// The first line's word.
pub const MAGIC: &str = "gpumalloc-plan";
/// The version written and read.
pub const VERSION: u32 = 1;

/// Why a plan file could not be read or written.
#[derive(Debug)]
pub enum PlanFileError {
    /// The file could not be read or written.
    Io(io::Error),
    /// Line (1-based) and what is wrong with it.
    Format(usize, String),
}

impl fmt::Display for PlanFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanFileError::Io(e) => write!(f, "plan file: {e}"),
            PlanFileError::Format(line, why) => write!(
                f,
                "not a plan file of version {VERSION} (line {line}: {why}); synthesize it again with the plan example"
            ),
        }
    }
}

impl std::error::Error for PlanFileError {}

impl From<io::Error> for PlanFileError {
    fn from(e: io::Error) -> PlanFileError {
        PlanFileError::Io(e)
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

impl Plan {
    /// A human-readable summary, one fact per line.
    pub fn summary(&self) -> String {
        let (stat, dynamic) = self.counts();
        let placed = self.requests.iter().filter(|r| r.offset.is_some()).count();
        let (idle_min, idle_mean) = self.template_idle();
        let s = &self.stats;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "plan arena {:.1} MiB, trace peak live {:.1} MiB: peak live / arena {:.4}",
            mib(self.arena),
            mib(self.trace_peak_live),
            self.trace_peak_live as f64 / self.arena.max(1) as f64
        );
        let _ = writeln!(
            out,
            "planned live peak {:.1} MiB (the least arena for these lifetimes and sizes): placement / peak {:.4}",
            mib(self.planned_peak()),
            self.planned_peak() as f64 / self.arena.max(1) as f64
        );
        let _ = writeln!(
            out,
            "prologue {} step(s), {} positions; template from {} profiled step(s), {} positions",
            self.prologue_steps, self.prologue_len, self.iterations, self.template_len
        );
        let _ = writeln!(
            out,
            "requests {} ({stat} static, {dynamic} dynamic; {placed} placed), {} template ordinal(s) unplanned",
            self.requests.len(),
            self.unplanned
        );
        let _ = writeln!(
            out,
            "HomoPhase groups {}, fused away {}, HomoSize layers {} holding {} request(s)",
            s.groups, s.fusions, s.layers, s.layered
        );
        let _ = writeln!(
            out,
            "placement: blocks {:.1} MiB, request by request ({} first) {:.1} MiB; kept {}",
            mib(s.blocks_arena),
            s.requests_order,
            mib(s.requests_arena),
            match s.strategy {
                Strategy::Blocks => "blocks",
                Strategy::Requests => "request by request",
            }
        );
        let _ = writeln!(
            out,
            "idle over the template: least {:.1} MiB, mean {:.1} MiB",
            mib(idle_min),
            mib(idle_mean)
        );
        let _ = writeln!(out, "synthesis {:.3} s", s.seconds);
        out
    }

    /// Writes the plan file.
    pub fn write_to(&self, w: &mut impl io::Write) -> io::Result<()> {
        let mut out = String::new();
        let _ = writeln!(out, "{MAGIC} {VERSION}");
        for line in self.summary().lines() {
            let _ = writeln!(out, "# {line}");
        }
        let s = &self.stats;
        let _ = writeln!(out, "small_below {}", self.small_below);
        let _ = writeln!(out, "prologue_steps {}", self.prologue_steps);
        let _ = writeln!(out, "iterations {}", self.iterations);
        let _ = writeln!(out, "prologue_len {}", self.prologue_len);
        let _ = writeln!(out, "template_len {}", self.template_len);
        let _ = writeln!(out, "arena {}", self.arena);
        let _ = writeln!(out, "trace_peak_live {}", self.trace_peak_live);
        let _ = writeln!(out, "unplanned {}", self.unplanned);
        let _ = writeln!(
            out,
            "stats {} {} {} {} {} {} {} {} {}",
            s.groups,
            s.fusions,
            s.layers,
            s.layered,
            s.blocks_arena,
            s.requests_arena,
            match s.strategy {
                Strategy::Blocks => "blocks",
                Strategy::Requests => "requests",
            },
            s.requests_order,
            s.seconds
        );
        let _ = writeln!(out, "requests {}", self.requests.len());
        for p in &self.requests {
            let r = &p.request;
            let _ = write!(
                out,
                "r {} {} {} {} {} {} {} ",
                match r.part {
                    Part::Prologue => 'p',
                    Part::Template => 't',
                },
                if r.small { 's' } else { 'l' },
                r.ordinal,
                r.stream,
                if r.dynamic { 'd' } else { 's' },
                r.size,
                r.min_size
            );
            match p.offset {
                Some(o) => {
                    let _ = write!(out, "{o}");
                }
                None => out.push('-'),
            }
            for (s, e) in r.life.spans() {
                let _ = write!(out, " {s} {e}");
            }
            out.push('\n');
        }
        out.push_str("end\n");
        w.write_all(out.as_bytes())
    }

    /// Reads a plan file written by [`Plan::write_to`] and checks it.
    pub fn read_from(text: &str) -> Result<Plan, PlanFileError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim()))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'));
        let bad = |n: usize, why: String| PlanFileError::Format(n, why);
        let mut next = |want: &str| -> Result<(usize, Vec<&str>), PlanFileError> {
            let (n, line) = lines
                .next()
                .ok_or_else(|| bad(0, format!("ends before `{want}`")))?;
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.first() != Some(&want) {
                return Err(bad(n, format!("expected `{want}`, found {line:?}")));
            }
            Ok((n, words[1..].to_vec()))
        };
        fn num<T: std::str::FromStr>(n: usize, w: Option<&&str>) -> Result<T, PlanFileError> {
            w.and_then(|w| w.parse().ok())
                .ok_or_else(|| PlanFileError::Format(n, format!("bad or missing number {w:?}")))
        }
        let (n, v) = next(MAGIC)?;
        let version: u32 = num(n, v.first())?;
        if version != VERSION {
            return Err(bad(n, format!("version {version}")));
        }
        let mut scalar = |name: &str| -> Result<u64, PlanFileError> {
            let (n, v) = next(name)?;
            num(n, v.first())
        };
        let small_below = scalar("small_below")?;
        let prologue_steps = scalar("prologue_steps")? as usize;
        let iterations = scalar("iterations")? as usize;
        let prologue_len = scalar("prologue_len")?;
        let template_len = scalar("template_len")?;
        let arena = scalar("arena")?;
        let trace_peak_live = scalar("trace_peak_live")?;
        let unplanned = scalar("unplanned")? as usize;
        let (n, v) = next("stats")?;
        let strategy = match v.get(6) {
            Some(&"blocks") => Strategy::Blocks,
            Some(&"requests") => Strategy::Requests,
            other => return Err(bad(n, format!("strategy {other:?}"))),
        };
        let stats = SynthStats {
            groups: num(n, v.first())?,
            fusions: num(n, v.get(1))?,
            layers: num(n, v.get(2))?,
            layered: num(n, v.get(3))?,
            blocks_arena: num(n, v.get(4))?,
            requests_arena: num(n, v.get(5))?,
            strategy,
            requests_order: match v.get(7) {
                Some(&"duration") => "duration",
                Some(&"area") => "area",
                Some(&"size") => "size",
                other => return Err(bad(n, format!("order {other:?}"))),
            },
            seconds: num(n, v.get(8))?,
        };
        let (n, v) = next("requests")?;
        let count: usize = num(n, v.first())?;
        let mut requests = Vec::with_capacity(count.min(1 << 24));
        for _ in 0..count {
            let (n, mut v) = next("r")?;
            let part = match v.first() {
                Some(&"p") => Part::Prologue,
                Some(&"t") => Part::Template,
                other => return Err(bad(n, format!("part {other:?}"))),
            };
            let small = match v.get(1) {
                Some(&"s") => true,
                Some(&"l") => false,
                other => return Err(bad(n, format!("lane {other:?}"))),
            };
            v.remove(1);
            let dynamic = match v.get(3) {
                Some(&"s") => false,
                Some(&"d") => true,
                other => return Err(bad(n, format!("kind {other:?}"))),
            };
            let offset = match v.get(6) {
                Some(&"-") => None,
                w => Some(num(n, w)?),
            };
            let span = |k: usize| -> Result<(u64, u64), PlanFileError> {
                let (s, e) = (num(n, v.get(k))?, num(n, v.get(k + 1))?);
                if s >= e {
                    return Err(bad(n, format!("empty span {s}..{e}")));
                }
                Ok((s, e))
            };
            let life = match v.len() {
                9 => {
                    let (s, e) = span(7)?;
                    Lifetime::one(s, e)
                }
                11 => {
                    let (a, b) = (span(7)?, span(9)?);
                    if !(a.1 <= b.0 || b.1 <= a.0) {
                        return Err(bad(n, "spans overlap".into()));
                    }
                    Lifetime::two(a, b)
                }
                k => return Err(bad(n, format!("{k} fields after `r`, expected 9 or 11"))),
            };
            requests.push(PlannedRequest {
                request: Request {
                    part,
                    small,
                    ordinal: num(n, v.get(1))?,
                    stream: num(n, v.get(2))?,
                    size: num(n, v.get(4))?,
                    min_size: num(n, v.get(5))?,
                    dynamic,
                    life,
                },
                offset,
            });
        }
        next("end")?;
        let plan = Plan {
            small_below,
            prologue_steps,
            iterations,
            prologue_len,
            template_len,
            arena,
            trace_peak_live,
            unplanned,
            requests,
            stats,
        };
        plan.check().map_err(|why| bad(0, why))?;
        Ok(plan)
    }

    /// Writes the plan to a file.
    pub fn save(&self, path: &Path) -> Result<(), PlanFileError> {
        let mut f = io::BufWriter::new(std::fs::File::create(path)?);
        self.write_to(&mut f)?;
        io::Write::flush(&mut f)?;
        Ok(())
    }

    /// Reads and checks a plan file.
    pub fn load(path: &Path) -> Result<Plan, PlanFileError> {
        Plan::read_from(&std::fs::read_to_string(path)?)
    }
}
