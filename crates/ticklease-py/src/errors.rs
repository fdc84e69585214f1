//! The exceptions the core raises in Python.

use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::PyErr;

create_exception!(
    _native,
    TickleaseError,
    PyException,
    "The database refused or could not be reached (the cause's chain in the message)."
);

/// A store error as Python sees it, with its chain of causes.
pub(crate) fn store_error(e: ticklease::StoreError) -> PyErr {
    TickleaseError::new_err(ticklease::error::chain(&e))
}
