//! The tokio runtime the core runs on: one per process. A forked child
//! (gunicorn, Celery, `multiprocessing`) inherits the parent's runtime
//! without its threads, so it gets a runtime of its own on first use; the
//! inherited one is never dropped (dropping would wait for threads that do
//! not exist in the child).
//!
//! [`Rt`] is that runtime as `pyo3-async-runtimes` sees it, so its bridges
//! (a Rust future as a Python awaitable, cancelled from Python) spawn here.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};

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
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .thread_name("ticklease")
            .enable_all()
            .build()
            .expect("the ticklease runtime starts (threads and an epoll instance)"),
    );
    *slot = Some((pid, rt.clone()));
    rt
}

/// Whether the interpreter is finishing (`atexit` ran [`shutdown`]): from
/// then on nothing of ours calls into Python (a thread that takes the GIL
/// while the interpreter finalizes is ended under our frames).
static FINISHING: AtomicBool = AtomicBool::new(false);

pub(crate) fn finishing() -> bool {
    FINISHING.load(Ordering::Acquire)
}

/// At the interpreter's exit: no more calls into Python, and this process's
/// runtime shut down (its tasks dropped, its blocking threads given up to
/// `bound`), so none of its threads outlives the interpreter.
pub(crate) fn shutdown(bound: std::time::Duration) {
    FINISHING.store(true, Ordering::Release);
    let taken = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some((pid, rt)) = taken {
        match Arc::try_unwrap(rt) {
            Ok(rt) if pid == std::process::id() => rt.shutdown_timeout(bound),
            // Another thread is inside `block_on`, or the runtime is a parent's: leave it be.
            Ok(rt) => std::mem::forget(rt),
            Err(rt) => std::mem::forget(rt),
        }
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

    fn spawn_blocking<F>(f: F) -> Joined
    where
        F: FnOnce() + Send + 'static,
    {
        Joined(runtime().spawn_blocking(f))
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
