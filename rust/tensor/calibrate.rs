//! Finds where torch keeps tensor metadata (offsets inside `THPVariable`, `TensorImpl` and
//! `AutogradMeta`) by looking for distinctive values in sample tensors, then verifies the result
//! on a broad set of tensors against the Python API. Only a layout that passes everything is
//! installed; otherwise every tensor read goes through Python (see `crate::tensor`).
use std::ffi::CString;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyModule};

use crate::ffi::tensor::{self as raw, TensorLayout, AUTOGRAD_SCAN, IMPL_SCAN, VIEW_SCAN};

/// What calibration learnt: the layout (if verified) and the raw-code tables.
pub(crate) struct Calibration {
    pub layout: Option<TensorLayout>,
    pub failure: Option<String>,
    /// Raw `TypeMeta` index -> torch.dtype.
    pub dtypes: Vec<(u16, Py<PyAny>)>,
    /// Raw `DeviceType` -> device type name.
    pub device_types: Vec<(u8, String)>,
    pub non_plain_keys: u64,
}

fn w64(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap())
}

fn unique(mut c: Vec<usize>, what: &str) -> Result<usize, String> {
    match c.len() {
        1 => Ok(c.pop().unwrap()),
        0 => Err(format!("calibration: {what} not found")),
        _ => Err(format!("calibration: {what} is ambiguous ({c:?})")),
    }
}

pub(crate) fn samples_module(py: Python<'_>) -> PyResult<Bound<'_, PyModule>> {
    let code = CString::new(include_str!("samples.py")).expect("no NUL in samples.py");
    PyModule::from_code(
        py,
        &code,
        c"<ferrodyn tensor samples>",
        c"ferrodyn._tensor_samples",
    )
}

/// Calibrate; never fails: any problem leaves the fast path off, with the reason.
pub(crate) fn calibrate(py: Python<'_>) -> Calibration {
    calibrate_or_err(py).unwrap_or_else(|e| Calibration {
        layout: None,
        failure: Some(format!("calibration raised {e}")),
        dtypes: Vec::new(),
        device_types: Vec::new(),
        non_plain_keys: u64::MAX,
    })
}

fn calibrate_or_err(py: Python<'_>) -> PyResult<Calibration> {
    let m = samples_module(py)?;
    let torch = py.import("torch")?;
    let base = torch.getattr("_C")?.getattr("TensorBase")?;
    let base_ptr = base.as_ptr() as usize;
    let tensor_type = torch.getattr("Tensor")?.as_ptr() as usize;
    let non_plain_keys = m.call_method0("non_plain_keys")?.extract::<u64>()?;
    let mut cal = Calibration {
        layout: None,
        failure: None,
        dtypes: Vec::new(),
        device_types: Vec::new(),
        non_plain_keys,
    };
    match locate(py, &m, base_ptr, tensor_type, &mut cal)
        .and_then(|l| verify(py, &m, &l, &cal).map(|_| l))
    {
        Ok(l) => {
            if raw::install_layout(l) {
                cal.layout = Some(l);
            } else {
                cal.failure = Some("a different layout was installed earlier".into());
            }
        }
        Err(e) => cal.failure = Some(e),
    }
    Ok(cal)
}

/// Word offsets in AutogradMeta bytes (`scan` long) that are null on every leaf, set on every
/// non-leaf, and set before / null after `detach_()` of one more non-leaf (`detached`).
fn grad_fn_candidates(
    leaves: &[Vec<u8>],
    nonleaves: &[Vec<u8>],
    detached: (&[u8], &[u8]),
    scan: usize,
) -> Vec<usize> {
    (8..scan - 8)
        .step_by(8)
        .filter(|&o| leaves.iter().all(|b| w64(b, o) == 0))
        .filter(|&o| nonleaves.iter().all(|b| w64(b, o) != 0))
        .filter(|&o| w64(detached.0, o) != 0 && w64(detached.1, o) == 0)
        .collect()
}

struct Probe<'py> {
    t: Bound<'py, PyAny>,
    d: Bound<'py, PyDict>,
    imp: usize,
}

fn probe<'py>(m: &Bound<'py, PyModule>, t: Bound<'py, PyAny>) -> Result<Probe<'py>, String> {
    let d = m
        .call_method1("describe", (&t,))
        .map_err(|e| e.to_string())?;
    let d = d.cast_into::<PyDict>().map_err(|e| e.to_string())?;
    let imp = d
        .get_item("impl")
        .ok()
        .flatten()
        .and_then(|v| v.extract::<usize>().ok())
        .ok_or("no _cdata")?;
    Ok(Probe { t, d, imp })
}

fn get<'py, T: for<'a> pyo3::FromPyObject<'a, 'py>>(
    d: &Bound<'py, PyDict>,
    k: &str,
) -> Result<T, String> {
    d.get_item(k)
        .ok()
        .flatten()
        .and_then(|v| v.extract::<T>().ok())
        .ok_or_else(|| format!("calibration: bad {k}"))
}

fn locate(
    py: Python<'_>,
    m: &Bound<'_, PyModule>,
    base: usize,
    tensor_type: usize,
    cal: &mut Calibration,
) -> Result<TensorLayout, String> {
    let e = |e: PyErr| e.to_string();
    let probes = m.call_method0("probes").map_err(e)?;
    let item = |k: &str| probes.get_item(k).map_err(|e| e.to_string());
    let strided = probe(m, item("strided")?)?;
    let plain = probe(m, item("plain")?)?;

    // THPVariable: the word holding the TensorImpl*.
    let ow = raw::object_words(&strided.t, 8);
    let cdata = unique(
        (2..ow.len())
            .filter(|&i| ow[i] == strided.imp)
            .map(|i| i * 8)
            .collect(),
        "THPVariable.cdata",
    )?;
    let pw = raw::object_words(&plain.t, 8);
    if pw.get(cdata / 8) != Some(&plain.imp) {
        return Err("calibration: cdata offset differs between tensors".into());
    }
    let bytes = |p: &Probe<'_>| {
        raw::impl_bytes(&p.t, base, cdata, p.imp, IMPL_SCAN)
            .ok_or("calibration: cannot read TensorImpl")
    };
    let sb = bytes(&strided)?;

    // SizesAndStrides: size_ = 3, then sizes (11, 13, 17) inline, strides (1009, 101, 7) at +5.
    let want = |o: usize| {
        w64(&sb, o) == 3
            && [11, 13, 17]
                .iter()
                .enumerate()
                .all(|(i, &v)| w64(&sb, o + 8 + 8 * i) == v)
            && [1009, 101, 7]
                .iter()
                .enumerate()
                .all(|(i, &v)| w64(&sb, o + 48 + 8 * i) == v)
    };
    let sas = unique(
        (16..IMPL_SCAN - 88)
            .step_by(8)
            .filter(|&o| want(o))
            .collect(),
        "sizes_and_strides_",
    )?;
    // storage_offset_ and numel_ follow; then data_type_, device_opt_, the bitfields.
    if w64(&sb, sas + 88) != 3 || w64(&sb, sas + 96) != 11 * 13 * 17 {
        return Err("calibration: storage_offset_/numel_ not where expected".into());
    }
    let dtype = sas + 104;
    let device = dtype + 2;
    let flags = device + 3;

    // key_set_: the first aligned word after the bitfields equal to every sample's raw keys.
    let keyed: Vec<Probe<'_>> = item("keyed")?
        .try_iter()
        .map_err(e)?
        .map(|t| probe(m, t.map_err(|e| e.to_string())?))
        .collect::<Result<_, _>>()?;
    let kb: Vec<(Vec<u8>, u64)> = keyed
        .iter()
        .map(|p| Ok((bytes(p)?, get::<u64>(&p.d, "dispatch_keys")?)))
        .collect::<Result<_, String>>()?;
    let start = flags.div_ceil(8) * 8;
    let keys = unique(
        (start..=IMPL_SCAN - 8)
            .step_by(8)
            .filter(|&o| kb.iter().all(|(b, k)| w64(b, o) == *k))
            .collect(),
        "key_set_",
    )?;
    let flags_len = keys - flags;
    if !(1..=4).contains(&flags_len) {
        return Err(format!("calibration: {flags_len} bytes of bitfields"));
    }
    let flag_word = |b: &[u8]| {
        let mut f = [0u8; 4];
        f[..flags_len].copy_from_slice(&b[flags..keys]);
        u32::from_le_bytes(f)
    };

    // Policy bits: what a wrapper subclass's custom sizes/strides/device/layout policies set.
    let wr = item("wrappers")?;
    let wflags = |k: &str| -> Result<Vec<u32>, String> {
        // Only `_cdata` here: sizes of a custom-policy wrapper are answered by its dispatch.
        let ts = wr.get_item(k).map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        for t in ts.try_iter().map_err(|e| e.to_string())? {
            let t = t.map_err(|e| e.to_string())?;
            let imp = t
                .getattr("_cdata")
                .and_then(|v| v.extract::<usize>())
                .map_err(|e| e.to_string())?;
            let b = raw::impl_bytes(&t, base, cdata, imp, IMPL_SCAN)
                .ok_or("calibration: cannot read a wrapper")?;
            out.push(flag_word(&b));
        }
        Ok(out)
    };
    // Policy-free samples: wrappers without a policy and every plain probe.
    let mut free = wflags("none")?;
    free.push(flag_word(&sb));
    free.push(flag_word(&bytes(&plain)?));
    for p in &keyed {
        free.push(flag_word(&bytes(p)?));
    }
    let kinds = ["sizes", "strides", "device", "layout"]
        .into_iter()
        .map(|k| Ok((k, wflags(k)?)))
        .collect::<Result<Vec<_>, String>>()?;
    let policy_mask = policy_mask(&kinds, &free)?;

    // autograd_meta_: null without autograd metadata, set on a leaf that requires grad.
    let leaves: Vec<Probe<'_>> = item("leaves")?
        .try_iter()
        .map_err(e)?
        .map(|t| probe(m, t.map_err(|e| e.to_string())?))
        .collect::<Result<_, _>>()?;
    let nonleaves: Vec<Probe<'_>> = item("nonleaves")?
        .try_iter()
        .map_err(e)?
        .map(|t| probe(m, t.map_err(|e| e.to_string())?))
        .collect::<Result<_, _>>()?;
    let pb = bytes(&plain)?;
    let lb: Vec<Vec<u8>> = leaves.iter().map(&bytes).collect::<Result<_, _>>()?;
    let am = unique(
        (8..sas)
            .step_by(8)
            .filter(|&o| w64(&pb, o) == 0 && lb.iter().all(|b| w64(b, o) != 0))
            .filter(|&o| o != cdata)
            .collect(),
        "autograd_meta_",
    )?;
    let amb = |p: &Probe<'_>| {
        raw::autograd_bytes(&p.t, base, cdata, p.imp, am, AUTOGRAD_SCAN)
            .ok_or("calibration: cannot read AutogradMeta")
    };
    let la: Vec<Vec<u8>> = leaves.iter().map(amb).collect::<Result<_, _>>()?;
    let na: Vec<Vec<u8>> = nonleaves.iter().map(amb).collect::<Result<_, _>>()?;
    let am_vtable = w64(&la[0], 0) as usize;
    if la
        .iter()
        .chain(na.iter())
        .any(|b| w64(b, 0) as usize != am_vtable)
    {
        return Err("calibration: AutogradMeta vtables differ".into());
    }
    // grad_fn_: null on leaves, set on non-leaves, and cleared by detach_() (uninitialised
    // bytes, e.g. a std::string's inline buffer, can pass the first two tests by chance).
    let dt = probe(m, item("detachable")?)?;
    let d_before = amb(&dt)?;
    m.call_method1("detach_in_place", (&dt.t,)).map_err(e)?;
    let d_after = amb(&dt)?;
    let am_grad_fn = unique(
        grad_fn_candidates(&la, &na, (&d_before, &d_after), AUTOGRAD_SCAN),
        "AutogradMeta.grad_fn_",
    )?;
    // requires_grad_: the byte that follows requires_grad_(False) / requires_grad_(True).
    let tg = probe(m, item("toggled")?)?;
    let b1 = amb(&tg)?;
    tg.t.call_method1("requires_grad_", (false,)).map_err(e)?;
    let b0 = amb(&tg)?;
    tg.t.call_method1("requires_grad_", (true,)).map_err(e)?;
    let b2 = amb(&tg)?;
    let am_requires_grad = unique(
        (8..AUTOGRAD_SCAN)
            .filter(|&i| b1[i] == 1 && b0[i] == 0 && b2[i] == 1)
            .collect(),
        "AutogradMeta.requires_grad_",
    )?;

    // Views: DifferentiableViewMeta (another vtable) holds backward_info_, an optional<ViewInfo>
    // whose first member is the base tensor; the optional's flag follows the 48-byte ViewInfo.
    let (view_vtable, view_base, view_engaged) =
        locate_views(m, &item("views")?, base, cdata, am, am_vtable).unwrap_or((0, 0, 0));

    // Raw dtype and device-type codes.
    for t in item("dtypes")?.try_iter().map_err(e)? {
        let p = probe(m, t.map_err(e)?)?;
        let b = bytes(&p)?;
        let code = u16::from_le_bytes([b[dtype], b[dtype + 1]]);
        let dt = p.d.get_item("dtype").ok().flatten().ok_or("no dtype")?;
        if cal
            .dtypes
            .iter()
            .any(|(c, d)| *c == code || d.bind(py).is(&dt))
        {
            return Err("calibration: dtype codes are not one-to-one".into());
        }
        cal.dtypes.push((code, dt.unbind()));
    }
    for t in item("devices")?.try_iter().map_err(e)? {
        let p = probe(m, t.map_err(e)?)?;
        let b = bytes(&p)?;
        let name: String = get(&p.d, "device_type")?;
        if b[device + 2] != 1
            || cal
                .device_types
                .iter()
                .any(|(c, n)| *c == b[device] || *n == name)
        {
            return Err("calibration: device codes are not one-to-one".into());
        }
        cal.device_types.push((b[device], name));
    }
    Ok(TensorLayout {
        tensor_base: base,
        tensor_type,
        cdata,
        autograd_meta: am,
        sizes_strides: sas,
        dtype,
        device,
        flags,
        flags_len,
        policy_mask,
        keys,
        am_vtable,
        am_grad_fn,
        am_requires_grad,
        view_vtable,
        view_base,
        view_engaged,
    })
}

/// Fewest samples of each policy kind (and of policy-free tensors) that [`policy_mask`] accepts.
const MIN_POLICY_SAMPLES: usize = 8;

/// The bits of the bitfield word that select a custom policy, from the words of wrappers of each
/// policy kind and of policy-free tensors.
///
/// The word is not all fields: it has padding bits (one on the builds seen, above
/// `python_custom_layout_`) that `TensorImpl`'s constructor never writes, so they keep whatever
/// the heap held there, e.g. the sign bit of a freed float64 buffer. Comparing one wrapper per
/// kind with one policy-free wrapper therefore picked such a bit up whenever the two samples'
/// garbage differed, and any tensor with the bit set then failed verification.
///
/// A policy bit is set in every wrapper of its kind and clear in every policy-free tensor
/// (policies are `Default`, i.e. 0, there); a padding bit passes only if its garbage happens to
/// line up the same way over all the samples, which is what the sample counts make negligible.
/// If one ever did, it would only send tensors with it set to the Python path (and fail
/// verification if one is in the set): never a wrong answer, since every policy bit is kept.
fn policy_mask(kinds: &[(&str, Vec<u32>)], free: &[u32]) -> Result<u32, String> {
    if free.len() < MIN_POLICY_SAMPLES {
        return Err("calibration: too few policy-free samples".into());
    }
    let any_free = free.iter().fold(0u32, |a, &w| a | w);
    let mut mask = 0u32;
    for (k, ws) in kinds {
        if ws.len() < MIN_POLICY_SAMPLES {
            return Err(format!("calibration: too few '{k}' policy samples"));
        }
        let bits = ws.iter().fold(u32::MAX, |a, &w| a & w) & !any_free;
        if bits == 0 {
            return Err(format!("calibration: the '{k}' policy sets no bit"));
        }
        mask |= bits;
    }
    Ok(mask)
}

/// (vtable, base offset, engaged-flag offset) of DifferentiableViewMeta, or None.
fn locate_views(
    m: &Bound<'_, PyModule>,
    views: &Bound<'_, PyAny>,
    base: usize,
    cdata: usize,
    am: usize,
    am_vtable: usize,
) -> Option<(usize, usize, usize)> {
    let mut metas = Vec::new();
    let mut vtable = 0usize;
    for pair in views.try_iter().ok()? {
        let pair = pair.ok()?;
        let v = probe(m, pair.get_item(0).ok()?).ok()?;
        let b = probe(m, pair.get_item(1).ok()?).ok()?;
        let head = raw::autograd_bytes(&v.t, base, cdata, v.imp, am, 8)?;
        let vt = w64(&head, 0) as usize;
        if vt == am_vtable || (vtable != 0 && vt != vtable) {
            return None;
        }
        vtable = vt;
        metas.push((
            raw::view_meta_bytes(&v.t, base, cdata, v.imp, am, vt, VIEW_SCAN)?,
            b.imp as u64,
        ));
    }
    let off = unique(
        (AUTOGRAD_SCAN..VIEW_SCAN - 48)
            .step_by(8)
            .filter(|&o| metas.iter().all(|(b, imp)| w64(b, o) == *imp))
            .collect(),
        "backward_info_.base_",
    )
    .ok()?;
    let engaged = off + 48;
    metas
        .iter()
        .all(|(b, _)| b[engaged] == 1)
        .then_some((vtable, off, engaged))
}

/// Every tensor of the verification set must read exactly as the Python API reports.
fn verify(
    py: Python<'_>,
    m: &Bound<'_, PyModule>,
    l: &TensorLayout,
    cal: &Calibration,
) -> Result<(), String> {
    let set = m
        .call_method0("verification_set")
        .map_err(|e| e.to_string())?;
    let set = set.cast_into::<PyList>().map_err(|e| e.to_string())?;
    let mut n_rg = 0;
    for (i, t) in set.iter().enumerate() {
        let p = probe(m, t)?;
        let r = raw::read_tensor_with(&p.t, l)
            .ok_or_else(|| format!("verification: tensor {i} unreadable"))?;
        let bad = |what: &str| {
            Err(format!(
                "verification: tensor {i}: {what} disagrees with the Python API"
            ))
        };
        if r.policy != 0 {
            return bad("policy");
        }
        if r.sizes != get::<Vec<i64>>(&p.d, "sizes")?.as_slice() {
            return bad("sizes");
        }
        if r.strides != get::<Vec<i64>>(&p.d, "strides")?.as_slice() {
            return bad("strides");
        }
        if r.keys != get::<u64>(&p.d, "dispatch_keys")? {
            return bad("dispatch keys");
        }
        let dt = p.d.get_item("dtype").ok().flatten().ok_or("no dtype")?;
        match cal.dtypes.iter().find(|(c, _)| *c == r.dtype) {
            Some((_, d)) if d.bind(py).is(&dt) => {}
            _ => return bad("dtype"),
        }
        let dev: String = get(&p.d, "device_type")?;
        match cal.device_types.iter().find(|(c, _)| *c == r.device[0]) {
            Some((_, n)) if *n == dev => {}
            _ => return bad("device type"),
        }
        if r.device[1] as i8 as i64 != get::<i64>(&p.d, "device_index")? || r.device[2] != 1 {
            return bad("device index");
        }
        if let Some(rg) = r.requires_grad {
            n_rg += 1;
            if rg != get::<bool>(&p.d, "requires_grad")? {
                return bad("requires_grad");
            }
        }
    }
    if n_rg < set.len() / 2 {
        return Err("verification: requires_grad unreadable for most tensors".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{grad_fn_candidates, policy_mask, MIN_POLICY_SAMPLES};

    const PAD: u32 = 1 << 23;
    const SIZES: u32 = (1 << 11) | (1 << 20);
    const LAYOUT: u32 = (1 << 16) | (1 << 22);
    const FIELDS: u32 = 0x141;

    fn n(w: u32) -> Vec<u32> {
        vec![w; MIN_POLICY_SAMPLES]
    }

    #[test]
    fn policy_bits_are_found() {
        let kinds = [("sizes", n(FIELDS | SIZES)), ("layout", n(FIELDS | LAYOUT))];
        assert_eq!(policy_mask(&kinds, &n(FIELDS)), Ok(SIZES | LAYOUT));
    }

    #[test]
    fn padding_garbage_is_not_a_policy_bit() {
        // One wrapper's padding bit set where the policy-free wrapper's is clear: the old
        // one-sample XOR took the padding bit for a policy bit.
        let mut sizes = n(FIELDS | SIZES);
        sizes[0] |= PAD;
        let mut layout = n(FIELDS | LAYOUT);
        layout.iter_mut().for_each(|w| *w |= PAD);
        let mut free = n(FIELDS);
        free[3] |= PAD;
        let m = policy_mask(&[("sizes", sizes), ("layout", layout)], &free).unwrap();
        assert_eq!(m, SIZES | LAYOUT);
        // Garbage in most samples either way never hides a policy bit.
        let mut sizes = n(FIELDS | SIZES | PAD);
        sizes[5] &= !PAD;
        let free: Vec<u32> = (0..MIN_POLICY_SAMPLES as u32)
            .map(|i| FIELDS | ((i % 2) * PAD))
            .collect();
        assert_eq!(policy_mask(&[("sizes", sizes)], &free), Ok(SIZES));
    }

    #[test]
    fn a_bit_seen_without_policy_is_dropped_and_an_empty_policy_fails() {
        let mut free = n(FIELDS);
        free[1] |= SIZES;
        let e = policy_mask(&[("sizes", n(FIELDS | SIZES))], &free).unwrap_err();
        assert!(e.contains("'sizes' policy sets no bit"), "{e}");
        let e = policy_mask(&[("sizes", vec![SIZES])], &n(0)).unwrap_err();
        assert!(e.contains("too few 'sizes'"), "{e}");
        let e = policy_mask(&[("sizes", n(SIZES))], &[0]).unwrap_err();
        assert!(e.contains("too few policy-free"), "{e}");
    }

    /// AutogradMeta bytes with word `o` set to `v` for each (o, v).
    fn am(words: &[(usize, u64)]) -> Vec<u8> {
        let mut b = vec![0u8; 96];
        for &(o, v) in words {
            b[o..o + 8].copy_from_slice(&v.to_le_bytes());
        }
        b
    }

    #[test]
    fn uninitialised_words_that_mimic_grad_fn_are_told_apart_by_detach() {
        // grad_fn_ at 48; words 24 and 32 (a std::string's inline buffer) hold heap garbage
        // that happens to be null on both leaves and set on both non-leaves.
        let leaves = [am(&[]), am(&[])];
        let nonleaves = [
            am(&[(24, 7), (32, 9), (48, 0x1000)]),
            am(&[(24, 3), (32, 5), (48, 0x2000)]),
        ];
        let before = am(&[(24, 1), (32, 1), (48, 0x3000)]);
        let after = am(&[(24, 1), (32, 1)]);
        assert_eq!(
            grad_fn_candidates(&leaves, &nonleaves, (&before, &after), 96),
            vec![48]
        );
        // A word that detach_() leaves set is never taken, whatever the other samples show.
        let kept = before.clone();
        assert!(grad_fn_candidates(&leaves, &nonleaves, (&before, &kept), 96).is_empty());
    }
}
