//! Install clock: a measuring build's breakdown of the slice path's waits
//! (issue 15, `docs/PERF.md`, "What an install costs"). Off by default;
//! `GPUMALLOC_INSTALL_CLOCK=n` at build time turns it on, and then each
//! install is counted with the SM cycles of one [`Interval`] (`n`: 1 from
//! `install`'s entry to the exchange that publishes the new block, what
//! teams past the end wait for; 2 from the entry until the block is in
//! hand; 3 the whole call as the installing leader sees it), and each team
//! leader that waited in `wait_for_install` counts the cycles it waited.
//! Off, every call below is a constant `false` branch and folds away: the
//! default build's PTX does not change.
//!
//! The counters are statistics words 3 to 6 (see [`Stat`]), which the
//! default build leaves zero. Each is a relaxed add: the words are only
//! read from a snapshot after the kernel, so no order between them
//! matters, and the kernel boundary publishes them.

use crate::arch;
use crate::class::SizeClass;
use crate::layout::{Heap, Stat};

/// Which interval this build counts (`GPUMALLOC_INSTALL_CLOCK`, 0 to 3;
/// 0: none).
const INSTALL_CLOCK_MODE: u32 = crate::class::build_knob(option_env!("GPUMALLOC_INSTALL_CLOCK"), 0);
const _: () = assert!(matches!(INSTALL_CLOCK_MODE, 0..=3));

/// Whether this build counts.
pub(crate) const INSTALL_CLOCK: bool = INSTALL_CLOCK_MODE != 0;

/// The one slice class whose installs and waits a counting build counts
/// (`GPUMALLOC_INSTALL_CLOCK_CLASS`, a class index: 0 is 16 B, 8 is
/// 4 KiB), or every class (the default, 255). Under mixed sizes it tells
/// which class's install chain the kernel waits on.
const INSTALL_CLOCK_CLASS: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_INSTALL_CLOCK_CLASS"), 255);

/// Whether a counting build counts `class`.
#[inline(always)]
fn counts(class: SizeClass) -> bool {
    INSTALL_CLOCK_CLASS == 255 || class.index() == INSTALL_CLOCK_CLASS
}

/// The part of an install a build times (its mode's number).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Interval {
    /// `install`'s entry to the exchange.
    Publish = 1,
    /// `install`'s entry to the block in hand (spare popped or claimed).
    Obtain = 2,
    /// The leader's call of `install`, the handle's copy included.
    Call = 3,
}

/// The cycle counter where this build counts, else 0 (no read).
#[inline(always)]
pub(crate) fn start() -> u64 {
    if INSTALL_CLOCK { arch::clock64() } else { 0 }
}

impl Heap {
    /// One install, where `interval` is the one this build times: `began`
    /// from [`start`] at the interval's start, `claimed` when no spare was
    /// popped (it claimed blocks or found none; not known for
    /// [`Interval::Call`]).
    #[inline(always)]
    pub(crate) fn count_install(
        &self,
        class: SizeClass,
        interval: Interval,
        began: u64,
        claimed: bool,
    ) {
        if INSTALL_CLOCK && interval as u32 == INSTALL_CLOCK_MODE && counts(class) {
            let cycles = arch::clock64().wrapping_sub(began);
            arch::fetch_add_relaxed(self.stat(Stat::Installs), 1 + ((claimed as u64) << 32));
            arch::fetch_add_relaxed(self.stat(Stat::InstallCycles), cycles);
        }
    }

    /// One team's wait for an install, `began` from [`start`] before it.
    #[inline(always)]
    pub(crate) fn count_wait(&self, class: SizeClass, began: u64) {
        if INSTALL_CLOCK && counts(class) {
            let cycles = arch::clock64().wrapping_sub(began);
            arch::fetch_add_relaxed(self.stat(Stat::Waits), 1);
            arch::fetch_add_relaxed(self.stat(Stat::WaitCycles), cycles);
        }
    }
}

/// What an instrumented build counted (all zero in others).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InstallClock {
    /// Installs of a slot word.
    pub installs: u64,
    /// Installs that popped no spare.
    pub claimed: u64,
    /// SM cycles of the interval the build times ([`Interval`]), summed.
    pub install_cycles: u64,
    /// Team waits in `wait_for_install`.
    pub waits: u64,
    /// SM cycles of those waits, summed.
    pub wait_cycles: u64,
}

impl InstallClock {
    /// Decodes the four statistics words (`at(stat)`: that word's value).
    pub fn from_words(at: impl Fn(Stat) -> u64) -> InstallClock {
        let installs = at(Stat::Installs);
        InstallClock {
            installs: installs & 0xffff_ffff,
            claimed: installs >> 32,
            install_cycles: at(Stat::InstallCycles),
            waits: at(Stat::Waits),
            wait_cycles: at(Stat::WaitCycles),
        }
    }
}

/// One line for a log: counts and mean cycles.
impl core::fmt::Display for InstallClock {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let mean = |sum: u64, n: u64| sum.checked_div(n).unwrap_or(0);
        write!(
            f,
            "{} installs ({} without a spare), {} cycles each (GPUMALLOC_INSTALL_CLOCK's \
             interval); {} team waits, {} cycles each",
            self.installs,
            self.claimed,
            mean(self.install_cycles, self.installs),
            self.waits,
            mean(self.wait_cycles, self.waits)
        )
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;
    use std::string::ToString;

    #[test]
    fn the_words_decode_into_counts_and_means() {
        let words = |stat: Stat| match stat {
            Stat::Installs => 256 | 66 << 32,
            Stat::InstallCycles => 256 * 4000,
            Stat::Waits => 8000,
            Stat::WaitCycles => 8000 * 7000,
            _ => unreachable!("only the clock's words are read"),
        };
        let clock = InstallClock::from_words(words);
        assert_eq!(
            (clock.installs, clock.claimed, clock.waits),
            (256, 66, 8000)
        );
        let line = format!("{clock}");
        assert!(
            line.contains("256 installs (66 without a spare), 4000 cycles each"),
            "{line}"
        );
        assert!(line.contains("8000 team waits, 7000 cycles each"), "{line}");
        assert_eq!(
            InstallClock::default()
                .to_string()
                .matches(" 0 cycles")
                .count(),
            2
        );
    }
}
