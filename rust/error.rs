//! The crate's one internal error type, turned into a Python exception at exactly one edge.
use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::PyErr;

#[derive(Debug)]
pub enum Error {
    /// A Python exception raised while evaluating; passed through unchanged.
    Py(PyErr),
    /// Bad argument type from Python.
    Type(String),
    /// Bad argument value from Python.
    Value(String),
    /// An internal invariant failed.
    Internal(String),
}

impl From<PyErr> for Error {
    fn from(e: PyErr) -> Self {
        Error::Py(e)
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> Self {
        match e {
            Error::Py(e) => e,
            Error::Type(m) => PyTypeError::new_err(m),
            Error::Value(m) => PyValueError::new_err(m),
            Error::Internal(m) => PyRuntimeError::new_err(format!("ferrodyn internal error: {m}")),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
