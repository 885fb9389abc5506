//! Weak-reference reads the weak dictionaries need without creating references or calling Python.
//!
//! - `supports_weakrefs`: whether `PyWeakref_NewRef` would accept the object (its type's
//!   `tp_weaklistoffset` is non-zero: positive on 3.11, negative for managed weakref lists on
//!   3.12 and 3.13; `Objects/weakrefobject.c`, `_PyType_SUPPORTS_WEAKREFS`).
//! - `referent_ptr`: the address a weakref points to, or null once it is dead, read with the
//!   borrowed-reference API (`PyWeakref_GetObject`: present on 3.11 to 3.14, deprecated since
//!   3.13, removed in 3.15, where `PyWeakref_GetRef` replaces it), so no reference
//!   count changes and no Python code runs (safe to call while a dictionary's lock is held).
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyWeakrefReference;

/// Whether `obj` can be weakly referenced.
#[inline]
pub fn supports_weakrefs(obj: &Bound<'_, PyAny>) -> bool {
    // SAFETY: `obj` is a live object (borrowed for the call) so its type object is live;
    // `tp_weaklistoffset` is a plain field of PyTypeObject (Include/cpython/object.h).
    unsafe { (*ffi::Py_TYPE(obj.as_ptr())).tp_weaklistoffset != 0 }
}

/// The referent's address, or null when the weakref is dead. Never touches reference counts.
#[inline]
pub fn referent_ptr(_py: Python<'_>, wr: &Py<PyWeakrefReference>) -> *mut ffi::PyObject {
    // SAFETY: the GIL is held (`_py`) and `wr` is a live weakref.ref object, the argument
    // `PyWeakref_GetObject` requires; it returns a borrowed reference (Py_None when dead) and
    // cannot fail or run Python code for a valid weakref.
    #[allow(deprecated)]
    let p = unsafe { ffi::PyWeakref_GetObject(wr.as_ptr()) };
    // SAFETY: Py_None() only reads the address of the None singleton.
    if p.is_null() || p == unsafe { ffi::Py_None() } {
        std::ptr::null_mut()
    } else {
        p
    }
}
