//! Raw object reads that guard accessors need without calling Python: a cell's contents, an
//! instance `__dict__` (no `__getattr__`), and exact-dict reads at a remembered entry position;
//! builtin callables that take their arguments as a borrowed array (`fastcall_builtin`) and
//! vectorcalls of borrowed slots (`vectorcall_slots`).
#![allow(unsafe_code)]

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::Borrowed;

use super::guard_reads::Held;
use super::slots::Slots;

/// The contents of a cell object, None if empty or not a cell.
pub fn cell_contents<'py>(cell: &Borrowed<'_, 'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    let c = cell.as_ptr();
    // SAFETY: c is live; PyCell_Type is CPython's cell type; PyCell_Get returns a new reference
    // (or NULL with an exception set only if c is not a cell, which we ruled out).
    unsafe {
        if ffi::Py_TYPE(c) != std::ptr::addr_of_mut!(ffi::PyCell_Type) {
            return None;
        }
        let v = ffi::PyCell_Get(c);
        Bound::from_owned_ptr_or_opt(cell.py(), v)
    }
}

/// `obj.__dict__` read directly (PyObject_GenericGetDict: no `__getattr__`/`__getattribute__`);
/// None if the object has no instance dict.
pub fn instance_dict<'py>(obj: &Bound<'py, PyAny>) -> Option<Bound<'py, PyAny>> {
    // SAFETY: obj is live; the call returns a new reference or NULL with an exception set.
    unsafe {
        let d = ffi::PyObject_GenericGetDict(obj.as_ptr(), std::ptr::null_mut());
        if d.is_null() {
            ffi::PyErr_Clear();
            return None;
        }
        Some(Bound::from_owned_ptr(obj.py(), d))
    }
}

/// `d[key]` found at entry position `*hint` of an exact dict, if the key stored there is `key`
/// itself (identity: exactly what a dict lookup accepts first). Guards keep one hint per
/// accessor, so a frame's `f_locals` (built in `co_varnames` order every time) or a module's
/// `_parameters` is read without hashing. None means "look it up normally".
pub fn dict_get_at<'py>(
    d: &Bound<'py, pyo3::types::PyDict>,
    key: *mut ffi::PyObject,
    hint: usize,
) -> Option<Bound<'py, PyAny>> {
    let mut pos = hint as ffi::Py_ssize_t;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    // SAFETY: d is a live dict; PyDict_Next takes any position (it bounds-checks and skips
    // deleted entries) and returns borrowed key/value pointers, the value is increfed at once.
    unsafe {
        if pos < 0 || ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) == 0 || k != key {
            return None;
        }
        Some(Bound::from_borrowed_ptr(d.py(), v))
    }
}

/// The entry position of the key that is `key` itself in an exact dict (scanning at most
/// `limit` entries), for [`dict_get_at`] hints.
pub fn dict_position_of(
    d: &Bound<'_, pyo3::types::PyDict>,
    key: *mut ffi::PyObject,
    limit: usize,
) -> Option<usize> {
    let mut pos: ffi::Py_ssize_t = 0;
    let mut k: *mut ffi::PyObject = std::ptr::null_mut();
    let mut v: *mut ffi::PyObject = std::ptr::null_mut();
    for _ in 0..limit {
        let before = pos;
        // SAFETY: as in dict_get_at; no Python code runs between the calls.
        if unsafe { ffi::PyDict_Next(d.as_ptr(), &mut pos, &mut k, &mut v) } == 0 {
            return None;
        }
        if k == key {
            // pos is now one past the entry found; the entry index is pos - 1 >= before.
            debug_assert!(pos > before);
            return Some(pos as usize - 1);
        }
    }
    None
}

/// What a [`fastcall_builtin`] calls: `(py, data, positional arguments)`, the arguments
/// borrowed from the caller for the call.
pub type FastHandler =
    for<'py> fn(Python<'py>, &Bound<'py, PyAny>, Slots<'_>) -> PyResult<Bound<'py, PyAny>>;

/// The `self` of a [`fastcall_builtin`]: its handler and the handler's data.
#[pyclass(module = "ferrodyn._C", name = "_FastCallOwner", frozen)]
pub struct FastCallOwner {
    handler: FastHandler,
    data: Py<PyAny>,
}

#[pymethods]
impl FastCallOwner {
    fn __traverse__(&self, visit: pyo3::PyVisit<'_>) -> Result<(), pyo3::PyTraverseError> {
        visit.call(&self.data)
    }
}

/// The one method definition of every fastcall builtin (CPython keeps a pointer to it in each
/// builtin, so it lives for the whole process).
fn fastcall_def() -> *mut ffi::PyMethodDef {
    static DEF: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *DEF.get_or_init(|| {
        Box::into_raw(Box::new(ffi::PyMethodDef {
            ml_name: c"ferrodyn_resume".as_ptr(),
            ml_meth: ffi::PyMethodDefPointer {
                PyCFunctionFast: fastcall_trampoline,
            },
            ml_flags: ffi::METH_FASTCALL,
            ml_doc: std::ptr::null(),
        })) as usize
    }) as *mut ffi::PyMethodDef
}

/// A builtin callable (METH_FASTCALL, so the vectorcall protocol with no argument tuple) whose
/// calls run `handler(py, data, args)`; it takes positional arguments only (CPython rejects
/// keywords before the handler runs).
pub fn fastcall_builtin<'py>(
    data: Bound<'py, PyAny>,
    handler: FastHandler,
) -> PyResult<Bound<'py, PyAny>> {
    let py = data.py();
    let owner = Bound::new(
        py,
        FastCallOwner {
            handler,
            data: data.unbind(),
        },
    )?;
    // SAFETY: the method definition is never freed; PyCFunction_NewEx takes a new reference to
    // `owner` (its `self`) and returns a new reference or NULL with an exception set.
    unsafe {
        let f = ffi::PyCFunction_NewEx(fastcall_def(), owner.as_ptr(), std::ptr::null_mut());
        Bound::from_owned_ptr_or_err(py, f)
    }
}

/// CPython's `_PyCFunctionFast` for [`fastcall_builtin`]s.
unsafe extern "C" fn fastcall_trampoline(
    slf: *mut ffi::PyObject,
    args: *mut *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    // SAFETY: called by CPython's builtin-call path with the GIL held; `slf` is the builtin's
    // `self`, a FastCallOwner (only `fastcall_builtin` makes builtins with this definition);
    // `args` holds `nargs` live objects borrowed for the call. The handler runs under a bare
    // token, as the frame hook's hit path does (objects it drops are released directly or
    // through pyo3's deferred pool).
    let py = Python::assume_attached();
    let owner: Borrowed<'_, '_, FastCallOwner> = Borrowed::from_ptr(py, slf).cast_unchecked();
    let owner = owner.get();
    let slots = Slots::from_raw(args, nargs.max(0) as usize);
    let data = owner.data.bind(py);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        (owner.handler)(py, data, slots)
    }));
    result_to_ptr(py, r, "a fastcall")
}

/// The C-API result of a Rust call made from a C slot: the new reference, or NULL with the
/// error (or a PanicException for a panic) set.
fn result_to_ptr(
    py: Python<'_>,
    r: std::thread::Result<PyResult<Bound<'_, PyAny>>>,
    what: &str,
) -> *mut ffi::PyObject {
    match r {
        Ok(Ok(v)) => v.into_ptr(),
        Ok(Err(e)) => {
            e.restore(py);
            std::ptr::null_mut()
        }
        Err(_) => {
            pyo3::panic::PanicException::new_err(format!("ferrodyn: internal panic in {what}"))
                .restore(py);
            std::ptr::null_mut()
        }
    }
}

/// `f(*slots, *extra)` by vectorcall (the slots passed as they are, borrowed).
pub fn vectorcall_slots<'py>(
    f: &Bound<'py, PyAny>,
    slots: Slots<'_>,
    extra: &[Bound<'py, PyAny>],
) -> PyResult<Bound<'py, PyAny>> {
    let py = f.py();
    let n = slots.len();
    if !slots.all_bound() {
        return Err(pyo3::exceptions::PyRuntimeError::new_err(
            "ferrodyn: unbound argument slot",
        ));
    }
    let args = slots.untagged();
    // SAFETY: every pointer is a live object borrowed for the call (the slots' contract, and
    // `extra`'s references held by the caller).
    unsafe {
        let res = if extra.is_empty() {
            ffi::PyObject_Vectorcall(f.as_ptr(), args.as_ptr(), n, std::ptr::null_mut())
        } else {
            let mut buf: Vec<*mut ffi::PyObject> = Vec::with_capacity(n + extra.len());
            buf.extend_from_slice(&args);
            buf.extend(extra.iter().map(|e| e.as_ptr()));
            ffi::PyObject_Vectorcall(f.as_ptr(), buf.as_ptr(), buf.len(), std::ptr::null_mut())
        };
        Bound::from_owned_ptr_or_err(py, res)
    }
}

/// The vectorcall function of a pyclass instance, as a field of the Rust struct: with
/// [`enable_vectorcall`], CPython calls instances through it (no argument tuple, no keyword
/// dict) instead of the class's `__call__` (which stays, for `type(obj).__call__(obj, ...)`).
#[repr(transparent)]
pub struct VectorcallSlot(ffi::vectorcallfunc);

/// A call's arguments as the vectorcall protocol passes them, borrowed for the call.
pub struct VectorArgs<'a> {
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
    _borrow: std::marker::PhantomData<&'a ()>,
}

impl VectorArgs<'_> {
    /// `f(*args, **kwargs)` with this call's arguments, passed on as they are.
    pub fn forward<'py>(&self, f: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        // SAFETY: the arguments are live for the call (the vectorcall contract); nargsf keeps
        // the caller's PY_VECTORCALL_ARGUMENTS_OFFSET bit, valid since `args` is unchanged.
        unsafe {
            let r = ffi::PyObject_Vectorcall(f.as_ptr(), self.args, self.nargsf, self.kwnames);
            Bound::from_owned_ptr_or_err(f.py(), r)
        }
    }
}

impl VectorArgs<'_> {
    /// `f(first, *args, **kwargs)` with this call's arguments, as a bound method `f.__get__(first)`
    /// would call it (CPython's `method_vectorcall`), without making the bound method: `first`
    /// goes into the slot before the arguments when the caller lent it
    /// (`PY_VECTORCALL_ARGUMENTS_OFFSET`, put back after the call), else into a copy of the
    /// argument array. `f` must be alive when called; a reference to it is held for the call
    /// (as the bound method would hold one).
    pub fn forward_with_first<'py>(
        &self,
        f: Held,
        first: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = first.py();
        let f = f.to_owned(py);
        let nargs = self.nargsf & !ffi::PY_VECTORCALL_ARGUMENTS_OFFSET;
        // SAFETY: `args` holds `nargs` positional values and one per name in `kwnames`, live
        // for the call; with the offset bit, `args[-1]` belongs to the caller and may be
        // overwritten temporarily (the vectorcall protocol), and is restored before return.
        unsafe {
            let nkw = if self.kwnames.is_null() {
                0
            } else {
                ffi::PyTuple_GET_SIZE(self.kwnames) as usize
            };
            let res = if self.nargsf & ffi::PY_VECTORCALL_ARGUMENTS_OFFSET != 0 {
                let slot = (self.args as *mut *mut ffi::PyObject).offset(-1);
                let saved = *slot;
                *slot = first.as_ptr();
                let r = ffi::PyObject_Vectorcall(f.as_ptr(), slot, nargs + 1, self.kwnames);
                *slot = saved;
                r
            } else {
                const INLINE: usize = 16;
                let total = nargs + nkw;
                let mut inline = [std::ptr::null_mut::<ffi::PyObject>(); INLINE];
                let mut heap;
                let buf: &mut [*mut ffi::PyObject] = if total < INLINE {
                    &mut inline[..total + 1]
                } else {
                    heap = vec![std::ptr::null_mut(); total + 1];
                    &mut heap[..]
                };
                buf[0] = first.as_ptr();
                if total > 0 {
                    buf[1..].copy_from_slice(std::slice::from_raw_parts(self.args, total));
                }
                ffi::PyObject_Vectorcall(f.as_ptr(), buf.as_ptr(), nargs + 1, self.kwnames)
            };
            Bound::from_owned_ptr_or_err(py, res)
        }
    }

    /// The positional arguments as argument slots, when the call passes no keywords.
    pub fn positional(&self) -> Option<Slots<'_>> {
        if !self.kwnames.is_null() {
            return None;
        }
        let n = self.nargsf & !ffi::PY_VECTORCALL_ARGUMENTS_OFFSET;
        // SAFETY: `args` holds `n` live positional values for the call (the vectorcall
        // contract; `from_raw` reads nothing when n == 0).
        Some(unsafe { Slots::from_raw(self.args, n) })
    }

    /// `f(slots)` with `slots` = `first` followed by the positional arguments, when the call
    /// passes no keywords (None otherwise, `f` not called): `first` goes into the slot before
    /// the arguments when the caller lent it (`PY_VECTORCALL_ARGUMENTS_OFFSET`, put back after
    /// `f`), else into a copy of the argument array.
    pub fn with_first<R>(
        &self,
        first: &Bound<'_, PyAny>,
        f: impl FnOnce(Slots<'_>) -> R,
    ) -> Option<R> {
        if !self.kwnames.is_null() {
            return None;
        }
        let nargs = self.nargsf & !ffi::PY_VECTORCALL_ARGUMENTS_OFFSET;
        // SAFETY: as in `forward_with_first`: `args[-1]` is the caller's to lend with the
        // offset bit, restored before return; the slots are live for the call.
        unsafe {
            if self.nargsf & ffi::PY_VECTORCALL_ARGUMENTS_OFFSET != 0 {
                let slot = (self.args as *mut *mut ffi::PyObject).offset(-1);
                let saved = *slot;
                *slot = first.as_ptr();
                let r = f(Slots::from_raw(slot, nargs + 1));
                *slot = saved;
                return Some(r);
            }
            const INLINE: usize = 16;
            let mut inline = [std::ptr::null_mut::<ffi::PyObject>(); INLINE];
            let mut heap;
            let buf: &mut [*mut ffi::PyObject] = if nargs < INLINE {
                &mut inline[..nargs + 1]
            } else {
                heap = vec![std::ptr::null_mut(); nargs + 1];
                &mut heap[..]
            };
            buf[0] = first.as_ptr();
            if nargs > 0 {
                buf[1..].copy_from_slice(std::slice::from_raw_parts(self.args, nargs));
            }
            Some(f(Slots::from_raw(buf.as_ptr(), nargs + 1)))
        }
    }

    /// The arguments as `(args tuple, kwargs dict or None)`, with `first` (if any) prepended to
    /// the positional ones: for the paths that call through `tp_call`.
    pub fn to_tuple_dict<'py>(
        &self,
        py: Python<'py>,
        first: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<(
        Bound<'py, pyo3::types::PyTuple>,
        Option<Bound<'py, pyo3::types::PyDict>>,
    )> {
        let nargs = self.nargsf & !ffi::PY_VECTORCALL_ARGUMENTS_OFFSET;
        // SAFETY: `args` holds `nargs` positional values followed by one value per name in
        // `kwnames` (a tuple of str, or NULL), all live for the call (the vectorcall contract).
        unsafe {
            let nkw = if self.kwnames.is_null() {
                0
            } else {
                ffi::PyTuple_GET_SIZE(self.kwnames) as usize
            };
            let all = if nargs + nkw == 0 {
                &[][..]
            } else {
                std::slice::from_raw_parts(self.args, nargs + nkw)
            };
            let positional: Vec<Bound<'py, PyAny>> = first
                .cloned()
                .into_iter()
                .chain(
                    all[..nargs]
                        .iter()
                        .map(|&p| Bound::from_borrowed_ptr(py, p)),
                )
                .collect();
            let tuple = pyo3::types::PyTuple::new(py, positional)?;
            if nkw == 0 {
                return Ok((tuple, None));
            }
            let dict = pyo3::types::PyDict::new(py);
            for (i, &v) in all[nargs..].iter().enumerate() {
                let k = ffi::PyTuple_GET_ITEM(self.kwnames, i as ffi::Py_ssize_t);
                dict.set_item(
                    Bound::from_borrowed_ptr(py, k),
                    Bound::from_borrowed_ptr(py, v),
                )?;
            }
            Ok((tuple, Some(dict)))
        }
    }
}

/// A frozen pyclass whose instances are called through [`VectorcallSlot`].
pub trait VectorcallTarget:
    pyo3::PyClass<Frozen = pyo3::pyclass::boolean_struct::True> + Sync
{
    /// The call, under a bare token (the GIL is held; pyo3's attach count is not raised, so
    /// `Py<T>` values dropped here go to pyo3's deferred pool: drop `Bound`s instead).
    fn vectorcall<'py>(&self, py: Python<'py>, args: VectorArgs<'_>)
        -> PyResult<Bound<'py, PyAny>>;
}

/// The slot value for instances of `T`.
pub fn vectorcall_slot<T: VectorcallTarget>() -> VectorcallSlot {
    VectorcallSlot(vectorcall_trampoline::<T>)
}

unsafe extern "C" fn vectorcall_trampoline<T: VectorcallTarget>(
    callable: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargsf: usize,
    kwnames: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls this with the GIL held, for an instance whose type has the slot at
    // the offset `enable_vectorcall` set: only `T`'s instances (T's type is final: pyo3 classes
    // without `subclass` cannot be subclassed).
    let py = Python::assume_attached();
    let slf: Borrowed<'_, '_, T> = Borrowed::from_ptr(py, callable).cast_unchecked();
    let call = VectorArgs {
        args,
        nargsf,
        kwnames,
        _borrow: std::marker::PhantomData,
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        slf.get().vectorcall(py, call)
    }));
    result_to_ptr(py, r, "a vectorcall")
}

/// Make CPython call instances of `T` through their [`VectorcallSlot`] field: `sample` is an
/// instance and `slot` its field (the offset is the same in every instance). `T` must not be
/// subclassable.
pub fn enable_vectorcall<T: VectorcallTarget>(
    sample: &Bound<'_, T>,
    slot: &VectorcallSlot,
) -> PyResult<()> {
    let base = sample.as_ptr() as usize;
    let field = slot as *const VectorcallSlot as usize;
    let tp = sample.as_any().get_type();
    let tp_ptr = tp.as_type_ptr();
    // SAFETY: `tp_ptr` is T's live type object; the offset is checked to lie inside the
    // instance; the flag and offset are set before any instance is called through them, with
    // the GIL held, and the slot is initialised in every instance (a field of T).
    unsafe {
        let basic = (*tp_ptr).tp_basicsize as usize;
        if field < base
            || field + std::mem::size_of::<VectorcallSlot>() > base + basic
            || (*tp_ptr).tp_flags & ffi::Py_TPFLAGS_BASETYPE != 0
        {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "ferrodyn: cannot enable vectorcall on this class",
            ));
        }
        (*tp_ptr).tp_vectorcall_offset = (field - base) as ffi::Py_ssize_t;
        (*tp_ptr).tp_flags |= ffi::Py_TPFLAGS_HAVE_VECTORCALL;
        ffi::PyType_Modified(tp_ptr);
    }
    Ok(())
}

/// `obj[i]`, as `BINARY_SUBSCR` computes it: exact tuples and lists indexed directly (for
/// `0 <= i < len`), anything else through `__getitem__`.
pub fn item_at<'py>(obj: &Bound<'py, PyAny>, i: isize) -> PyResult<Bound<'py, PyAny>> {
    use pyo3::types::{PyList, PyTuple};
    if i >= 0 {
        if let Ok(t) = obj.cast_exact::<PyTuple>() {
            if (i as usize) < t.len() {
                return t.get_item(i as usize);
            }
        } else if let Ok(l) = obj.cast_exact::<PyList>() {
            if (i as usize) < l.len() {
                return l.get_item(i as usize);
            }
        }
    }
    obj.get_item(i)
}
