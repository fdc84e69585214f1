//! The crate's configuration types as Python constructs them: durations in
//! seconds (the Python layer turns a `timedelta` into seconds first), every
//! check the crate's own, a refusal a `ValueError` that names the knob.

use std::time::Duration;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use ticklease::{CatchUp, Retry};

/// Seconds as a duration; `knob` names the argument in the error.
pub(crate) fn seconds(knob: &str, value: f64) -> PyResult<Duration> {
    if !value.is_finite() || value < 0.0 {
        return Err(PyValueError::new_err(format!(
            "{knob} must be a finite number of seconds >= 0, not {value}"
        )));
    }
    Duration::try_from_secs_f64(value).map_err(|e| PyValueError::new_err(format!("{knob} = {value} s: {e}")))
}

pub(crate) fn value_error(e: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(e.to_string())
}

/// `ticklease.Config`: T, H, S, A, P of the crate's [`ticklease::Config`].
#[pyclass(frozen, module = "ticklease._native", name = "Config")]
#[derive(Clone)]
pub(crate) struct PyConfig {
    pub(crate) inner: ticklease::Config,
}

#[pymethods]
impl PyConfig {
    #[new]
    #[pyo3(signature = (lease_ttl=None, heartbeat_every=None, statement_timeout=None, abandon_after=None, max_poll=None))]
    fn new(
        lease_ttl: Option<f64>,
        heartbeat_every: Option<f64>,
        statement_timeout: Option<f64>,
        abandon_after: Option<f64>,
        max_poll: Option<f64>,
    ) -> PyResult<Self> {
        let mut b = ticklease::Config::builder();
        if let Some(v) = lease_ttl {
            b = b.lease_ttl(seconds("lease_ttl", v)?);
        }
        if let Some(v) = heartbeat_every {
            b = b.heartbeat_every(seconds("heartbeat_every", v)?);
        }
        if let Some(v) = statement_timeout {
            b = b.statement_timeout(seconds("statement_timeout", v)?);
        }
        if let Some(v) = abandon_after {
            b = b.abandon_after(seconds("abandon_after", v)?);
        }
        if let Some(v) = max_poll {
            b = b.max_poll(seconds("max_poll", v)?);
        }
        Ok(PyConfig {
            inner: b.build().map_err(value_error)?,
        })
    }

    /// Every default divided by `factor`, for tests.
    #[staticmethod]
    fn scaled_down(factor: u32) -> PyResult<Self> {
        let inner = ticklease::Config::builder()
            .scaled_down(factor)
            .build()
            .map_err(value_error)?;
        Ok(PyConfig { inner })
    }

    #[getter]
    fn lease_ttl(&self) -> f64 {
        self.inner.lease_ttl().as_secs_f64()
    }
    #[getter]
    fn heartbeat_every(&self) -> f64 {
        self.inner.heartbeat_every().as_secs_f64()
    }
    #[getter]
    fn statement_timeout(&self) -> f64 {
        self.inner.statement_timeout().as_secs_f64()
    }
    #[getter]
    fn abandon_after(&self) -> f64 {
        self.inner.abandon_after().as_secs_f64()
    }
    #[getter]
    fn max_poll(&self) -> f64 {
        self.inner.max_poll().as_secs_f64()
    }
}

/// `ticklease.Schedule`: the crate's [`ticklease::Schedule`].
#[pyclass(frozen, module = "ticklease._native", name = "Schedule")]
#[derive(Clone)]
pub(crate) struct PySchedule {
    pub(crate) inner: ticklease::Schedule,
}

/// `catch_up` as Python names it: `"latest"`, `"all"` (with `catch_up_max`) or `"skip"`.
fn catch_up(policy: &str, max: u32) -> PyResult<CatchUp> {
    match policy {
        "latest" => Ok(CatchUp::Latest),
        "all" => Ok(CatchUp::All { max }),
        "skip" => Ok(CatchUp::Skip),
        other => Err(PyValueError::new_err(format!(
            "catch_up must be \"latest\", \"all\" or \"skip\", not {other:?}"
        ))),
    }
}

#[pymethods]
impl PySchedule {
    #[staticmethod]
    fn every(interval: f64) -> PyResult<Self> {
        Ok(PySchedule {
            inner: ticklease::Schedule::every(seconds("interval", interval)?),
        })
    }

    #[staticmethod]
    fn long_lived(restart: f64) -> PyResult<Self> {
        Ok(PySchedule {
            inner: ticklease::Schedule::long_lived(seconds("restart", restart)?),
        })
    }

    #[staticmethod]
    #[pyo3(signature = (expression, zone=None, catch_up_policy=None, catch_up_max=10, starting_deadline=None))]
    fn cron(
        expression: &str,
        zone: Option<&str>,
        catch_up_policy: Option<&str>,
        catch_up_max: u32,
        starting_deadline: Option<f64>,
    ) -> PyResult<Self> {
        let mut s = ticklease::Schedule::cron_tz(expression).map_err(value_error)?;
        if let Some(zone) = zone {
            s = s.zone(zone).map_err(value_error)?;
        }
        if let Some(policy) = catch_up_policy {
            s = s.catch_up(catch_up(policy, catch_up_max)?).map_err(value_error)?;
        }
        if let Some(deadline) = starting_deadline {
            s = s
                .starting_deadline(seconds("starting_deadline", deadline)?)
                .map_err(value_error)?;
        }
        Ok(PySchedule { inner: s })
    }

    /// This schedule with retries of a failed tick.
    fn retry(&self, attempts: u32, backoff: f64, backoff_max: f64) -> PyResult<Self> {
        let retry = Retry {
            attempts,
            backoff: seconds("backoff", backoff)?,
            backoff_max: seconds("backoff_max", backoff_max)?,
        };
        Ok(PySchedule {
            inner: self.inner.clone().retry(retry).map_err(value_error)?,
        })
    }

    /// The next occurrence after `after` (seconds since the epoch), for a cron schedule.
    fn next_after(&self, after: f64) -> PyResult<Option<f64>> {
        let at = std::time::UNIX_EPOCH + seconds("after", after)?;
        Ok(self.inner.next_after(at).map(crate::term::epoch_seconds))
    }

    fn __repr__(&self) -> String {
        format!("Schedule({})", self.inner)
    }
}

/// `ticklease.Family`: the crate's [`ticklease::Family`], its keys changed at run time.
#[pyclass(frozen, module = "ticklease._native", name = "Family")]
pub(crate) struct PyFamily {
    pub(crate) inner: ticklease::Family,
}

#[pymethods]
impl PyFamily {
    #[new]
    #[pyo3(signature = (name, keys=Vec::new(), max_terms=None))]
    fn new(name: &str, keys: Vec<String>, max_terms: Option<usize>) -> PyResult<Self> {
        let inner = ticklease::Family::new(name).map_err(value_error)?;
        inner.set(&keys).map_err(value_error)?;
        if let Some(max) = max_terms {
            inner.set_max_terms(max).map_err(value_error)?;
        }
        Ok(PyFamily { inner })
    }
    #[getter]
    fn name(&self) -> String {
        self.inner.name().to_owned()
    }
    /// Adds `key`; returns its role's name.
    fn add(&self, key: &str) -> PyResult<String> {
        Ok(self.inner.add(key).map_err(value_error)?.to_string())
    }
    fn remove(&self, key: &str) -> bool {
        self.inner.remove(key)
    }
    fn set(&self, keys: Vec<String>) -> PyResult<()> {
        self.inner.set(&keys).map_err(value_error)
    }
    fn keys(&self) -> Vec<String> {
        self.inner.key_list()
    }
    fn __len__(&self) -> usize {
        self.inner.len()
    }
}
