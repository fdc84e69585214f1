//! `ticklease.Scheduler`'s engine: the crate's [`Scheduler`] over a
//! [`PgStore`], its jobs' work in Python. It decides nothing about leases:
//! it collects the jobs, builds the crate's scheduler when the run starts,
//! and waits for it, from asyncio or from a thread.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::prelude::*;
use ticklease::prometheus_client::registry::Registry;
use ticklease::{
    CancellationToken, Family, Manager, Metrics, PgConnect, PgStore, PgStoreOptions, Role, Schedule,
    Scheduler, Stopped,
};

use crate::config::{seconds, value_error, PyConfig, PyFamily, PySchedule};
use crate::errors::{store_error, TickleaseError};
use crate::runtime::{block_on, runtime, Rt};
use crate::work::PyWork;

struct Job {
    role: Role,
    schedule: Schedule,
    work: Arc<PyWork>,
}

struct FamilyJob {
    family: Family,
    schedule: Schedule,
    work: Arc<PyWork>,
}

/// What a run needs, taken by the run that starts.
struct Plan {
    url: PgConnect,
    direct_url: Option<PgConnect>,
    /// With the direct URL: holder keys (a dead replica's terms end with its session) or wake-ups only.
    holder_keys: bool,
    /// Patroni's REST APIs: terms run only while it confirms the server as the primary.
    patroni: Option<ticklease::patroni::Patroni>,
    config: ticklease::Config,
    pool_size: usize,
    shutdown_timeout: Option<Duration>,
    jobs: Vec<Job>,
    families: Vec<FamilyJob>,
}

/// A running scheduler's metrics, for `metrics_text`.
struct Running {
    registry: Arc<Registry>,
    metrics: Metrics,
    store: PgStore,
}

#[pyclass(frozen, module = "ticklease._native", name = "Runner")]
pub(crate) struct PyRunner {
    plan: Mutex<Option<Plan>>,
    stop: CancellationToken,
    event_loop: Arc<Mutex<Option<Py<PyAny>>>>,
    running: Arc<Mutex<Option<Running>>>,
}

fn parse_url(knob: &str, url: &str) -> PyResult<PgConnect> {
    url.parse::<PgConnect>()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("{knob}: {e}")))
}

impl PyRunner {
    fn with_plan<T>(&self, f: impl FnOnce(&mut Plan) -> PyResult<T>) -> PyResult<T> {
        let mut plan = self.plan.lock().unwrap_or_else(PoisonError::into_inner);
        match plan.as_mut() {
            Some(plan) => f(plan),
            None => Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this scheduler has run: a scheduler runs once (make a new one)",
            )),
        }
    }

    fn take_plan(&self) -> PyResult<Plan> {
        self.with_plan(|_| Ok(()))?;
        Ok(self
            .plan
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
            .expect("checked"))
    }

    fn work(&self, work: Py<PyAny>, is_async: bool) -> Arc<PyWork> {
        Arc::new(PyWork {
            func: work,
            is_async,
            event_loop: self.event_loop.clone(),
        })
    }
}

#[pymethods]
impl PyRunner {
    #[new]
    #[pyo3(signature = (url, config, direct_url=None, holder_keys=true, pool_size=8, shutdown_timeout=None, patroni=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        url: &str,
        config: &PyConfig,
        direct_url: Option<&str>,
        holder_keys: bool,
        pool_size: usize,
        shutdown_timeout: Option<f64>,
        patroni: Option<Vec<String>>,
    ) -> PyResult<Self> {
        if !(1..=ticklease::POOL_SIZE_MAX).contains(&pool_size) {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "pool_size must be within 1..={}, not {pool_size}",
                ticklease::POOL_SIZE_MAX
            )));
        }
        let plan = Plan {
            url: parse_url("url", url)?,
            direct_url: direct_url.map(|d| parse_url("direct_url", d)).transpose()?,
            holder_keys,
            patroni: patroni
                .map(|urls| ticklease::patroni::Patroni::new(urls, config.inner.statement_timeout()))
                .transpose()
                .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("patroni: {e}")))?,
            config: config.inner,
            pool_size,
            shutdown_timeout: shutdown_timeout
                .map(|t| seconds("shutdown_timeout", t))
                .transpose()?,
            jobs: Vec::new(),
            families: Vec::new(),
        };
        Ok(PyRunner {
            plan: Mutex::new(Some(plan)),
            stop: CancellationToken::new(),
            event_loop: Arc::default(),
            running: Arc::default(),
        })
    }

    /// Adds the job of `role`; its schedule is checked against the config here.
    fn job(&self, role: &str, schedule: &PySchedule, work: Py<PyAny>, is_async: bool) -> PyResult<()> {
        let role = Role::new(role).map_err(value_error)?;
        let work = self.work(work, is_async);
        self.with_plan(|plan| {
            schedule.inner.check(&plan.config).map_err(value_error)?;
            if plan.jobs.iter().any(|j| j.role == role) {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "role {role} has a job already"
                )));
            }
            plan.jobs.push(Job {
                role,
                schedule: schedule.inner.clone(),
                work,
            });
            Ok(())
        })
    }

    /// Adds the job of every key of `family`.
    fn family(
        &self,
        family: &PyFamily,
        schedule: &PySchedule,
        work: Py<PyAny>,
        is_async: bool,
    ) -> PyResult<()> {
        schedule.inner.check_family().map_err(value_error)?;
        let work = self.work(work, is_async);
        self.with_plan(|plan| {
            plan.families.push(FamilyJob {
                family: family.inner.clone(),
                schedule: schedule.inner.clone(),
                work,
            });
            Ok(())
        })
    }

    /// Stops the run: every term is released as interrupted. Safe from any
    /// thread and from a signal handler.
    fn stop(&self) {
        self.stop.cancel();
    }

    /// Runs on asyncio: `async def` work on `event_loop`, the one awaiting.
    fn run_async<'py>(&self, py: Python<'py>, event_loop: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let plan = self.take_plan()?;
        *self.event_loop.lock().unwrap_or_else(PoisonError::into_inner) = Some(event_loop);
        let (stop, running) = (self.stop.clone(), self.running.clone());
        pyo3_async_runtimes::generic::future_into_py::<Rt, _, _>(py, async move {
            run(plan, stop, running).await.map(stopped_tuple)
        })
    }

    /// Runs in this thread until stopped, the GIL released; Python's signal
    /// handlers run every 50 ms meanwhile (a handler calls `stop`). `async
    /// def` work runs on `event_loop` (a loop another thread runs).
    #[pyo3(signature = (event_loop=None))]
    fn run_blocking(
        &self,
        py: Python<'_>,
        event_loop: Option<Py<PyAny>>,
    ) -> PyResult<(bool, bool, usize, String)> {
        let plan = self.take_plan()?;
        *self.event_loop.lock().unwrap_or_else(PoisonError::into_inner) = event_loop;
        let (stop, running) = (self.stop.clone(), self.running.clone());
        let mut handle = runtime().spawn(run(plan, stop, running));
        loop {
            let joined = py.detach(|| {
                block_on(async {
                    tokio::select! {
                        joined = &mut handle => Some(joined),
                        _ = tokio::time::sleep(Duration::from_millis(50)) => None,
                    }
                })
            });
            match joined {
                Some(Ok(result)) => return result.map(stopped_tuple),
                Some(Err(e)) => return Err(TickleaseError::new_err(format!("the scheduler failed: {e}"))),
                None => {
                    if let Err(e) = py.check_signals() {
                        // KeyboardInterrupt or a handler's exception: stop, release, then raise it.
                        self.stop.cancel();
                        let _ = py.detach(|| block_on(&mut handle));
                        return Err(e);
                    }
                }
            }
        }
    }

    /// The metrics in Prometheus' text format, refreshed from the database
    /// (empty before the run has started).
    fn metrics_text(&self, py: Python<'_>) -> PyResult<String> {
        let running = self.running.clone();
        py.detach(move || {
            let guard = running.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(r) = guard.as_ref() else {
                return Ok(String::new());
            };
            let (registry, metrics, store) = (r.registry.clone(), r.metrics.clone(), r.store.clone());
            drop(guard);
            block_on(metrics.refresh(&store));
            let mut text = String::new();
            ticklease::prometheus_client::encoding::text::encode(&mut text, &registry)
                .map_err(|e| TickleaseError::new_err(format!("encoding the metrics: {e}")))?;
            Ok(text)
        })
    }
}

fn stopped_tuple(s: Stopped) -> (bool, bool, usize, String) {
    (s.loops_finished, s.releases_done, s.unreleased, s.to_string())
}

async fn run(plan: Plan, stop: CancellationToken, running: Arc<Mutex<Option<Running>>>) -> PyResult<Stopped> {
    let config = plan.config;
    let options = PgStoreOptions {
        pool_size: plan.pool_size,
        statement_timeout: config.statement_timeout(),
    };
    let mut store = PgStore::connect(plan.url, options).await.map_err(store_error)?;
    store = match plan.direct_url {
        Some(direct) if plan.holder_keys => store.with_direct(direct).await.map_err(store_error)?,
        Some(direct) => store.with_direct_wakeups(direct).await.map_err(store_error)?,
        None => store,
    };
    if let Some(patroni) = plan.patroni {
        store = store.with_patroni(patroni, &config).await.map_err(store_error)?;
    }
    let roles: Vec<Role> = plan.jobs.iter().map(|j| j.role.clone()).collect();
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry, roles.clone());
    *running.lock().unwrap_or_else(PoisonError::into_inner) = Some(Running {
        registry: Arc::new(registry),
        metrics: metrics.clone(),
        store: store.clone(),
    });
    let manager = Manager::start_with_metrics(store, config, roles, metrics)
        .await
        .map_err(|e| TickleaseError::new_err(ticklease::error::chain(&e)))?;
    let mut scheduler = Scheduler::new(manager);
    if let Some(bound) = plan.shutdown_timeout {
        scheduler = scheduler.shutdown_timeout(bound);
    }
    for job in plan.jobs {
        let work = job.work;
        scheduler = scheduler
            .job(&job.role, job.schedule, move |tick| work.clone().call(tick))
            .map_err(value_error)?;
    }
    for job in plan.families {
        let work = job.work;
        scheduler = scheduler
            .family(&job.family, job.schedule, move |tick| work.clone().call(tick))
            .map_err(value_error)?;
    }
    let stopped = scheduler.run(stop).await;
    // A stopped scheduler keeps no connection.
    running.lock().unwrap_or_else(PoisonError::into_inner).take();
    Ok(stopped)
}
