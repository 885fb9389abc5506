//! `Shared`: a `Table` behind a lock that is never held while Python code runs, plus the queue of
//! removals deferred while it is held, and the count of live iterators.
//!
//! Entries are generic (no Python objects named here); the lock is a `GilLock`
//! (rust/ffi/weakkey.rs), so taking it asks for a `Python` token (the GIL held) and costs no atomic
//! instruction. The discipline that makes the weak dictionaries re-entrant:
//! - `with` runs a closure on the locked table; the closure may only touch the table and bump
//!   reference counts (no Python calls, no object creation, no drops of Python objects);
//! - everything the closure removes lands in `Table::trash`, which `with` drops after the lock is
//!   released, so a value's `__del__` (or the key deaths it causes) can re-enter the dictionary;
//! - a weakref callback that finds the lock taken (which the discipline rules out, but nothing
//!   here relies on that) queues its removal in `pending`, applied by the next `with`.
//!
//! - dropping removed entries can kill other keys whose callbacks remove more entries, and so on:
//!   a drop that starts while this thread is already dropping entries is queued and done by the
//!   outermost drop loop, so a long chain of dying keys never nests deeper than one level (no
//!   C-stack overflow however long the chain).
//!
//! Owned by the dictionary object and by each of its iterators, and by the weakrefs' callback
//! (`Arc`s): the last of the dictionary and its iterators empties the table (`core::Owner`), so
//! what the weakrefs keep alive after their dictionary died is an empty table.
use std::any::Any;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use pyo3::Python;

use crate::ffi::gil_lock::GilLock;

use super::table::{Placed, Table};

/// The table was already locked on this thread (a re-entrant call the discipline forbids).
#[derive(Debug, PartialEq, Eq)]
pub struct Busy;

pub struct Shared<E> {
    table: GilLock<Table<E>>,
    /// (slot, refid) of deaths that found the table locked.
    pending: Mutex<Vec<(usize, usize)>>,
    has_pending: AtomicBool,
    iterators: AtomicUsize,
    /// Holders that keep the entries alive (the dictionary, its iterators: `core::Owner`).
    owners: AtomicUsize,
}

impl<E: Placed> Default for Shared<E> {
    fn default() -> Self {
        Shared {
            table: GilLock::default(),
            pending: Mutex::new(Vec::new()),
            has_pending: AtomicBool::new(false),
            iterators: AtomicUsize::new(0),
            owners: AtomicUsize::new(0),
        }
    }
}

thread_local! {
    /// Whether this thread is inside `drop_unlocked`'s loop.
    static DROPPING: Cell<bool> = const { Cell::new(false) };
    /// Entries removed while `DROPPING`, for that loop to drop.
    static DEFERRED: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// What one locked section removed. A single entry (a key's death, one deletion) is moved out
/// on its own, so the table's `trash` keeps its capacity and the common case allocates nothing.
pub enum Trash<E> {
    Empty,
    One(E),
    Many(Vec<E>),
}

impl<E> Trash<E> {
    /// Take what `trash` holds, leaving it empty.
    #[inline]
    fn take_from(trash: &mut Vec<E>) -> Trash<E> {
        match trash.len() {
            0 => Trash::Empty,
            1 => Trash::One(trash.pop().expect("len 1")),
            _ => Trash::Many(std::mem::take(trash)),
        }
    }
}

/// Drop removed entries (after the lock is released), iteratively rather than recursively when
/// dropping one entry removes others.
#[inline]
pub fn drop_unlocked<E: Placed + 'static>(trash: Trash<E>) {
    match trash {
        Trash::Empty => {}
        // nothing can cascade from this drop: no thread-local bookkeeping
        Trash::One(e) if e.quiet_drop() => drop(e),
        trash => drop_cascading(trash),
    }
}

#[inline(never)]
fn drop_cascading<E: Placed + 'static>(trash: Trash<E>) {
    if DROPPING.with(|d| d.get()) {
        DEFERRED.with(|q| q.borrow_mut().push(Box::new(trash)));
        return;
    }
    struct Reset;
    impl Drop for Reset {
        fn drop(&mut self) {
            DROPPING.with(|d| d.set(false));
        }
    }
    DROPPING.with(|d| d.set(true));
    let _reset = Reset;
    drop(trash);
    while let Some(next) = DEFERRED.with(|q| q.borrow_mut().pop()) {
        drop(next);
    }
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl<E: Placed + 'static> Shared<E> {
    /// Run `f` on the locked table; entries it removed are dropped after unlocking.
    pub fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Table<E>) -> R) -> Result<R, Busy> {
        let (r, trash) = {
            let Some(mut t) = self.table.try_lock(py) else {
                return Err(Busy);
            };
            if self.has_pending.load(Ordering::Acquire) {
                self.has_pending.store(false, Ordering::Release);
                let refs = std::mem::take(&mut *lock_ignoring_poison(&self.pending));
                for (slot, refid) in refs {
                    t.remove_dead_deferred(slot, refid);
                }
            }
            let r = f(&mut t);
            t.maybe_compact(self.iterators.load(Ordering::Acquire) == 0);
            (r, Trash::take_from(&mut t.trash))
        };
        drop_unlocked(trash);
        Ok(r)
    }

    /// A key died: remove the entry of weakref `refid`, placed at `slot`, now, or later if the
    /// table is busy. Returns true when it was applied now.
    pub fn remove_dead(&self, py: Python<'_>, slot: usize, refid: usize) -> bool {
        if self.with(py, |t| t.remove_dead(slot, refid)).is_ok() {
            return true;
        }
        lock_ignoring_poison(&self.pending).push((slot, refid));
        self.has_pending.store(true, Ordering::Release);
        false
    }

    /// Removals queued while the table was busy, not yet applied.
    pub fn pending_count(&self) -> usize {
        lock_ignoring_poison(&self.pending).len()
    }

    /// One more holder of the entries.
    pub fn add_owner(&self) {
        self.owners.fetch_add(1, Ordering::AcqRel);
    }

    /// One holder less; true when it was the last one.
    pub fn release_owner(&self) -> bool {
        self.owners.fetch_sub(1, Ordering::AcqRel) == 1
    }

    /// An iterator started: slot indices must stay put until `end_iteration`.
    pub fn begin_iteration(&self) {
        self.iterators.fetch_add(1, Ordering::AcqRel);
    }

    pub fn end_iteration(&self) {
        self.iterators.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn iterators(&self) -> usize {
        self.iterators.load(Ordering::Acquire)
    }

    /// Everything, for the garbage collector's traversal: `None` if the table is busy (then the
    /// collector sees fewer references, which only keeps objects alive).
    pub fn try_peek<R>(&self, py: Python<'_>, f: impl FnOnce(&Table<E>) -> R) -> Option<R> {
        self.table.try_lock(py).map(|t| f(&t))
    }

    /// `try_peek` inside the garbage collector's traversal (no `Python` token there).
    pub fn try_peek_in_traverse<R>(
        &self,
        visit: &pyo3::PyVisit<'_>,
        f: impl FnOnce(&Table<E>) -> R,
    ) -> Option<R> {
        self.table.try_lock_in_traverse(visit).map(|t| f(&t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pyo3::Python;
    use std::sync::Arc;
    use std::sync::Mutex as StdMutex;

    /// An entry that records when it is dropped and whether the table was locked then.
    struct Probe {
        name: &'static str,
        log: Arc<StdMutex<Vec<String>>>,
        shared: std::sync::Weak<Shared<Probe>>,
        on_drop: Option<(usize, usize)>, // (slot, refid) of a key that "dies" when this is dropped
    }

    impl Placed for Probe {
        fn place(&self, _: usize) {}
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            Python::attach(|py| {
                let shared = self.shared.upgrade().expect("shared alive");
                let free = shared.try_peek(py, |_| ()).is_some();
                self.log
                    .lock()
                    .unwrap()
                    .push(format!("drop {} unlocked={free}", self.name));
                if let Some((slot, r)) = self.on_drop {
                    shared.remove_dead(py, slot, r);
                }
            })
        }
    }

    fn probe(
        s: &Arc<Shared<Probe>>,
        log: &Arc<StdMutex<Vec<String>>>,
        name: &'static str,
        on_drop: Option<(usize, usize)>,
    ) -> Probe {
        Probe {
            name,
            log: log.clone(),
            shared: Arc::downgrade(s),
            on_drop,
        }
    }

    #[test]
    fn entries_are_dropped_after_unlocking_and_may_cascade() {
        Python::initialize();
        Python::attach(|py| {
            let s: Arc<Shared<Probe>> = Arc::new(Shared::default());
            let log = Arc::new(StdMutex::new(Vec::new()));
            // dropping a's entry kills b's key, whose entry kills c's key
            let (a, b, c) = (
                probe(&s, &log, "a", Some((1, 2))),
                probe(&s, &log, "b", Some((2, 3))),
                probe(&s, &log, "c", None),
            );
            s.with(py, |t| {
                t.insert_new(10, 1, a);
                t.insert_new(20, 2, b);
                t.insert_new(30, 3, c);
            })
            .unwrap();
            s.with(py, |t| {
                t.remove(10, true);
            })
            .unwrap();
            assert_eq!(
                *log.lock().unwrap(),
                [
                    "drop a unlocked=true",
                    "drop b unlocked=true",
                    "drop c unlocked=true"
                ]
            );
            assert_eq!(s.with(py, |t| t.len()).unwrap(), 0);
        })
    }

    #[test]
    fn long_cascades_are_dropped_iteratively() {
        Python::initialize();
        Python::attach(|py| {
            thread_local!(static DEPTH: Cell<usize> = const { Cell::new(0) });
            thread_local!(static MAX_DEPTH: Cell<usize> = const { Cell::new(0) });
            struct Link {
                shared: std::sync::Weak<Shared<Link>>,
                next: Option<usize>,
                /// Where each link was placed (compaction moves them as the cascade goes).
                placed: Arc<Vec<AtomicUsize>>,
                me: usize,
            }
            impl Placed for Link {
                fn place(&self, slot: usize) {
                    self.placed[self.me].store(slot, Ordering::Relaxed);
                }
            }
            impl Drop for Link {
                fn drop(&mut self) {
                    let d = DEPTH.with(|d| d.get()) + 1;
                    DEPTH.with(|x| x.set(d));
                    MAX_DEPTH.with(|m| m.set(m.get().max(d)));
                    if let (Some(r), Some(s)) = (self.next, self.shared.upgrade()) {
                        Python::attach(|py| {
                            s.remove_dead(py, self.placed[r].load(Ordering::Relaxed), r)
                        });
                    }
                    DEPTH.with(|x| x.set(d - 1));
                }
            }
            let s: Arc<Shared<Link>> = Arc::new(Shared::default());
            let n = 100_000;
            let placed: Arc<Vec<AtomicUsize>> =
                Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
            s.with(py, |t| {
                for i in 0..n {
                    let next = (i + 1 < n).then_some(i + 1);
                    t.insert_new(
                        i as u64,
                        i,
                        Link {
                            shared: Arc::downgrade(&s),
                            next,
                            placed: placed.clone(),
                            me: i,
                        },
                    );
                }
            })
            .unwrap();
            s.remove_dead(py, 0, 0);
            assert_eq!(s.with(py, |t| t.len()).unwrap(), 0);
            assert_eq!(MAX_DEPTH.with(|m| m.get()), 1);
        })
    }

    #[test]
    fn removal_while_busy_is_deferred_then_applied() {
        Python::initialize();
        Python::attach(|py| {
            let s: Arc<Shared<u32>> = Arc::new(Shared::default());
            s.with(py, |t| {
                t.insert_new(1, 11, 1);
                t.insert_new(2, 22, 2);
            })
            .unwrap();
            let applied = s
                .with(py, |t| {
                    // a callback firing while the table is locked
                    let now = s.remove_dead(py, 0, 11);
                    (now, t.len())
                })
                .unwrap();
            assert_eq!(applied, (false, 2));
            assert_eq!(s.pending_count(), 1);
            assert_eq!(
                s.with(py, |t| t.len()).unwrap(),
                1,
                "applied by the next with()"
            );
            assert_eq!(s.pending_count(), 0);
        })
    }

    #[test]
    fn reentrant_with_is_refused_not_deadlocked() {
        Python::initialize();
        Python::attach(|py| {
            let s: Shared<u32> = Shared::default();
            let inner = s.with(py, |_| s.with(py, |_| ())).unwrap();
            assert_eq!(inner, Err(Busy));
        })
    }

    #[test]
    fn no_compaction_while_iterating() {
        Python::initialize();
        Python::attach(|py| {
            let s: Shared<u32> = Shared::default();
            s.with(py, |t| {
                (0..64).for_each(|k| t.insert_new(k, k as usize, k as u32))
            })
            .unwrap();
            s.begin_iteration();
            for r in 0..60 {
                s.remove_dead(py, r, r);
            }
            assert_eq!(s.with(py, |t| (t.len(), t.slot_count())).unwrap(), (4, 64));
            s.end_iteration();
            s.with(py, |_| ()).unwrap(); // compaction happens as a locked section ends
            assert_eq!(s.with(py, |t| (t.len(), t.slot_count())).unwrap(), (4, 4));
        })
    }
}
