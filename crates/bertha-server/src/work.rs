//! Model work of the task routes (`/predict`, `/rerank`, `/fill-mask`,
//! `/ner`, `/qa`, `/attention`): off the async runtime, a few at a time,
//! and the memory it freed handed back to the system once none is left.
//!
//! Each request's memory is bounded by the task itself (e.g. `/qa` runs a
//! long context's windows a few at a time); the slots bound how many such
//! requests hold memory at once (16 parallel 1 MB `/qa` contexts used to
//! run side by side), and requests beyond them wait their turn. The
//! model's matrix multiplies use every core already, so more at once
//! would not be faster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Semaphore;

use crate::api::AppResult;
use crate::error::ApiError;

/// Task work running at once: the cores, at least 2 (a long request does
/// not stall every other) and at most 8.
pub fn default_slots() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2)
        .clamp(2, 8)
}

/// The slots of task work.
pub struct TaskSlots {
    slots: Arc<Semaphore>,
    size: usize,
}

impl TaskSlots {
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self {
            slots: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// Runs `f` on the blocking pool once a slot is free.
    pub async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> AppResult<T> + Send + 'static,
    ) -> AppResult<T> {
        let slot = self
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| ApiError::backend(e.to_string()))?;
        let done = tokio::task::spawn_blocking(f).await;
        drop(slot);
        if self.slots.available_permits() == self.size {
            tokio::task::spawn_blocking(return_freed_memory);
        }
        done.map_err(|e| ApiError::backend(e.to_string()))?
    }
}

/// Hands freed heap memory back to the system. `bertha` tunes glibc to keep
/// freed memory for reuse (training runs 50 % faster), so without this a
/// server would keep the peak of its largest request forever.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only releases free pages of malloc's own arenas.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Raises a flag when dropped: held by a request's handler, whose future
/// hyper drops when the client goes away, so that work running on the
/// blocking pool (which a dropped future does not stop) can see it and
/// stop early.
pub struct StopOnDrop(Arc<AtomicBool>);

impl StopOnDrop {
    pub fn new() -> Self {
        Self(Arc::new(AtomicBool::new(false)))
    }

    /// What the work checks: `true` once the handler is gone.
    pub fn stopped(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let flag = self.0.clone();
        move || flag.load(Ordering::Relaxed)
    }
}

impl Default for StopOnDrop {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
