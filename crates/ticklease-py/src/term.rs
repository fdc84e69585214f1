//! A term as Python work sees it: the crate's [`Tick`], its fence and its
//! cancellation, awaitable from asyncio and waitable from a thread.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use ticklease::{Cancel, Tick};

use crate::runtime::{block_on, Rt};

/// The term a job's work runs in (`ticklease.Term` wraps it).
#[pyclass(frozen, module = "ticklease._native", name = "Term")]
pub(crate) struct PyTerm {
    pub(crate) tick: Tick,
}

/// Seconds since the Unix epoch (Python makes the `datetime`).
pub(crate) fn epoch_seconds(at: SystemTime) -> f64 {
    match at.duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    }
}

/// A cancellation's cause as Python sees it: `lost:<reason>`, `shutdown`, `removed`.
pub(crate) fn cause_name(cause: Cancel) -> String {
    match cause {
        Cancel::LeaseLost(reason) => format!("lost:{reason}"),
        Cancel::Shutdown => "shutdown".into(),
        Cancel::Removed => "removed".into(),
        _ => "cancelled".into(),
    }
}

#[pymethods]
impl PyTerm {
    #[getter]
    fn role(&self) -> String {
        self.tick.role().to_string()
    }

    #[getter]
    fn token(&self) -> i64 {
        self.tick.token().0
    }

    /// The occurrence, in seconds since the epoch; `None` on an interval or a manual run.
    #[getter]
    fn occurrence(&self) -> Option<f64> {
        self.tick.occurrence().map(epoch_seconds)
    }

    /// `(host, port, hostaddr)` of the server the term started on.
    #[getter]
    fn server(&self) -> Option<(String, u16, Option<String>)> {
        self.tick
            .server()
            .map(|s| (s.host.clone(), s.port, s.hostaddr.map(|a| a.to_string())))
    }

    /// The crate's fence predicate, its parameters numbered from `first_param`.
    fn predicate(&self, first_param: usize) -> String {
        self.tick.fence().predicate(first_param)
    }

    fn is_cancelled(&self) -> bool {
        self.tick.is_cancelled()
    }

    fn cause(&self) -> Option<String> {
        self.tick.cause().map(cause_name)
    }

    fn keep_output(&self, output: String) {
        self.tick.keep_output(output);
    }

    /// Resolves with the cause when the term is cancelled.
    fn cancelled<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let tick = self.tick.clone();
        pyo3_async_runtimes::generic::future_into_py::<Rt, _, _>(py, async move {
            Ok(cause_name(tick.cancelled().await))
        })
    }

    /// Blocks (without the GIL) until the term is cancelled or `timeout`
    /// seconds passed; `True` when it was cancelled.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let bound = match timeout {
            None => None,
            Some(t) if t.is_finite() && t >= 0.0 => Some(Duration::from_secs_f64(t.min(1e9))),
            Some(t) => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "timeout must be a finite number of seconds >= 0, not {t}"
                )))
            }
        };
        let tick = self.tick.clone();
        Ok(py.detach(move || {
            block_on(async move {
                match bound {
                    None => {
                        tick.cancelled().await;
                        true
                    }
                    Some(b) => tokio::time::timeout(b, tick.cancelled()).await.is_ok(),
                }
            })
        }))
    }
}
