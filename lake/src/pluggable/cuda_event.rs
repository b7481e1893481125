//! `CudaEvents`: [`EventSource`] on a real GPU through cudarc's raw `sys`
//! event calls (`cuEventCreate`, `cuEventRecord`, `cuEventQuery`,
//! `cuEventDestroy`). Every error names the driver call.
//!
//! Destroyed events are kept on a spare list and recorded again (recording
//! over a completed event is allowed), so the steady state creates none;
//! the spares are destroyed with the source.
//!
//! Concurrency: the spare list sits behind a mutex; the call counter is a
//! relaxed atomic. Each call binds the device's primary context to the
//! calling thread first, so any thread may use it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, sys};

use super::error::EventFailure;
use super::event::{EventId, EventSource, StreamId};

/// CUDA events of one device.
pub struct CudaEvents {
    ctx: Arc<CudaContext>,
    /// Events destroyed by the pool, ready to be recorded again.
    spare: Mutex<Vec<EventId>>,
    calls: AtomicU64,
}

/// Turns a driver status into a result naming `call`.
fn check(call: &'static str, status: sys::CUresult) -> Result<(), EventFailure> {
    status.result().map_err(|e| EventFailure {
        call,
        cause: e.to_string(),
    })
}

fn raw(event: EventId) -> sys::CUevent {
    event.0 as usize as sys::CUevent
}

impl CudaEvents {
    /// Events on device `ordinal` (its primary context).
    pub fn open(ordinal: usize) -> Result<CudaEvents, EventFailure> {
        host::thread_cuda::before_driver_call();
        let ctx = CudaContext::new(ordinal).map_err(|e| EventFailure {
            call: "cuDevicePrimaryCtxRetain",
            cause: e.to_string(),
        })?;
        Ok(CudaEvents {
            ctx,
            spare: Mutex::new(Vec::new()),
            calls: AtomicU64::new(0),
        })
    }

    fn bind(&self) -> Result<(), EventFailure> {
        host::thread_cuda::before_driver_call();
        self.ctx.bind_to_thread().map_err(|e| EventFailure {
            call: "cuCtxSetCurrent",
            cause: e.to_string(),
        })
    }

    fn count(&self) {
        // Relaxed: an independent counter, read only for reporting.
        self.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn create(&self) -> Result<EventId, EventFailure> {
        let mut event: sys::CUevent = std::ptr::null_mut();
        self.count();
        // SAFETY: `event` is a valid out-pointer; the flag asks for an event
        // without timing, the cheapest kind to record and query.
        let status = unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as std::ffi::c_uint,
            )
        };
        check("cuEventCreate", status)?;
        Ok(EventId(event as usize as u64))
    }
}

impl EventSource for CudaEvents {
    fn record(&self, stream: StreamId) -> Result<EventId, EventFailure> {
        self.bind()?;
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let event = match spare {
            Some(e) => e,
            None => self.create()?,
        };
        self.count();
        // SAFETY: `event` is a live event of this context (created above or
        // kept on the spare list); `stream` is a stream handle the caller
        // got from CUDA for this device (0 is the legacy default stream).
        let status = unsafe { sys::cuEventRecord(raw(event), stream.0 as usize as sys::CUstream) };
        if let Err(e) = check("cuEventRecord", status) {
            self.destroy(event);
            return Err(e);
        }
        Ok(event)
    }

    fn is_complete(&self, event: EventId) -> Result<bool, EventFailure> {
        self.bind()?;
        self.count();
        // SAFETY: `event` came from `record` and was not destroyed.
        let status = unsafe { sys::cuEventQuery(raw(event)) };
        match status {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            other => check("cuEventQuery", other).map(|()| false),
        }
    }

    fn destroy(&self, event: EventId) {
        self.spare
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
    }

    fn synchronize_all(&self) -> Result<(), EventFailure> {
        self.bind()?;
        self.count();
        // SAFETY: the device's primary context is current (bound above);
        // the call only waits.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }

    fn synchronize(&self, event: EventId) -> Result<(), EventFailure> {
        self.bind()?;
        self.count();
        // SAFETY: `event` came from `record` and was not destroyed; the call
        // only waits.
        check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(raw(event))
        })
    }

    fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

impl Drop for CudaEvents {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let spare = self.spare.get_mut().unwrap_or_else(|e| e.into_inner());
        for event in spare.drain(..) {
            // SAFETY: every spare event is live and no longer recorded on by
            // anyone; it is destroyed once. Errors cannot be reported from a
            // drop; the driver frees events with the context anyway.
            let _ = unsafe { sys::cuEventDestroy_v2(raw(event)) };
        }
    }
}
