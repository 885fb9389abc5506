//! `Table`: the insertion-ordered, identity-keyed bookkeeping behind the weak dictionaries.
//!
//! Pure Rust (no pyo3): entries are generic, keys are `u64` (an object's address, or its hash for
//! hash-keyed dictionaries) and every entry also carries a `refid` (the address of its weakref).
//!
//! Layout: a `Vec` of slots in insertion order (removed slots become tombstones) plus one hash
//! map, key -> slot index. Every entry is told its slot index (`Placed::place`) when it is
//! inserted and whenever compaction moves it; the real entries store it in their weakref, so a
//! key's death (the hot removal) names its slot and `remove_dead` only checks that the slot still
//! holds that weakref (`refid`): no hash probe. The key's `index` entry is left behind, stale, and
//! every lookup through `index` checks that the slot it names is live and holds that key. Stale
//! entries are dropped in place (`HashMap::retain`, nothing re-inserted) at a fixed ratio of stale
//! to live entries (so their number stays bounded), and with every rebuild after compaction. Iterators walk slot indices, so slots never move while an
//! iterator is alive; compaction (dropping tombstones) only happens when the caller says no
//! iterator exists.
//!
//! Nothing here drops an entry: every removed entry is moved to `trash`, which the owner empties
//! only after it has released its lock (dropping an entry runs Python code in the real
//! dictionaries).
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// Hasher for keys that are already well spread integers (addresses, hashes): one multiply and
/// a fold, so both the low bits (bucket) and the high bits (hashbrown's tag) vary.
#[derive(Clone, Copy, Default)]
pub struct IdHash;

pub struct IdHasher(u64);

impl BuildHasher for IdHash {
    type Hasher = IdHasher;
    #[inline]
    fn build_hasher(&self) -> IdHasher {
        IdHasher(0)
    }
}

#[inline]
fn mix(x: u64) -> u64 {
    let h = x.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h ^ (h >> 29)
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = mix(self.0.rotate_left(8) ^ u64::from(b));
        }
    }
    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.0 = mix(n);
    }
    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.0 = mix(n as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// An entry that wants to know its slot index (the weak dictionaries' entries write it into
/// their key's weakref, for `Table::remove_dead`). Called inside the owner's locked section: it
/// must not run Python code.
pub trait Placed {
    fn place(&self, slot: usize);

    /// Whether dropping this entry now would run no code of the owner's users (no `__del__`, no
    /// other key's death), so the owner may drop it without its cascade bookkeeping.
    #[inline]
    fn quiet_drop(&self) -> bool {
        false
    }
}

/// One live slot.
pub struct Slot<E> {
    pub key: u64,
    pub refid: usize,
    pub entry: E,
}

/// Tombstones are compacted away once they are `COMPACT_RATIO - 1` times as many as live slots
/// (and at least this many slots exist); stale index entries are dropped at the same ratio. A
/// dictionary whose keys all die then re-inserts about a third of its entries in total, not all.
const COMPACT_MIN_SLOTS: usize = 16;
const COMPACT_RATIO: usize = 2;

pub struct Table<E> {
    slots: Vec<Option<Slot<E>>>,
    index: HashMap<u64, usize, IdHash>,
    /// Number of live slots (`index` may also hold stale entries of dead keys).
    live: usize,
    /// Bumped by every explicit insertion of a new key and every explicit removal (not by a key's
    /// death): iterators compare it to detect "dictionary changed size during iteration".
    size_changes: u64,
    /// Removed entries, waiting to be dropped by the owner outside its lock.
    pub trash: Vec<E>,
}

impl<E> Default for Table<E> {
    fn default() -> Self {
        Table {
            slots: Vec::new(),
            index: HashMap::with_hasher(IdHash),
            live: 0,
            size_changes: 0,
            trash: Vec::new(),
        }
    }
}

impl<E: Placed> Table<E> {
    /// Number of live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.live
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The live slot holding `key` (an `index` entry may be stale: its slot dead, popped, or
    /// reused by another key).
    #[inline]
    fn slot_of(&self, key: u64) -> Option<usize> {
        let &i = self.index.get(&key)?;
        match self.slots.get(i) {
            Some(Some(s)) if s.key == key => Some(i),
            _ => None,
        }
    }

    #[inline]
    pub fn size_changes(&self) -> u64 {
        self.size_changes
    }

    /// Number of index entries (live and stale).
    pub fn index_len(&self) -> usize {
        self.index.len()
    }

    /// Number of slots (live and tombstones): an upper bound for iteration positions.
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    #[inline]
    pub fn get(&self, key: u64) -> Option<&E> {
        let i = self.slot_of(key)?;
        self.slots[i].as_ref().map(|s| &s.entry)
    }

    #[inline]
    pub fn get_mut(&mut self, key: u64) -> Option<&mut E> {
        let i = self.slot_of(key)?;
        self.slots[i].as_mut().map(|s| &mut s.entry)
    }

    /// Insert a key that is not present (the caller checked). Counts as a size change.
    pub fn insert_new(&mut self, key: u64, refid: usize, entry: E) {
        debug_assert!(self.slot_of(key).is_none(), "insert_new of a present key");
        let i = self.slots.len();
        entry.place(i);
        self.slots.push(Some(Slot { key, refid, entry }));
        self.index.insert(key, i);
        self.live += 1;
        self.size_changes += 1;
    }

    /// Insert `entry` under `key` with a single probe of the index, unless a live slot holds
    /// `key` and `is_present` accepts its entry: then `entry` is handed back with the present
    /// one. A live slot holding `key` that `is_present` rejects (its key died and a new object
    /// took the address before the death was processed) is removed first, as a death would.
    /// Counts as a size change when it inserts.
    pub fn insert_or_present(
        &mut self,
        key: u64,
        refid: usize,
        entry: E,
        is_present: impl FnOnce(&E) -> bool,
    ) -> Result<(), (E, &mut E)> {
        let new_i = self.slots.len();
        match self.index.entry(key) {
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let i = *o.get();
                let held = match self.slots.get(i) {
                    Some(Some(s)) if s.key == key => Some(is_present(&s.entry)),
                    _ => None, // a stale index entry
                };
                match held {
                    Some(true) => {
                        let s = self.slots[i].as_mut().expect("checked live above");
                        return Err((entry, &mut s.entry));
                    }
                    Some(false) => {
                        let old = self.slots[i].take().expect("checked live above");
                        self.live -= 1;
                        self.trash.push(old.entry);
                    }
                    None => {}
                }
                *o.get_mut() = new_i;
            }
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(new_i);
            }
        }
        entry.place(new_i);
        self.slots.push(Some(Slot { key, refid, entry }));
        self.live += 1;
        self.size_changes += 1;
        Ok(())
    }

    fn take_slot(&mut self, i: usize) -> Option<&E> {
        let slot = self.slots[i].take()?;
        self.index.remove(&slot.key);
        self.live -= 1;
        self.trash.push(slot.entry);
        self.trash.last()
    }

    /// Remove `key` (moved to `trash`; a reference to it is returned). `explicit`: a user's
    /// removal (counts as a size change), not a death.
    pub fn remove(&mut self, key: u64, explicit: bool) -> Option<&E> {
        let i = self.slot_of(key)?;
        if explicit {
            self.size_changes += 1;
        }
        self.take_slot(i)
    }

    /// Remove the entry of weakref `refid` (its key died), which was placed at `slot`. Nothing
    /// happens when that slot does not hold it (the entry was removed explicitly before the key
    /// died, and the weakref outlived its entry, e.g. through `keyrefs()`). Not a size change.
    #[inline]
    pub fn remove_dead(&mut self, slot: usize, refid: usize) -> bool {
        let Some(s) = self.slots.get_mut(slot) else {
            return false;
        };
        if s.as_ref().is_none_or(|s| s.refid != refid) {
            return false;
        }
        let s = s.take().expect("checked above");
        // the key's `index` entry is left stale (see the module doc)
        self.live -= 1;
        self.trash.push(s.entry);
        true
    }

    /// `remove_dead` for a removal that was deferred (`Shared`'s pending queue): the slot may
    /// have moved since, so the entry is looked for by `refid` when it is not at `slot`.
    pub fn remove_dead_deferred(&mut self, slot: usize, refid: usize) -> bool {
        if self.remove_dead(slot, refid) {
            return true;
        }
        match self
            .slots
            .iter()
            .position(|s| s.as_ref().is_some_and(|s| s.refid == refid))
        {
            Some(i) => self.remove_dead(i, refid),
            None => false,
        }
    }

    /// The last live slot (LIFO order, as `dict.popitem`), without removing it.
    pub fn last(&self) -> Option<&Slot<E>> {
        self.slots.iter().rev().find_map(|s| s.as_ref())
    }

    /// The first live slot at index `>= from`, with its index.
    #[inline]
    pub fn next_live(&self, from: usize) -> Option<(usize, &Slot<E>)> {
        self.slots
            .get(from..)?
            .iter()
            .enumerate()
            .find_map(|(off, s)| s.as_ref().map(|s| (from + off, s)))
    }

    /// Every live slot in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = &Slot<E>> {
        self.slots.iter().filter_map(|s| s.as_ref())
    }

    /// Move every entry to `trash` (an explicit removal when anything was there).
    pub fn clear(&mut self) {
        if !self.is_empty() {
            self.size_changes += 1;
        }
        self.index.clear();
        self.live = 0;
        self.trash
            .extend(self.slots.drain(..).flatten().map(|s| s.entry));
    }

    /// Drop tombstones when `allowed` (no iterator holds a slot index) and they are worth it:
    /// trailing ones always, the rest at `COMPACT_RATIO`. The index is rebuilt
    /// (without stale entries) whenever slots move; otherwise its stale entries are dropped in
    /// place at the same ratio of stale to live entries (slots stay put for that, so it is done
    /// even while iterators exist). Runs at the end of every locked section: the checks are
    /// inline, the work is not.
    #[inline]
    pub fn maybe_compact(&mut self, allowed: bool) {
        let n = self.slots.len();
        let tombstones = allowed
            && (matches!(self.slots.last(), Some(None))
                || (n >= COMPACT_MIN_SLOTS && self.live * COMPACT_RATIO <= n));
        if tombstones || self.index.len() > COMPACT_RATIO * self.live + COMPACT_MIN_SLOTS {
            self.compact(allowed);
        }
    }

    #[inline(never)]
    fn compact(&mut self, allowed: bool) {
        if allowed {
            while matches!(self.slots.last(), Some(None)) {
                self.slots.pop();
            }
            let n = self.slots.len();
            if n >= COMPACT_MIN_SLOTS && self.live * COMPACT_RATIO <= n {
                self.slots.retain(|s| s.is_some());
                for (i, s) in self.slots.iter().enumerate() {
                    if let Some(s) = s {
                        s.entry.place(i);
                    }
                }
                self.rebuild_index();
                if self.slots.capacity() > 4 * self.slots.len() + COMPACT_MIN_SLOTS {
                    self.slots.shrink_to(2 * self.slots.len());
                }
                return;
            }
        }
        if self.index.len() > COMPACT_RATIO * self.live + COMPACT_MIN_SLOTS {
            self.drop_stale_index_entries();
        }
    }

    /// Drop the index entries whose slot no longer holds their key, in place (slots have not
    /// moved, so every live slot's entry is already right: no re-insertion, no rehash).
    fn drop_stale_index_entries(&mut self) {
        if self.live == 0 {
            self.index.clear();
            return;
        }
        let slots = &self.slots;
        self.index
            .retain(|&k, &mut i| matches!(slots.get(i), Some(Some(s)) if s.key == k));
    }

    fn rebuild_index(&mut self) {
        self.index.clear();
        for (i, s) in self.slots.iter().enumerate() {
            if let Some(s) = s {
                self.index.insert(s.key, i);
            }
        }
    }

    /// Internal consistency (for tests): the index and the slots agree.
    pub fn check_invariants(&self) -> Result<(), String> {
        let live: Vec<(usize, &Slot<E>)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i, s)))
            .collect();
        if live.len() != self.live || live.len() > self.index.len() {
            return Err(format!(
                "{} live slots (counted {}), {} index entries",
                live.len(),
                self.live,
                self.index.len(),
            ));
        }
        if self.index.len() > COMPACT_RATIO * self.live + COMPACT_MIN_SLOTS + 1 {
            return Err(format!(
                "{} stale index entries",
                self.index.len() - self.live
            ));
        }
        for (i, s) in live {
            if self.index.get(&s.key) != Some(&i) {
                return Err(format!(
                    "key {} maps to {:?}, slot {}",
                    s.key,
                    self.index.get(&s.key),
                    i
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    impl Placed for u32 {
        fn place(&self, _: usize) {}
    }
    impl Placed for u64 {
        fn place(&self, _: usize) {}
    }
    impl Placed for String {
        fn place(&self, _: usize) {}
    }
    impl Placed for () {
        fn place(&self, _: usize) {}
    }

    /// An entry that remembers where it was placed, as the dictionaries' weakrefs do.
    struct At {
        v: u64,
        slot: Rc<Cell<usize>>,
    }
    impl Placed for At {
        fn place(&self, slot: usize) {
            self.slot.set(slot);
        }
    }

    fn keys<E: Placed>(t: &Table<E>) -> Vec<u64> {
        t.iter().map(|s| s.key).collect()
    }

    #[test]
    fn insert_get_remove_keep_order() {
        let mut t = Table::default();
        for k in [30u64, 10, 20] {
            t.insert_new(k, k as usize + 1, format!("v{k}"));
        }
        assert_eq!(keys(&t), [30, 10, 20]);
        assert_eq!(t.get(10).map(String::as_str), Some("v10"));
        assert_eq!(t.remove(10, true).map(String::as_str), Some("v10"));
        assert_eq!(t.trash, ["v10"]);
        assert!(t.get(10).is_none());
        assert!(t.remove(10, true).is_none());
        assert_eq!(keys(&t), [30, 20]);
        assert_eq!(t.len(), 2);
        t.check_invariants().unwrap();
    }

    #[test]
    fn a_dead_keys_stale_index_entry_never_answers_for_a_reused_slot() {
        let mut t: Table<u32> = Table::default();
        t.insert_new(1, 11, 1);
        assert!(t.remove_dead(0, 11)); // index keeps 1 -> 0, stale
        t.maybe_compact(true); // the trailing tombstone is popped
        t.insert_new(2, 22, 2); // slot 0 again, another key
        assert_eq!(t.get(1), None);
        assert_eq!(t.get(2), Some(&2));
        assert_eq!(t.remove(1, true), None);
        t.insert_new(1, 33, 3); // the dead key's address comes back
        assert_eq!((t.get(1), t.len()), (Some(&3), 2));
        t.check_invariants().unwrap();
    }

    #[test]
    fn stale_index_entries_stay_bounded() {
        let mut t: Table<u32> = Table::default();
        t.insert_new(0, 0, 0); // one long-lived key: slots never become empty
        for k in 1..10_000u64 {
            t.insert_new(k, k as usize, 0);
            assert!(t.remove_dead(t.slot_count() - 1, k as usize));
            t.maybe_compact(k % 2 == 0); // with and without iterators alive
            assert!(t.index.len() <= COMPACT_RATIO * t.len() + COMPACT_MIN_SLOTS + 1);
        }
        t.check_invariants().unwrap();
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn insert_or_present_inserts_finds_or_replaces_a_dead_keys_slot() {
        let mut t: Table<u32> = Table::default();
        // vacant: inserted, a size change
        assert!(t.insert_or_present(1, 11, 1, |_| unreachable!()).is_ok());
        assert_eq!((t.get(1), t.size_changes()), (Some(&1), 1));
        // present: the new entry comes back with the present one, nothing changes
        match t.insert_or_present(1, 12, 2, |&e| e == 1) {
            Err((unused, present)) => {
                assert_eq!(unused, 2);
                *present = 5;
            }
            Ok(()) => panic!("the key is present"),
        }
        assert_eq!((t.get(1), t.len(), t.size_changes()), (Some(&5), 1, 1));
        // a live slot the caller rejects (its key died, the address came back): removed as a
        // death, the new entry inserted after it
        assert!(t.insert_or_present(1, 13, 3, |_| false).is_ok());
        assert_eq!(
            (t.get(1), t.len(), t.trash.as_slice()),
            (Some(&3), 1, &[5][..])
        );
        assert!(
            !t.remove_dead(0, 11),
            "the old weakref's slot is a tombstone"
        );
        // a stale index entry (the key's entry died): overwritten in place
        assert!(t.remove_dead(1, 13));
        assert_eq!(t.index_len(), 1);
        assert!(t.insert_or_present(1, 14, 4, |_| unreachable!()).is_ok());
        assert_eq!((t.get(1), t.len(), t.index_len()), (Some(&4), 1, 1));
        t.check_invariants().unwrap();
    }

    #[test]
    fn remove_dead_is_not_a_size_change() {
        let mut t = Table::default();
        t.insert_new(1, 100, ());
        t.insert_new(2, 200, ());
        let before = t.size_changes();
        assert!(t.remove_dead(0, 100));
        assert!(!t.remove_dead(0, 100));
        assert_eq!(t.size_changes(), before);
        assert!(t.remove(2, true).is_some());
        assert_eq!(t.size_changes(), before + 1);
        assert!(t.is_empty());
        t.check_invariants().unwrap();
    }

    #[test]
    fn slots_stay_put_until_compaction_is_allowed() {
        let mut t = Table::default();
        for k in 0..100u64 {
            t.insert_new(k, k as usize, k);
        }
        for k in 0..90u64 {
            t.remove_dead(k as usize, k as usize);
            t.maybe_compact(false);
        }
        // an iterator positioned at slot 95 still finds key 95 there
        assert_eq!(t.next_live(95).map(|(i, s)| (i, s.key)), Some((95, 95)));
        assert_eq!(t.slot_count(), 100);
        t.maybe_compact(true);
        assert_eq!(t.slot_count(), 10);
        assert_eq!(keys(&t), (90..100).collect::<Vec<_>>());
        assert_eq!(t.get(95), Some(&95));
        t.check_invariants().unwrap();
    }

    #[test]
    fn trailing_tombstones_go_and_last_is_lifo() {
        let mut t = Table::default();
        for k in 0..4u64 {
            t.insert_new(k, k as usize, ());
        }
        assert_eq!(t.last().map(|s| s.key), Some(3));
        t.remove(3, true);
        assert_eq!(t.last().map(|s| s.key), Some(2));
        t.maybe_compact(true);
        assert_eq!(t.slot_count(), 3);
        t.check_invariants().unwrap();
    }

    #[test]
    fn clear_moves_everything_to_trash() {
        let mut t = Table::default();
        for k in 0..5u64 {
            t.insert_new(k, k as usize, k);
        }
        let before = t.size_changes();
        t.clear();
        assert!(t.is_empty());
        assert_eq!(t.trash, [0, 1, 2, 3, 4]);
        assert_eq!(t.size_changes(), before + 1);
        t.check_invariants().unwrap();
        t.clear();
        assert_eq!(
            t.size_changes(),
            before + 1,
            "clearing an empty table changes nothing"
        );
    }

    #[test]
    fn remove_dead_checks_the_slot_holds_the_weakref() {
        let mut t = Table::default();
        t.insert_new(1, 11, 1u32);
        t.insert_new(2, 22, 2u32);
        assert!(t.remove(1, true).is_some()); // explicit removal; weakref 11 lives on elsewhere
        t.maybe_compact(true);
        assert!(!t.remove_dead(0, 11), "slot 0 is a tombstone");
        assert!(!t.remove_dead(1, 11), "slot 1 holds another weakref");
        assert!(!t.remove_dead(7, 22), "out of range");
        assert_eq!(t.len(), 1);
        assert!(t.remove_dead(1, 22));
        assert!(t.is_empty());
        t.check_invariants().unwrap();
    }

    #[test]
    fn compaction_tells_entries_their_new_slot() {
        let mut t = Table::default();
        let cells: Vec<_> = (0..40u64).map(|_| Rc::new(Cell::new(usize::MAX))).collect();
        for (k, c) in cells.iter().enumerate() {
            let slot = c.clone();
            t.insert_new(k as u64, k, At { v: k as u64, slot });
            assert_eq!(c.get(), k);
        }
        for (k, c) in cells.iter().enumerate().take(30) {
            assert!(t.remove_dead(c.get(), k));
        }
        t.maybe_compact(true);
        assert_eq!(t.slot_count(), 10);
        for (k, c) in cells.iter().enumerate().skip(30) {
            assert_eq!(c.get(), k - 30);
            assert_eq!(t.get(k as u64).map(|e| e.v), Some(k as u64));
        }
        // a removal deferred across the compaction still finds its entry
        assert!(!t.remove_dead(35, 35));
        assert!(t.remove_dead_deferred(35, 35));
        assert_eq!(t.len(), 9);
        t.check_invariants().unwrap();
    }

    #[test]
    fn random_operations_match_a_model() {
        // a tiny deterministic generator, no external crates
        let mut seed = 0x1234_5678_u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut t: Table<At> = Table::default();
        // (key, value, the slot its entry was told) in insertion order
        let mut model: Vec<(u64, u64, Rc<Cell<usize>>)> = Vec::new();
        let mut refid = 0usize;
        let mut refids = std::collections::HashMap::new();
        for step in 0..20_000u64 {
            let k = rnd(64) * 16; // address-like keys
            match rnd(4) {
                0 | 1 => {
                    if let Some(e) = t.get_mut(k) {
                        e.v = step;
                        model.iter_mut().find(|(mk, ..)| *mk == k).unwrap().1 = step;
                    } else {
                        let slot = Rc::new(Cell::new(usize::MAX));
                        refid += 1; // every insertion makes a new weakref
                        refids.insert(k, refid);
                        let e = At {
                            v: step,
                            slot: slot.clone(),
                        };
                        if step % 2 == 0 {
                            t.insert_new(k, refid, e);
                        } else {
                            assert!(t.insert_or_present(k, refid, e, |_| true).is_ok());
                        }
                        model.push((k, step, slot));
                    }
                }
                2 => {
                    let got = t.remove(k, true).map(|e| e.v);
                    let pos = model.iter().position(|(mk, ..)| *mk == k);
                    assert_eq!(got, pos.map(|p| model.remove(p).1));
                }
                _ => {
                    // k's key dies: its weakref names the slot it was last told
                    let pos = model.iter().position(|(mk, ..)| *mk == k);
                    let slot = pos.map_or(rnd(8) as usize, |p| model[p].2.get());
                    let r = refids.get(&k).copied().unwrap_or(usize::MAX);
                    assert_eq!(t.remove_dead(slot, r), pos.is_some(), "step {step}");
                    if let Some(p) = pos {
                        model.remove(p);
                    }
                }
            }
            t.maybe_compact(rnd(3) != 0);
            t.trash.clear();
            let got: Vec<(u64, u64)> = t.iter().map(|s| (s.key, s.entry.v)).collect();
            let want: Vec<(u64, u64)> = model.iter().map(|(k, v, _)| (*k, *v)).collect();
            assert_eq!(got, want, "step {step}");
        }
        t.check_invariants().unwrap();
    }

    #[test]
    fn hasher_spreads_aligned_addresses() {
        let b = IdHash;
        let mut low = std::collections::HashSet::new();
        for i in 0..256u64 {
            let mut h = b.build_hasher();
            h.write_u64(0x7f00_0000_0000 + i * 16);
            low.insert(h.finish() & 0xff);
        }
        assert!(low.len() > 128, "only {} distinct low bytes", low.len());
    }
}
