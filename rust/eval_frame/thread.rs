//! The thread-local callback (with the backend id whose cache entries this thread's frames may
//! run: [`BackendCallback`]) and the interpreter-wide install count.
//!
//! The hot path reads a `thread_local!` cell: the thread's mode and the thread state it was set
//! for. Each thread that ever set a callback also has a [`CallbackHolder`] in its thread
//! state's dict, sharing an `active` flag with the thread-local slot: the flag is this thread's
//! share of the install count. `set_eval_frame` flips the flag (no dict work after the first
//! call on a thread); CPython clears the dict when the thread state is cleared (thread exit,
//! GIL held), and the holder's drop gives back the share of a thread that exits with a
//! callback still set. The PEP 523 function is installed while the count is non-zero.
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyBool;

use crate::ffi::frame as hook;

/// What the hook does for frames of this thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No callback: frames run unchanged.
    Off,
    /// `False`: cached entries run, misses run the frame normally.
    RunOnly,
    /// A callable: misses call it.
    Callback,
}

#[derive(Clone, Copy)]
struct ThreadHook {
    mode: Mode,
    /// Inside the callback: its own frames run unchanged.
    in_callback: bool,
    /// The thread state the mode was set for (0: none).
    tstate: usize,
    /// The backend whose entries this thread's frames may run (0: any; see [`thread_hook`]).
    backend_id: i64,
}

const OFF: ThreadHook = ThreadHook {
    mode: Mode::Off,
    in_callback: false,
    tstate: 0,
    backend_id: 0,
};

/// This thread's link to its holder.
struct Slot {
    tstate: usize,
    active: Arc<AtomicBool>,
}

thread_local! {
    static HOOK: Cell<ThreadHook> = const { Cell::new(OFF) };
    /// (the object as set — returned by `get_eval_frame` —, the callable to call on a miss).
    static CALLBACK: RefCell<Option<(Py<PyAny>, Py<PyAny>)>> = const { RefCell::new(None) };
    static SLOT: RefCell<Option<Slot>> = const { RefCell::new(None) };
}

/// Threads with a non-None callback (holders whose flag is set).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);

/// The hot-path read: this thread's mode for frames of thread state `tstate` and its backend
/// id, in one thread-local access (in a shared library each access is a call to
/// `__tls_get_addr`). A lookup runs only entries whose `backend_id` is this one, or 0; 0 (a
/// plain callable, run-only `False`, or no callback) matches every entry, as torch's run-only
/// mode accepts entries of any backend.
#[inline]
pub fn thread_hook(tstate: usize) -> (Mode, i64) {
    HOOK.with(|h| {
        let h = h.get();
        if h.tstate != tstate || h.in_callback {
            (Mode::Off, 0)
        } else {
            (h.mode, h.backend_id)
        }
    })
}

/// A frame callback tied to a backend: `set_eval_frame(BackendCallback(cb, id))` calls `cb` on
/// a miss and makes lookups consider only entries with `backend_id` `id` (or 0). The object
/// itself is what `set_eval_frame` returns as the prior callback, so the usual
/// `prior = set_eval_frame(x) ... set_eval_frame(prior)` restores the backend id too.
#[pyclass(module = "ferrodyn._C", name = "BackendCallback", frozen)]
pub struct BackendCallback {
    callback: Py<PyAny>,
    backend_id: i64,
}

#[pymethods]
impl BackendCallback {
    #[new]
    fn py_new(callback: Bound<'_, PyAny>, backend_id: i64) -> PyResult<Self> {
        if !callback.is_callable() || callback.is_instance_of::<BackendCallback>() {
            return Err(PyTypeError::new_err(
                "BackendCallback: callback must be a callable (not a BackendCallback)",
            ));
        }
        if backend_id < 0 {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "BackendCallback: backend_id must be >= 0",
            ));
        }
        Ok(BackendCallback {
            callback: callback.unbind(),
            backend_id,
        })
    }

    #[getter]
    fn callback(&self, py: Python<'_>) -> Py<PyAny> {
        self.callback.clone_ref(py)
    }

    #[getter]
    fn backend_id(&self) -> i64 {
        self.backend_id
    }

    /// Calls the callback (so the object is itself a valid callback).
    fn __call__(&self, py: Python<'_>, frame: Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.callback.bind(py).call1((frame,)).map(Bound::unbind)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let cb = self
            .callback
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_default();
        format!("<BackendCallback {cb} backend_id={}>", self.backend_id)
    }
}

/// Lives in a thread state's dict; owns that thread's share of the install count while
/// `active` is set.
#[pyclass(module = "ferrodyn._C", name = "_CallbackHolder", frozen)]
pub struct CallbackHolder {
    active: Arc<AtomicBool>,
}

// The flags and the count are only written with the GIL held (`switch` runs under it, and a
// holder is dropped under it), so a plain load and store replaces each locked
// read-modify-write (two per compiled call each way): the GIL serialises the writers.

fn activate(active: &AtomicBool) {
    if !active.load(Ordering::Relaxed) {
        active.store(true, Ordering::Relaxed);
        ACTIVE.store(ACTIVE.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    }
}

/// Clear the flag; true when that gave back the last share (the caller uninstalls).
fn release(active: &AtomicBool) -> bool {
    if !active.load(Ordering::Relaxed) {
        return false;
    }
    active.store(false, Ordering::Relaxed);
    let n = ACTIVE.load(Ordering::Relaxed).saturating_sub(1);
    ACTIVE.store(n, Ordering::Relaxed);
    n == 0
}

fn deactivate(active: &AtomicBool) {
    if release(active) {
        let _ = Python::try_attach(hook::uninstall);
    }
}

impl Drop for CallbackHolder {
    fn drop(&mut self) {
        // Dropped with the GIL held, when the thread state's dict is cleared (or the holder is
        // replaced). On its own thread, forget the thread-local state too.
        let mine = SLOT
            .try_with(|s| {
                s.try_borrow_mut().ok().is_some_and(|mut s| {
                    let mine = s
                        .as_ref()
                        .is_some_and(|s| Arc::ptr_eq(&s.active, &self.active));
                    if mine {
                        *s = None;
                    }
                    mine
                })
            })
            .unwrap_or(false);
        if mine {
            let _ = HOOK.try_with(|h| h.set(OFF));
            let old = CALLBACK
                .try_with(|c| c.try_borrow_mut().ok().and_then(|mut c| c.take()))
                .ok()
                .flatten();
            drop(old);
        }
        deactivate(&self.active);
    }
}

/// This thread's callback as Python sees it: None, False or the callable.
pub fn current(py: Python<'_>) -> Py<PyAny> {
    current_for(py, hook::current_thread_state(py))
}

fn current_for(py: Python<'_>, tstate: usize) -> Py<PyAny> {
    let h = HOOK.with(|h| h.get());
    if h.tstate != tstate {
        return py.None();
    }
    match h.mode {
        Mode::Off => py.None(),
        Mode::RunOnly => PyBool::new(py, false).to_owned().into_any().unbind(),
        Mode::Callback => CALLBACK
            .with(|c| c.borrow().as_ref().map(|c| c.0.clone_ref(py)))
            .unwrap_or_else(|| py.None()),
    }
}

/// The callback to call on a miss (Mode::Callback only).
pub fn callback(py: Python<'_>) -> Option<Py<PyAny>> {
    CALLBACK.with(|c| c.borrow().as_ref().map(|c| c.1.clone_ref(py)))
}

/// The mode, backend id and callable (Mode::Callback) that `new` sets.
fn parse_mode<'py>(new: &Bound<'py, PyAny>) -> PyResult<(Mode, i64, Option<Bound<'py, PyAny>>)> {
    if new.is_none() {
        return Ok((Mode::Off, 0, None)); // the common restore: no type checks
    }
    if let Ok(bc) = new.cast::<BackendCallback>() {
        let bc = bc.get();
        return Ok((
            Mode::Callback,
            bc.backend_id,
            Some(bc.callback.bind(new.py()).clone()),
        ));
    }
    let mode = parse_plain(new)?;
    Ok((mode, 0, (mode == Mode::Callback).then(|| new.clone())))
}

fn parse_plain(new: &Bound<'_, PyAny>) -> PyResult<Mode> {
    if new.is_none() {
        Ok(Mode::Off)
    } else if new.is_instance_of::<PyBool>() {
        if new.is_truthy()? {
            return Err(PyTypeError::new_err(
                "set_eval_frame: expected None, False or a callable, got True",
            ));
        }
        Ok(Mode::RunOnly)
    } else if new.is_callable() {
        Ok(Mode::Callback)
    } else {
        Err(PyTypeError::new_err(format!(
            "set_eval_frame: expected None, False or a callable, got {}",
            new.get_type().name()?
        )))
    }
}

/// Create this thread state's holder and link it (first callback set on a thread state).
fn thread_flag(py: Python<'_>, tstate: usize) -> PyResult<()> {
    let dict = hook::thread_state_dict(py)
        .ok_or_else(|| PyRuntimeError::new_err("ferrodyn: no thread state dict"))?;
    let active = Arc::new(AtomicBool::new(false));
    let holder = Py::new(
        py,
        CallbackHolder {
            active: Arc::clone(&active),
        },
    )?;
    // Link first, so that a stale holder replaced below is not taken for this thread's.
    let stale = SLOT.with(|s| {
        s.borrow_mut().replace(Slot {
            tstate,
            active: Arc::clone(&active),
        })
    });
    drop(stale);
    dict.set_item(intern!(py, "ferrodyn._C.eval_frame_callback"), holder)?;
    Ok(())
}

/// Set this thread's callback; returns the previous one.
pub fn set(py: Python<'_>, new: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let (mode, backend_id, call) = parse_mode(new)?;
    let tstate = hook::current_thread_state(py);
    let prev = current_for(py, tstate);
    let cb = call.map(|call| (new.clone().unbind(), call.unbind()));
    let old_cb = switch(py, tstate, mode, backend_id, cb)?;
    drop(old_cb); // last: may run Python code
    Ok(prev)
}

/// Make (mode, backend_id, cb) this thread's hook state for thread state `tstate`, keeping the
/// in-callback flag; returns the callback slot's previous content (the caller drops it, outside
/// any borrow: dropping may run Python code).
fn switch(
    py: Python<'_>,
    tstate: usize,
    mode: Mode,
    backend_id: i64,
    cb: Option<(Py<PyAny>, Py<PyAny>)>,
) -> PyResult<Option<(Py<PyAny>, Py<PyAny>)>> {
    let h = HOOK.with(|h| h.get());
    let in_callback = h.in_callback && h.tstate == tstate;
    if mode != Mode::Off && !SLOT.with(|s| s.borrow().as_ref().is_some_and(|s| s.tstate == tstate))
    {
        thread_flag(py, tstate)?; // first callback on this thread state: create its holder
    }
    let old_cb = CALLBACK.with(|c| std::mem::replace(&mut *c.borrow_mut(), cb));
    HOOK.with(|c| {
        c.set(ThreadHook {
            mode,
            in_callback,
            tstate,
            backend_id,
        })
    });
    // Flip this thread's share of the install count (a thread without a holder has none).
    let uninstall = SLOT.with(
        |s| match s.borrow().as_ref().filter(|s| s.tstate == tstate) {
            Some(slot) if mode == Mode::Off => release(&slot.active),
            Some(slot) => {
                activate(&slot.active);
                false
            }
            None => false,
        },
    );
    if mode != Mode::Off {
        hook::install(py);
    } else if uninstall {
        hook::uninstall(py);
    }
    Ok(old_cb)
}

/// A callback parsed once (what `set_eval_frame(obj)` would install), for the native call
/// path (`CompiledFunction`): entering it costs no type checks.
pub struct Installed {
    obj: Py<PyAny>,
    call: Option<Py<PyAny>>,
    mode: Mode,
    backend_id: i64,
}

impl Installed {
    pub fn parse(new: &Bound<'_, PyAny>) -> PyResult<Installed> {
        let (mode, backend_id, call) = parse_mode(new)?;
        Ok(Installed {
            obj: new.clone().unbind(),
            call: call.map(Bound::unbind),
            mode,
            backend_id,
        })
    }

    pub fn object(&self) -> &Py<PyAny> {
        &self.obj
    }

    /// The mode and backend a frame sees while this callback is installed.
    pub fn mode(&self) -> (Mode, i64) {
        (self.mode, self.backend_id)
    }

    /// The Python objects held (for the owner's GC traversal).
    pub fn objects(&self) -> impl Iterator<Item = &Py<PyAny>> {
        std::iter::once(&self.obj).chain(self.call.iter())
    }
}

/// What [`enter`] replaced, restored by [`exit`].
pub struct Saved {
    tstate: usize,
    mode: Mode,
    backend_id: i64,
    cb: Option<(Py<PyAny>, Py<PyAny>)>,
}

/// Install `inst` as this thread's callback for a call: the native equivalent of
/// `prior = set_eval_frame(obj)`; [`exit`] is `set_eval_frame(prior)`.
pub fn enter(py: Python<'_>, inst: &Installed) -> PyResult<Saved> {
    let tstate = hook::current_thread_state(py);
    let h = HOOK.with(|h| h.get());
    let cb = inst
        .call
        .as_ref()
        .map(|c| (inst.obj.clone_ref(py), c.clone_ref(py)));
    let old = switch(py, tstate, inst.mode, inst.backend_id, cb)?;
    if h.tstate == tstate {
        Ok(Saved {
            tstate,
            mode: h.mode,
            backend_id: h.backend_id,
            cb: old,
        })
    } else {
        // The thread-local state was another thread state's: as `current_for`, prior is None.
        drop(old.map(|(a, b)| (a.into_bound(py), b.into_bound(py))));
        Ok(Saved {
            tstate,
            mode: Mode::Off,
            backend_id: 0,
            cb: None,
        })
    }
}

/// Restore what [`enter`] replaced.
pub fn exit(py: Python<'_>, saved: Saved) {
    let Saved {
        tstate,
        mode,
        backend_id,
        cb,
    } = saved;
    // Restoring never creates a holder (`enter` made one if any mode other than Off was set on
    // this thread state), so it cannot fail; if it ever did, the thread's hook is left off.
    match switch(py, tstate, mode, backend_id, cb) {
        // Released as `Bound`s: the native call path runs under a bare token, where a dropped
        // `Py` would wait in pyo3's deferred pool.
        Ok(old) => drop(old.map(|(a, b)| (a.into_bound(py), b.into_bound(py)))),
        Err(e) => {
            let _ = switch(py, tstate, Mode::Off, 0, None).map(drop);
            e.write_unraisable(py, None);
        }
    }
}

/// Run `f` with this thread's hook off for the frames `f` runs (the callback's own frames).
pub fn with_callback_off<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            let was = self.0;
            let _ = HOOK.try_with(|h| {
                let mut v = h.get();
                v.in_callback = was;
                h.set(v);
            });
        }
    }
    let was = HOOK.with(|h| {
        let mut v = h.get();
        let was = v.in_callback;
        v.in_callback = true;
        h.set(v);
        was
    });
    let _restore = Restore(was);
    f()
}

/// Threads that currently have a callback (for tests).
pub fn active_threads() -> usize {
    ACTIVE.load(Ordering::Relaxed)
}
