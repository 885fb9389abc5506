//! `GilLock`: a lock for data only ever touched by a thread holding the GIL (a weak dictionary's
//! table, a code object's cache entries): a plain flag, no atomic instruction, because the GIL
//! already orders every access. Taking a taken lock is refused, never waited for.
#![allow(unsafe_code)]

use pyo3::prelude::*;

/// A lock for data that is only ever touched by a thread holding the GIL (a weak dictionary's
/// table): taking it is a plain read and write of a flag, no atomic instruction, because the GIL
/// already orders every access (its hand-over between threads is a synchronisation). Taking it
/// is refused, not waited for, when it is taken: by this thread (re-entrance), or by a thread
/// that took it and then let the GIL go. `try_lock` asks for a `Python` token, the proof that the
/// caller holds the GIL (free-threaded builds are refused in rust/ffi/mod.rs); the guard is not
/// `Send`, so it is released by the thread that took it.
pub struct GilLock<T> {
    taken: std::cell::Cell<bool>,
    data: std::cell::UnsafeCell<T>,
}

// SAFETY: every access to `taken` and `data` goes through `try_lock` (which needs the GIL) or the
// guard it returns (used and dropped only by the thread that took it, with the GIL held: a guard
// cannot cross `Python::detach`, which needs `Send`), or through `&mut self`; so accesses from
// different threads are ordered by the GIL, and `T: Send` lets the data move between threads.
unsafe impl<T: Send> Sync for GilLock<T> {}

impl<T: Default> Default for GilLock<T> {
    fn default() -> Self {
        GilLock {
            taken: std::cell::Cell::new(false),
            data: std::cell::UnsafeCell::new(T::default()),
        }
    }
}

impl<T> GilLock<T> {
    /// The data, locked; `None` when it is already locked.
    #[inline]
    pub fn try_lock<'a>(&'a self, _py: Python<'_>) -> Option<GilGuard<'a, T>> {
        self.take()
    }

    /// `try_lock` for a garbage collector's traversal, where no `Python` token can be had: the
    /// `PyVisit` is the proof, since CPython's collector calls `tp_traverse` with the GIL held.
    #[inline]
    pub fn try_lock_in_traverse<'a>(
        &'a self,
        _visit: &pyo3::PyVisit<'_>,
    ) -> Option<GilGuard<'a, T>> {
        self.take()
    }

    /// `f(&mut data)` with the lock held, or None when it is already taken (re-entry on this
    /// thread, or a thread that let the GIL go while holding it). `f` must not let the GIL go.
    #[inline]
    pub fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut T) -> R) -> Option<R> {
        self.try_lock(py).map(|mut g| f(&mut g))
    }

    /// Exclusive access through `&mut self` (no lock needed).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// Set the flag unless it is set (the callers hold the GIL, which orders every access).
    #[inline]
    fn take(&self) -> Option<GilGuard<'_, T>> {
        if self.taken.replace(true) {
            return None;
        }
        Some(GilGuard {
            lock: self,
            _not_send: std::marker::PhantomData,
        })
    }
}

/// The locked data of a [`GilLock`]; unlocks when dropped.
pub struct GilGuard<'a, T> {
    lock: &'a GilLock<T>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl<T> std::ops::Deref for GilGuard<'_, T> {
    type Target = T;
    #[inline]
    fn deref(&self) -> &T {
        // SAFETY: the guard is the only way to the data while `taken` is set (see `GilLock`).
        unsafe { &*self.lock.data.get() }
    }
}

impl<T> std::ops::DerefMut for GilGuard<'_, T> {
    #[inline]
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as for `deref`; `&mut self` makes this borrow the only one.
        unsafe { &mut *self.lock.data.get() }
    }
}

impl<T> Drop for GilGuard<'_, T> {
    #[inline]
    fn drop(&mut self) {
        self.lock.taken.set(false);
    }
}
