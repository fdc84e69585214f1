//! `ticklease._native`: the Rust core as a Python extension module. The
//! public API is the `ticklease` package (`python/ticklease`), which wraps
//! these types in Python's idioms; this module converts types, runs the
//! crate, and maps its errors and outcomes. It decides nothing about leases.

mod config;
mod errors;
mod log;
mod ops;
mod run;
mod runtime;
mod term;
mod work;

use pyo3::prelude::*;

/// Sets the lowest `logging` level the core's lines are passed on at.
#[pyfunction]
fn set_log_level(level: u8) {
    log::set_level(level);
}

/// At the interpreter's exit (`atexit`): shuts the core's runtime down
/// before the interpreter finalizes, the GIL released meanwhile.
#[pyfunction]
fn shutdown(py: Python<'_>) {
    py.detach(|| runtime::shutdown(std::time::Duration::from_secs(1)));
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    log::install();
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("TickleaseError", m.py().get_type::<errors::TickleaseError>())?;
    m.add_class::<config::PyConfig>()?;
    m.add_class::<config::PySchedule>()?;
    m.add_class::<config::PyFamily>()?;
    m.add_class::<term::PyTerm>()?;
    m.add_class::<run::PyRunner>()?;
    m.add_function(wrap_pyfunction!(set_log_level, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(ops::status, m)?)?;
    m.add_function(wrap_pyfunction!(ops::pause, m)?)?;
    m.add_function(wrap_pyfunction!(ops::unpause, m)?)?;
    m.add_function(wrap_pyfunction!(ops::run_now, m)?)?;
    m.add_function(wrap_pyfunction!(ops::migrate, m)?)?;
    m.add_function(wrap_pyfunction!(ops::history, m)?)?;
    m.add_function(wrap_pyfunction!(ops::escape, m)?)?;
    Ok(())
}
