//! Driver work on the lake's tables: new chunks at home, stitched views,
//! patches of stitched views, unmapping and release. Each call is all or
//! nothing: a failed driver call undoes what the call had done (mappings
//! removed or put back, chunks and reservations given back, or kept as
//! orphans to retry when the driver refuses even that) and the tables are
//! as before.
//!
//! Concurrency: none of its own; runs under the lake's state mutex like the
//! rest of the tables.

use std::collections::BTreeMap;

use super::super::driver::{ChunkHandle, VmmDriver, VmmResult};
use super::super::fence::Fence;
use super::{Chunk, ChunkId, FreeBits, Placement, StitchedList, Tables, View, ViewId, consecutive};

/// Where new chunks may go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Spill {
    /// Device memory only: the driver's out of memory is the request's.
    Off,
    /// The device for at most `device_room` more chunks (the lake's limit
    /// less what it holds there) while the driver has memory, host memory
    /// for the others ([`VmmDriver::create_on_host`]).
    On {
        /// Chunks the device may still take; 0 once the driver ran out.
        device_room: usize,
    },
}

/// Unmaps the granules at `addrs` (all mapped by us), best effort: used only
/// to undo work after an earlier failure, whose error is the one reported.
fn undo_maps(driver: &dyn VmmDriver, addrs: impl Iterator<Item = u64>) -> usize {
    addrs.filter(|&a| driver.unmap(a).is_err()).count()
}

impl Tables {
    /// Makes new free chunks at home where `placement` says: create and
    /// map each, then grant access per stretch of consecutive slots (one
    /// call when they are contiguous). With [`Spill::On`], a chunk the
    /// device has no room or memory for is made in host memory instead
    /// (see [`Tables::fill`]). On failure everything made so far is undone
    /// (a new view's reservation freed) and the error returned.
    pub fn grow(
        &mut self,
        driver: &dyn VmmDriver,
        placement: Placement,
        mut spill: Spill,
    ) -> VmmResult<Vec<ChunkId>> {
        let g = self.granularity;
        let (view, slots, new_view) = match placement {
            Placement::Tail(v, count) => {
                let from = self.views[&v].filled_to;
                (v, (from..from + count).collect::<Vec<_>>(), None)
            }
            Placement::Holes(count) => {
                let picked: Vec<(ViewId, usize)> = self.holes.iter().take(count).copied().collect();
                // Holes may lie in several views: grow each in turn.
                let mut by_view: BTreeMap<ViewId, Vec<usize>> = BTreeMap::new();
                for (v, s) in picked {
                    by_view.entry(v).or_default().push(s);
                }
                let mut made: Vec<ChunkId> = Vec::new();
                for (v, slots) in by_view {
                    match self.fill(driver, v, &slots, &mut spill) {
                        Ok(ids) => made.extend(ids),
                        Err(e) => {
                            for c in made {
                                let _ = self.release_chunk(driver, c);
                            }
                            return Err(e);
                        }
                    }
                }
                return Ok(made);
            }
            Placement::NewView { capacity, count } => {
                let base = driver.reserve(g * capacity as u64)?;
                let id = self.id();
                self.views.insert(
                    id,
                    View {
                        base,
                        slots: vec![None; capacity],
                        stitched: false,
                        users: 0,
                        last_used: 0,
                        filled_to: 0,
                        reserved: capacity,
                        occupied: 0,
                        fence: Fence::none(),
                        free: FreeBits::new(capacity),
                        pieces: Vec::new().into(),
                    },
                );
                (id, (0..count).collect(), Some((base, capacity)))
            }
        };
        let result = self.fill(driver, view, &slots, &mut spill);
        if result.is_err()
            && let Some((base, capacity)) = new_view
        {
            self.views.remove(&view);
            if driver.free_address(base, g * capacity as u64).is_err() {
                self.orphans.reservations.push((base, g * capacity as u64));
            }
        }
        result
    }

    /// Creates and maps chunks at the empty `slots` (ascending) of home
    /// view `v` and grants access; all or nothing. Returns the new chunks.
    ///
    /// With [`Spill::On`], the device takes chunks while it has room (the
    /// limit) and memory; a `create` that fails for lack of memory is
    /// answered with a host chunk ([`VmmDriver::create_on_host`]) at the
    /// same slot, and so are the request's remaining chunks (the room drops
    /// to 0: the device stays full within one request); the next request
    /// asks the device first again. Every other failure, a host chunk's
    /// included, is the fill's.
    fn fill(
        &mut self,
        driver: &dyn VmmDriver,
        v: ViewId,
        slots: &[usize],
        spill: &mut Spill,
    ) -> VmmResult<Vec<ChunkId>> {
        let g = self.granularity;
        let base = self.views[&v].base;
        // Handles, and whether each is in host memory.
        let mut made: Vec<(ChunkHandle, bool)> = Vec::with_capacity(slots.len());
        let mut mapped = 0usize;
        let result = (|| {
            for (i, &s) in slots.iter().enumerate() {
                let chunk = match spill {
                    Spill::Off => (driver.create()?, false),
                    Spill::On { device_room: 0 } => (driver.create_on_host()?, true),
                    Spill::On { device_room } => match driver.create() {
                        Ok(h) => {
                            *device_room -= 1;
                            (h, false)
                        }
                        Err(e) if e.is_out_of_memory() => {
                            *device_room = 0;
                            (driver.create_on_host()?, true)
                        }
                        Err(e) => return Err(e),
                    },
                };
                made.push(chunk);
                driver.map(base + g * s as u64, made[i].0)?;
                mapped += 1;
            }
            for (start, len) in consecutive(slots) {
                driver.set_access(base + g * start as u64, g * len as u64)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            undo_maps(driver, slots[..mapped].iter().map(|&s| base + g * s as u64));
            for (h, on_host) in made {
                if driver.release(h).is_err() {
                    self.orphans.chunks.push((h, on_host));
                }
            }
            return Err(e);
        }
        let mut ids = Vec::with_capacity(slots.len());
        for (&s, (handle, on_host)) in slots.iter().zip(made) {
            if on_host {
                self.host_chunks += 1;
                self.spills += 1;
            }
            let cid = self.chunks.add(Chunk {
                handle,
                on_host,
                home: (v, s),
                fence: Fence::none(),
                stitched: StitchedList::default(),
            });
            ids.push(cid);
            self.holes.remove(&(v, s));
            let view = self.views.get_mut(&v).expect("live view");
            view.slots[s] = Some(cid);
            view.occupied += 1;
            view.filled_to = view.filled_to.max(s + 1);
            // Born used (in no run), then freed: joins its neighbours'
            // runs.
            self.set_used(cid, false);
        }
        Ok(ids)
    }

    /// Maps `chunks` (all free) back to back in a new stitched view and
    /// grants access; the view's reservation has room for `room` slots
    /// (at least the chunks), see [`super::EXTEND_ROOM`]. A failure halfway
    /// unmaps what was mapped and frees the reservation.
    pub fn stitch(
        &mut self,
        driver: &dyn VmmDriver,
        chunks: &[ChunkId],
        room: usize,
        clock: u64,
    ) -> VmmResult<ViewId> {
        let g = self.granularity;
        let room = room.max(chunks.len());
        let size = g * chunks.len() as u64;
        let base = driver.reserve(g * room as u64)?;
        let mut mapped = 0usize;
        let result = (|| {
            for (i, c) in chunks.iter().enumerate() {
                driver.map(base + g * i as u64, self.chunks[c].handle)?;
                mapped += 1;
            }
            driver.set_access(base, size)
        })();
        if let Err(e) = result {
            undo_maps(driver, (0..mapped).map(|i| base + g * i as u64));
            if driver.free_address(base, g * room as u64).is_err() {
                self.orphans.reservations.push((base, g * room as u64));
            }
            return Err(e);
        }
        let id = self.id();
        self.views.insert(
            id,
            View {
                base,
                slots: chunks.iter().map(|&c| Some(c)).collect(),
                stitched: true,
                users: 0,
                last_used: clock,
                filled_to: chunks.len(),
                reserved: room,
                occupied: chunks.len(),
                fence: Fence::none(),
                free: FreeBits::default(),
                pieces: Vec::new().into(),
            },
        );
        for (i, &c) in chunks.iter().enumerate() {
            self.chunks
                .get_mut(&c)
                .expect("live chunk")
                .stitched
                .push((id, i));
        }
        self.idle_stitched += 1;
        self.repiece(id);
        Ok(id)
    }

    /// Extends stitched view `v` (no allocation uses it) at its end by the
    /// free chunks `with`, which it does not map yet: each is mapped in the
    /// next slot of the reservation, then access is granted over the new
    /// slots only. A longer tensor of the same kind finds its old view
    /// grown by the difference instead of stitching every chunk again
    /// (`cuMemSetAccess` costs ~20 µs per mapping on H100). On failure the
    /// new mappings are undone and the view is as it was.
    pub fn extend(&mut self, driver: &dyn VmmDriver, v: ViewId, with: &[ChunkId]) -> VmmResult<()> {
        let g = self.granularity;
        let (base, from) = {
            let view = &self.views[&v];
            assert!(
                view.stitched && view.users == 0,
                "extension of a home or used view"
            );
            assert!(
                view.slots.len() + with.len() <= view.reserved,
                "extension past the reservation"
            );
            (view.base, view.slots.len())
        };
        let mut mapped = 0usize;
        let result = (|| {
            for (k, c) in with.iter().enumerate() {
                driver.map(base + g * (from + k) as u64, self.chunks[c].handle)?;
                mapped += 1;
            }
            driver.set_access(base + g * from as u64, g * with.len() as u64)
        })();
        if let Err(e) = result {
            undo_maps(driver, (0..mapped).map(|k| base + g * (from + k) as u64));
            return Err(e);
        }
        for (k, &c) in with.iter().enumerate() {
            self.chunks
                .get_mut(&c)
                .expect("live chunk")
                .stitched
                .push((v, from + k));
        }
        let view = self.views.get_mut(&v).expect("live view");
        view.slots.extend(with.iter().map(|&c| Some(c)));
        view.occupied += with.len();
        view.filled_to = view.slots.len();
        self.repiece(v);
        Ok(())
    }

    /// Patches stitched view `v` (no allocation uses it): the chunk at each
    /// of `slots` (ascending) is unmapped there and replaced by the free
    /// chunk at the same position of `with`, then access is granted per
    /// stretch of consecutive slots. Far cheaper than a new stitch when few
    /// slots change (`cuMemSetAccess` costs per granule). On failure every
    /// slot is put back as it was.
    pub fn patch(
        &mut self,
        driver: &dyn VmmDriver,
        v: ViewId,
        slots: &[usize],
        with: &[ChunkId],
    ) -> VmmResult<()> {
        assert_eq!(slots.len(), with.len(), "one replacement per slot");
        let g = self.granularity;
        let base = self.views[&v].base;
        assert!(
            self.views[&v].stitched && self.views[&v].users == 0,
            "patch of a home or used view"
        );
        let old: Vec<ChunkId> = slots
            .iter()
            .map(|&i| self.views[&v].slots[i].expect("full"))
            .collect();
        let mut done = 0usize;
        let mut half = false;
        let result = (|| {
            for (k, &i) in slots.iter().enumerate() {
                driver.unmap(base + g * i as u64)?;
                half = true;
                driver.map(base + g * i as u64, self.chunks[&with[k]].handle)?;
                half = false;
                done += 1;
            }
            for (start, len) in consecutive(slots) {
                driver.set_access(base + g * start as u64, g * len as u64)?;
            }
            Ok(())
        })();
        if let Err(e) = result {
            // Put back what changed: slots [0, done) hold new chunks, slot
            // `done` is unmapped if the failure came between unmap and map.
            for k in 0..done {
                let a = base + g * slots[k] as u64;
                let _ = driver.unmap(a);
                let _ = driver.map(a, self.chunks[&old[k]].handle);
            }
            if half {
                let _ = driver.map(
                    base + g * slots[done] as u64,
                    self.chunks[&old[done]].handle,
                );
            }
            for (start, len) in consecutive(&slots[..done + usize::from(half)]) {
                let _ = driver.set_access(base + g * start as u64, g * len as u64);
            }
            return Err(e);
        }
        for (k, &i) in slots.iter().enumerate() {
            self.chunks
                .get_mut(&old[k])
                .expect("live chunk")
                .stitched
                .retain(|&p| p != (v, i));
            self.chunks
                .get_mut(&with[k])
                .expect("live chunk")
                .stitched
                .push((v, i));
            self.views.get_mut(&v).expect("live view").slots[i] = Some(with[k]);
        }
        self.repiece(v);
        Ok(())
    }

    /// Unmaps a stitched view no allocation uses and frees its
    /// reservation. If an unmap fails, the granules already unmapped are
    /// mapped again and the view stays. Returns its address range.
    pub fn drop_stitched(&mut self, driver: &dyn VmmDriver, id: ViewId) -> VmmResult<(u64, u64)> {
        let g = self.granularity;
        let (base, chunks): (u64, Vec<ChunkId>) = {
            let v = &self.views[&id];
            assert!(v.stitched && v.users == 0, "drop of a home or used view");
            (v.base, v.slots.iter().map(|c| c.expect("full")).collect())
        };
        for i in 0..chunks.len() {
            if let Err(e) = driver.unmap(base + g * i as u64) {
                for (j, c) in chunks.iter().enumerate().take(i) {
                    let _ = driver.map(base + g * j as u64, self.chunks[c].handle);
                }
                if i > 0 {
                    let _ = driver.set_access(base, g * i as u64);
                }
                return Err(e);
            }
        }
        let size = g * self.views[&id].reserved as u64;
        if driver.free_address(base, size).is_err() {
            self.orphans.reservations.push((base, size));
        }
        for c in chunks {
            self.chunks
                .get_mut(&c)
                .expect("live chunk")
                .stitched
                .retain(|&(v, _)| v != id);
        }
        self.views.remove(&id);
        self.idle_stitched -= 1;
        self.repiece(id);
        Ok((base, size))
    }

    /// Unmaps a free chunk mapped only at home and releases it; its slot
    /// becomes a hole. A home view left with no chunk is freed. Returns the
    /// freed view's range, if any.
    pub fn release_chunk(
        &mut self,
        driver: &dyn VmmDriver,
        c: ChunkId,
    ) -> VmmResult<Option<(u64, u64)>> {
        let g = self.granularity;
        let (v, slot) = {
            let chunk = &self.chunks[&c];
            assert!(
                !self.is_used(c) && chunk.stitched.is_empty(),
                "release of a used or stitched chunk"
            );
            chunk.home
        };
        let base = self.views[&v].base;
        driver.unmap(base + g * slot as u64)?;
        self.set_fence(c, Fence::none());
        let chunk = self.chunks.remove(&c).expect("live chunk");
        if chunk.on_host {
            self.host_chunks -= 1;
        }
        if driver.release(chunk.handle).is_err() {
            self.orphans.chunks.push((chunk.handle, chunk.on_host));
        }
        self.run_cut(v, slot, slot + 1);
        self.free_chunks -= 1;
        let view = self.views.get_mut(&v).expect("live view");
        view.slots[slot] = None;
        view.occupied -= 1;
        self.holes.insert((v, slot));
        if view.occupied == 0 {
            let size = g * view.slots.len() as u64;
            self.views.remove(&v);
            let gone: Vec<(ViewId, usize)> =
                self.holes.range((v, 0)..(v + 1, 0)).copied().collect();
            for h in gone {
                self.holes.remove(&h);
            }
            if driver.free_address(base, size).is_err() {
                self.orphans.reservations.push((base, size));
            }
            return Ok(Some((base, size)));
        }
        Ok(None)
    }

    /// Tries again to return orphaned chunks and reservations.
    pub fn retry_orphans(&mut self, driver: &dyn VmmDriver) {
        self.orphans
            .chunks
            .retain(|&(h, _)| driver.release(h).is_err());
        self.orphans
            .reservations
            .retain(|&(a, s)| driver.free_address(a, s).is_err());
    }

    /// Gives everything back to the driver, used chunks included (the
    /// lake is going away); errors are ignored, the driver keeps what it
    /// refused.
    pub fn teardown(&mut self, driver: &dyn VmmDriver) {
        let ids: Vec<ViewId> = self.views.keys().copied().collect();
        for id in ids {
            if let Some(v) = self.views.get_mut(&id)
                && v.stitched
            {
                if v.users > 0 {
                    v.users = 0;
                    self.idle_stitched += 1;
                }
                let _ = self.drop_stitched(driver, id);
            }
        }
        let ids: Vec<ChunkId> = self.chunks.keys().collect();
        for c in ids {
            if self.is_used(c) {
                self.set_used(c, false);
            }
            self.set_fence(c, Fence::none());
            if self.chunks[&c].stitched.is_empty() {
                let _ = self.release_chunk(driver, c);
            }
        }
        self.retry_orphans(driver);
    }
}
