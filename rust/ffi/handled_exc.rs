//! Whether the running thread is handling an exception (`sys.exception() is None`), read
//! through CPython's public `PyErr_GetHandledException` (3.11+, Include/pyerrors.h): the
//! innermost entry of the thread's exc_info stack that holds an exception. Checked by the
//! guard tree before a compiled frame runs, so it is the frame's caller that is asked.
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::Python;

/// True when no exception is being handled on this thread.
pub fn no_handled_exception(_py: Python<'_>) -> bool {
    // SAFETY: the GIL is held (`_py`); the call returns a new reference or NULL and sets no
    // error; the reference is released before returning.
    unsafe {
        let exc = ffi::PyErr_GetHandledException();
        if exc.is_null() {
            return true;
        }
        let none = exc == ffi::Py_None();
        ffi::Py_DECREF(exc);
        none
    }
}
