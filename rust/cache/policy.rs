//! The per-code entry list as plain data: most-recently-hit first, a size limit, and cheap
//! snapshots for lookups that may run Python code (no pyo3 here, so `cargo test` covers it).
use std::sync::Arc;

/// An ordered list of entries. Readers take a [`snapshot`](EntryList::snapshot) (one atomic
/// increment) and iterate it without holding any lock; writers replace or copy-on-write the
/// shared vector, so a lookup in progress keeps seeing the list it started with.
#[derive(Debug)]
pub struct EntryList<T> {
    items: Arc<Vec<T>>,
}

impl<T> Default for EntryList<T> {
    fn default() -> Self {
        EntryList {
            items: Arc::new(Vec::new()),
        }
    }
}

/// Why an insert was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum InsertError {
    /// The list already holds `limit` entries.
    AtLimit,
}

impl<T: Clone> EntryList<T> {
    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// True when no further entry may be inserted under `limit`.
    pub fn at_limit(&self, limit: usize) -> bool {
        self.items.len() >= limit
    }

    /// The most recently hit entry.
    pub fn first(&self) -> Option<&T> {
        self.items.first()
    }

    /// The current entries, most recently hit first.
    pub fn snapshot(&self) -> Arc<Vec<T>> {
        Arc::clone(&self.items)
    }

    /// Insert at the front unless the list is at `limit`; on refusal the item is handed back.
    pub fn insert_front(&mut self, item: T, limit: usize) -> Result<(), (InsertError, T)> {
        if self.at_limit(limit) {
            return Err((InsertError::AtLimit, item));
        }
        Arc::make_mut(&mut self.items).insert(0, item);
        Ok(())
    }

    /// Move the first entry matching `is_it` to the front (a hit). Returns whether it was found.
    pub fn promote(&mut self, is_it: impl Fn(&T) -> bool) -> bool {
        match self.items.iter().position(is_it) {
            Some(0) => true,
            Some(i) => {
                let v = Arc::make_mut(&mut self.items);
                let e = v.remove(i);
                v.insert(0, e);
                true
            }
            None => false,
        }
    }

    /// Empty the list, returning the old entries so the caller can drop them outside any lock.
    pub fn take_all(&mut self) -> Arc<Vec<T>> {
        std::mem::take(&mut self.items)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[u32]) -> EntryList<u32> {
        let mut l = EntryList::default();
        for &i in items.iter().rev() {
            l.insert_front(i, usize::MAX).unwrap();
        }
        l
    }

    #[test]
    fn insert_goes_to_front() {
        let mut l = EntryList::default();
        l.insert_front(1, 8).unwrap();
        l.insert_front(2, 8).unwrap();
        assert_eq!(*l.snapshot(), vec![2, 1]);
    }

    #[test]
    fn limit_refuses_and_returns_item() {
        let mut l = EntryList::default();
        for i in 0..3 {
            l.insert_front(i, 3).unwrap();
        }
        assert!(l.at_limit(3));
        assert_eq!(l.insert_front(9, 3), Err((InsertError::AtLimit, 9)));
        assert_eq!(l.len(), 3);
        // A larger limit admits it again.
        l.insert_front(9, 4).unwrap();
        assert_eq!(l.snapshot()[0], 9);
    }

    #[test]
    fn promote_moves_hit_to_front_keeping_others_in_order() {
        let mut l = list(&[1, 2, 3, 4]);
        assert!(l.promote(|&x| x == 3));
        assert_eq!(*l.snapshot(), vec![3, 1, 2, 4]);
        assert!(l.promote(|&x| x == 3));
        assert_eq!(*l.snapshot(), vec![3, 1, 2, 4]);
        assert!(!l.promote(|&x| x == 7));
    }

    #[test]
    fn snapshot_is_stable_across_writes() {
        let mut l = list(&[1, 2, 3]);
        let snap = l.snapshot();
        l.promote(|&x| x == 3);
        l.insert_front(0, 8).unwrap();
        assert_eq!(*snap, vec![1, 2, 3]);
        assert_eq!(*l.snapshot(), vec![0, 3, 1, 2]);
        let old = l.take_all();
        assert_eq!(*old, vec![0, 3, 1, 2]);
        assert!(l.is_empty());
    }
}
