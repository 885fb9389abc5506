//! Bound methods made directly (what `types.MethodType(func, obj)` makes), for the original
//! module's remembered `forward` in `crate::eval_frame::call` (no attribute lookup per call).
//!
//! Mirrors `PyMethod_New` (Include/cpython/classobject.h, 3.11-3.13: a public function that
//! takes new references to both arguments and returns a new reference or NULL with an
//! exception set).
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;

use super::guard_reads::Held;

extern "C" {
    fn PyMethod_New(func: *mut ffi::PyObject, obj: *mut ffi::PyObject) -> *mut ffi::PyObject;
}

/// `func` bound to `obj`. `func` must be alive for the call (the caller proves it is held by
/// a type whose version tag it checked).
pub fn bound_method<'py>(func: Held, obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = obj.py();
    // SAFETY: both pointers are live objects; PyMethod_New increfs them and returns a new
    // reference or NULL with an exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, PyMethod_New(func.ptr(), obj.as_ptr())) }
}
