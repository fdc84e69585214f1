//! The operator's calls, for scripts: each connects with the login the URL
//! names, runs one of the crate's statements, and returns (the GIL released
//! meanwhile).

use pyo3::prelude::*;
use pyo3::types::PyDict;
use ticklease::{
    HistoryEntry, HistoryKind, HistoryStore, LeaseStatus, LeaseStore, MigrateOptions, PgConnect, PgStore,
    PgStoreOptions, Role,
};

use crate::config::{seconds, value_error};
use crate::errors::{store_error, TickleaseError};
use crate::runtime::block_on;
use crate::term::epoch_seconds;

/// The most rows `status` returns (any app login may create rows).
const STATUS_ROWS_MAX: usize = 10_000;

fn connect(url: &str, statement_timeout: f64) -> PyResult<PgStore> {
    let pg: PgConnect = url
        .parse()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("url: {e}")))?;
    let options = PgStoreOptions {
        pool_size: 1,
        statement_timeout: seconds("statement_timeout", statement_timeout)?,
    };
    block_on(PgStore::connect(pg, options)).map_err(store_error)
}

fn role(name: &str) -> PyResult<Role> {
    Role::new(name).map_err(value_error)
}

/// `leader_status`, by role: at most `limit` rows (paused, then held, first) and how many there are.
#[pyfunction]
#[pyo3(signature = (url, limit=1000, statement_timeout=2.0))]
pub(crate) fn status(
    py: Python<'_>,
    url: &str,
    limit: usize,
    statement_timeout: f64,
) -> PyResult<(Vec<Py<PyDict>>, u64)> {
    if !(1..=STATUS_ROWS_MAX).contains(&limit) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "limit must be within 1..={STATUS_ROWS_MAX}, not {limit}"
        )));
    }
    let (rows, total) = py.detach(|| {
        let store = connect(url, statement_timeout)?;
        block_on(store.status_bounded(limit)).map_err(store_error)
    })?;
    let rows = rows.iter().map(|r| status_row(py, r)).collect::<PyResult<_>>()?;
    Ok((rows, total))
}

fn status_row(py: Python<'_>, r: &LeaseStatus) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    let t = |v: Option<std::time::SystemTime>| v.map(epoch_seconds);
    d.set_item("role", &r.role)?;
    d.set_item("held", r.held)?;
    d.set_item("holder_id", &r.holder_id)?;
    d.set_item("token", r.token.0)?;
    d.set_item("acquired_at", t(r.acquired_at))?;
    d.set_item("expires_at", t(r.expires_at))?;
    d.set_item("db_now", epoch_seconds(r.db_now))?;
    d.set_item("paused_at", t(r.paused_at))?;
    d.set_item("paused_by", &r.paused_by)?;
    d.set_item("pause_reason", &r.pause_reason)?;
    d.set_item("last_tick_ended_at", t(r.last_tick_ended_at))?;
    d.set_item("last_tick_holder", &r.last_tick_holder)?;
    d.set_item("not_before", t(r.not_before))?;
    d.set_item("last_outcome", &r.last_outcome)?;
    d.set_item("schedule", &r.schedule)?;
    d.set_item("next_occurrence", t(r.next_occurrence))?;
    d.set_item("long_lived", r.long_lived)?;
    d.set_item("tick_interval", r.tick_interval.map(|i| i.as_secs_f64()))?;
    Ok(d.unbind())
}

/// The history of `role` (every role when `None`) over the last `since`
/// seconds, newest first, at most `limit` entries; text as stored (the
/// Python layer says how to show it).
#[pyfunction]
#[pyo3(signature = (url, role_name=None, since=86_400.0, limit=100, statement_timeout=2.0))]
pub(crate) fn history(
    py: Python<'_>,
    url: &str,
    role_name: Option<&str>,
    since: f64,
    limit: usize,
    statement_timeout: f64,
) -> PyResult<Vec<Py<PyDict>>> {
    if !(1..=ticklease::HISTORY_LIMIT_MAX).contains(&limit) {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "limit must be within 1..={}, not {limit}",
            ticklease::HISTORY_LIMIT_MAX
        )));
    }
    let role = role_name.map(role).transpose()?;
    let since = seconds("since", since)?;
    let entries = py.detach(|| {
        let store = connect(url, statement_timeout)?;
        block_on(store.history(role.as_ref(), since, limit)).map_err(store_error)
    })?;
    entries.iter().map(|e| history_entry(py, e)).collect()
}

fn history_entry(py: Python<'_>, e: &HistoryEntry) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    d.set_item("role", &e.role)?;
    d.set_item("at", epoch_seconds(e.at))?;
    match &e.kind {
        HistoryKind::Term {
            token,
            holder,
            acquired_at,
            outcome,
            reason,
            error,
            output,
            manual_by,
        } => {
            d.set_item("kind", "term")?;
            d.set_item("token", token)?;
            d.set_item("holder", holder)?;
            d.set_item("acquired_at", acquired_at.map(epoch_seconds))?;
            d.set_item("outcome", outcome)?;
            d.set_item("reason", reason)?;
            d.set_item("error", error)?;
            d.set_item("output", output)?;
            d.set_item("manual_by", manual_by)?;
        }
        HistoryKind::Pause { by, reason } => {
            d.set_item("kind", "pause")?;
            d.set_item("by", by)?;
            d.set_item("reason", reason)?;
        }
        HistoryKind::Unpause { by } => {
            d.set_item("kind", "unpause")?;
            d.set_item("by", by)?;
        }
        HistoryKind::RunNow { by } => {
            d.set_item("kind", "run_now")?;
            d.set_item("by", by)?;
        }
        HistoryKind::Skipped { reason, summary } => {
            d.set_item("kind", "skipped")?;
            d.set_item("reason", reason)?;
            d.set_item("summary", summary)?;
        }
        _ => d.set_item("kind", "other")?,
    }
    Ok(d.unbind())
}

/// The crate's one escaping rule for database text shown on a terminal or a page.
#[pyfunction]
pub(crate) fn escape(text: &str) -> String {
    HistoryEntry::escape(text)
}

/// Pauses `role`; `True` when this call paused it.
#[pyfunction]
#[pyo3(signature = (url, role_name, by, reason, statement_timeout=2.0))]
pub(crate) fn pause(
    py: Python<'_>,
    url: &str,
    role_name: &str,
    by: &str,
    reason: &str,
    statement_timeout: f64,
) -> PyResult<bool> {
    let role = role(role_name)?;
    py.detach(|| {
        let store = connect(url, statement_timeout)?;
        block_on(store.pause(&role, by, reason)).map_err(store_error)
    })
}

/// Unpauses `role`; `True` when this call unpaused it.
#[pyfunction]
#[pyo3(signature = (url, role_name, statement_timeout=2.0))]
pub(crate) fn unpause(py: Python<'_>, url: &str, role_name: &str, statement_timeout: f64) -> PyResult<bool> {
    let role = role(role_name)?;
    py.detach(|| {
        let store = connect(url, statement_timeout)?;
        block_on(store.unpause(&role)).map_err(store_error)
    })
}

/// Asks for a manual run of `role`: its next term starts at the next poll once no term is live,
/// whatever its interval, cooldown or schedule.
#[pyfunction]
#[pyo3(signature = (url, role_name, statement_timeout=2.0))]
pub(crate) fn run_now(py: Python<'_>, url: &str, role_name: &str, statement_timeout: f64) -> PyResult<bool> {
    let role = role(role_name)?;
    py.detach(|| {
        let store = connect(url, statement_timeout)?;
        block_on(store.run_now(&role)).map_err(store_error)
    })
}

/// Applies the schema as its owner; returns the versions this call applied.
#[pyfunction]
#[pyo3(signature = (url, app_role="ticklease_app", operator_role="ticklease_operator"))]
pub(crate) fn migrate(py: Python<'_>, url: &str, app_role: &str, operator_role: &str) -> PyResult<Vec<i32>> {
    let pg: PgConnect = url
        .parse()
        .map_err(|e| pyo3::exceptions::PyValueError::new_err(format!("url: {e}")))?;
    let options = MigrateOptions {
        app_role: app_role.to_owned(),
        operator_role: operator_role.to_owned(),
    };
    let report = py
        .detach(|| block_on(ticklease::migrate_at(&pg, &options)))
        .map_err(|e| TickleaseError::new_err(ticklease::error::chain(&e)))?;
    Ok(report.applied)
}
