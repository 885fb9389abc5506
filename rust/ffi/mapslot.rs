//! A direct `mp_ass_subscript` slot (`d[k] = v`, `del d[k]`) for a pyclass, in place of the one
//! pyo3 generates from `__setitem__`/`__delitem__`: CPython calls it with no pyo3 trampoline
//! (no attach-count bookkeeping in thread-local storage, no indirect call through the method
//! table), which is a fair share of the weak dictionaries' cost of `d[k] = v`.
//!
//! - `install_ass_subscript::<H>(tp)`: writes the slot of a heap type created by pyo3
//!   (`PyHeapTypeObject.as_mapping`, which `tp_as_mapping` points at for heap types) and calls
//!   `PyType_Modified`. It must run before any subclass is created: a subclass copies its
//!   base's slots when it is readied (`inherit_slots`, Objects/typeobject.c), so the native
//!   subclasses created after it share the slot. Python subclasses take their slot from the
//!   `__setitem__` wrapper descriptor (pyo3's function, which stays in place and does the same
//!   thing), so they run pyo3's slot: correct, only not this fast path.
//! - `AssSubscript`: what the slot calls, with the GIL held. pyo3 has not entered the thread
//!   (its attach count may be zero), so the handler must drop no `Py` (pyo3 would defer the
//!   release to its pool, and a value's `__del__` would run late): it works with `Bound`s and
//!   `GilRef`s (rust/ffi/weakkey.rs), as the weakref callback there does. Its error (a panic
//!   becomes a `PanicException`) is raised inside `Python::attach`, where pyo3 releases what
//!   the error held at once.
//!
//! Does not own what the slot does (rust/weak/dict.rs).
use std::ffi::c_int;

use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use pyo3::types::PyType;
use pyo3::{Borrowed, PyClass};

/// The Rust side of a direct `mp_ass_subscript` on the pyclass `Self`: store `value` under
/// `key`, or delete `key` when `value` is `None`. Must drop no `Py` (see the module doc).
pub trait AssSubscript: PyClass {
    fn ass_subscript(
        slf: Borrowed<'_, '_, Self>,
        key: Borrowed<'_, '_, PyAny>,
        value: Option<Borrowed<'_, '_, PyAny>>,
    ) -> PyResult<()>;
}

unsafe extern "C" fn ass_subscript<H: AssSubscript>(
    slf: *mut ffi::PyObject,
    key: *mut ffi::PyObject,
    value: *mut ffi::PyObject,
) -> c_int {
    // SAFETY: CPython calls `mp_ass_subscript` with the GIL held, `slf` an instance of the type
    // (or of a subtype) holding the slot, `key` live and `value` live or NULL (deletion), all
    // borrowed for the call.
    let py = unsafe { Python::assume_attached() };
    // The slot is only ever installed on `H`'s type (`install_ass_subscript`) and CPython
    // reaches it through `Py_TYPE(slf)`, so `slf` is an `H` (or a subclass instance): the
    // type check pyo3 would make cannot fail. (No wrapper descriptor holds this function: a
    // type's wrappers are made from its own slots before it inherits any.)
    let (slf, key, value) = unsafe {
        (
            Borrowed::from_ptr(py, slf).cast_unchecked::<H>(),
            Borrowed::from_ptr(py, key),
            Borrowed::from_ptr_or_opt(py, value),
        )
    };
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        H::ass_subscript(slf, key, value)
    }));
    let err = match result {
        Ok(Ok(())) => return 0,
        Ok(Err(e)) => e,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "panic in a mapping slot".to_string());
            PanicException::new_err(msg)
        }
    };
    // Raising a pyo3 error releases `Py`s (a lazy error's type and arguments, e.g. the key of a
    // KeyError): entered through pyo3, so that they are released now, not deferred.
    Python::attach(|py| err.restore(py));
    -1
}

/// Point the `mp_ass_subscript` of `H`'s type at `H`'s handler. `H` must declare
/// `__setitem__` or `__delitem__` (so its type has a mapping slot table), and no subclass of
/// it may exist yet (see the module doc).
pub fn install_ass_subscript<H: AssSubscript>(py: Python<'_>) -> PyResult<()> {
    let tp = py.get_type::<H>();
    let raw = tp.as_type_ptr();
    // SAFETY: `raw` is a live type object (borrowed through `tp`), the GIL is held. For a heap
    // type `tp_as_mapping` points into the type object itself (PyHeapTypeObject.as_mapping,
    // Include/cpython/object.h), which is writable; CPython reads the slot on every
    // `PyObject_SetItem`/`PyObject_DelItem`, and `PyType_Modified` drops any cached lookups.
    unsafe {
        if (*raw).tp_flags & ffi::Py_TPFLAGS_HEAPTYPE == 0 || (*raw).tp_as_mapping.is_null() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "install_ass_subscript needs a heap type with mapping slots",
            ));
        }
        (*(*raw).tp_as_mapping).mp_ass_subscript = Some(ass_subscript::<H>);
        ffi::PyType_Modified(raw);
    }
    Ok(())
}

/// Whether `tp`'s `mp_ass_subscript` is `H`'s direct slot (for the tests).
pub fn has_direct_ass_subscript<H: AssSubscript>(tp: &Bound<'_, PyType>) -> bool {
    let raw = tp.as_type_ptr();
    // SAFETY: a plain read of a live type object's slot table.
    unsafe {
        let m = (*raw).tp_as_mapping;
        !m.is_null()
            && (*m).mp_ass_subscript.map(|f| f as *const () as usize)
                == Some(ass_subscript::<H> as *const () as usize)
    }
}
