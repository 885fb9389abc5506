//! Per-code state in `co_extra` (PEP 523's code-extra API): one index requested once per
//! process, a boxed [`CodeState`] per code object that has cache state, freed by CPython when
//! the code object dies, and a registry of the codes that have state (for `reset()`).
//!
//! Owns the raw pointers only; what the state holds and means is `crate::cache`'s.
use std::collections::HashSet;
use std::os::raw::c_void;
use std::sync::{Mutex, OnceLock};

use pyo3::exceptions::PyRuntimeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCode;

use crate::cache::CodeState;

extern "C" {
    #[cfg_attr(Py_3_12, link_name = "PyUnstable_Eval_RequestCodeExtraIndex")]
    #[cfg_attr(not(Py_3_12), link_name = "_PyEval_RequestCodeExtraIndex")]
    fn request_code_extra_index(free: Option<unsafe extern "C" fn(*mut c_void)>)
        -> ffi::Py_ssize_t;
    #[cfg_attr(Py_3_12, link_name = "PyUnstable_Code_GetExtra")]
    #[cfg_attr(not(Py_3_12), link_name = "_PyCode_GetExtra")]
    fn code_get_extra(
        code: *mut ffi::PyObject,
        index: ffi::Py_ssize_t,
        extra: *mut *mut c_void,
    ) -> i32;
    #[cfg_attr(Py_3_12, link_name = "PyUnstable_Code_SetExtra")]
    #[cfg_attr(not(Py_3_12), link_name = "_PyCode_SetExtra")]
    fn code_set_extra(code: *mut ffi::PyObject, index: ffi::Py_ssize_t, extra: *mut c_void) -> i32;
}

/// What `co_extra[INDEX]` points at.
struct Extra {
    code: usize,
    state: CodeState,
}

/// The extra index, requested on first use (under the GIL).
static INDEX: OnceLock<ffi::Py_ssize_t> = OnceLock::new();
/// Addresses of the code objects that currently have an [`Extra`].
static REGISTRY: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// Called by CPython from `code_dealloc` (GIL held) when a code object with state dies.
unsafe extern "C" fn free_extra(p: *mut c_void) {
    if p.is_null() {
        return;
    }
    let extra = Box::from_raw(p as *mut Extra);
    // Unregister first: dropping the state may run Python code (entries dying), and `reset()`
    // must never see a code object whose deallocation has begun.
    if let Ok(mut reg) = REGISTRY.lock() {
        if let Some(set) = reg.as_mut() {
            set.remove(&extra.code);
        }
    }
    // Entries hold Python objects: drop them attached (so they are released now, not deferred).
    // Late in interpreter shutdown attaching may be refused; then the state is leaked rather
    // than touched without the interpreter.
    let mut extra = Some(extra);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        Python::try_attach(|_py| drop(extra.take()));
    }));
    std::mem::forget(extra);
}

fn index(_py: Python<'_>) -> PyResult<ffi::Py_ssize_t> {
    if let Some(i) = INDEX.get() {
        return Ok(*i);
    }
    // SAFETY: GIL held (the token); the free function matches the boxes stored below.
    let i = unsafe { request_code_extra_index(Some(free_extra)) };
    if i < 0 {
        return Err(PyRuntimeError::new_err(
            "ferrodyn: no code-extra index available",
        ));
    }
    Ok(*INDEX.get_or_init(|| i))
}

/// The state of a code object by raw pointer (the hook's path). None when it has none.
///
/// # Safety
/// `code` must be a live code object, kept alive by the caller for `'a`, GIL held.
pub(crate) unsafe fn state_raw<'a>(code: *mut ffi::PyObject) -> Option<&'a CodeState> {
    let i = *INDEX.get()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    if code_get_extra(code, i, &mut p) != 0 {
        ffi::PyErr_Clear();
        return None;
    }
    if p.is_null() {
        None
    } else {
        Some(&(*(p as *const Extra)).state)
    }
}

/// The state of `code`, if it has any. Borrowed for as long as the caller holds the code.
pub fn state<'a>(code: &'a Bound<'_, PyCode>) -> Option<&'a CodeState> {
    // SAFETY: `code` is a live code object borrowed for 'a; the box lives until the code dies.
    unsafe { state_raw(code.as_ptr()) }
}

/// The state of `code`, created (empty) if it has none.
pub fn state_or_init<'a>(code: &'a Bound<'_, PyCode>) -> PyResult<&'a CodeState> {
    if let Some(s) = state(code) {
        return Ok(s);
    }
    let i = index(code.py())?;
    let boxed = Box::into_raw(Box::new(Extra {
        code: code.as_ptr() as usize,
        state: CodeState::default(),
    }));
    // SAFETY: live code object, GIL held; on success CPython owns the box and frees it through
    // `free_extra`.
    let rc = unsafe { code_set_extra(code.as_ptr(), i, boxed as *mut c_void) };
    if rc != 0 {
        // SAFETY: not stored; reclaim.
        drop(unsafe { Box::from_raw(boxed) });
        return Err(PyErr::fetch(code.py()));
    }
    REGISTRY
        .lock()
        .map_err(|_| PyRuntimeError::new_err("ferrodyn: code registry poisoned"))?
        .get_or_insert_with(HashSet::new)
        .insert(code.as_ptr() as usize);
    // SAFETY: just stored; lives until the code dies, which `code` prevents for 'a.
    Ok(unsafe { &(*boxed).state })
}

/// Every code object that has state now, as new references (so none dies while the caller
/// works through them).
pub fn codes_with_state(py: Python<'_>) -> Vec<Bound<'_, PyCode>> {
    let reg = match REGISTRY.lock() {
        Ok(r) => r,
        Err(_) => return Vec::new(),
    };
    let Some(set) = reg.as_ref() else {
        return Vec::new();
    };
    set.iter()
        // SAFETY: a registered code is alive (its free function unregisters it before anything
        // else, and runs only once the refcount reached zero, under the GIL we hold).
        .map(|&p| unsafe {
            Bound::from_borrowed_ptr(py, p as *mut ffi::PyObject).cast_into_unchecked::<PyCode>()
        })
        .collect()
}
