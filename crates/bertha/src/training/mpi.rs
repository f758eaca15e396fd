//! The MPI process group (feature `mpi`): rsmpi over the system's MPI
//! (MPICH on Debian; any MPI rsmpi builds against works), so a run
//! started by `mpirun -np N`, `mpiexec` or Slurm's `srun` trains
//! data-parallel over its processes.
//!
//! A collective that waits longer than the group's timeout means another
//! process stalled or died: a watchdog thread then aborts the whole job
//! (`MPI_Abort`) with a message naming this process, the step and the
//! collective, so no run hangs silently; a process that dies is named by
//! the launcher, which ends the others.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use mpi::Threading;

use super::distributed::ProcessGroup;
use crate::error::{Error, Result};

/// The processes of the MPI job this program runs in (one when started
/// without a launcher).
pub struct MpiGroup {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    watch: Arc<Watch>,
    // Last: finalises MPI when the group is dropped.
    _universe: Universe,
}

/// What the watchdog sees: when the pending collective started (ms since
/// `origin`, 0: none) and what it is.
struct Watch {
    origin: Instant,
    since_ms: AtomicU64,
    what: Mutex<String>,
}

impl MpiGroup {
    /// Initialises MPI (once per program); a collective waiting longer
    /// than `timeout` aborts the job.
    pub fn init(timeout: Duration) -> Result<Self> {
        let (universe, _) =
            mpi::initialize_with_threading(Threading::Multiple).ok_or_else(|| {
                Error::Distributed("MPI was initialised already in this program".into())
            })?;
        let world = universe.world();
        let rank = usize::try_from(world.rank()).unwrap_or(0);
        let size = usize::try_from(world.size()).unwrap_or(1);
        let watch = Arc::new(Watch {
            origin: Instant::now(),
            since_ms: AtomicU64::new(0),
            what: Mutex::new(String::new()),
        });
        if size > 1 {
            let watch = watch.clone();
            std::thread::Builder::new()
                .name("bertha-mpi-watchdog".into())
                .spawn(move || watchdog(&watch, rank, timeout))
                .map_err(|e| Error::Distributed(format!("cannot start the watchdog: {e}")))?;
        }
        Ok(Self {
            world,
            rank,
            size,
            watch,
            _universe: universe,
        })
    }

    /// Ends every process of the job with `code` (after an error on one).
    pub fn abort(&self, code: i32) -> ! {
        self.world.abort(code)
    }

    /// Process `r`'s MPI rank.
    fn peer(&self, r: usize) -> Result<mpi::Rank> {
        mpi::Rank::try_from(r)
            .ok()
            .filter(|_| r < self.size)
            .ok_or_else(|| Error::Distributed(format!("no process {r} of {}", self.size)))
    }

    /// Runs collective `f`, watched.
    fn watched<T>(&self, what: &str, f: impl FnOnce() -> T) -> T {
        if let Ok(mut w) = self.watch.what.lock() {
            w.clear();
            w.push_str(what);
        }
        let now = self.watch.origin.elapsed().as_millis() as u64;
        self.watch.since_ms.store(now.max(1), Ordering::SeqCst);
        let out = f();
        self.watch.since_ms.store(0, Ordering::SeqCst);
        out
    }
}

fn watchdog(watch: &Watch, rank: usize, timeout: Duration) {
    loop {
        std::thread::sleep(Duration::from_millis(250));
        let since = watch.since_ms.load(Ordering::SeqCst);
        if since == 0 {
            continue;
        }
        let waited = (watch.origin.elapsed().as_millis() as u64).saturating_sub(since);
        if waited >= timeout.as_millis() as u64 {
            let what = watch.what.lock().map(|w| w.clone()).unwrap_or_default();
            let line = format!(
                "error: data-parallel run: process {rank} waited {:.0} s for the other processes \
                 in {what}: one of them stalled or died; stopping every process\n",
                waited as f64 / 1000.0
            );
            // One write, and a moment for the launcher to forward it.
            let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
            std::thread::sleep(Duration::from_millis(300));
            SimpleCommunicator::world().abort(3);
        }
    }
}

impl ProcessGroup for MpiGroup {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn sum_f64(&self, values: &mut [f64]) -> Result<()> {
        let send = values.to_vec();
        self.watched("a sum of losses or figures", || {
            self.world
                .all_reduce_into(&send[..], values, SystemOperation::sum())
        });
        Ok(())
    }

    fn sum_f32(&self, send: &[f32], recv: &mut [f32]) -> Result<()> {
        self.watched("the gradient all-reduce", || {
            self.world
                .all_reduce_into(send, recv, SystemOperation::sum())
        });
        Ok(())
    }

    fn broadcast_f32(&self, values: &mut [f32]) -> Result<()> {
        self.watched("the broadcast of process 0's weights", || {
            self.world.process_at_rank(0).broadcast_into(values)
        });
        Ok(())
    }

    fn gather_u64(&self, values: &[u64]) -> Result<Vec<u64>> {
        let mut all = vec![0u64; values.len() * self.size];
        self.watched("the check that every process runs the same job", || {
            self.world.all_gather_into(values, &mut all[..])
        });
        Ok(all)
    }

    fn gather_f32(&self, values: &[f32]) -> Result<Vec<Vec<f32>>> {
        use mpi::datatype::PartitionMut;
        let mut counts = vec![0 as mpi::Count; self.size];
        let mine = mpi::Count::try_from(values.len()).map_err(|_| {
            Error::Distributed(format!("{} values are too many to gather", values.len()))
        })?;
        self.watched(
            "the exchange of a batch's embeddings or predictions",
            || self.world.all_gather_into(&mine, &mut counts[..]),
        );
        let mut displs = Vec::with_capacity(self.size);
        let mut total: mpi::Count = 0;
        for &c in &counts {
            displs.push(total);
            total = total.checked_add(c).ok_or_else(|| {
                Error::Distributed("the gathered values overflow MPI's count".into())
            })?;
        }
        let mut all = vec![0f32; usize::try_from(total).unwrap_or(0)];
        {
            let mut part = PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            self.watched(
                "the exchange of a batch's embeddings or predictions",
                || self.world.all_gather_varcount_into(values, &mut part),
            );
        }
        let mut out = Vec::with_capacity(self.size);
        let mut at = 0usize;
        for &c in &counts {
            let c = usize::try_from(c).unwrap_or(0);
            out.push(all[at..at + c].to_vec());
            at += c;
        }
        Ok(out)
    }

    fn exchange_u16(&self, send: &[u16], to: usize, recv: &mut [u16], from: usize) -> Result<()> {
        let (to, from) = (self.peer(to)?, self.peer(from)?);
        self.watched("the compressed gradient exchange", || {
            mpi::point_to_point::send_receive_into(
                send,
                &self.world.process_at_rank(to),
                recv,
                &self.world.process_at_rank(from),
            )
        });
        Ok(())
    }

    fn describe(&self) -> String {
        let version = mpi::environment::library_version().unwrap_or_default();
        let first = version.lines().next().unwrap_or("MPI").trim().to_string();
        format!("{first}, {} processes", self.size)
    }
}
