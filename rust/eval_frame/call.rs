//! The native call path: what `ferrodyn.compile(fn)` and `ferrodyn.compile(module)` return
//! calls into, with no Python frame of ferrodyn's own per call.
//!
//! `CompiledFunction(fn, callback)` (called by vectorcall: no argument tuple): calling it installs `callback` as this thread's frame
//! callback (parsed once, at construction), calls `fn` with the same arguments, and restores
//! the previous callback, also when `fn` raises; nested and concurrent calls restore what they
//! replaced (thread-local state). It binds as a method (`__get__`), and carries a `__dict__`
//! for `functools.update_wrapper`.
//!
//! `ModuleCall` (also called by vectorcall) is `OptimizedModule.__call__` (installed per instance; `ModuleCallSlot` is the
//! class-level descriptor that finds it): when neither the wrapper nor the original module has
//! hooks (checked on every call: torch's global hook dicts, both modules' hook dicts,
//! `_compiled_call_impl`, the wrapper's `forward`, JIT tracing), it calls the original's
//! `forward` under the callback directly, skipping both `nn.Module.__call__` layers; otherwise
//! it takes the full `nn.Module.__call__` path of the wrapper, as before. The "no hooks"
//! verdicts are remembered with the dict version tags that prove them ([`PlainStamp`]), so a
//! call re-decides them from a few raw reads (the hook containers' lengths) instead of ~15 dict
//! lookups; JIT tracing is asked every call.
//! Owns none of the hook's decisions (`super::on_frame_cached`) or the thread state
//! (`super::thread`).
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString, PyTuple, PyWeakrefMethods, PyWeakrefReference};

use super::cached_call;
use super::thread::{self, Installed};
use crate::ffi::guard_reads::{self as reads, Held};
use crate::ffi::method;
use crate::ffi::object::{
    self as raw, enable_vectorcall, vectorcall_slot, VectorArgs, VectorcallSlot, VectorcallTarget,
};
use crate::ffi::torch_state::TracingReader;

/// A function compiled with ferrodyn (see the module docs).
#[pyclass(
    module = "ferrodyn._C",
    name = "CompiledFunction",
    frozen,
    dict,
    weakref
)]
pub struct CompiledFunction {
    func: Py<PyAny>,
    installed: Installed,
    /// Calls come in through here (`enable_vectorcall`, at registration), not `__call__`.
    vectorcall: VectorcallSlot,
}

impl VectorcallTarget for CompiledFunction {
    fn vectorcall<'py>(
        &self,
        py: Python<'py>,
        args: VectorArgs<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let func = self.func.bind(py);
        if let Some(slots) = args.positional() {
            if let Some(r) = cached_call::run(py, reads::held(func), slots, &self.installed) {
                return r;
            }
        }
        let saved = thread::enter(py, &self.installed)?;
        let r = args.forward(func);
        thread::exit(py, saved);
        r
    }
}

/// Register the classes of this module, with `CompiledFunction` called by vectorcall.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<CompiledFunction>()?;
    m.add_class::<ModuleCall>()?;
    m.add_class::<ModuleCallSlot>()?;
    m.add_function(wrap_pyfunction!(_debug_is_tracing, m)?)?;
    let sample = Bound::new(
        py,
        CompiledFunction {
            func: py.None(),
            installed: Installed::parse(&py.None().into_bound(py))?,
            vectorcall: vectorcall_slot::<CompiledFunction>(),
        },
    )?;
    enable_vectorcall(&sample, &sample.get().vectorcall)?;
    let module_sample = Bound::new(
        py,
        ModuleCall {
            wrapper: PyWeakrefReference::new(m.as_any())?.unbind(),
            orig: py.None(),
            target: sample.clone().unbind(),
            inline: false,
            module_call: py.None(),
            torch_globals: PyDict::new(py).unbind(),
            is_tracing: py.None(),
            global_stamp: PlainStamp::default(),
            wrapper_stamp: PlainStamp::default(),
            orig_stamp: PlainStamp::default(),
            object_getattribute: py.None(),
            vectorcall: vectorcall_slot::<ModuleCall>(),
        },
    )?;
    enable_vectorcall(&module_sample, &module_sample.get().vectorcall)
}

#[pymethods]
impl CompiledFunction {
    #[new]
    fn py_new(func: Bound<'_, PyAny>, callback: Bound<'_, PyAny>) -> PyResult<Self> {
        if !func.is_callable() {
            return Err(pyo3::exceptions::PyTypeError::new_err(
                "CompiledFunction: fn must be callable",
            ));
        }
        Ok(CompiledFunction {
            installed: Installed::parse(&callback)?,
            func: func.unbind(),
            vectorcall: vectorcall_slot::<CompiledFunction>(),
        })
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.call_under(py, self.func.bind(py), &Call::Tuple(args, kwargs))
    }

    /// Bind as a method, like a Python function.
    fn __get__<'py>(
        slf: Bound<'py, Self>,
        obj: Option<Bound<'py, PyAny>>,
        _owner: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match obj {
            Some(o) if !o.is_none() => {
                let py = slf.py();
                py.import(intern!(py, "types"))?
                    .getattr(intern!(py, "MethodType"))?
                    .call1((slf, o))
            }
            _ => Ok(slf.into_any()),
        }
    }

    /// Copied by reference, like a function.
    fn __copy__(slf: Bound<'_, Self>) -> Bound<'_, Self> {
        slf
    }

    fn __deepcopy__<'py>(slf: Bound<'py, Self>, _memo: Bound<'py, PyAny>) -> Bound<'py, Self> {
        slf
    }

    /// The function called under the callback.
    #[getter]
    fn _ferrodyn_orig(&self, py: Python<'_>) -> Py<PyAny> {
        self.func.clone_ref(py)
    }

    /// The callback as installed (a `BackendCallback`, a plain callable, False or None).
    #[getter]
    fn _ferrodyn_installed(&self, py: Python<'_>) -> Py<PyAny> {
        self.installed.object().clone_ref(py)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let f = self
            .func
            .bind(py)
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_default();
        format!("<ferrodyn compiled {f}>")
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.func)?;
        for o in self.installed.objects() {
            visit.call(o)?;
        }
        Ok(())
    }
}

/// `OptimizedModule.__call__` for one wrapper (see the module docs).
#[pyclass(module = "ferrodyn._C", name = "ModuleCall", frozen)]
pub struct ModuleCall {
    /// The wrapper (weakly: it holds this object).
    wrapper: Py<PyWeakrefReference>,
    orig: Py<PyAny>,
    /// The wrapper's `forward`: the original's `__call__` (or an inline frame calling it)
    /// under the callback.
    target: Py<CompiledFunction>,
    /// `target` calls an inline frame (modules whose `forward` is torch's): always call it.
    inline: bool,
    /// `torch.nn.Module.__call__`, `torch.nn.modules.module`'s globals, `torch._C._is_tracing`.
    module_call: Py<PyAny>,
    torch_globals: Py<PyDict>,
    is_tracing: Py<PyAny>,
    /// The last "no hooks" verdicts, with the version tags that prove them still current
    /// (see [`PlainStamp`]): torch's global hook dicts, the wrapper, the original.
    global_stamp: PlainStamp,
    wrapper_stamp: PlainStamp,
    orig_stamp: PlainStamp,
    /// `object.__getattribute__` (a type whose lookup is this one binds `forward` plainly).
    object_getattribute: Py<PyAny>,
    /// Calls come in through here (`enable_vectorcall`), not `__call__`.
    vectorcall: VectorcallSlot,
}

/// A "no hooks" verdict remembered for one dict of hook attributes (a module's instance
/// `__dict__`, or `torch.nn.modules.module`'s globals), stamped with that dict's version tag
/// (`crate::ffi::guard_reads::dict_version`: unique per dict and state, so an equal tag proves
/// the same dict with the same values). While it holds, the hook containers found in it are
/// the same objects (the dict keeps them alive), so the verdict is re-decided by reading their
/// lengths only (a hook registration mutates its container in place; `m._forward_hooks = {}`
/// changes the tag). Where the verdict also read `type(m)._compiled_call_impl`, the type and
/// its attribute-cache tag are stamped too. Only decided verdicts that read no Python code
/// are remembered; any difference sends the call to the full check, which stamps again.
/// Where dict tags are not read (3.13), nothing is ever stamped.
#[derive(Default)]
struct PlainStamp {
    /// The dict's version tag; 0: no verdict.
    version: AtomicU64,
    /// The four hook containers (exact dict, OrderedDict, list or tuple).
    hooks: [AtomicUsize; 4],
    /// `type(m)` and its version tag when the verdict read `_compiled_call_impl` there; 0: not
    /// read.
    type_ptr: AtomicUsize,
    type_tag: AtomicU64,
    /// For the original module: `type(m).forward`, an exact function that `m.forward` binds
    /// (no `forward` in the instance dict, `__getattribute__` is object's, the type stamped);
    /// 0: look `m.forward` up.
    forward: AtomicUsize,
}

impl PlainStamp {
    /// Whether the remembered verdict still holds for `d` (the current dict) and `obj`'s type.
    #[inline]
    fn holds(&self, d: Held, obj: Option<Held>) -> bool {
        let v = self.version.load(Ordering::Relaxed);
        if v == 0 || reads::dict_version(d) != Some(v) {
            return false;
        }
        let tag = self.type_tag.load(Ordering::Relaxed);
        if tag != 0 {
            let Some(t) = obj.map(Held::type_of) else {
                return false;
            };
            if t.addr() != self.type_ptr.load(Ordering::Relaxed)
                || reads::type_version(t).map(u64::from) != Some(tag)
            {
                return false;
            }
        }
        // The version proved the containers are the ones stamped, alive in `d`.
        self.hooks
            .iter()
            .all(|h| reads::held_at(h.load(Ordering::Relaxed)).exact_len() == Some(0))
    }

    fn clear(&self) {
        self.version.store(0, Ordering::Relaxed);
        self.forward.store(0, Ordering::Relaxed);
    }

    /// The remembered `forward` while a verdict is stamped (see the field).
    fn forward(&self) -> Option<Held> {
        let f = self.forward.load(Ordering::Relaxed);
        (f != 0 && self.version.load(Ordering::Relaxed) != 0).then(|| reads::held_at(f))
    }

    /// Remember a "no hooks" verdict on `d` at `version` (taken before the verdict was
    /// decided; nothing is stored if `d` moved since).
    fn store(
        &self,
        d: &Bound<'_, PyAny>,
        version: Option<u64>,
        hooks: &[Option<Held>; 4],
        ty: Option<(Held, u32)>,
        forward: Option<Held>,
    ) {
        self.clear();
        let Some(v) = version.filter(|&v| v != 0) else {
            return;
        };
        if reads::dict_version_of(d) != Some(v) {
            return;
        }
        for (slot, h) in self.hooks.iter().zip(hooks) {
            match h {
                Some(h) if h.exact_len() == Some(0) => slot.store(h.addr(), Ordering::Relaxed),
                _ => return,
            }
        }
        match ty {
            Some((t, tag)) => {
                self.type_ptr.store(t.addr(), Ordering::Relaxed);
                self.type_tag.store(u64::from(tag), Ordering::Relaxed);
            }
            None => self.type_tag.store(0, Ordering::Relaxed),
        }
        // A remembered forward is only valid under a stamped type (its dict holds it).
        if let (Some(f), Some((t, tag))) = (forward, ty) {
            if reads::type_version(t) == Some(tag) {
                self.forward.store(f.addr(), Ordering::Relaxed);
            }
        }
        self.version.store(v, Ordering::Relaxed);
    }
}

/// What deciding "no hooks" on one dict of hook attributes found: the verdict, and what
/// [`PlainStamp::store`] needs to remember it (None where it cannot be remembered).
struct Verdict {
    plain: bool,
    hooks: [Option<Held>; 4],
    /// `Some(None)`: no type attribute read; `Some(Some(..))`: `type(m)` and its tag, fixed
    /// while the tag is; None: a read that cannot be stamped.
    ty: Option<Option<(Held, u32)>>,
}

/// Whether the hook containers named `names` in `d` are all empty (each present, a dict
/// empty, anything else falsy). A container that is not an exact dict, OrderedDict, list or
/// tuple is not stampable.
fn empty_hooks(d: &Bound<'_, PyDict>, names: [&Bound<'_, PyString>; 4]) -> Verdict {
    let mut out = Verdict {
        plain: true,
        hooks: [None; 4],
        ty: Some(None),
    };
    for (slot, name) in out.hooks.iter_mut().zip(names) {
        let empty = match d.get_item(name) {
            Ok(Some(v)) => {
                let h = reads::held(&v);
                *slot = h.exact_len().map(|_| h);
                match v.cast::<PyDict>() {
                    Ok(hd) => hd.is_empty(),
                    Err(_) => !v.is_truthy().unwrap_or(true),
                }
            }
            _ => false,
        };
        if !empty {
            out.plain = false;
            return out;
        }
    }
    out
}

/// Whether an nn.Module's instance dict says `__call__` is exactly `forward` (no hooks, no
/// `_compiled_call_impl`). Anything unexpected (a missing attribute) says no.
fn plain_module(py: Python<'_>, m: &Bound<'_, PyAny>, d: &Bound<'_, PyDict>) -> Verdict {
    let mut v = empty_hooks(
        d,
        [
            intern!(py, "_forward_hooks"),
            intern!(py, "_forward_pre_hooks"),
            intern!(py, "_backward_hooks"),
            intern!(py, "_backward_pre_hooks"),
        ],
    );
    if !v.plain {
        return v;
    }
    let name = intern!(py, "_compiled_call_impl");
    v.plain = match d.get_item(name) {
        Ok(Some(c)) => c.is_none(),
        // Not set on the instance: nn.Module's class-level None (unless a class overrides it).
        _ => {
            let t = m.get_type();
            let c = t.getattr(name);
            v.ty = match &c {
                Ok(c) if reads::type_attr_is_mro_entry(t.as_any(), name, c) => {
                    let th = reads::held(t.as_any());
                    reads::type_version(th).map(|tag| Some((th, tag)))
                }
                _ => None,
            };
            c.is_ok_and(|c| c.is_none())
        }
    };
    v
}

fn no_global_hooks(py: Python<'_>, g: &Bound<'_, PyDict>) -> Verdict {
    empty_hooks(
        g,
        [
            intern!(py, "_global_forward_hooks"),
            intern!(py, "_global_forward_pre_hooks"),
            intern!(py, "_global_backward_hooks"),
            intern!(py, "_global_backward_pre_hooks"),
        ],
    )
}

fn module_dict<'py>(m: &Bound<'py, PyAny>) -> Option<Bound<'py, PyDict>> {
    raw::instance_dict(m).and_then(|d| d.cast_into::<PyDict>().ok())
}

#[pymethods]
impl ModuleCall {
    #[new]
    fn py_new(
        wrapper: Bound<'_, PyAny>,
        orig: Bound<'_, PyAny>,
        target: Bound<'_, CompiledFunction>,
        inline: bool,
    ) -> PyResult<Self> {
        let py = wrapper.py();
        let module = py.import("torch.nn.modules.module")?;
        Ok(ModuleCall {
            wrapper: PyWeakrefReference::new(&wrapper)?.unbind(),
            orig: orig.unbind(),
            target: target.unbind(),
            inline,
            module_call: module
                .getattr("Module")?
                .getattr(intern!(py, "__call__"))?
                .unbind(),
            torch_globals: module.dict().unbind(),
            is_tracing: py.import("torch._C")?.getattr("_is_tracing")?.unbind(),
            global_stamp: PlainStamp::default(),
            wrapper_stamp: PlainStamp::default(),
            orig_stamp: PlainStamp::default(),
            object_getattribute: py
                .get_type::<pyo3::types::PyAny>()
                .getattr(intern!(py, "__getattribute__"))?
                .unbind(),
            vectorcall: vectorcall_slot::<ModuleCall>(),
        })
    }

    #[pyo3(signature = (*args, **kwargs))]
    fn __call__<'py>(
        &self,
        py: Python<'py>,
        args: &Bound<'py, PyTuple>,
        kwargs: Option<&Bound<'py, PyDict>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.dispatch(py, Call::Tuple(args, kwargs))
    }

    /// Which "no hooks" verdicts are remembered now: (torch's globals, wrapper, original).
    #[getter]
    fn _stamped(&self) -> (bool, bool, bool) {
        let on = |s: &PlainStamp| s.version.load(Ordering::Relaxed) != 0;
        (
            on(&self.global_stamp),
            on(&self.wrapper_stamp),
            on(&self.orig_stamp),
        )
    }

    /// Whether the original's `forward` is remembered (bound without a lookup).
    #[getter]
    fn _forward_stamped(&self) -> bool {
        self.orig_stamp.forward().is_some()
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.orig)?;
        visit.call(&self.target)?;
        Ok(())
    }
}

/// A call's arguments: as `tp_call` receives them, or as vectorcall does.
enum Call<'a, 'py> {
    Tuple(&'a Bound<'py, PyTuple>, Option<&'a Bound<'py, PyDict>>),
    Vector(VectorArgs<'a>),
}

impl<'py> Call<'_, 'py> {
    /// `f(*args, **kwargs)`.
    fn call(&self, f: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        match self {
            Call::Tuple(args, kwargs) => f.call((*args).clone(), *kwargs),
            Call::Vector(v) => v.forward(f),
        }
    }

    /// `f(first, *args, **kwargs)`.
    fn call_with_first(
        &self,
        f: &Bound<'py, PyAny>,
        first: Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = f.py();
        match self {
            Call::Tuple(args, kwargs) => {
                let full: Vec<Bound<'py, PyAny>> =
                    std::iter::once(first).chain(args.iter()).collect();
                f.call(PyTuple::new(py, full)?, *kwargs)
            }
            Call::Vector(v) => {
                let (args, kwargs) = v.to_tuple_dict(py, Some(&first))?;
                f.call(args, kwargs.as_ref())
            }
        }
    }
}

impl CompiledFunction {
    /// `func(*call)` with this function's callback installed.
    fn call_under<'py>(
        &self,
        py: Python<'py>,
        func: &Bound<'py, PyAny>,
        call: &Call<'_, 'py>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let saved = thread::enter(py, &self.installed)?;
        let r = call.call(func);
        thread::exit(py, saved);
        r
    }
}

impl VectorcallTarget for ModuleCall {
    fn vectorcall<'py>(
        &self,
        py: Python<'py>,
        args: VectorArgs<'_>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.dispatch(py, Call::Vector(args))
    }
}

/// torch's C++ reader of the JIT tracing state (`crate::ffi::torch_state::TracingReader`),
/// if found in the loaded `libtorch_cpu.so` and in agreement with `torch._C._is_tracing()`
/// (tests/test_native_call.py also checks it inside a `torch.jit.trace`).
fn tracing_reader(py: Python<'_>) -> Option<&'static TracingReader> {
    static READER: pyo3::sync::PyOnceLock<Option<TracingReader>> = pyo3::sync::PyOnceLock::new();
    READER
        .get_or_init(py, || {
            let find = || -> PyResult<Option<TracingReader>> {
                let torch = py.import("torch")?;
                let file: String = torch.getattr("__file__")?.extract()?;
                let lib = std::path::Path::new(&file).with_file_name("lib");
                let Some(r) =
                    TracingReader::resolve(&lib.join("libtorch_cpu.so").to_string_lossy())
                else {
                    return Ok(None);
                };
                let now: bool = torch
                    .getattr("_C")?
                    .call_method0("_is_tracing")?
                    .extract()?;
                Ok((r.is_tracing() == now).then_some(r))
            };
            find().unwrap_or(None)
        })
        .as_ref()
}

/// Whether a JIT trace runs on this thread, as `torch._C._is_tracing()` says (through the
/// direct reader when there is one), for tests.
#[pyfunction]
pub fn _debug_is_tracing(py: Python<'_>) -> PyResult<(bool, bool)> {
    let direct = tracing_reader(py).is_some();
    let v = match tracing_reader(py) {
        Some(r) => r.is_tracing(),
        None => py
            .import("torch")?
            .getattr("_C")?
            .call_method0("_is_tracing")?
            .is_truthy()?,
    };
    Ok((v, direct))
}

impl ModuleCall {
    fn dispatch<'py>(&self, py: Python<'py>, call: Call<'_, 'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(wrapper) = self.wrapper.bind(py).upgrade() else {
            return Err(pyo3::exceptions::PyReferenceError::new_err(
                "ferrodyn: the OptimizedModule of this call has died",
            ));
        };
        let target = self.target.bind(py);
        let wrapper_plain =
            self.no_hooks_global(py) && self.wrapper_plain(py, &wrapper, target) && {
                // JIT tracing is thread-local C++ state with no Python-visible flag: asked
                // every call, of torch's own reader where it was found and agreed with
                // `torch._C._is_tracing()`.
                !match tracing_reader(py) {
                    Some(r) => r.is_tracing(),
                    None => self.is_tracing.bind(py).call0()?.is_truthy()?,
                }
            };
        if !wrapper_plain {
            // Hooks on the wrapper (or global ones, or JIT tracing): nn.Module.__call__ runs
            // them and calls the wrapper's forward, whatever it is now.
            return call.call_with_first(self.module_call.bind(py), wrapper);
        }
        let t = target.get();
        let orig = self.orig.bind(py);
        if self.inline || !self.orig_plain(py, orig) {
            return t.call_under(py, t.func.bind(py), &call);
        }
        let forward = match (self.orig_stamp.forward(), &call) {
            // The remembered `forward` called with the module first: what the bound method
            // would do, without making one.
            (Some(f), Call::Vector(v)) => {
                let cached =
                    v.with_first(orig, |slots| cached_call::run(py, f, slots, &t.installed));
                if let Some(Some(r)) = cached {
                    return r;
                }
                let saved = thread::enter(py, &t.installed)?;
                let r = v.forward_with_first(f, orig);
                thread::exit(py, saved);
                return r;
            }
            (Some(f), Call::Tuple(..)) => method::bound_method(f, orig)?,
            (None, _) => orig.getattr(intern!(py, "forward"))?,
        };
        t.call_under(py, &forward, &call)
    }

    /// torch's four global hook dicts are empty (stamped: see [`PlainStamp`]).
    fn no_hooks_global(&self, py: Python<'_>) -> bool {
        let g = self.torch_globals.bind(py);
        let gh = reads::held_dict(g);
        if self.global_stamp.holds(gh, None) {
            return true;
        }
        let before = reads::dict_version(gh);
        let v = no_global_hooks(py, g);
        if v.plain {
            self.global_stamp
                .store(g.as_any(), before, &v.hooks, None, None);
        } else {
            self.global_stamp.clear();
        }
        v.plain
    }

    /// The wrapper has no hooks and its `forward` is still `target` (stamped).
    fn wrapper_plain<'py>(
        &self,
        py: Python<'py>,
        wrapper: &Bound<'py, PyAny>,
        target: &Bound<'py, CompiledFunction>,
    ) -> bool {
        let w = reads::held(wrapper);
        if let Some(d) = w.instance_dict() {
            if self.wrapper_stamp.holds(d, Some(w)) {
                return true;
            }
        }
        self.decide(
            py,
            wrapper,
            &self.wrapper_stamp,
            false,
            |d: &Bound<'py, PyDict>| {
                matches!(d.get_item(intern!(py, "forward")), Ok(Some(f)) if f.is(target))
            },
        )
    }

    /// The original module has no hooks (stamped).
    fn orig_plain<'py>(&self, py: Python<'py>, orig: &Bound<'py, PyAny>) -> bool {
        let o = reads::held(orig);
        if let Some(d) = o.instance_dict() {
            if self.orig_stamp.holds(d, Some(o)) {
                return true;
            }
        }
        self.decide(py, orig, &self.orig_stamp, true, |_| true)
    }

    /// `type(m).forward` when `m.forward` is exactly that function bound to `m` and stays so
    /// while `m`'s dict version and its type's tag (`ty`) do: not in `m`'s dict, found as the
    /// type's own MRO entry, an exact function, and the type's `__getattribute__` is
    /// object's (nn.Module's `__getattr__` only runs when that lookup fails).
    fn plain_forward<'py>(
        &self,
        py: Python<'py>,
        d: &Bound<'py, PyDict>,
        ty: (Held, u32),
    ) -> Option<Held> {
        let name = intern!(py, "forward");
        if !matches!(d.get_item(name), Ok(None)) {
            return None;
        }
        let t = ty.0.bound(py);
        let getattribute = t.getattr(intern!(py, "__getattribute__")).ok()?;
        if !getattribute.is(self.object_getattribute.bind(py)) {
            return None;
        }
        let f = t.getattr(name).ok()?;
        let h = reads::held(&f);
        // `function_globals` answers only for exact Python functions.
        (reads::type_attr_is_mro_entry(&t, name, &f) && h.function_globals().is_some()).then_some(h)
    }

    /// The full check of one module (its hooks, `_compiled_call_impl`, and `also`), stamping a
    /// "no hooks" verdict.
    fn decide<'py>(
        &self,
        py: Python<'py>,
        m: &Bound<'py, PyAny>,
        stamp: &PlainStamp,
        with_forward: bool,
        also: impl FnOnce(&Bound<'py, PyDict>) -> bool,
    ) -> bool {
        stamp.clear();
        let Some(d) = module_dict(m) else {
            return false;
        };
        let before = reads::dict_version_of(d.as_any());
        let v = plain_module(py, m, &d);
        let plain = v.plain && also(&d);
        if plain {
            if let Some(ty) = v.ty {
                let forward = match ty {
                    Some(ty) if with_forward => self.plain_forward(py, &d, ty),
                    _ => None,
                };
                stamp.store(d.as_any(), before, &v.hooks, ty, forward);
            }
        }
        plain
    }
}

/// The class-level `OptimizedModule.__call__`: reading it on an instance gives that instance's
/// `ModuleCall` (from its `__dict__`, no allocation), so `opt(x)` enters Rust directly. An
/// instance without one (mid-construction) gets `nn.Module.__call__` bound to it.
#[pyclass(module = "ferrodyn._C", name = "ModuleCallSlot", frozen)]
pub struct ModuleCallSlot {}

#[pymethods]
impl ModuleCallSlot {
    #[new]
    fn py_new() -> Self {
        ModuleCallSlot {}
    }

    fn __get__<'py>(
        slf: Bound<'py, Self>,
        obj: Option<Bound<'py, PyAny>>,
        _owner: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let Some(obj) = obj.filter(|o| !o.is_none()) else {
            return Ok(slf.into_any());
        };
        if let Some(d) = module_dict(&obj) {
            if let Ok(Some(c)) = d.get_item(intern!(py, "_ferrodyn_call")) {
                return Ok(c);
            }
        }
        let call = py
            .import(intern!(py, "torch.nn"))?
            .getattr(intern!(py, "Module"))?
            .getattr(intern!(py, "__call__"))?;
        py.import(intern!(py, "types"))?
            .getattr(intern!(py, "MethodType"))?
            .call1((call, obj))
    }
}
