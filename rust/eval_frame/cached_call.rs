//! A compiled function's or module's cached entry, run before any frame of the function
//! exists: the native call path (`super::call`) looks the function's code cache up with the
//! call's positional arguments as the argument slots (and the function's globals and builtins,
//! as its frame would have them) and, on a hit, runs the entry (or its direct call) under the
//! callback the call installs, exactly as the frame hook would have in the frame's place
//! (`super::on_frame_cached`), without pushing and clearing the frame.
//!
//! Everything else returns None and the caller calls the function as before, so the hook
//! decides as it always does: a function that is not plain (`func_call::plain_function_parts`),
//! keyword arguments or another number of arguments, SKIP code, no entries, a trace or profile
//! function set, a miss (whose guard failures the hook then counts).
//! Owns nothing of the cache (`crate::cache`) or the hook's decisions (`super`).
use pyo3::prelude::*;

use super::thread::{self, Installed, Mode};
use crate::cache::{self, CodeFlag};
use crate::ffi::code_extra;
use crate::ffi::func_call;
use crate::ffi::guard_reads::Held;
use crate::ffi::object::vectorcall_slots;
use crate::ffi::slots::Slots;
use crate::guards::{GuardInput, Locals};

/// `func(*slots)` from `func`'s code cache, under `installed` (see the module docs); None
/// when the call must take the ordinary path.
pub fn run<'py>(
    py: Python<'py>,
    func: Held,
    slots: Slots<'_>,
    installed: &Installed,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    let (mode, backend_id) = installed.mode();
    if mode == Mode::Off {
        return None;
    }
    let parts = func_call::plain_function_parts(py, func)?;
    // Held for the call: a guard's full path may run Python code, which could rebind the
    // function's `__code__` or drop the function.
    let _func = func.to_owned(py);
    parts.with_slots(slots, |slots| {
        run_slots(py, &parts, slots, installed, backend_id)
    })?
}

fn run_slots<'py>(
    py: Python<'py>,
    parts: &func_call::FunctionParts<'_, 'py>,
    slots: Slots<'_>,
    installed: &Installed,
    backend_id: i64,
) -> Option<PyResult<Bound<'py, PyAny>>> {
    if !slots.all_bound() {
        return None;
    }
    let code = parts.code.to_owned();
    let (globals, builtins) = (parts.globals.to_owned(), parts.builtins.to_owned());
    let st = code_extra::state(&code)?;
    if st.flag() == CodeFlag::Skip || st.is_empty() || func_call::current_thread_traced(py) {
        return None;
    }
    let input = GuardInput {
        locals: Locals::Slots(slots),
        globals: Some(&globals),
        builtins: Some(&builtins),
        closure: None,
    };
    let mut exports = Vec::new();
    let (hit, errors) = cache::lookup(py, st, &input, backend_id, &mut exports, false);
    if errors {
        // As in the hook: free what a failing guard released into pyo3's deferred pool.
        Python::attach(|_| ());
    }
    let hit = hit?;
    if let Some(d) = hit.direct.as_deref() {
        let graph = d.graph.bind(py);
        let inst = if d.fence {
            super::fence(py)?
        } else {
            installed
        };
        let saved = match thread::enter(py, inst) {
            Ok(s) => s,
            Err(e) => return Some(Err(e)),
        };
        let r = func_call::call_direct(py, &slots, graph, &d.args, &exports, d.out);
        thread::exit(py, saved);
        if r.is_some() {
            return r;
        }
    }
    let saved = match thread::enter(py, installed) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let r = vectorcall_slots(&hit.func, slots, &exports);
    thread::exit(py, saved);
    Some(r)
}
