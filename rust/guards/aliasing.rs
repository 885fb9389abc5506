//! The aliasing leaf: one check over several accessors that the identity relations between
//! their values are those seen when the graph was traced. Objects in the same identity group
//! must be the same object and objects in different groups must not; tensors in the same
//! storage group must share one storage (at the traced storage offsets when the group has more
//! than one member) and tensors in different storage groups must not.
//!
//! Storage identity is `TensorImpl::storage_` read directly (`crate::ffi::storage`) at an
//! offset found here on sample tensors and verified against `untyped_storage()._cdata` and
//! `storage_offset()`; where that is not verified (or a tensor has custom size/stride policies)
//! the check asks torch's Python API (`untyped_storage()._cdata`, `storage_offset()`), slower
//! but always correct. No user Python code is called. Pure relation logic (`Partition`) has no
//! pyo3 in it and is unit-tested with `cargo test`.
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;

use crate::ffi::storage::{impl_prefix, read_storage};
use crate::ffi::tensor::IMPL_SCAN;

/// The expected relations: for each accessor, its identity group and (tensors only) its
/// storage group and storage offset.
pub(crate) struct AliasSpec {
    pub nodes: Vec<usize>,
    pub sources: Vec<String>,
    pub groups: Vec<u32>,
    pub storages: Vec<Option<(u32, i64)>>,
}

/// What was read on one check: object address, and for tensors (storage address, offset).
pub(crate) struct Observed {
    pub addr: usize,
    pub storage: Option<(usize, i64)>,
}

/// The first violated relation, as (i, j, what), j == i for a per-value failure.
pub(crate) fn first_violation(
    spec: &AliasSpec,
    seen: &[Observed],
) -> Option<(usize, usize, &'static str)> {
    let n = spec.groups.len();
    for i in 0..n {
        if let Some((g, off)) = spec.storages[i] {
            match seen[i].storage {
                None => return Some((i, i, "storage could not be read")),
                Some((_, got)) => {
                    let shared = spec
                        .storages
                        .iter()
                        .filter(|s| s.map(|x| x.0) == Some(g))
                        .count()
                        > 1;
                    if shared && got != off {
                        return Some((i, i, "storage offset changed"));
                    }
                }
            }
        }
        for j in (i + 1)..n {
            let same_now = seen[i].addr == seen[j].addr;
            let same_then = spec.groups[i] == spec.groups[j];
            if same_now != same_then {
                return Some((
                    i,
                    j,
                    if same_then {
                        "are no longer the same object"
                    } else {
                        "are now the same object"
                    },
                ));
            }
            if let (Some((gi, _)), Some((gj, _))) = (spec.storages[i], spec.storages[j]) {
                let (si, sj) = (seen[i].storage.map(|s| s.0), seen[j].storage.map(|s| s.0));
                let share_now = si.is_some() && si == sj;
                if share_now != (gi == gj) {
                    return Some((
                        i,
                        j,
                        if gi == gj {
                            "no longer share storage"
                        } else {
                            "now share storage"
                        },
                    ));
                }
            }
        }
    }
    None
}

/// The check of the hot path: O(n) with two maps per relation (object -> group, group ->
/// object), equivalent to `first_violation(..).is_none()` (which explains, in O(n²)).
pub(crate) fn holds(spec: &AliasSpec, seen: &[Observed]) -> bool {
    use std::collections::HashMap;
    let n = spec.groups.len();
    if n <= 16 {
        return first_violation(spec, seen).is_none();
    }
    let mut by_addr: HashMap<usize, u32> = HashMap::with_capacity(n);
    let mut by_group: HashMap<u32, usize> = HashMap::with_capacity(n);
    let mut by_storage: HashMap<usize, u32> = HashMap::new();
    let mut by_sgroup: HashMap<u32, (usize, usize)> = HashMap::new(); // group -> (storage, count)
    for ((obs, &g), expect) in seen.iter().zip(&spec.groups).zip(&spec.storages) {
        let addr = obs.addr;
        if *by_addr.entry(addr).or_insert(g) != g || *by_group.entry(g).or_insert(addr) != addr {
            return false;
        }
        if let Some((sg, _)) = *expect {
            let Some((st, _)) = obs.storage else {
                return false;
            };
            if *by_storage.entry(st).or_insert(sg) != sg {
                return false;
            }
            let e = by_sgroup.entry(sg).or_insert((st, 0));
            if e.0 != st {
                return false;
            }
            e.1 += 1;
        }
    }
    // storage offsets of tensors that share a storage group
    spec.storages
        .iter()
        .zip(seen)
        .all(|(expect, obs)| match (*expect, obs.storage) {
            (Some((sg, off)), Some((_, got))) => by_sgroup[&sg].1 < 2 || got == off,
            _ => true,
        })
}

impl AliasSpec {
    pub(crate) fn describe(&self) -> String {
        format!("aliasing({}) as traced", self.sources.join(", "))
    }

    pub(crate) fn observe(
        &self,
        py: Python<'_>,
        vals: &[Option<Bound<'_, PyAny>>],
    ) -> Option<Vec<Observed>> {
        let at = storage_at(py);
        let mut out = Vec::with_capacity(vals.len());
        for (i, v) in vals.iter().enumerate() {
            let v = v.as_ref()?;
            let storage = match self.storages[i] {
                None => None,
                Some(_) => storage_of(v, at),
            };
            out.push(Observed {
                addr: v.as_ptr() as usize,
                storage,
            });
        }
        Some(out)
    }

    pub(crate) fn check(&self, py: Python<'_>, vals: &[Option<Bound<'_, PyAny>>]) -> bool {
        match self.observe(py, vals) {
            Some(seen) => holds(self, &seen),
            None => false,
        }
    }

    pub(crate) fn explain(&self, py: Python<'_>, vals: &[Option<Bound<'_, PyAny>>]) -> String {
        let Some(seen) = self.observe(py, vals) else {
            return format!("{} (a value could not be read)", self.describe());
        };
        match first_violation(self, &seen) {
            None => self.describe(),
            Some((i, j, what)) if i == j => format!(
                "{}: {} {what} (traced with another alias)",
                self.describe(),
                self.sources[i]
            ),
            Some((i, j, what)) => format!(
                "{}: {} and {} {what} (they were traced {})",
                self.describe(),
                self.sources[i],
                self.sources[j],
                if what.starts_with("are now") || what.starts_with("now") {
                    "apart"
                } else {
                    "aliased"
                }
            ),
        }
    }
}

fn storage_of(v: &Bound<'_, PyAny>, at: Option<usize>) -> Option<(usize, i64)> {
    if let Some(at) = at {
        if let Some(s) = read_storage(v, at) {
            return Some(s);
        }
    }
    storage_py(v)
}

/// torch's own answer (the fallback and the calibration reference).
fn storage_py(v: &Bound<'_, PyAny>) -> Option<(usize, i64)> {
    let st = v
        .call_method0("untyped_storage")
        .ok()?
        .getattr("_cdata")
        .ok()?
        .extract::<usize>()
        .ok()?;
    let off = v
        .call_method0("storage_offset")
        .ok()?
        .extract::<i64>()
        .ok()?;
    Some((st, off))
}

static STORAGE_AT: PyOnceLock<Option<usize>> = PyOnceLock::new();

/// The verified offset of `TensorImpl::storage_`, or None (then every read takes the Python
/// path).
fn storage_at(py: Python<'_>) -> Option<usize> {
    *STORAGE_AT.get_or_init(py, || calibrate(py).ok())
}

const SAMPLES: &std::ffi::CStr = c"
base = torch.arange(24.0)
S = [base, base[3:], base.view(4, 6), base.view(4, 6).t()[1:], torch.empty(5, dtype=torch.int64),
     torch.zeros(2, 3).t(), torch.ones(7)[2:], torch.zeros(0), torch.tensor(3.0),
     torch.ones(2, 3, 4, 5, 6, 7)[1:]]
";

fn calibrate(py: Python<'_>) -> Result<usize, String> {
    let e = |e: PyErr| e.to_string();
    crate::tensor::torch(py).map_err(e)?; // installs the tensor layout if it verifies
    let ns = PyDict::new(py);
    ns.set_item("torch", py.import("torch").map_err(e)?)
        .map_err(e)?;
    py.run(SAMPLES, Some(&ns), None).map_err(e)?;
    let samples = ns.get_item("S").map_err(e)?.ok_or("no samples")?;
    let mut probes = Vec::new();
    for t in samples.try_iter().map_err(e)? {
        let t = t.map_err(e)?;
        let imp: usize = t.getattr("_cdata").map_err(e)?.extract().map_err(e)?;
        let want = storage_py(&t).ok_or("storage of a sample")?;
        let bytes = impl_prefix(&t, imp).ok_or("direct tensor reads are not enabled")?;
        probes.push((t, want, bytes));
    }
    let word = |b: &[u8], o: usize| usize::from_le_bytes(b[o..o + 8].try_into().unwrap());
    let found: Vec<usize> = (8..IMPL_SCAN - 8)
        .step_by(8)
        .filter(|&o| probes.iter().all(|(_, w, b)| word(b, o) == w.0))
        .collect();
    let [at] = found[..] else {
        return Err(format!("storage_: {} candidate offsets", found.len()));
    };
    // Distinct storages must read differently, shared ones alike (base and its views).
    if probes[0].1 .0 == probes[4].1 .0 || probes[0].1 .0 != probes[1].1 .0 {
        return Err("samples do not have the expected storages".into());
    }
    for (t, want, _) in &probes {
        if read_storage(t, at) != Some(*want) {
            return Err(
                "direct storage read differs from untyped_storage()/storage_offset()".into(),
            );
        }
    }
    Ok(at)
}

/// Whether storage identity is read directly (diagnostics and tests).
#[pyfunction]
pub fn _aliasing_fast_path(py: Python<'_>) -> bool {
    storage_at(py).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(groups: Vec<u32>, storages: Vec<Option<(u32, i64)>>) -> AliasSpec {
        let n = groups.len();
        AliasSpec {
            nodes: (0..n).collect(),
            sources: (0..n).map(|i| format!("L[{i}]")).collect(),
            groups,
            storages,
        }
    }

    fn obs(addr: usize, st: Option<(usize, i64)>) -> Observed {
        Observed { addr, storage: st }
    }

    #[test]
    fn distinct_then_same_object_fails() {
        let s = spec(vec![0, 1], vec![Some((0, 0)), Some((1, 0))]);
        assert!(first_violation(&s, &[obs(1, Some((10, 0))), obs(2, Some((20, 0)))]).is_none());
        assert_eq!(
            first_violation(&s, &[obs(1, Some((10, 0))), obs(1, Some((10, 0)))]).map(|v| v.2),
            Some("are now the same object")
        );
    }

    #[test]
    fn shared_storage_is_detected_both_ways() {
        let apart = spec(vec![0, 1], vec![Some((0, 0)), Some((1, 0))]);
        assert_eq!(
            first_violation(&apart, &[obs(1, Some((10, 0))), obs(2, Some((10, 4)))]).map(|v| v.2),
            Some("now share storage")
        );
        let shared = spec(vec![0, 1], vec![Some((0, 0)), Some((0, 4))]);
        assert!(
            first_violation(&shared, &[obs(1, Some((10, 0))), obs(2, Some((10, 4)))]).is_none()
        );
        assert_eq!(
            first_violation(&shared, &[obs(1, Some((10, 0))), obs(2, Some((10, 2)))]).map(|v| v.2),
            Some("storage offset changed")
        );
        assert_eq!(
            first_violation(&shared, &[obs(1, Some((10, 0))), obs(2, Some((11, 4)))]).map(|v| v.2),
            Some("no longer share storage")
        );
    }

    #[test]
    fn linear_check_agrees_with_pairwise_on_large_inputs() {
        // 40 values: groups i/2 (pairs of one object), storages i/4 with offsets
        let n = 40;
        let s = spec(
            (0..n).map(|i| (i / 2) as u32).collect(),
            (0..n)
                .map(|i| Some(((i / 4) as u32, (i % 4 / 2) as i64 * 8)))
                .collect(),
        );
        let good: Vec<Observed> = (0..n)
            .map(|i| obs(100 + i / 2, Some((1000 + i / 4, (i % 4 / 2) as i64 * 8))))
            .collect();
        assert!(holds(&s, &good) && first_violation(&s, &good).is_none());
        let mut variants = Vec::new();
        let mut merged = good
            .iter()
            .map(|o| obs(o.addr, o.storage))
            .collect::<Vec<_>>();
        merged[5] = obs(100, Some((1000, 0))); // two groups now one object
        variants.push(merged);
        let mut split = good
            .iter()
            .map(|o| obs(o.addr, o.storage))
            .collect::<Vec<_>>();
        split[1] = obs(999, Some((1000, 0))); // a pair now two objects
        variants.push(split);
        let mut offset = good
            .iter()
            .map(|o| obs(o.addr, o.storage))
            .collect::<Vec<_>>();
        offset[2] = obs(offset[2].addr, Some((1000, 4)));
        offset[3] = obs(offset[3].addr, Some((1000, 4)));
        variants.push(offset);
        let mut shared = good
            .iter()
            .map(|o| obs(o.addr, o.storage))
            .collect::<Vec<_>>();
        for o in shared.iter_mut().skip(4).take(4) {
            o.storage = Some((1000, o.storage.unwrap().1)); // two storage groups now one
        }
        variants.push(shared);
        for v in &variants {
            assert!(!holds(&s, v));
            assert!(first_violation(&s, v).is_some());
        }
    }

    #[test]
    fn unreadable_storage_fails() {
        let s = spec(vec![0], vec![Some((0, 0))]);
        assert!(first_violation(&s, &[obs(1, None)]).is_some());
    }
}
