//! Read-only introspection of the hook for tests/test_ffi_layout.py and tests/test_eval_frame.py
//! (names start with `_debug_`; not part of the `_C.pyi` contract).
use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::{PyCode, PyDict};

use crate::ffi::frame as hook;

/// Fields of the last frame a `_debug_capture` callback saw, read through the frame mirror.
static LAST_FRAME: Mutex<Vec<(&'static str, i64)>> = Mutex::new(Vec::new());

pub(super) fn record_frame(fields: Vec<(&'static str, i64)>) {
    if let Ok(mut l) = LAST_FRAME.lock() {
        *l = fields;
    }
}

#[pyfunction]
fn _debug_last_frame(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in LAST_FRAME.lock().map(|l| l.clone()).unwrap_or_default() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

#[pyfunction]
fn _debug_code_fields<'py>(
    py: Python<'py>,
    code: Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let code = code.cast::<PyCode>()?;
    let d = PyDict::new(py);
    for (k, v) in hook::debug_code_fields(code) {
        d.set_item(k, v)?;
    }
    Ok(d)
}

#[pyfunction]
fn _debug_hook_state(py: Python<'_>) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("installed", hook::installed(py))?;
    d.set_item("active_threads", super::thread::active_threads())?;
    for (k, v) in hook::debug_counters() {
        d.set_item(k, v)?;
    }
    d.set_item("thread_ids", hook::debug_thread_ids(py))?;
    d.set_item("thread_traced", hook::debug_thread_traced(py))?;
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(_debug_last_frame, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_code_fields, m)?)?;
    m.add_function(wrap_pyfunction!(_debug_hook_state, m)?)?;
    Ok(())
}
