//! `_WeakKeyRef`: the weak reference a weak dictionary makes for each key, a subclass of
//! `weakref.ref` with one extra field, the slot of the key's entry in its dictionary's table. A
//! dying key's callback reads the slot from the weakref it is handed and removes the entry
//! without a hash-map probe.
//!
//! Layout: the instance is CPython's `PyWeakReference` (Include/cpython/weakrefobject.h; it is
//! not mirrored here: its size is read at run time from `weakref.ref.__basicsize__`, so it
//! is right on every minor) followed by one `Py_ssize_t`, at `SLOT_OFFSET` (the base size
//! rounded up to the field's alignment). tests/test_weak_keyref.py checks the size and that
//! writing the slot leaves the weakref's own fields (referent, callback, hash) intact.
//!
//! - `new_key_ref(key, callback)`: calls `weakref.ref`'s `tp_new` on the subtype directly, which
//!   creates, links and GC-tracks the weakref exactly as `weakref.ref(key, callback)` does for a
//!   subclass (`weakref___new__`, Objects/weakrefobject.c), without `type.__call__`'s
//!   `__init__` round; the slot starts as `NO_SLOT`;
//! - `set_slot` / `slot_of`: write / read the field (no Python code, no reference counts: both
//!   are allowed while a dictionary's table is locked);
//! - a free list of up to `FREE_LIST_CAP` deallocated instances (`tp_alloc`/`tp_free`), reused
//!   by the next `new_key_ref`s as CPython reuses freed tuples;
//! - the type: `tp_dealloc` is the base's plus the heap-type reference every instance holds,
//!   `tp_traverse` visits nothing (see `key_ref_traverse`), `tp_clear` is the base's;
//!   instances cannot be created from Python (`Py_TPFLAGS_DISALLOW_INSTANTIATION`), nor
//!   subclassed.
//!
//! - `key_died_callback(remover)`: the callback the dictionary gives its weakrefs, a builtin
//!   function (`METH_O`, called by CPython with no argument tuple and without pyo3's method
//!   trampoline) bound to the dictionary's remover; for a dead `_WeakKeyRef` it calls
//!   `crate::weak::core::on_key_death(remover, slot, weakref address)`;
//! - `GilRef`: a strong reference released with a plain `Py_DECREF` (pyo3's `Py` defers the
//!   release when pyo3 did not enter the thread, which the callback above does not): what the
//!   tables own, since they are only ever dropped with the GIL held.
//!
//! Does not own what the slot means (rust/weak/table.rs) or when it is written (rust/weak/).
use std::ffi::{c_int, c_uint, c_void};
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyType, PyWeakrefReference};
use pyo3::Borrowed;

/// A strong reference owned by a weak dictionary's table, released with `Py_DECREF` directly.
/// Only dropped with the GIL held: the tables live in `Arc`s owned by Python objects (the
/// dictionaries and their iterators) and upgraded only inside callbacks CPython runs.
#[repr(transparent)]
pub struct GilRef<T>(ManuallyDrop<Py<T>>);

impl<T> GilRef<T> {
    #[inline]
    pub fn new(obj: Py<T>) -> Self {
        GilRef(ManuallyDrop::new(obj))
    }
}

impl<T> GilRef<T> {
    /// Whether another reference to the object exists, so that releasing this one cannot
    /// deallocate it (the GIL is held by the caller, so no other thread changes the count).
    #[inline]
    pub fn is_shared(&self) -> bool {
        // SAFETY: the object is live (we own a reference); reading its count is a field read.
        unsafe { ffi::Py_REFCNT(self.0.as_ptr()) > 1 }
    }
}

impl<T> std::ops::Deref for GilRef<T> {
    type Target = Py<T>;
    #[inline]
    fn deref(&self) -> &Py<T> {
        &self.0
    }
}

impl<T> Drop for GilRef<T> {
    #[inline]
    fn drop(&mut self) {
        debug_assert!(
            // SAFETY: PyGILState_Check only reads the thread state.
            unsafe { ffi::PyGILState_Check() } == 1,
            "GilRef dropped without the GIL"
        );
        // SAFETY: we own one reference to a live object (never released elsewhere: the `Py`
        // is never dropped), and the GIL is held (see the type's doc).
        unsafe { ffi::Py_DECREF(self.0.as_ptr()) }
    }
}

/// `Sync` wrapper so the method definition can be a plain static (CPython only reads it).
struct MethodDef(ffi::PyMethodDef);
// SAFETY: the definition is immutable after construction; it holds only pointers to static data.
unsafe impl Sync for MethodDef {}

static KEY_DIED_DEF: MethodDef = MethodDef(ffi::PyMethodDef {
    ml_name: c"key_died".as_ptr(),
    ml_meth: ffi::PyMethodDefPointer {
        PyCFunction: key_died_trampoline,
    },
    ml_flags: ffi::METH_O,
    ml_doc: c"Remove the entry of a dead key's weakref (the dictionary's weakref callback)."
        .as_ptr(),
});

unsafe extern "C" fn key_died_trampoline(
    remover: *mut ffi::PyObject,
    wr: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // Anything but a dead `_WeakKeyRef` placed in a table is ignored (the callback can be
    // fetched as `r.__callback__` and called by hand).
    // SAFETY: `wr` is a live object borrowed for the call (CPython passes the weakref).
    if let Some(slot) = unsafe { slot_of_raw(wr) } {
        // SAFETY: `wr` is a live `_WeakKeyRef` (checked by `slot_of_raw`).
        if unsafe { is_dead(wr) } {
            // SAFETY: CPython calls a METH_O function with the GIL held, `remover` (the bound
            // self, kept alive by the function object) and `wr` borrowed for the call. pyo3 did
            // not enter the thread, so what runs here drops no `Py` (the tables hold `GilRef`s).
            let py = unsafe { Python::assume_attached() };
            let remover = unsafe { Borrowed::from_ptr(py, remover) };
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::weak::core::on_key_death(remover, slot, wr as usize)
            }));
        }
    }
    // SAFETY: returning a new reference to None, as a METH_O function returning nothing must.
    unsafe { ffi::Py_NewRef(ffi::Py_None()) }
}

/// The weakref callback of a dictionary: a builtin function bound to `remover`.
pub fn key_died_callback<'py>(remover: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    let py = remover.py();
    // SAFETY: the definition is static; `remover` is live (the function keeps a reference);
    // returns a new reference or NULL with an error set.
    unsafe {
        let f = ffi::PyCFunction_NewEx(
            std::ptr::addr_of!(KEY_DIED_DEF.0).cast_mut(),
            remover.as_ptr(),
            std::ptr::null_mut(),
        );
        Bound::from_owned_ptr_or_err(py, f)
    }
}

/// The slot value of a weakref that no table slot holds (yet).
pub const NO_SLOT: usize = usize::MAX;

struct KeyRefType {
    /// The heap type (kept alive for the process: this reference is never released).
    tp: usize,
    /// Byte offset of the slot field.
    slot_offset: usize,
}

static KEY_REF: OnceLock<KeyRefType> = OnceLock::new();

/// `new_key_ref`'s argument tuple between calls (items NULL), or null. Only touched with the GIL
/// held, so the atomic is only there to make the static `Sync`.
static ARGS: AtomicPtr<ffi::PyObject> = AtomicPtr::new(std::ptr::null_mut());

fn base() -> *mut ffi::PyTypeObject {
    std::ptr::addr_of_mut!(ffi::_PyWeakref_RefType)
}

unsafe extern "C" fn key_ref_dealloc(obj: *mut ffi::PyObject) {
    // SAFETY: called by CPython on an instance of our type whose refcount reached zero. The
    // base's dealloc untracks, unlinks and frees it; it does not release the reference to the
    // heap type that `PyType_GenericAlloc` took, which we release after it.
    unsafe {
        let tp = ffi::Py_TYPE(obj);
        if let Some(dealloc) = (*base()).tp_dealloc {
            dealloc(obj);
        }
        ffi::Py_DECREF(tp.cast());
    }
}

/// Visits nothing. What an instance references is its heap type (kept alive for the process by
/// `KEY_REF`, never collectable) and its callback (the dictionary's builtin function, referenced
/// by the dictionary too, and bound to a remover that reaches the table only through a Rust
/// `Arc` the collector cannot see): no cycle the collector could break runs through either, so
/// not reporting them only keeps them reachable, which they are. Every collection that finds
/// the weakrefs of fresh keys in its generation (most of them, right after inserts) then
/// skips two visits and the base's traverse call per weakref.
unsafe extern "C" fn key_ref_traverse(
    _obj: *mut ffi::PyObject,
    _visit: ffi::visitproc,
    _arg: *mut c_void,
) -> c_int {
    0
}

/// Freed instances kept for reuse, as CPython keeps freed tuples, lists and dicts: at most this
/// many (each is 88 bytes on 3.11: the collector's header, the weakref, the slot).
pub const FREE_LIST_CAP: usize = 2048;

/// The free list: memory of deallocated instances (untracked by the collector, fields cleared
/// by the base's dealloc), pushed by `key_ref_free` and popped by `key_ref_alloc`. A reused
/// instance skips the allocator, and, like a tuple taken from CPython's free list, does not
/// count as a new allocation toward the collector's next young collection (nor its return as
/// a deallocation).
struct FreeList {
    len: std::cell::Cell<usize>,
    items: std::cell::UnsafeCell<[*mut c_void; FREE_LIST_CAP]>,
}

// SAFETY: only `key_ref_alloc`, `key_ref_free` and `free_list_len` touch it, and CPython calls
// the first two (a type's `tp_alloc` and `tp_free`) with the GIL held; `free_list_len` asks for
// a `Python` token. Free-threaded builds are refused in rust/ffi/mod.rs.
unsafe impl Sync for FreeList {}

static FREE: FreeList = FreeList {
    len: std::cell::Cell::new(0),
    items: std::cell::UnsafeCell::new([std::ptr::null_mut(); FREE_LIST_CAP]),
};

/// `tp_alloc`: a cleared instance from the free list, or `PyType_GenericAlloc`'s.
unsafe extern "C" fn key_ref_alloc(
    tp: *mut ffi::PyTypeObject,
    nitems: ffi::Py_ssize_t,
) -> *mut ffi::PyObject {
    let n = FREE.len.get();
    if n == 0 || nitems != 0 {
        // SAFETY: CPython's allocator for (GC) types, called as CPython would.
        return unsafe { ffi::PyType_GenericAlloc(tp, nitems) };
    }
    // SAFETY: the GIL is held (tp_alloc). Every pointer on the list is the memory of an instance
    // of this type (the only type with `key_ref_free` as tp_free; it cannot be subclassed),
    // deallocated and untracked, with its collector header before it: clearing `tp_basicsize`
    // bytes from the object start and `PyObject_Init` (type, the heap type's reference,
    // refcount 1) leaves it as `PyType_GenericAlloc` would, then it is tracked as that does.
    unsafe {
        let obj = (*FREE.items.get())[n - 1];
        FREE.len.set(n - 1);
        std::ptr::write_bytes(obj.cast::<u8>(), 0, (*tp).tp_basicsize as usize);
        let obj = ffi::PyObject_Init(obj.cast(), tp);
        ffi::PyObject_GC_Track(obj.cast());
        obj
    }
}

/// `tp_free` (called by the base's dealloc after it untracked and cleared the weakref): onto
/// the free list, or `PyObject_GC_Del` when it is full.
unsafe extern "C" fn key_ref_free(obj: *mut c_void) {
    let n = FREE.len.get();
    if n < FREE_LIST_CAP {
        // SAFETY: the GIL is held (tp_free); `n` is in bounds.
        unsafe { (*FREE.items.get())[n] = obj };
        FREE.len.set(n + 1);
    } else {
        // SAFETY: what `PyType_GenericAlloc` allocated for a GC type is freed with this.
        unsafe { ffi::PyObject_GC_Del(obj) }
    }
}

/// Instances waiting on the free list (for the tests).
pub fn free_list_len(_py: Python<'_>) -> usize {
    FREE.len.get()
}

const DOC: &std::ffi::CStr =
    c"Weak reference to a key of a ferrodyn weak dictionary (a weakref.ref carrying its entry's slot).";

fn create_type(py: Python<'_>) -> PyResult<KeyRefType> {
    // SAFETY: `_PyWeakref_RefType` is CPython's static weakref.ref type, initialised before any
    // extension loads; reading its basicsize is a plain field read.
    let base_size = unsafe { (*base()).tp_basicsize } as usize;
    let align = std::mem::align_of::<ffi::Py_ssize_t>();
    let slot_offset = base_size.div_ceil(align) * align;
    let basicsize = slot_offset + std::mem::size_of::<ffi::Py_ssize_t>();
    let mut slots = [
        ffi::PyType_Slot {
            slot: ffi::Py_tp_dealloc,
            pfunc: key_ref_dealloc as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_traverse,
            pfunc: key_ref_traverse as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_clear,
            // SAFETY: a plain field read of the static base type.
            pfunc: unsafe { (*base()).tp_clear }.map_or(std::ptr::null_mut(), |f| f as *mut c_void),
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_alloc,
            pfunc: key_ref_alloc as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_free,
            pfunc: key_ref_free as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: ffi::Py_tp_doc,
            pfunc: DOC.as_ptr() as *mut c_void,
        },
        ffi::PyType_Slot {
            slot: 0,
            pfunc: std::ptr::null_mut(),
        },
    ];
    let mut spec = ffi::PyType_Spec {
        name: c"ferrodyn._C._WeakKeyRef".as_ptr(),
        basicsize: basicsize as c_int,
        itemsize: 0,
        flags: (ffi::Py_TPFLAGS_DEFAULT
            | ffi::Py_TPFLAGS_HAVE_GC
            | ffi::Py_TPFLAGS_DISALLOW_INSTANTIATION) as c_uint,
        slots: slots.as_mut_ptr(),
    };
    // SAFETY: the spec and its slots are valid for the call (CPython copies what it keeps; the
    // name and doc are static); the base is a live type object. Returns a new reference.
    let tp = unsafe { ffi::PyType_FromSpecWithBases(&mut spec, base().cast()) };
    if tp.is_null() {
        return Err(PyErr::fetch(py));
    }
    Ok(KeyRefType {
        tp: tp as usize,
        slot_offset,
    })
}

fn key_ref_type(py: Python<'_>) -> PyResult<&'static KeyRefType> {
    if let Some(t) = KEY_REF.get() {
        return Ok(t);
    }
    let t = create_type(py)?;
    // Another thread cannot have won: this runs with the GIL held and creates no Python code.
    Ok(KEY_REF.get_or_init(|| t))
}

/// The `_WeakKeyRef` type (created on first use).
pub fn type_object(py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
    let t = key_ref_type(py)?;
    // SAFETY: `t.tp` is a type object that lives for the process (its creation reference is
    // never released).
    Ok(
        unsafe { Bound::from_borrowed_ptr(py, t.tp as *mut ffi::PyObject) }
            .cast_into::<PyType>()?,
    )
}

/// `weakref.ref(key, callback)` as a `_WeakKeyRef`, its slot `NO_SLOT`. Raises what
/// `weakref.ref` raises (TypeError for objects that cannot be weakly referenced).
pub fn new_key_ref<'py>(
    key: &Bound<'py, PyAny>,
    callback: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyWeakrefReference>> {
    let py = key.py();
    let t = key_ref_type(py)?;
    // SAFETY: the GIL is held; PyTuple_Pack returns a new reference (or NULL with an error);
    // `tp_new` of weakref.ref is `weakref___new__`, which accepts any subtype of weakref.ref and
    // (key[, callback]) arguments, returns a new reference or NULL with an error, and does not
    // keep the argument tuple. Our type's instances are `slot_offset + 8` bytes, zeroed by
    // `tp_alloc`, so the slot field is ours to write.
    unsafe {
        // The argument tuple is reused from call to call (as `zip` reuses its result tuple):
        // taken out of `ARGS` (so a nested call, from code the allocation runs, makes its own),
        // filled, emptied after the call, and put back if nothing else kept a reference to it.
        // (a load and a store, not `swap`: the GIL orders every access, and `swap` would be
        // a locked instruction on each call)
        let mut args = ARGS.load(Ordering::Relaxed);
        ARGS.store(std::ptr::null_mut(), Ordering::Relaxed);
        if args.is_null() {
            args = ffi::PyTuple_New(2);
            if args.is_null() {
                return Err(PyErr::fetch(py));
            }
        }
        ffi::PyTuple_SET_ITEM(args, 0, ffi::Py_NewRef(key.as_ptr()));
        ffi::PyTuple_SET_ITEM(args, 1, ffi::Py_NewRef(callback.as_ptr()));
        let new = (*base()).tp_new.expect("weakref.ref has tp_new");
        let obj = new(t.tp as *mut ffi::PyTypeObject, args, std::ptr::null_mut());
        if ffi::Py_REFCNT(args) == 1 {
            // only we hold it: empty it (a tuple with NULL items is valid for the collector,
            // which skips them) and keep it for the next call
            for i in 0..2 {
                let item = ffi::PyTuple_GET_ITEM(args, i);
                ffi::PyTuple_SET_ITEM(args, i, std::ptr::null_mut());
                ffi::Py_DECREF(item);
            }
            let previous = ARGS.load(Ordering::Relaxed);
            ARGS.store(args, Ordering::Relaxed);
            if !previous.is_null() {
                ffi::Py_DECREF(previous);
            }
        } else {
            ffi::Py_DECREF(args);
        }
        if obj.is_null() {
            return Err(PyErr::fetch(py));
        }
        write_slot(t, obj, NO_SLOT);
        Ok(Bound::from_owned_ptr(py, obj).cast_into_unchecked())
    }
}

/// # Safety
/// `obj` is a live instance of the `_WeakKeyRef` type `t`.
#[inline]
unsafe fn write_slot(t: &KeyRefType, obj: *mut ffi::PyObject, slot: usize) {
    // SAFETY: (caller) the field lies inside the instance, aligned.
    unsafe {
        obj.cast::<u8>()
            .add(t.slot_offset)
            .cast::<usize>()
            .write(slot)
    }
}

/// Record `slot` in a weakref made by [`new_key_ref`]; other objects are left alone.
#[inline]
pub fn set_slot(wr: &Py<PyWeakrefReference>, slot: usize) {
    let obj = wr.as_ptr();
    if let Some(t) = KEY_REF.get() {
        // SAFETY: `obj` is live (borrowed through `wr`); the exact type check makes it ours.
        unsafe {
            if ffi::Py_TYPE(obj) as usize == t.tp {
                write_slot(t, obj, slot);
            }
        }
    }
}

/// The slot recorded in `obj` if it is a `_WeakKeyRef` (None for any other object, or for
/// `NO_SLOT`).
#[inline]
pub fn slot_of(obj: &Bound<'_, PyAny>) -> Option<usize> {
    // SAFETY: `obj` is live for the call.
    unsafe { slot_of_raw(obj.as_ptr()) }
}

/// # Safety
/// `obj` is a live object.
#[inline]
unsafe fn slot_of_raw(obj: *mut ffi::PyObject) -> Option<usize> {
    let t = KEY_REF.get()?;
    // SAFETY: `obj` is a live object (the caller's contract); the exact type check makes the
    // field ours to read.
    let slot = unsafe {
        if ffi::Py_TYPE(obj) as usize != t.tp {
            return None;
        }
        obj.cast::<u8>().add(t.slot_offset).cast::<usize>().read()
    };
    (slot != NO_SLOT).then_some(slot)
}

/// Whether `obj` no longer has a referent.
///
/// # Safety
/// `obj` is a live weakref.
#[inline]
unsafe fn is_dead(obj: *mut ffi::PyObject) -> bool {
    // SAFETY: `obj` is a live weakref (the caller's contract); its referent field holds
    // Py_None once the referent is gone.
    unsafe { super::weakref::wr_object(obj) == ffi::Py_None() }
}

/// For the layout tests: (base basicsize, slot offset, our basicsize).
pub fn layout(py: Python<'_>) -> PyResult<(usize, usize, usize)> {
    let t = key_ref_type(py)?;
    // SAFETY: both are live type objects; plain field reads.
    unsafe {
        Ok((
            (*base()).tp_basicsize as usize,
            t.slot_offset,
            (*(t.tp as *mut ffi::PyTypeObject)).tp_basicsize as usize,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyo3::types::PyWeakrefMethods;

    #[test]
    fn slot_field_lies_past_the_weakref_and_keeps_it_intact() {
        Python::initialize();
        Python::attach(|py| {
            let (base, off, size) = layout(py).unwrap();
            assert!(off >= base && size == off + 8, "{base} {off} {size}");
            let key = py.eval(c"type('K', (), {})()", None, None).unwrap();
            let cb = py.eval(c"lambda r: None", None, None).unwrap();
            let wr = new_key_ref(&key, &cb).unwrap();
            assert_eq!(slot_of(wr.as_any()), None);
            let owned = wr.clone().unbind();
            set_slot(&owned, 12345);
            assert_eq!(slot_of(wr.as_any()), Some(12345));
            assert!(wr.upgrade().unwrap().is(&key));
            assert!(wr.getattr("__callback__").unwrap().is(&cb));
            assert!(wr
                .is_instance(&py.get_type::<PyWeakrefReference>())
                .unwrap());
            // a plain weakref is not ours: never read, never written
            let plain = PyWeakrefReference::new(&key).unwrap();
            assert_eq!(slot_of(plain.as_any()), None);
            // the reused argument tuple is back in its cache, empty and held by nothing else
            let args = ARGS.load(Ordering::Relaxed);
            assert!(!args.is_null());
            // SAFETY: the GIL is held; `args` is the cached tuple, kept alive by the cache.
            unsafe {
                assert_eq!(ffi::Py_REFCNT(args), 1);
                assert!(ffi::PyTuple_GET_ITEM(args, 0).is_null());
                assert!(ffi::PyTuple_GET_ITEM(args, 1).is_null());
            }
            let again = new_key_ref(&key, &cb).unwrap();
            assert!(!again.is(&wr) && again.upgrade().unwrap().is(&key));
            assert_eq!(
                ARGS.load(Ordering::Relaxed),
                args,
                "the same tuple was reused"
            );
            drop(key);
            assert!(wr.upgrade().is_none());
            assert_eq!(slot_of(wr.as_any()), Some(12345));
        });
    }
}
