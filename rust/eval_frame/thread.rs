//! The thread-local callback and the interpreter-wide install count.
//!
//! Each thread's callback is kept twice: the hot path reads a `thread_local!` cell (its mode
//! and the thread state it belongs to), and a [`CallbackHolder`] stored in the thread state's
//! dict owns the thread's share of the install count. CPython clears that dict when the thread
//! state is cleared (thread exit), with the GIL held, so a thread that exits with a callback set
//! still gives its share back, and the PEP 523 function is uninstalled when the last one goes.
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pyo3::exceptions::PyTypeError;
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
    /// The id of this thread's `CallbackHolder` (0: none).
    holder: u64,
}

const OFF: ThreadHook = ThreadHook {
    mode: Mode::Off,
    in_callback: false,
    tstate: 0,
    holder: 0,
};

thread_local! {
    static HOOK: Cell<ThreadHook> = const { Cell::new(OFF) };
    static CALLBACK: RefCell<Option<Py<PyAny>>> = const { RefCell::new(None) };
}

/// Threads with a non-None callback (live holders).
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static NEXT_HOLDER: AtomicU64 = AtomicU64::new(1);
const HOLDER_KEY: &str = "ferrodyn._C.eval_frame_callback";

/// The hot-path read: this thread's mode for frames of thread state `tstate`.
#[inline]
pub fn thread_mode(tstate: usize) -> Mode {
    HOOK.with(|h| {
        let h = h.get();
        if h.tstate != tstate || h.in_callback {
            Mode::Off
        } else {
            h.mode
        }
    })
}

/// Owns one thread's share of the install count; lives in the thread state's dict.
#[pyclass(module = "ferrodyn._C", name = "_CallbackHolder", frozen)]
pub struct CallbackHolder {
    id: u64,
}

impl Drop for CallbackHolder {
    fn drop(&mut self) {
        // Dropped with the GIL held: by set_eval_frame(None) or when the thread state is cleared.
        let mine = HOOK
            .try_with(|h| h.get().holder == self.id)
            .unwrap_or(false);
        if mine {
            let _ = HOOK.try_with(|h| h.set(OFF));
            let old = CALLBACK.try_with(|c| c.borrow_mut().take()).ok().flatten();
            drop(old);
        }
        if ACTIVE.fetch_sub(1, Ordering::AcqRel) == 1 {
            let _ = Python::try_attach(hook::uninstall);
        }
    }
}

/// This thread's callback as Python sees it: None, False or the callable.
pub fn current(py: Python<'_>) -> Py<PyAny> {
    let h = HOOK.with(|h| h.get());
    if h.tstate != hook::current_thread_state(py) {
        return py.None();
    }
    match h.mode {
        Mode::Off => py.None(),
        Mode::RunOnly => PyBool::new(py, false).to_owned().into_any().unbind(),
        Mode::Callback => CALLBACK
            .with(|c| c.borrow().as_ref().map(|c| c.clone_ref(py)))
            .unwrap_or_else(|| py.None()),
    }
}

/// The callback to call on a miss (Mode::Callback only).
pub fn callback(py: Python<'_>) -> Option<Py<PyAny>> {
    CALLBACK.with(|c| c.borrow().as_ref().map(|c| c.clone_ref(py)))
}

/// Set this thread's callback; returns the previous one.
pub fn set(py: Python<'_>, new: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let mode = if new.is_none() {
        Mode::Off
    } else if new.is_instance_of::<PyBool>() {
        if new.is_truthy()? {
            return Err(PyTypeError::new_err(
                "set_eval_frame: expected None, False or a callable, got True",
            ));
        }
        Mode::RunOnly
    } else if new.is_callable() {
        Mode::Callback
    } else {
        return Err(PyTypeError::new_err(format!(
            "set_eval_frame: expected None, False or a callable, got {}",
            new.get_type().name()?
        )));
    };
    let prev = current(py);
    let tstate = hook::current_thread_state(py);
    let dict = hook::thread_state_dict(py).ok_or_else(|| {
        pyo3::exceptions::PyRuntimeError::new_err("ferrodyn: no thread state dict")
    })?;
    let old_cb = CALLBACK.with(|c| {
        let mut c = c.borrow_mut();
        std::mem::replace(
            &mut *c,
            if mode == Mode::Callback {
                Some(new.clone().unbind())
            } else {
                None
            },
        )
    });
    let h = HOOK.with(|h| h.get());
    let has_holder = h.holder != 0 && h.tstate == tstate && dict.contains(HOLDER_KEY)?;
    if mode == Mode::Off {
        HOOK.with(|c| {
            c.set(ThreadHook {
                in_callback: h.in_callback && h.tstate == tstate,
                ..OFF
            })
        });
        if has_holder {
            dict.del_item(HOLDER_KEY)?; // drops the holder: count down, maybe uninstall
        }
    } else {
        let holder = if has_holder {
            h.holder
        } else {
            let id = NEXT_HOLDER.fetch_add(1, Ordering::Relaxed);
            ACTIVE.fetch_add(1, Ordering::AcqRel);
            // Set the TLS first so a holder left over from an earlier thread state is not "mine".
            HOOK.with(|c| {
                c.set(ThreadHook {
                    mode,
                    in_callback: h.in_callback,
                    tstate,
                    holder: id,
                })
            });
            dict.set_item(HOLDER_KEY, Py::new(py, CallbackHolder { id })?)?;
            id
        };
        HOOK.with(|c| {
            c.set(ThreadHook {
                mode,
                in_callback: h.in_callback && h.tstate == tstate,
                tstate,
                holder,
            })
        });
        hook::install(py);
    }
    drop(old_cb); // last: may run Python code
    Ok(prev)
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
