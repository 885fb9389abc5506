//! The PEP 523 frame hook's policy: which frames are intercepted, what runs in their place, and
//! the Python API around it (`set_eval_frame`, `skip_code`, ...).
//!
//! The raw hook (reading CPython's frame, calling the default evaluator, clearing replaced
//! frames) is `crate::ffi::frame`; it asks [`on_frame_cached`] (and, on a miss with a callback
//! set, [`on_frame_miss`]) what to do with each candidate frame.
//! Owns: the per-frame decision (skip / cached entry / callback / default), the thread-local
//! callback (`thread`), the frame view (`view`), the native call path of compiled functions
//! and modules (`call`) and their look-up of a cached entry before any frame (`cached_call`),
//! the direct call of a resume function's cached entry (`resume`).
//! Does not own: entry storage (`crate::cache`)
//! or guard evaluation (`crate::guards`).
mod cached_call;
mod call;
mod debug;
mod resume;
mod thread;
mod view;

use pyo3::prelude::*;
use pyo3::types::PyCode;

use crate::cache::direct::DirectCall;
use crate::cache::{self, CacheEntry, CodeFlag};
use crate::ffi::code_extra;
use crate::ffi::frame::{FrameAction, InterceptedFrame};
use crate::guards::{GuardInput, Locals};
pub use thread::{thread_hook, BackendCallback, Mode};
pub use view::FrameView;

/// The hook's pre-check, before it attaches to Python: false when the frame certainly runs
/// unchanged (its code is SKIP, or this thread only runs cached entries and the code has none).
#[inline]
pub fn worth_offering(mode: Mode, state: Option<&crate::cache::CodeState>) -> bool {
    match state {
        Some(st) if st.flag() == CodeFlag::Skip => false,
        Some(st) => mode == Mode::Callback || !st.is_empty(),
        None => mode == Mode::Callback,
    }
}

/// `f` applied to the guard input of `frame`: its argument slots, globals, builtins, closure.
fn with_guard_input<'py, R>(
    frame: &InterceptedFrame<'py>,
    f: impl FnOnce(&GuardInput<'_, 'py>) -> R,
) -> R {
    let globals = frame.globals();
    let builtins = frame.builtins();
    let closure = frame.closure();
    f(&GuardInput {
        locals: Locals::Slots(frame.arg_slots()),
        globals: Some(&*globals),
        builtins: Some(&*builtins),
        closure: closure.as_deref(),
    })
}

/// The hit path: decide from the cache alone. `Some(action)` when decided (SKIP code, a hit,
/// or nothing more to do), `None` when the miss path must run. Called by the hook without a
/// pyo3 attach guard (the GIL is held), so it creates no `Py<T>` it would drop: objects it
/// handles are borrowed or `Bound` (an entry removed from the cache while it runs is released
/// through pyo3's deferred-decref pool, later but correctly).
/// `backend_id` is the thread's (from [`thread_hook`]): only entries of that backend (or 0) run.
pub fn on_frame_cached(
    frame: &InterceptedFrame<'_>,
    state: Option<&crate::cache::CodeState>,
    mode: Mode,
    backend_id: i64,
) -> Option<FrameAction> {
    let py = frame.py();
    if let Some(st) = state {
        if st.flag() == CodeFlag::Skip {
            return Some(FrameAction::RunDefault);
        }
        let mut exports = Vec::new();
        let (hit, errors) = with_guard_input(frame, |input| {
            cache::lookup(py, st, input, backend_id, &mut exports, true)
        });
        if errors {
            // A failing guard may have swallowed an exception, released under the bare token
            // into pyo3's deferred pool: attach briefly so it is freed now, not whenever pyo3
            // next attaches. Hits on the first entry (the common case) skip this.
            Python::attach(|_| ());
        }
        if let Some(hit) = hit {
            if let Some(d) = hit.direct.as_deref() {
                if let Some(r) = call_direct(frame, d, &exports) {
                    return Some(FrameAction::Return(r.map(Bound::unbind)));
                }
            }
            // `f(*arg_slots, *closure_cells, *exports)`: an entry whose guard tree hands it
            // the values of exported nodes (graph inputs read during the check) takes them last.
            return Some(FrameAction::Return(
                frame
                    .call_with_slots(&hit.func, &exports)
                    .map(Bound::unbind),
            ));
        }
    }
    if mode != Mode::Callback || state.is_some_and(|s| s.flag() == CodeFlag::RunOnly) {
        return Some(FrameAction::RunDefault);
    }
    None
}

/// A hit's direct call (`crate::cache::direct`): the graph called with the frame's slots and
/// the exports, fenced like the entry function's call when the plan says so. None when it
/// cannot be taken (a trace or profile function would see the entry's frame; an unbound slot):
/// the entry function runs instead.
fn call_direct<'py>(
    frame: &InterceptedFrame<'py>,
    d: &DirectCall,
    exports: &[Bound<'py, PyAny>],
) -> Option<PyResult<Bound<'py, PyAny>>> {
    if frame.thread_traced() {
        return None;
    }
    let py = frame.py();
    let graph = d.graph.bind(py);
    if !d.fence {
        return frame.call_direct(graph, &d.args, exports, d.out);
    }
    let saved = match thread::enter(py, fence(py)?) {
        Ok(s) => s,
        Err(e) => return Some(Err(e)),
    };
    let r = frame.call_direct(graph, &d.args, exports, d.out);
    thread::exit(py, saved);
    r
}

/// What the entry's fence installs around its graph call: `set_eval_frame(False)`.
fn fence(py: Python<'_>) -> Option<&'static thread::Installed> {
    static FENCE: pyo3::sync::PyOnceLock<thread::Installed> = pyo3::sync::PyOnceLock::new();
    FENCE
        .get_or_try_init(py, || {
            thread::Installed::parse(&pyo3::types::PyBool::new(py, false))
        })
        .ok()
}

/// The miss path (a callback is set and no entry passed): the limit, then the callback.
pub fn on_frame_miss(frame: &InterceptedFrame<'_>) -> FrameAction {
    let py = frame.py();
    let state = frame.code_state();
    let code = frame.code().to_owned();
    let at_limit = state.map_or(cache::cache_size_limit() == 0, |s| s.at_limit(py));
    if at_limit {
        let warned =
            code_extra::state_or_init(&code).and_then(|st| cache::limit_reached(&code, st));
        return match warned {
            Ok(()) => FrameAction::RunDefault,
            Err(e) => FrameAction::Return(Err(e)),
        };
    }
    let Some(cb) = thread::callback(py) else {
        return FrameAction::RunDefault;
    };
    cache::count_miss();
    debug::record_frame(frame.debug_fields());
    let result = thread::with_callback_off(|| -> PyResult<Option<Bound<'_, CacheEntry>>> {
        let view = Bound::new(py, FrameView::from_frame(frame)?)?;
        let r = cb.bind(py).call1((view,))?;
        if r.is_none() {
            return Ok(None);
        }
        match r.cast_into::<CacheEntry>() {
            Ok(e) => Ok(Some(e)),
            Err(e) => Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "ferrodyn: the frame callback must return a CacheEntry or None, got {}",
                e.into_inner()
                    .get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))),
        }
    });
    match result {
        Err(e) => FrameAction::Return(Err(e)),
        Ok(None) => FrameAction::RunDefault,
        Ok(Some(entry)) => {
            let st = match code_extra::state_or_init(&code) {
                Ok(s) => s,
                Err(e) => return FrameAction::Return(Err(e)),
            };
            let f = entry.get().func().bind(py).clone();
            // An entry whose tree exports graph inputs takes them as extra arguments: read
            // them with its guards (which pass on the frame it was compiled for; if they do
            // not, the frame runs normally this once).
            let tree = entry.get().tree().bind(py).clone();
            let mut exports = Vec::new();
            if tree.get().has_exports()
                && !with_guard_input(frame, |input| {
                    tree.get().check_export(py, input, &mut exports)
                })
            {
                exports.clear();
            }
            let runnable = !tree.get().has_exports() || !exports.is_empty();
            if !st.insert(&code, std::sync::Arc::new(entry.unbind())) {
                // The callback filled the cache itself meanwhile: still run what it returned.
                if let Err(e) = cache::limit_reached(&code, st) {
                    return FrameAction::Return(Err(e));
                }
            }
            if !runnable {
                return FrameAction::RunDefault;
            }
            FrameAction::Return(frame.call_with_slots(&f, &exports).map(Bound::unbind))
        }
    }
}

fn as_code<'a, 'py>(code: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyCode>> {
    code.cast::<PyCode>()
        .map_err(|_| pyo3::exceptions::PyTypeError::new_err("expected a code object"))
}

#[pyfunction]
fn set_eval_frame(py: Python<'_>, callback: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    thread::set(py, &callback)
}

#[pyfunction]
fn get_eval_frame(py: Python<'_>) -> Py<PyAny> {
    thread::current(py)
}

#[pyfunction]
fn skip_code(code: Bound<'_, PyAny>) -> PyResult<()> {
    code_extra::state_or_init(as_code(&code)?)?.set_flag(CodeFlag::Skip);
    Ok(())
}

#[pyfunction]
fn run_only_code(code: Bound<'_, PyAny>) -> PyResult<()> {
    code_extra::state_or_init(as_code(&code)?)?.set_flag(CodeFlag::RunOnly);
    Ok(())
}

#[pyfunction]
fn code_flags(code: Bound<'_, PyAny>) -> PyResult<&'static str> {
    Ok(code_extra::state(as_code(&code)?)
        .map(|s| s.flag())
        .unwrap_or(CodeFlag::Default)
        .name())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<FrameView>()?;
    m.add_class::<BackendCallback>()?;
    call::register(m)?;
    resume::register(m)?;
    m.add_function(wrap_pyfunction!(set_eval_frame, m)?)?;
    m.add_function(wrap_pyfunction!(get_eval_frame, m)?)?;
    m.add_function(wrap_pyfunction!(skip_code, m)?)?;
    m.add_function(wrap_pyfunction!(run_only_code, m)?)?;
    m.add_function(wrap_pyfunction!(code_flags, m)?)?;
    debug::register(m)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CodeState;

    #[test]
    fn pre_check_offers_only_frames_with_work() {
        let st = CodeState::default();
        // Run-only: nothing to run without entries, with or without state.
        assert!(!worth_offering(Mode::RunOnly, None));
        assert!(!worth_offering(Mode::RunOnly, Some(&st)));
        // A callback: every frame may compile.
        assert!(worth_offering(Mode::Callback, None));
        assert!(worth_offering(Mode::Callback, Some(&st)));
        // SKIP wins over everything.
        st.set_flag(CodeFlag::Skip);
        assert!(!worth_offering(Mode::Callback, Some(&st)));
        st.set_flag(CodeFlag::RunOnly);
        assert!(worth_offering(Mode::Callback, Some(&st)));
    }

    #[test]
    fn threads_start_with_the_hook_off() {
        assert_eq!(thread_hook(0), (Mode::Off, 0));
        assert_eq!(thread_hook(12345), (Mode::Off, 0));
    }
}
