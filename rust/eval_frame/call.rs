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
//! it takes the full `nn.Module.__call__` path of the wrapper, as before.
//! Owns none of the hook's decisions (`super::on_frame_cached`) or the thread state
//! (`super::thread`).
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple, PyWeakrefMethods, PyWeakrefReference};

use super::thread::{self, Installed};
use crate::ffi::object::{
    self as raw, enable_vectorcall, vectorcall_slot, VectorArgs, VectorcallSlot, VectorcallTarget,
};

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
        let saved = thread::enter(py, &self.installed)?;
        let r = args.forward(self.func.bind(py));
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
    /// Calls come in through here (`enable_vectorcall`), not `__call__`.
    vectorcall: VectorcallSlot,
}

/// Whether an nn.Module's instance dict says `__call__` is exactly `forward` (no hooks, no
/// `_compiled_call_impl`). Anything unexpected (a missing attribute) says no.
fn plain_module(py: Python<'_>, m: &Bound<'_, PyAny>, d: &Bound<'_, PyDict>) -> bool {
    let empty = |name: &Bound<'_, pyo3::types::PyString>| match d.get_item(name) {
        Ok(Some(v)) => match v.cast::<PyDict>() {
            Ok(h) => h.is_empty(),
            Err(_) => !v.is_truthy().unwrap_or(true),
        },
        _ => false,
    };
    empty(intern!(py, "_forward_hooks"))
        && empty(intern!(py, "_forward_pre_hooks"))
        && empty(intern!(py, "_backward_hooks"))
        && empty(intern!(py, "_backward_pre_hooks"))
        && match d.get_item(intern!(py, "_compiled_call_impl")) {
            Ok(Some(v)) => v.is_none(),
            // Not set on the instance: nn.Module's class-level None (unless a class overrides it).
            _ => m
                .get_type()
                .getattr(intern!(py, "_compiled_call_impl"))
                .is_ok_and(|v| v.is_none()),
        }
}

fn no_global_hooks(py: Python<'_>, g: &Bound<'_, PyDict>) -> bool {
    [
        intern!(py, "_global_forward_hooks"),
        intern!(py, "_global_forward_pre_hooks"),
        intern!(py, "_global_backward_hooks"),
        intern!(py, "_global_backward_pre_hooks"),
    ]
    .iter()
    .all(|n| match g.get_item(*n) {
        Ok(Some(v)) => match v.cast::<PyDict>() {
            Ok(h) => h.is_empty(),
            Err(_) => !v.is_truthy().unwrap_or(true),
        },
        _ => false,
    })
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

impl ModuleCall {
    fn dispatch<'py>(&self, py: Python<'py>, call: Call<'_, 'py>) -> PyResult<Bound<'py, PyAny>> {
        let Some(wrapper) = self.wrapper.bind(py).upgrade() else {
            return Err(pyo3::exceptions::PyReferenceError::new_err(
                "ferrodyn: the OptimizedModule of this call has died",
            ));
        };
        let target = self.target.bind(py);
        let wrapper_plain = no_global_hooks(py, self.torch_globals.bind(py))
            && module_dict(&wrapper).is_some_and(|d| {
                plain_module(py, &wrapper, &d)
                    && matches!(d.get_item(intern!(py, "forward")), Ok(Some(f)) if f.is(target))
            })
            && !self.is_tracing.bind(py).call0()?.is_truthy()?;
        if !wrapper_plain {
            // Hooks on the wrapper (or global ones, or JIT tracing): nn.Module.__call__ runs
            // them and calls the wrapper's forward, whatever it is now.
            return call.call_with_first(self.module_call.bind(py), wrapper);
        }
        let t = target.get();
        let orig = self.orig.bind(py);
        if self.inline || !module_dict(orig).is_some_and(|d| plain_module(py, orig, &d)) {
            return t.call_under(py, t.func.bind(py), &call);
        }
        let forward = orig.getattr(intern!(py, "forward"))?;
        t.call_under(py, &forward, &call)
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
