//! `Parked`: freed windows kept whole, by size, for the next request of the
//! same number of chunks.
//!
//! Giving a window back to the tables and taking one again costs work per
//! chunk (each chunk's flag and every view that maps it: a GPT-2 step frees
//! and takes some 30,000 chunks in windows of 10-1500). Training repeats
//! its sizes, layer after layer and step after step, so a freed window is
//! first parked here as it is: its chunks stay marked used in the tables,
//! its view keeps the user. A request of the same chunk count whose stream
//! the window's fence admits takes it back in O(1), no table work at all.
//!
//! Parking never costs memory: the lake gives every parked window back to
//! the tables ([`Parked::drain`]) before it patches, stitches or grows, and
//! before trimming, so those decisions see all free chunks as before. In
//! statistics parked chunks count as free (or waiting, by their fence).
//!
//! Concurrency: none of its own; it lives inside the lake's state mutex.

use std::collections::HashMap;

use super::fence::{Fence, Requester};
use super::tables::Window;

/// A parked window: the fence it was freed behind and the lake clock then.
#[derive(Debug)]
pub struct ParkedWindow {
    /// The window, its chunks still marked used.
    pub window: Window,
    /// The fence of the free.
    pub fence: Fence,
    /// The lake's clock at the free (the view's last use, for the LRU).
    pub clock: u64,
}

/// Freed windows by chunk count.
#[derive(Debug, Default)]
pub struct Parked {
    by_len: HashMap<usize, Vec<ParkedWindow>>,
    chunks: usize,
}

impl Parked {
    /// Keeps `window`, freed behind `fence` at lake time `clock`.
    pub fn park(&mut self, window: Window, fence: Fence, clock: u64) {
        self.chunks += window.len;
        self.by_len
            .entry(window.len)
            .or_default()
            .push(ParkedWindow {
                window,
                fence,
                clock,
            });
    }

    /// The most recently parked window of `len` chunks that `req` may use,
    /// taken out.
    pub fn take(&mut self, len: usize, req: &Requester<'_>) -> Option<Window> {
        let list = self.by_len.get_mut(&len)?;
        let i = list.iter().rposition(|p| p.fence.admits(req))?;
        let parked = list.swap_remove(i);
        self.chunks -= len;
        Some(parked.window)
    }

    /// Every parked window, taken out, in the order they were freed.
    pub fn drain(&mut self) -> Vec<ParkedWindow> {
        self.chunks = 0;
        let mut all: Vec<ParkedWindow> = self.by_len.drain().flat_map(|(_, list)| list).collect();
        all.sort_unstable_by_key(|p| p.clock);
        all
    }

    /// Chunks in parked windows.
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Every parked window.
    pub fn iter(&self) -> impl Iterator<Item = &ParkedWindow> {
        self.by_len.values().flatten()
    }

    /// Whether nothing is parked.
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lake::fence::Progress;

    fn window(view: u64, len: usize) -> Window {
        Window {
            view,
            start: 0,
            len,
        }
    }

    #[test]
    fn a_fenced_window_goes_only_to_its_stream_until_the_free_completes() {
        let mut parked = Parked::default();
        parked.park(window(1, 4), Fence::single(7, 1), 10);
        let mut progress = Progress::new();
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert_eq!(parked.take(4, &other), None, "stream 8 must wait");
        let own = Requester {
            stream: 7,
            progress: &progress,
        };
        assert_eq!(parked.take(3, &own), None, "another size");
        assert_eq!(parked.take(4, &own), Some(window(1, 4)));
        parked.park(window(1, 4), Fence::single(7, 2), 11);
        progress.advance(7, 2);
        let other = Requester {
            stream: 8,
            progress: &progress,
        };
        assert_eq!(parked.take(4, &other), Some(window(1, 4)));
        assert!(parked.is_empty());
    }

    #[test]
    fn drain_gives_windows_back_in_the_order_they_were_freed() {
        let mut parked = Parked::default();
        parked.park(window(3, 2), Fence::none(), 30);
        parked.park(window(1, 5), Fence::none(), 10);
        parked.park(window(2, 2), Fence::none(), 20);
        assert_eq!(parked.chunks(), 9);
        let order: Vec<u64> = parked.drain().iter().map(|p| p.clock).collect();
        assert_eq!(order, [10, 20, 30]);
        assert_eq!(parked.chunks(), 0);
    }
}
