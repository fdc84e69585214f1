//! A job's Python work as the crate's work: one call per term, its outcome
//! mapped back as the crate maps a Rust closure's (returned → completed,
//! `ticklease.Failed` → failed, any other exception → panicked).
//!
//! An `async def` runs as a task of the scheduler's asyncio loop; when the
//! crate drops the work (the term was lost), the task is cancelled. A plain
//! function runs on a daemon thread of Python's (the interpreter's exit
//! neither waits for it nor crashes on it); Python cannot stop a thread, so
//! it polls or waits on its term. Either way the work reports its outcome
//! once, through [`Done`]. No runtime worker ever waits for the GIL: the
//! calls that start a work run on the blocking pool.

use std::sync::{Arc, Mutex, PoisonError};

use pyo3::prelude::*;
use ticklease::Tick;
use tokio::sync::oneshot;

use crate::term::PyTerm;

/// Python's account of how the work ended: `completed`, `failed` or `panicked`, with a message.
type Outcome = (String, Option<String>);

/// Work that raised `ticklease.Failed`: the tick is released as failed.
#[derive(Debug)]
pub(crate) struct WorkFailed(String);

impl std::fmt::Display for WorkFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WorkFailed {}

/// One job's Python callable.
pub(crate) struct PyWork {
    pub(crate) func: Py<PyAny>,
    pub(crate) is_async: bool,
    /// The asyncio loop `async def` work runs on (set when the run starts).
    pub(crate) event_loop: Arc<Mutex<Option<Py<PyAny>>>>,
}

impl PyWork {
    /// Runs the work of one term; a panic (re-raised without the panic hook)
    /// when Python's work raised anything but `ticklease.Failed`.
    pub(crate) async fn call(self: Arc<Self>, tick: Tick) -> Result<(), WorkFailed> {
        let (kind, message) = if self.is_async {
            self.call_async(tick).await
        } else {
            self.call_sync(tick).await
        };
        match kind.as_str() {
            "completed" => Ok(()),
            "failed" => Err(WorkFailed(message.unwrap_or_else(|| "failed".into()))),
            _ => std::panic::resume_unwind(Box::new(message.unwrap_or_else(|| "the work raised".into()))),
        }
    }

    /// A plain function on a Python daemon thread (`ticklease._work.start_sync`):
    /// nothing can stop it, so dropping this future only stops waiting for it.
    async fn call_sync(self: Arc<Self>, tick: Tick) -> Outcome {
        let (sender, receiver) = oneshot::channel();
        let started = tokio::task::spawn_blocking(move || {
            crate::runtime::with_python(|py| -> PyResult<()> {
                let term = Py::new(py, PyTerm { tick })?;
                let done = Py::new(py, Done(Mutex::new(Some(sender))))?;
                py.import("ticklease._work")?
                    .call_method1("start_sync", (self.func.clone_ref(py), term, done))?;
                Ok(())
            })
        })
        .await;
        match started {
            Ok(Some(Ok(()))) => {}
            Ok(Some(Err(e))) => return panicked(format!("could not start the work: {e}")),
            Ok(None) => return panicked(FINISHING.into()),
            Err(e) => return panicked(format!("the work's thread failed: {e}")),
        }
        receiver
            .await
            .unwrap_or_else(|_| panicked("the work's thread ended without an outcome".into()))
    }

    async fn call_async(self: Arc<Self>, tick: Tick) -> Outcome {
        let (sender, receiver) = oneshot::channel();
        let event_loop = self.event_loop.clone();
        let started = tokio::task::spawn_blocking(move || {
            crate::runtime::with_python(|py| -> PyResult<Py<PyAny>> {
                let event_loop = event_loop
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map(|l| l.clone_ref(py))
                    .ok_or_else(|| pyo3::exceptions::PyRuntimeError::new_err("no event loop"))?;
                let term = Py::new(py, PyTerm { tick })?;
                let done = Py::new(py, Done(Mutex::new(Some(sender))))?;
                Ok(py
                    .import("ticklease._work")?
                    .call_method1("start_async", (event_loop, self.func.clone_ref(py), term, done))?
                    .unbind())
            })
        })
        .await;
        let task = match started {
            Ok(Some(Ok(task))) => task,
            Ok(Some(Err(e))) => return panicked(format!("could not start the work: {e}")),
            Ok(None) => return panicked(FINISHING.into()),
            Err(e) => return panicked(format!("the work's thread failed: {e}")),
        };
        // Dropped with this future when the crate drops the work: the task is cancelled.
        let _cancel = CancelOnDrop(Some(task));
        receiver
            .await
            .unwrap_or_else(|_| panicked("the work's task ended without an outcome".into()))
    }
}

/// Why no work starts once the interpreter is finishing.
const FINISHING: &str = "the interpreter is exiting";

fn panicked(message: String) -> Outcome {
    ("panicked".into(), Some(message))
}

/// The asyncio side's completion: called once, on the loop's thread, with the outcome.
#[pyclass(frozen, module = "ticklease._native")]
struct Done(Mutex<Option<oneshot::Sender<Outcome>>>);

#[pymethods]
impl Done {
    #[pyo3(signature = (kind, message=None))]
    fn __call__(&self, kind: String, message: Option<String>) {
        if let Some(sender) = self.0.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = sender.send((kind, message));
        }
    }
}

/// Cancels the asyncio task (a `concurrent.futures.Future`) when dropped.
struct CancelOnDrop(Option<Py<PyAny>>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(task) = self.0.take() else { return };
        let cancel = move || {
            crate::runtime::with_python(|py| {
                let _ = task.call_method0(py, "cancel");
            })
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => drop(handle.spawn_blocking(cancel)),
            Err(_) => {
                cancel();
            }
        }
    }
}
