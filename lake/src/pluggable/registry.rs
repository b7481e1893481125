//! `Registry`: one pool per device, keyed by device ordinal, made on first
//! use and kept for the life of the registry (the C ABI keeps one for the
//! life of the process).
//!
//! Concurrency: a mutex guards the map; it is held while a missing pool is
//! made, so two threads asking for the same new device get the same pool.
//! Pools are shared as `Arc`s and used without the registry's lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Pools of type `P`, one per device ordinal.
pub struct Registry<P> {
    pools: Mutex<HashMap<i32, Arc<P>>>,
}

impl<P> Default for Registry<P> {
    fn default() -> Self {
        Registry {
            pools: Mutex::new(HashMap::new()),
        }
    }
}

impl<P> Registry<P> {
    /// An empty registry.
    pub fn new() -> Registry<P> {
        Registry::default()
    }

    /// The pool of `device`, made with `make` if there is none yet. A
    /// failed `make` leaves no entry (the next call tries again).
    pub fn get_or_make<Err>(
        &self,
        device: i32,
        make: impl FnOnce(i32) -> Result<P, Err>,
    ) -> Result<Arc<P>, Err> {
        // The map is only inserted into: a poisoned lock still guards a
        // consistent map.
        let mut pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = pools.get(&device) {
            return Ok(Arc::clone(p));
        }
        let pool = Arc::new(make(device)?);
        pools.insert(device, Arc::clone(&pool));
        Ok(pool)
    }

    /// The pool of `device`, if one was made.
    pub fn get(&self, device: i32) -> Option<Arc<P>> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        pools.get(&device).cloned()
    }

    /// Devices with a pool, in ascending order.
    pub fn devices(&self) -> Vec<i32> {
        let pools = self.pools.lock().unwrap_or_else(|e| e.into_inner());
        let mut d: Vec<i32> = pools.keys().copied().collect();
        d.sort_unstable();
        d
    }
}
