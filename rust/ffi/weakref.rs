//! Weak-reference reads the weak dictionaries need without creating references or calling Python.
//!
//! - `supports_weakrefs`: whether `PyWeakref_NewRef` would accept the object (its type's
//!   `tp_weaklistoffset` is non-zero: positive on 3.11, negative for managed weakref lists on
//!   3.12 and 3.13; `Objects/weakrefobject.c`, `_PyType_SUPPORTS_WEAKREFS`).
//! - `has_no_weakrefs`: whether an object's weakref list is empty (so it is the key of no weak
//!   dictionary entry), read from the list head;
//! - `referent_ptr`: the address a weakref points to, or null once it is dead, read from its
//!   `wr_object` field (`wr_object`: what `PyWeakref_GetObject` returns, borrowed, without its
//!   type check), so no reference count changes and no Python code runs (safe to call while a
//!   dictionary's lock is held).
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

/// Whether `obj` certainly has no weak reference: its weakref list (the head pointer at
/// `tp_weaklistoffset` from the object, `_PyObject_GET_WEAKREFS_LISTPTR` in
/// Include/internal/pycore_object.h: a plain offset on 3.11, negative for managed lists on
/// 3.12 and 3.13, the same arithmetic) is empty. False for objects that cannot be weakly
/// referenced and for type objects (3.12+ keep static builtin types' lists in the interpreter
/// state): "not certain". No reference counts, no Python code.
#[inline]
pub fn has_no_weakrefs(obj: &Bound<'_, PyAny>) -> bool {
    let p = obj.as_ptr();
    // SAFETY: `obj` is live (borrowed for the call), so its type is; `tp_weaklistoffset` is a
    // plain field (Include/cpython/object.h). When it is non-zero and the object is not a type,
    // the list head lies at that offset from the object (inside it, or in the pre-header of a
    // managed list) and is NULL exactly when no weakref to the object exists.
    unsafe {
        let tp = ffi::Py_TYPE(p);
        let offset = (*tp).tp_weaklistoffset;
        if offset == 0 || ffi::PyType_Check(p) != 0 {
            return false;
        }
        (*p.cast::<u8>().offset(offset).cast::<*mut ffi::PyObject>()).is_null()
    }
}

/// The referent's address, or null when the weakref is dead. Never touches reference counts.
#[inline]
pub fn referent_ptr(_py: Python<'_>, wr: &Py<PyWeakrefReference>) -> *mut ffi::PyObject {
    // SAFETY: the GIL is held (`_py`) and `wr` is a live weakref.ref (or subclass) object.
    let p = unsafe { wr_object(wr.as_ptr()) };
    // SAFETY: Py_None() only reads the address of the None singleton.
    if p.is_null() || p == unsafe { ffi::Py_None() } {
        std::ptr::null_mut()
    } else {
        p
    }
}

/// The `wr_object` field of a weakref: its referent, borrowed, or Py_None once it died
/// (`PyWeakReference`, Include/cpython/weakrefobject.h: the first field after the object
/// header on 3.11, 3.12 and 3.13; mirrored by pyo3-ffi's `_PyWeakReference`). What
/// `PyWeakref_GetObject` returns, without its exact-type-or-subtype check (an MRO walk for the
/// dictionaries' `_WeakKeyRef` subtype) on every lookup.
///
/// # Safety
/// `wr` is a live `weakref.ref` (or subclass) instance, and the GIL is held.
#[inline]
pub unsafe fn wr_object(wr: *mut ffi::PyObject) -> *mut ffi::PyObject {
    // SAFETY: (caller) `wr` points at a PyWeakReference.
    unsafe { (*wr.cast::<ffi::_PyWeakReference>()).wr_object }
}
