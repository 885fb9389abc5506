//! The direct call of a resume function from the entry that continues into it.
//!
//! An entry ending at a graph break calls its resume function. Called as a Python function,
//! that call pushes the resume function's frame, enters the frame hook, looks up the code's
//! cache and runs the hit's entry in the frame's place. `resume_call(fn)` gives the entry a
//! builtin (no argument tuple) that does the same without the frame: it looks up `fn`'s code
//! cache with the call's positional arguments as the argument slots (and `fn`'s globals and
//! builtins, as the frame would have) and, on a hit, calls the entry with those arguments
//! directly. Everything else calls `fn` as before, so the hook decides as it would have: this
//! thread's hook off (or inside the callback), SKIP code, no entries, a different number of
//! arguments, a miss (the hook then recompiles, or runs the frame at the cache limit; the
//! look-ahead's guard failures are not counted, the hook's are). Only plain functions without
//! closure, `*args`, `**kwargs`, keyword-only parameters, or generator/coroutine flags are
//! called directly; `resume_call` returns any other callable unchanged.
//! Owns nothing of the cache (`crate::cache`) or of the hook's decisions (`super`).
use pyo3::prelude::*;
use pyo3::types::{PyCode, PyDict, PyFunction};

use super::thread::{thread_hook, Mode};
use crate::cache::{self, CodeFlag};
use crate::ffi::code_extra;
use crate::ffi::frame::current_thread_state;
use crate::ffi::object::{fastcall_builtin, vectorcall_slots};
use crate::ffi::slots::Slots;
use crate::guards::{GuardInput, Locals};

/// `co_flags` that make a function's frames ineligible (Include/cpython/code.h): `*args`,
/// `**kwargs`, generator, coroutine, iterable coroutine, async generator.
const CO_NOT_DIRECT: i64 = 0x0004 | 0x0008 | 0x0020 | 0x0080 | 0x0100 | 0x0200;

/// One resume function, called directly (see the module docs).
#[pyclass(module = "ferrodyn._C", name = "ResumeCall", frozen)]
pub struct ResumeCall {
    func: Py<PyAny>,
    code: Py<PyCode>,
    globals: Py<PyDict>,
    builtins: Py<PyDict>,
    nargs: usize,
}

#[pymethods]
impl ResumeCall {
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.func)?;
        visit.call(&self.code)?;
        visit.call(&self.globals)?;
        visit.call(&self.builtins)
    }
}

/// The `ResumeCall` of `f`, or None when its frames are not eligible (see the module docs).
fn resume_call_of(f: &Bound<'_, PyAny>) -> PyResult<Option<ResumeCall>> {
    if !f.is_exact_instance_of::<PyFunction>() {
        return Ok(None);
    }
    if !f.getattr("__closure__")?.is_none() {
        return Ok(None);
    }
    let Ok(code) = f.getattr("__code__")?.cast_into::<PyCode>() else {
        return Ok(None);
    };
    let flags: i64 = code.getattr("co_flags")?.extract()?;
    let kwonly: usize = code.getattr("co_kwonlyargcount")?.extract()?;
    if flags & CO_NOT_DIRECT != 0 || kwonly != 0 {
        return Ok(None);
    }
    let (Ok(globals), Ok(builtins)) = (
        f.getattr("__globals__")?.cast_into::<PyDict>(),
        f.getattr("__builtins__")?.cast_into::<PyDict>(),
    ) else {
        return Ok(None);
    };
    Ok(Some(ResumeCall {
        nargs: code.getattr("co_argcount")?.extract()?,
        func: f.clone().unbind(),
        code: code.unbind(),
        globals: globals.unbind(),
        builtins: builtins.unbind(),
    }))
}

/// The call of a `resume_call` builtin.
fn call_resume<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyAny>,
    args: Slots<'_>,
) -> PyResult<Bound<'py, PyAny>> {
    let rc = data.cast::<ResumeCall>()?.get();
    let func = rc.func.bind(py);
    if args.len() == rc.nargs {
        if let Some(f) = lookup(py, rc, args) {
            let (f, exports) = f;
            return vectorcall_slots(&f, args, &exports);
        }
    }
    vectorcall_slots(func, args, &[])
}

/// A hit of `rc`'s code for these arguments, as the hook would find it for a frame of
/// `rc.func` called with them: the entry's function and the exported values it takes.
#[allow(clippy::type_complexity)]
fn lookup<'py>(
    py: Python<'py>,
    rc: &ResumeCall,
    args: Slots<'_>,
) -> Option<(Bound<'py, PyAny>, Vec<Bound<'py, PyAny>>)> {
    let (mode, backend_id) = thread_hook(current_thread_state(py));
    if mode == Mode::Off || !args.all_bound() {
        return None;
    }
    let code = rc.code.bind(py);
    let st = code_extra::state(code)?;
    if st.flag() == CodeFlag::Skip || st.is_empty() {
        return None;
    }
    let globals = rc.globals.bind(py);
    let builtins = rc.builtins.bind(py);
    let input = GuardInput {
        locals: Locals::Slots(args),
        globals: Some(globals),
        builtins: Some(builtins),
        closure: None,
    };
    let mut exports = Vec::new();
    let (hit, errors) = cache::lookup(py, st, &input, backend_id, &mut exports, false);
    if errors {
        // As in the hook: free what a failing guard released into pyo3's deferred pool.
        Python::attach(|_| ());
    }
    hit.map(|h| (h.func, exports))
}

/// `resume_call(fn)`: the callable an entry calls its resume function `fn` through (see the
/// module docs); `fn` itself when it is not eligible.
#[pyfunction]
fn resume_call<'py>(f: Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    match resume_call_of(&f)? {
        None => Ok(f),
        Some(rc) => fastcall_builtin(Bound::new(f.py(), rc)?.into_any(), call_resume),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<ResumeCall>()?;
    m.add_function(wrap_pyfunction!(resume_call, m)?)?;
    Ok(())
}
