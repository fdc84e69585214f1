//! The tokio runtime the core runs on: one per process. A forked child
//! (gunicorn, Celery, `multiprocessing`) inherits the parent's runtime
//! without its threads, so it gets a runtime of its own on first use; the
//! inherited one is never dropped (dropping would wait for threads that do
//! not exist in the child). And the gate through which the runtime's
//! threads enter Python, closed at the interpreter's exit.
//!
//! [`Rt`] is that runtime as `pyo3-async-runtimes` sees it, so its bridges
//! (a Rust future as a Python awaitable, cancelled from Python) spawn here.
//!
//! The runtime's threads block every asynchronous signal. The kernel hands a
//! process-directed signal (Ctrl-C, a `kill`) to any thread that does not
//! block it; Python runs its handlers on the main thread only, and a signal
//! taken by another thread does not interrupt the main thread's sleep (in
//! asyncio's `epoll_wait`, in `time.sleep`). So no thread of ours takes one:
//! it goes to a Python thread, the main one if no other is running.
//! (`ticklease._scheduler._signals_wake` covers the rest under asyncio.)

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

use nix::sys::signal::{pthread_sigmask, SigSet, SigmaskHow, Signal};
use pyo3_async_runtimes::generic::{ContextExt, JoinError, Runtime};
use pyo3_async_runtimes::TaskLocals;
use tokio::runtime::Runtime as Tokio;

/// The runtime of the process that created it (by pid).
static RUNTIME: Mutex<Option<(u32, Arc<Tokio>)>> = Mutex::new(None);

/// This process's runtime, built on first use in each process.
pub(crate) fn runtime() -> Arc<Tokio> {
    let pid = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((owner, rt)) = &*slot {
        if *owner == pid {
            return rt.clone();
        }
    }
    if let Some((_, inherited)) = slot.take() {
        // A parent's runtime: its worker threads were not forked with us.
        std::mem::forget(inherited);
    }
    // The workers start inside `build`, from this thread: they inherit the
    // mask set around it. Threads started later (the blocking pool's) block
    // the signals first thing, from `on_thread_start`.
    let rt = Arc::new(with_signals_blocked(|| {
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("ticklease")
            .on_thread_start(block_signals)
            .enable_all()
            .build()
            .expect("the ticklease runtime starts (threads and an epoll instance)")
    }));
    *slot = Some((pid, rt.clone()));
    rt
}

/// The signals a thread of ours never takes: all but the synchronous ones
/// (a fault is delivered to the thread that caused it, blocked or not).
fn asynchronous_signals() -> SigSet {
    let mut set = SigSet::all();
    for fault in [
        Signal::SIGSEGV,
        Signal::SIGBUS,
        Signal::SIGFPE,
        Signal::SIGILL,
        Signal::SIGTRAP,
        Signal::SIGSYS,
    ] {
        set.remove(fault);
    }
    set
}

pub(crate) fn block_signals() {
    // pthread_sigmask fails only on a bad `how`: nothing to handle.
    let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&asynchronous_signals()), None);
}

/// Runs `f` with this thread's asynchronous signals blocked, then restores its mask.
fn with_signals_blocked<T>(f: impl FnOnce() -> T) -> T {
    let mut previous = SigSet::empty();
    let _ = pthread_sigmask(
        SigmaskHow::SIG_BLOCK,
        Some(&asynchronous_signals()),
        Some(&mut previous),
    );
    let out = f();
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
    out
}

/// The gate through which the core's own threads enter Python. At the
/// interpreter's exit (`atexit` runs [`shutdown`]) it closes: it waits for
/// the threads inside to leave, and from then on lets none in. A thread that
/// takes the GIL while the interpreter finalizes is ended by Python under our
/// frames (an abort or a segmentation fault at exit): none may.
static GATE: Mutex<Gate> = Mutex::new(Gate {
    closed: false,
    inside: 0,
});
static GATE_LEFT: Condvar = Condvar::new();

struct Gate {
    closed: bool,
    inside: usize,
}

/// A thread's pass through the gate: it may take the GIL until dropped.
pub(crate) struct Pass(());

impl Drop for Pass {
    fn drop(&mut self) {
        let mut gate = GATE.lock().unwrap_or_else(PoisonError::into_inner);
        gate.inside -= 1;
        GATE_LEFT.notify_all();
    }
}

/// A pass, or `None` once the interpreter is finishing (then the caller must not touch Python).
pub(crate) fn enter() -> Option<Pass> {
    let mut gate = GATE.lock().unwrap_or_else(PoisonError::into_inner);
    if gate.closed {
        return None;
    }
    gate.inside += 1;
    Some(Pass(()))
}

/// Runs `f` with the GIL through the gate; `None` once the interpreter is finishing.
pub(crate) fn with_python<T>(f: impl for<'py> FnOnce(pyo3::Python<'py>) -> T) -> Option<T> {
    let _pass = enter()?;
    Some(pyo3::Python::attach(f))
}

/// At the interpreter's exit, the GIL released: closes the gate, waiting up
/// to `bound` for the threads inside. The runtime runs on (Rust alone: every
/// way into Python goes through the gate) until the process ends; it is not
/// shut down, since a thread that asked for it afterwards would build another.
pub(crate) fn shutdown(bound: std::time::Duration) {
    let mut gate = GATE.lock().unwrap_or_else(PoisonError::into_inner);
    gate.closed = true;
    let deadline = std::time::Instant::now() + bound;
    while gate.inside > 0 {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        gate = GATE_LEFT
            .wait_timeout(gate, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}

/// Runs `fut` to its end on this process's runtime, from a thread that is
/// not one of the runtime's workers (a Python thread, with the GIL released).
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    runtime().block_on(fut)
}

/// The process's runtime for `pyo3-async-runtimes`.
pub(crate) struct Rt;

/// A spawned task's failure, for `pyo3-async-runtimes`.
pub(crate) struct Failed(tokio::task::JoinError);

impl JoinError for Failed {
    fn is_panic(&self) -> bool {
        self.0.is_panic()
    }
    fn into_panic(self) -> Box<dyn std::any::Any + Send + 'static> {
        self.0.into_panic()
    }
}

/// A spawned task, for `pyo3-async-runtimes`.
pub(crate) struct Joined(tokio::task::JoinHandle<()>);

impl Future for Joined {
    type Output = Result<(), Failed>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map_err(Failed)
    }
}

tokio::task_local! {
    static LOCALS: OnceLock<TaskLocals>;
}

impl Runtime for Rt {
    type JoinError = Failed;
    type JoinHandle = Joined;

    fn spawn<F>(fut: F) -> Joined
    where
        F: Future<Output = ()> + Send + 'static,
    {
        Joined(runtime().spawn(fut))
    }

    /// `pyo3-async-runtimes` completes a Python future here, with the GIL:
    /// through the gate, like every other way into Python (once it is
    /// closed, the future is left as it is: the interpreter is exiting).
    fn spawn_blocking<F>(f: F) -> Joined
    where
        F: FnOnce() + Send + 'static,
    {
        Joined(runtime().spawn_blocking(move || {
            if let Some(_pass) = enter() {
                f();
            }
        }))
    }
}

impl ContextExt for Rt {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        let cell = OnceLock::new();
        let _ = cell.set(locals);
        Box::pin(LOCALS.scope(cell, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        LOCALS.try_with(|c| c.get().cloned()).unwrap_or_default()
    }
}
