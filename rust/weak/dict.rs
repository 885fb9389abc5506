//! The Python classes: `WeakIdKeyDictionary` (= `WeakTensorKeyDictionary`), its subclass
//! `WeakKeyExactDictionary`, and their iterator. Argument parsing and result shaping only; the
//! operations are `Core`'s.
//!
//! Behaviour follows `torch.utils.weak.WeakIdKeyDictionary`: the MutableMapping API with identity
//! keys held weakly, `keys()`/`values()`/`items()` returning one-shot iterators, `__eq__` against
//! any Mapping by key identity, `|`, `|=`, `copy`, `deepcopy`, `keyrefs()`, TypeError for keys that
//! cannot be weakly referenced (except `in`, which answers False).
use std::sync::Mutex;

use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyTypeError};
use pyo3::gc::{PyTraverseError, PyVisit};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyMapping, PyTuple, PyType, PyWeakrefMethods};
use pyo3::Borrowed;

use super::core::{fix_weakref, Core, KeyMode, Owner};
use crate::ffi::mapslot::AssSubscript;

/// `ref_type` -> key mode: torch's `WeakIdRef` (or None) compares by identity, `_WeakHashRef` by
/// `hash()`. torch.utils.weak is imported only when a ref_type is given (torch is then loaded).
fn mode_of(py: Python<'_>, ref_type: Option<&Bound<'_, PyAny>>) -> PyResult<KeyMode> {
    let Some(rt) = ref_type.filter(|r| !r.is_none()) else {
        return Ok(KeyMode::Id);
    };
    let weak = py.import("torch.utils.weak")?;
    let rt_type = rt.cast::<PyType>().map_err(|_| {
        PyTypeError::new_err(format!(
            "ref_type must be a class, got {}",
            rt.repr().map(|r| r.to_string()).unwrap_or_default()
        ))
    })?;
    if rt_type.is_subclass(&weak.getattr("_WeakHashRef")?)? {
        return Ok(KeyMode::Hash);
    }
    if rt_type.is_subclass(&weak.getattr("WeakIdRef")?)? {
        return Ok(KeyMode::Id);
    }
    Err(PyTypeError::new_err(format!(
        "ferrodyn's weak dictionaries support ref_type torch.utils.weak.WeakIdRef (identity keys) or \
         torch.utils.weak._WeakHashRef (hash keys), got {}",
        rt.repr()?
    )))
}

fn is_mapping(obj: &Bound<'_, PyAny>) -> bool {
    obj.cast::<PyMapping>().is_ok()
}

/// Weak-key dictionary with identity keys: torch.utils.weak.WeakIdKeyDictionary's behaviour.
#[pyclass(
    module = "ferrodyn._C",
    name = "WeakIdKeyDictionary",
    frozen,
    subclass,
    weakref,
    mapping,
    generic
)]
pub struct PyWeakIdKeyDictionary {
    pub(crate) core: Core,
    /// The `ref_type` given to `__init__`, if any (None: torch's WeakIdRef).
    ref_type: Mutex<Option<Py<PyAny>>>,
}

impl PyWeakIdKeyDictionary {
    fn from_core(core: Core, ref_type: Option<Py<PyAny>>) -> Self {
        PyWeakIdKeyDictionary {
            core,
            ref_type: Mutex::new(ref_type),
        }
    }

    fn ref_type_given(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.ref_type
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|r| r.clone_ref(py))
    }

    /// `__init__`'s work, shared with the exact dictionary: reset, then fill from `dict`.
    fn init(
        &self,
        py: Python<'_>,
        dict: Option<&Bound<'_, PyAny>>,
        ref_type: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let mode = mode_of(py, ref_type)?;
        self.core.reset(py, mode)?;
        let given = ref_type
            .filter(|r| !r.is_none())
            .map(|r| r.clone().unbind());
        let old = std::mem::replace(
            &mut *self.ref_type.lock().unwrap_or_else(|p| p.into_inner()),
            given,
        );
        drop(old);
        if let Some(d) = dict.filter(|d| !d.is_none()) {
            self.core.update_from(d)?;
        }
        Ok(())
    }

    /// An empty dictionary of the same kind (the exact dictionary stays exact; Python subclasses
    /// get the base class, as torch's `copy()` does).
    fn empty_like<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let this = slf.get();
        let core = this.core.new_like(py)?;
        let ref_type = this.ref_type_given(py);
        let base = PyWeakIdKeyDictionary::from_core(core, ref_type);
        if !this.core.strict {
            let init = PyClassInitializer::from(base).add_subclass(PyWeakKeyExactDictionary);
            return Ok(Bound::new(py, init)?.into_any());
        }
        Ok(Bound::new(py, base)?.into_any())
    }

    fn iter(slf: &Bound<'_, Self>, kind: IterKind) -> PyResult<PyWeakDictIterator> {
        PyWeakDictIterator::new(slf.py(), &slf.get().core.shared, kind)
    }
}

impl PyWeakIdKeyDictionary {
    fn delitem(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.core.delete(key)? {
            Ok(())
        } else {
            Err(PyKeyError::new_err(key.clone().unbind()))
        }
    }
}

/// `d[k] = v` and `del d[k]` on the two native classes, called by CPython without pyo3's
/// trampoline (rust/ffi/mapslot.rs; Python subclasses run `__setitem__`/`__delitem__` above,
/// which do the same). Drops no `Py`: `Core::set` and `Core::delete` clone no value.
impl AssSubscript for PyWeakIdKeyDictionary {
    #[inline]
    fn ass_subscript(
        slf: Borrowed<'_, '_, Self>,
        key: Borrowed<'_, '_, PyAny>,
        value: Option<Borrowed<'_, '_, PyAny>>,
    ) -> PyResult<()> {
        let this = slf.get();
        match value {
            Some(v) => this.core.set(&key, &v),
            None => this.delitem(&key),
        }
    }
}

/// The core of a dictionary created by `empty_like` or `type(self)()`.
fn core_of<'a>(obj: &'a Bound<'_, PyAny>) -> Option<&'a Core> {
    obj.cast::<PyWeakIdKeyDictionary>()
        .ok()
        .map(|d| &d.get().core)
}

#[pymethods]
impl PyWeakIdKeyDictionary {
    /// Arguments are `__init__`'s (so Python subclasses may define their own `__init__`).
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(
        py: Python<'_>,
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        Ok(PyWeakIdKeyDictionary::from_core(
            Core::new(py, KeyMode::Id, true)?,
            None,
        ))
    }

    #[pyo3(signature = (dict=None, ref_type=None))]
    fn __init__(
        &self,
        py: Python<'_>,
        dict: Option<&Bound<'_, PyAny>>,
        ref_type: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.init(py, dict, ref_type)
    }

    /// The weak-reference class that defines key equality (torch's attribute).
    #[getter]
    fn ref_type(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.ref_type_given(py) {
            Some(r) => Ok(r),
            None => Ok(py
                .import("torch.utils.weak")?
                .getattr("WeakIdRef")?
                .unbind()),
        }
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        self.core.len(py)
    }

    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
        self.core.getitem(key)
    }

    fn __setitem__(&self, key: &Bound<'_, PyAny>, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.core.set(key, value)
    }

    fn __delitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<()> {
        self.delitem(key)
    }

    fn __contains__(&self, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.core.contains(key)
    }

    #[pyo3(signature = (key, default=None))]
    fn get(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        default: Option<Py<PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        Ok(self.core.get(key)?.or(default).unwrap_or_else(|| py.None()))
    }

    #[pyo3(signature = (key, *default))]
    fn pop(&self, key: &Bound<'_, PyAny>, default: &Bound<'_, PyTuple>) -> PyResult<Py<PyAny>> {
        if default.len() > 1 {
            return Err(PyTypeError::new_err(format!(
                "pop expected at most 2 arguments, got {}",
                default.len() + 1
            )));
        }
        match self.core.remove(key)? {
            Some(v) => Ok(v),
            None if default.len() == 1 => Ok(default.get_item(0)?.unbind()),
            None => Err(PyKeyError::new_err(key.clone().unbind())),
        }
    }

    fn popitem<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, Py<PyAny>)> {
        self.core
            .popitem(py)?
            .ok_or_else(|| PyKeyError::new_err("popitem(): dictionary is empty"))
    }

    #[pyo3(signature = (key, default=None))]
    fn setdefault(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        default: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let none = py.None().into_bound(py);
        self.core.setdefault(key, default.unwrap_or(&none))
    }

    #[pyo3(signature = (dict=None, **kwargs))]
    fn update(
        &self,
        dict: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        if let Some(d) = dict.filter(|d| !d.is_none()) {
            self.core.update_from(d)?;
        }
        if let Some(kw) = kwargs.filter(|k| !k.is_empty()) {
            self.core.update_from(kw.as_any())?;
        }
        Ok(())
    }

    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        self.core.clear(py)
    }

    fn keys(slf: &Bound<'_, Self>) -> PyResult<PyWeakDictIterator> {
        Self::iter(slf, IterKind::Keys)
    }

    fn values(slf: &Bound<'_, Self>) -> PyResult<PyWeakDictIterator> {
        Self::iter(slf, IterKind::Values)
    }

    fn items(slf: &Bound<'_, Self>) -> PyResult<PyWeakDictIterator> {
        Self::iter(slf, IterKind::Items)
    }

    fn __iter__(slf: &Bound<'_, Self>) -> PyResult<PyWeakDictIterator> {
        Self::iter(slf, IterKind::Keys)
    }

    /// Weak references to the keys (dead ones possibly included, as torch's).
    fn keyrefs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        PyList::new(py, self.core.keyrefs(py)?)
    }

    fn copy<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let new = Self::empty_like(slf)?;
        let core = core_of(&new).expect("empty_like makes one of ours");
        for (k, v) in slf.get().core.snapshot(py)? {
            core.set(&k, v.bind(py))?;
        }
        Ok(new)
    }

    fn __copy__<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        Self::copy(slf)
    }

    fn __deepcopy__<'py>(
        slf: &Bound<'py, Self>,
        memo: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let deepcopy = py
            .import(intern!(py, "copy"))?
            .getattr(intern!(py, "deepcopy"))?;
        let new = slf.get_type().call0()?;
        for (k, v) in slf.get().core.snapshot(py)? {
            new.set_item(k, deepcopy.call1((v, memo))?)?;
        }
        Ok(new)
    }

    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        Ok(format!(
            "<{} at {:#x}>",
            slf.get_type().name()?,
            slf.as_ptr() as usize
        ))
    }

    /// Equal to any Mapping with the same key identities and equal values.
    fn __eq__<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        if !is_mapping(other) {
            return Ok(py.NotImplemented());
        }
        let mine = PyDict::new(py);
        for (k, v) in slf.get().core.snapshot(py)? {
            mine.set_item(k.as_ptr() as usize, v)?;
        }
        let theirs = PyDict::new(py);
        for item in other.call_method0(intern!(py, "items"))?.try_iter()? {
            let (k, v) = super::core::unpack2(&item?)?;
            theirs.set_item(k.as_ptr() as usize, v)?;
        }
        Ok(mine
            .eq(theirs)?
            .into_pyobject(py)?
            .to_owned()
            .into_any()
            .unbind())
    }

    fn __ne__<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        let py = slf.py();
        let eq = Self::__eq__(slf, other)?;
        if eq.is(py.NotImplemented()) {
            return Ok(eq);
        }
        Ok((!eq.bind(py).is_truthy()?)
            .into_pyobject(py)?
            .to_owned()
            .into_any()
            .unbind())
    }

    fn __or__<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        if !is_mapping(other) {
            return Ok(slf.py().NotImplemented());
        }
        let new = Self::copy(slf)?;
        core_of(&new)
            .expect("copy makes one of ours")
            .update_from(other)?;
        Ok(new.unbind())
    }

    fn __ror__<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Py<PyAny>> {
        if !is_mapping(other) {
            return Ok(slf.py().NotImplemented());
        }
        let new = slf.get_type().call0()?;
        new.call_method1(intern!(slf.py(), "update"), (other,))?;
        new.call_method1(intern!(slf.py(), "update"), (slf,))?;
        Ok(new.unbind())
    }

    fn __ior__(&self, other: &Bound<'_, PyAny>) -> PyResult<()> {
        self.core.update_from(other)
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        self.core.traverse(&visit)
    }

    fn __clear__(&self) {
        let _ = Python::attach(|py| self.core.clear(py));
    }
}

/// Identity-keyed weak dictionary for the converter's object tracking: keys that cannot be
/// weakly referenced raise TypeError on insertion; looking them up simply misses.
#[pyclass(module = "ferrodyn._C", name = "WeakKeyExactDictionary", extends = PyWeakIdKeyDictionary, frozen, subclass)]
pub struct PyWeakKeyExactDictionary;

#[pymethods]
impl PyWeakKeyExactDictionary {
    #[new]
    #[pyo3(signature = (*_args, **_kwargs))]
    fn py_new(
        py: Python<'_>,
        _args: &Bound<'_, PyTuple>,
        _kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<PyClassInitializer<Self>> {
        let core = Core::new(py, KeyMode::Id, false)?;
        Ok(
            PyClassInitializer::from(PyWeakIdKeyDictionary::from_core(core, None))
                .add_subclass(PyWeakKeyExactDictionary),
        )
    }

    #[pyo3(signature = (dict=None))]
    fn __init__(slf: &Bound<'_, Self>, dict: Option<&Bound<'_, PyAny>>) -> PyResult<()> {
        slf.as_super().get().init(slf.py(), dict, None)
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum IterKind {
    Keys,
    Values,
    Items,
}

struct IterState {
    /// Next slot index to look at.
    pos: usize,
    done: bool,
}

/// Iterator over a weak dictionary's keys, values or items. Keys that die meanwhile are skipped;
/// adding or removing keys explicitly meanwhile raises RuntimeError (as dict iteration does).
#[pyclass(module = "ferrodyn._C", name = "WeakDictIterator", frozen)]
pub struct PyWeakDictIterator {
    shared: Owner,
    state: Mutex<IterState>,
    kind: IterKind,
    /// The table's size-change count when iteration started.
    expected: u64,
}

impl PyWeakDictIterator {
    fn new(py: Python<'_>, shared: &Owner, kind: IterKind) -> PyResult<Self> {
        let expected = shared.with(py, |t| t.size_changes()).map_err(|_| {
            PyRuntimeError::new_err(
                "ferrodyn weak dictionary re-entered while its table was locked",
            )
        })?;
        shared.begin_iteration();
        Ok(PyWeakDictIterator {
            shared: shared.clone(),
            state: Mutex::new(IterState {
                pos: 0,
                done: false,
            }),
            kind,
            expected,
        })
    }

    fn finish(&self, st: &mut IterState) {
        if !st.done {
            st.done = true;
            self.shared.end_iteration();
        }
    }
}

impl Drop for PyWeakDictIterator {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        if !st.done {
            st.done = true;
            self.shared.end_iteration();
        }
    }
}

enum Step<'py> {
    Item(usize, Bound<'py, PyAny>, Py<PyAny>),
    End,
    Changed,
}

#[pymethods]
impl PyWeakDictIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        let pos = {
            let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            if st.done {
                return Ok(None);
            }
            st.pos
        };
        let step = self
            .shared
            .with(py, |t| {
                if t.size_changes() != self.expected {
                    return Step::Changed;
                }
                let mut from = pos;
                while let Some((i, s)) = t.next_live(from) {
                    from = i + 1;
                    // a dead weakref: the key is dying and its callback has not run yet
                    if let Some(key) = s.entry.wr.bind(py).upgrade() {
                        return Step::Item(i + 1, key, s.entry.value.clone_ref(py));
                    }
                }
                Step::End
            })
            .map_err(|_| {
                PyRuntimeError::new_err(
                    "ferrodyn weak dictionary re-entered while its table was locked",
                )
            })?;
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match step {
            Step::Item(next, key, value) => {
                st.pos = next;
                drop(st);
                fix_weakref(&key)?;
                Ok(Some(match self.kind {
                    IterKind::Keys => key.unbind(),
                    IterKind::Values => value,
                    IterKind::Items => PyTuple::new(py, [key.unbind(), value])?.into_any().unbind(),
                }))
            }
            Step::End => {
                self.finish(&mut st);
                Ok(None)
            }
            Step::Changed => {
                self.finish(&mut st);
                Err(PyRuntimeError::new_err(
                    "dictionary changed size during iteration",
                ))
            }
        }
    }
}
