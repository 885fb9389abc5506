//! Raw reads of torch tensor objects (`THPVariable` -> `TensorImpl` -> `AutogradMeta`).
//!
//! Nothing here knows torch's layout by heart: `crate::tensor::calibrate` finds the offsets at
//! run time by looking for distinctive values in sample tensors, verifies them on a broad set
//! against the Python API and only then calls [`install_layout`]. Until then (or if
//! verification failed) [`read_tensor`] returns None and callers take the Python path.
//!
//! Structures read (torch 2.x, 64-bit; names from the headers, offsets never hard-coded):
//! - `THPVariable` (torch/csrc/autograd/python_variable.h): `PyObject_HEAD; at::Tensor cdata;`
//!   where `at::Tensor` is one `intrusive_ptr<TensorImpl>` (a `TensorImpl*`, as `Tensor._cdata`).
//! - `TensorImpl` (c10/core/TensorImpl.h): `autograd_meta_` (unique_ptr), `sizes_and_strides_`
//!   (`c10::impl::SizesAndStrides`, c10/core/impl/SizesAndStrides.h: `size_t size_; union {
//!   int64_t* outOfLineStorage_; int64_t inlineStorage_[10]; }`, sizes then strides, inline
//!   for up to 5 dims), `data_type_` (u16 `TypeMeta` index), `device_opt_` (3 bytes:
//!   `DeviceType` i8, `DeviceIndex` i8, engaged flag), the policy bitfields, `key_set_` (u64).
//! - `AutogradMeta` (torch/csrc/autograd/variable.h): vtable, ..., `grad_fn_`, ...,
//!   `requires_grad_`; views use a subclass (another vtable) whose `requires_grad()` also looks at
//!   the base, so for those [`TensorRaw::requires_grad`] is None.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use pyo3::ffi;
use pyo3::prelude::*;

/// Largest prefix of a `TensorImpl` that calibration may copy: `key_set_`, the last member, ends
/// at 176 bytes on the builds seen (the header asserts sizeof <= 208), and glibc's usable size
/// for a 176-byte allocation is 184.
pub const IMPL_SCAN: usize = 176;
/// Prefix of an `AutogradMeta` that calibration may copy (requires_grad_ sits at 128 on the
/// builds seen; the struct continues with output_nr_, grad_dtype_ and a mutex).
pub const AUTOGRAD_SCAN: usize = 136;
/// Prefix of a `DifferentiableViewMeta` (an AutogradMeta followed by two optional<ViewInfo>)
/// that calibration may copy: its backward_info_ ends near 240 bytes, the struct near 312.
pub const VIEW_SCAN: usize = 248;

/// Offsets found by calibration (bytes). See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// `PyTypeObject*` of `torch._C.TensorBase` (immortal for our purposes: torch never
    /// unloads), used to check that an object has the THPVariable layout before reading it.
    pub tensor_base: usize,
    /// `PyTypeObject*` of `torch.Tensor`, the common exact type (a fast first comparison).
    pub tensor_type: usize,
    pub cdata: usize,
    pub autograd_meta: usize,
    pub sizes_strides: usize,
    pub dtype: usize,
    pub device: usize,
    /// The policy bitfields: `flags_len` bytes at `flags`, little-endian.
    pub flags: usize,
    pub flags_len: usize,
    /// Bits of the flags word that select custom sizes/strides/device/layout policies.
    pub policy_mask: u32,
    pub keys: usize,
    pub am_vtable: usize,
    pub am_grad_fn: usize,
    pub am_requires_grad: usize,
    /// vtable of `DifferentiableViewMeta` (0: views are not read directly).
    pub view_vtable: usize,
    /// Offsets in it of `backward_info_->base_` (a TensorImpl*) and of the optional's flag.
    pub view_base: usize,
    pub view_engaged: usize,
}

static LAYOUT: OnceLock<TensorLayout> = OnceLock::new();

/// Enable direct reads. The caller (calibration) must have verified `l` against the Python API.
pub fn install_layout(l: TensorLayout) -> bool {
    LAYOUT.set(l).is_ok() || LAYOUT.get() == Some(&l)
}

pub fn layout() -> Option<&'static TensorLayout> {
    LAYOUT.get()
}

/// What a tensor leaf reads, borrowed from the `TensorImpl` (valid while the tensor is alive
/// and no Python code runs: use it at once).
pub struct TensorRaw<'a> {
    pub keys: u64,
    pub dtype: u16,
    /// `[DeviceType, DeviceIndex, engaged]`.
    pub device: [u8; 3],
    /// Flags word masked by `policy_mask`: non-zero means sizes/strides/device/layout are
    /// answered by custom code, so the raw fields must not be trusted.
    pub policy: u32,
    pub sizes: &'a [i64],
    pub strides: &'a [i64],
    /// None where the autograd metadata is of a kind we do not read (views).
    pub requires_grad: Option<bool>,
}

#[inline]
fn is_tensor(obj: *mut ffi::PyObject, base: usize) -> bool {
    // SAFETY: obj is a live object (borrowed by the caller); PyType_IsSubtype only reads types.
    unsafe {
        let tp = ffi::Py_TYPE(obj);
        tp as usize == base || ffi::PyType_IsSubtype(tp, base as *mut ffi::PyTypeObject) != 0
    }
}

#[inline]
fn is_tensor_fast(obj: *mut ffi::PyObject, l: &TensorLayout) -> bool {
    // SAFETY: obj is a live object; reading its type pointer is always valid.
    let tp = unsafe { ffi::Py_TYPE(obj) } as usize;
    tp == l.tensor_type || is_tensor(obj, l.tensor_base)
}

/// The TensorImpl* held by THPVariable `o` (None while it is null).
///
/// # Safety
/// `o` is a live THPVariable and `l` a layout verified by calibration (its `cdata` offset).
#[inline(always)]
unsafe fn tensor_impl(o: *mut ffi::PyObject, l: &TensorLayout) -> Option<*const u8> {
    let imp = *((o as *const u8).add(l.cdata) as *const *const u8);
    (!imp.is_null()).then_some(imp)
}

/// A TensorImpl's size-policy bits (masked) and dispatch key set.
///
/// # Safety
/// `imp` is a live TensorImpl read with verified layout `l`. The mask only has bits in the
/// `flags_len` bitfield bytes; the 4-byte read stays inside the TensorImpl (key_set_ follows the
/// bitfields).
#[inline(always)]
unsafe fn policy_and_keys(imp: *const u8, l: &TensorLayout) -> (u32, u64) {
    let policy = u32::from_le((imp.add(l.flags) as *const u32).read_unaligned()) & l.policy_mask;
    (policy, *(imp.add(l.keys) as *const u64))
}

/// Sizes and strides from a TensorImpl's `c10::impl::SizesAndStrides`: inline up to [`INLINE`]
/// dims (sizes, then strides at `INLINE`), else one heap array (sizes, then strides at `n`).
/// None over 64 dims or for a null heap pointer.
///
/// # Safety
/// `imp` is a live TensorImpl read with verified layout `l`, whose sizes are stored the plain
/// way; the slices borrow its storage and live no longer than the tensor.
#[inline(always)]
unsafe fn sizes_and_strides<'a>(
    imp: *const u8,
    l: &TensorLayout,
) -> Option<(&'a [i64], &'a [i64])> {
    let sas = imp.add(l.sizes_strides);
    let n = *(sas as *const usize);
    if n > 64 {
        return None;
    }
    let (base, stride_at) = if n <= INLINE {
        (sas.add(8) as *const i64, INLINE)
    } else {
        let b = *(sas.add(8) as *const *const i64);
        if b.is_null() {
            return None;
        }
        (b, n)
    };
    Some((
        std::slice::from_raw_parts(base, n),
        std::slice::from_raw_parts(base.add(stride_at), n),
    ))
}

/// Read a tensor's metadata directly, or None if reads are not enabled, `obj` is not a tensor,
/// or its sizes are not stored in the plain way.
#[inline]
pub fn read_tensor<'a>(obj: &'a Bound<'_, PyAny>) -> Option<TensorRaw<'a>> {
    read_tensor_with(obj, LAYOUT.get()?)
}

/// [`read_tensor`] with a given layout: only for calibration's verification step, with a
/// layout that calibration located on its probes.
#[inline]
pub fn read_tensor_with<'a>(obj: &'a Bound<'_, PyAny>, l: &TensorLayout) -> Option<TensorRaw<'a>> {
    let o = obj.as_ptr();
    if !is_tensor_fast(o, l) {
        return None;
    }
    // SAFETY: `o` is a THPVariable (checked above) whose `cdata` member, at the verified offset,
    // holds a TensorImpl* that stays alive as long as the Python object does (borrowed for 'a).
    // Every offset read below was located and verified by calibration, and lies inside the
    // TensorImpl (or the AutogradMeta / out-of-line sizes array it points to).
    unsafe {
        let imp = tensor_impl(o, l)?;
        let (policy, keys) = policy_and_keys(imp, l);
        let dtype = *(imp.add(l.dtype) as *const u16);
        let mut device = [0u8; 3];
        std::ptr::copy_nonoverlapping(imp.add(l.device), device.as_mut_ptr(), 3);
        let (sizes, strides) = sizes_and_strides(imp, l)?;
        let requires_grad = impl_requires_grad(imp, l, true);
        Some(TensorRaw {
            keys,
            dtype,
            device,
            policy,
            sizes,
            strides,
            requires_grad,
        })
    }
}

/// `TensorImpl::requires_grad()` from raw fields: no autograd meta means false; a plain
/// `AutogradMeta` answers `requires_grad_ || grad_fn_`; a view's `DifferentiableViewMeta` also
/// asks its base (one level: a view's base is never a view). None for anything else.
///
/// # Safety
/// `imp` must be a live TensorImpl and `l` a verified layout.
#[inline]
unsafe fn impl_requires_grad(imp: *const u8, l: &TensorLayout, follow_view: bool) -> Option<bool> {
    let am = *(imp.add(l.autograd_meta) as *const *const u8);
    if am.is_null() {
        return Some(false);
    }
    let vt = *(am as *const usize);
    if vt != l.am_vtable && (vt != l.view_vtable || l.view_vtable == 0 || !follow_view) {
        return None;
    }
    if *am.add(l.am_requires_grad) != 0 || *(am.add(l.am_grad_fn) as *const usize) != 0 {
        return Some(true);
    }
    if vt == l.am_vtable {
        return Some(false);
    }
    if *am.add(l.view_engaged) == 0 {
        return Some(false);
    }
    let base = *(am.add(l.view_base) as *const *const u8);
    if base.is_null() {
        return None;
    }
    impl_requires_grad(base, l, false)
}

// -- calibration reads (bounded copies; only used before a layout is installed) -------------

/// The first `n` machine words of `obj`, bounded by its type's `tp_basicsize`.
pub fn object_words(obj: &Bound<'_, PyAny>, n: usize) -> Vec<usize> {
    let o = obj.as_ptr();
    // SAFETY: an object has at least tp_basicsize bytes; we read whole words below it.
    unsafe {
        let basic = (*ffi::Py_TYPE(o)).tp_basicsize as usize;
        let k = n.min(basic / 8);
        (0..k).map(|i| *((o as *const usize).add(i))).collect()
    }
}

/// A copy of the first `n` (<= IMPL_SCAN) bytes of the TensorImpl of `obj`, provided `obj` is a
/// TensorBase instance whose word at `cdata` (inside its basic size) equals `expect_impl` (the
/// `_cdata` Python reports for it).
pub fn impl_bytes(
    obj: &Bound<'_, PyAny>,
    tensor_base: usize,
    cdata: usize,
    expect_impl: usize,
    n: usize,
) -> Option<Vec<u8>> {
    if n > IMPL_SCAN || !cdata.is_multiple_of(8) || !is_tensor(obj.as_ptr(), tensor_base) {
        return None;
    }
    let words = object_words(obj, cdata / 8 + 1);
    if words.len() <= cdata / 8 || words[cdata / 8] != expect_impl || expect_impl == 0 {
        return None;
    }
    // SAFETY: expect_impl is the live TensorImpl of obj (torch says so through _cdata and the
    // object holds it); TensorImpl is at least IMPL_SCAN bytes readable (see IMPL_SCAN).
    unsafe { Some(std::slice::from_raw_parts(expect_impl as *const u8, n).to_vec()) }
}

/// A copy of the first `n` (<= AUTOGRAD_SCAN) bytes of the object that the word at `am` of the
/// TensorImpl of `obj` points to (checked as in [`impl_bytes`]); None if null.
pub fn autograd_bytes(
    obj: &Bound<'_, PyAny>,
    tensor_base: usize,
    cdata: usize,
    expect_impl: usize,
    am: usize,
    n: usize,
) -> Option<Vec<u8>> {
    if n > AUTOGRAD_SCAN || !am.is_multiple_of(8) {
        return None;
    }
    let imp = impl_bytes(obj, tensor_base, cdata, expect_impl, am + 8)?;
    let p = usize::from_le_bytes(imp[am..am + 8].try_into().ok()?);
    if p == 0 || !p.is_multiple_of(8) {
        return None;
    }
    // SAFETY: calibration only calls this with `am` located as the unique word that is null
    // for a tensor without autograd metadata and set for one with it: the AutogradMeta pointer.
    unsafe { Some(std::slice::from_raw_parts(p as *const u8, n).to_vec()) }
}

/// A copy of the first `n` (<= VIEW_SCAN) bytes of the autograd metadata of `obj` (checked as
/// in [`autograd_bytes`]), provided its first word is `view_vtable` (a DifferentiableViewMeta,
/// which is larger than VIEW_SCAN).
pub fn view_meta_bytes(
    obj: &Bound<'_, PyAny>,
    tensor_base: usize,
    cdata: usize,
    expect_impl: usize,
    am: usize,
    view_vtable: usize,
    n: usize,
) -> Option<Vec<u8>> {
    if n > VIEW_SCAN {
        return None;
    }
    let head = autograd_bytes(obj, tensor_base, cdata, expect_impl, am, 8)?;
    if usize::from_le_bytes(head[..8].try_into().ok()?) != view_vtable {
        return None;
    }
    let imp = impl_bytes(obj, tensor_base, cdata, expect_impl, am + 8)?;
    let p = usize::from_le_bytes(imp[am..am + 8].try_into().ok()?);
    // SAFETY: p is the autograd metadata of obj (see autograd_bytes) and its vtable says it
    // is a DifferentiableViewMeta, which has more than VIEW_SCAN bytes.
    unsafe { Some(std::slice::from_raw_parts(p as *const u8, n).to_vec()) }
}

/// What a tensor leaf expects of a plain tensor, arranged for [`check_expect`]: the fewest
/// loads on the common path, and for up to 2 dims all of it in the first 64 bytes (one cache
/// line when placed at a 64-byte boundary, as [`Packed`] does). Built from a verified layout
/// whose dtype, device and policy bitfields are contiguous (`TensorImpl`: `data_type_` u16,
/// `device_opt_` 3 bytes, then the 3 bitfield bytes: one 8-byte word, ending where `key_set_`
/// starts). `repr(C)` only to keep that order: it mirrors no foreign struct.
#[derive(Clone, Debug)]
#[repr(C)]
pub struct Expect {
    /// The exact `THPVariable` type the leaf was built for.
    type_ptr: usize,
    /// dtype and device bytes of the packed word (the policy bits are expected to be 0).
    word: u64,
    keys: u64,
    ndim: u8,
    requires_grad: bool,
    /// Bit `2i` set: size `i` is compared; bit `2i + 1`: stride `i`.
    mask: u16,
    /// (size, stride) of each dimension, interleaved.
    dims: [i64; 2 * INLINE],
}

/// An [`Expect`] at the start of its own 64-byte line, with a tag for its owner (the replay
/// plan keeps its tensor leaves in a vector of these). `repr(C)` only for that placement.
#[derive(Clone, Debug)]
#[repr(C, align(64))]
pub struct Packed<T: Copy> {
    pub expect: Expect,
    pub tag: T,
}

/// Inline dimensions of `c10::impl::SizesAndStrides` (C10_SIZES_AND_STRIDES_MAX_INLINE_SIZE).
const INLINE: usize = 5;

impl Expect {
    /// None when the layout does not allow the packed compare, the example is not a plain
    /// tensor read directly (with the dispatch keys `keys` the Python API reports), or it has
    /// more than 5 dimensions.
    pub fn new(
        example: &Bound<'_, PyAny>,
        sizes: &[Option<i64>],
        strides: &[Option<i64>],
        requires_grad: bool,
        keys: u64,
        non_plain_keys: u64,
    ) -> Option<Expect> {
        let l = layout()?;
        if l.device != l.dtype + 2
            || l.flags != l.dtype + 5
            || l.flags_len != 3
            || l.keys != l.dtype + 8
        {
            return None;
        }
        let r = read_tensor(example)?;
        if r.policy != 0 || r.keys != keys || keys & non_plain_keys != 0 || r.sizes.len() > INLINE {
            return None;
        }
        let n = r.sizes.len();
        let (mut dims, mut mask) = ([0i64; 2 * INLINE], 0u16);
        for i in 0..n {
            if let Some(s) = sizes[i] {
                dims[2 * i] = s;
                mask |= 1 << (2 * i);
            }
            if let Some(s) = strides[i] {
                dims[2 * i + 1] = s;
                mask |= 1 << (2 * i + 1);
            }
        }
        let word = r.dtype as u64
            | (r.device[0] as u64) << 16
            | (r.device[1] as u64) << 24
            | (r.device[2] as u64) << 32;
        Some(Expect {
            type_ptr: example.get_type_ptr() as usize,
            word,
            keys: r.keys,
            ndim: n as u8,
            requires_grad,
            mask,
            dims,
        })
    }
}

/// The tensor leaf on `obj` from raw fields: Some(false) on a mismatch, Some(true) on a match,
/// None when only the Python API can decide (a view's autograd metadata of an unknown kind).
#[inline]
pub fn check_expect(obj: &Bound<'_, PyAny>, e: &Expect) -> Option<bool> {
    check_expect_with(obj, e, layout()?)
}

/// [`check_expect`] with the installed [`layout`] already in hand (a caller checking many
/// tensors reads it once).
#[inline(always)]
pub fn check_expect_with(obj: &Bound<'_, PyAny>, e: &Expect, l: &TensorLayout) -> Option<bool> {
    let o = obj.as_ptr();
    // SAFETY: reading a live object's type pointer.
    if unsafe { ffi::Py_TYPE(o) } as usize != e.type_ptr {
        return Some(false);
    }
    // Mask bit `k` of `e.mask` as all ones / all zeros.
    let sel = |k: u32| ((e.mask as i64) << (63 - k)) >> 63;
    // SAFETY: `o` has the exact type of the example, a THPVariable type read with the verified
    // layout `l` when the Expect was built (`Expect::new`); the offsets below lie inside its
    // TensorImpl: the packed word at `dtype` ends where `key_set_` starts, `key_set_` is 8
    // bytes, and for a tensor whose (equal) key set marks plain storage the inline
    // sizes/strides hold `size_` <= 5 entries each (`size_` == `ndim` <= 5 is compared first),
    // so the first two sizes and strides are always inside the inline array (entries past
    // `size_` are masked out).
    unsafe {
        let imp = tensor_impl(o, l)?;
        let word = (imp.add(l.dtype) as *const u64).read_unaligned();
        let keys = *(imp.add(l.keys) as *const u64);
        let word_mask = 0xFF_FFFF_FFFF | (l.policy_mask as u64) << 40;
        let sas = imp.add(l.sizes_strides);
        let n = *(sas as *const usize);
        if (word & word_mask) != e.word || keys != e.keys || n != e.ndim as usize {
            return Some(false);
        }
        let base = sas.add(8) as *const i64;
        let mut diff = ((*base ^ e.dims[0]) & sel(0))
            | ((*base.add(INLINE) ^ e.dims[1]) & sel(1))
            | ((*base.add(1) ^ e.dims[2]) & sel(2))
            | ((*base.add(INLINE + 1) ^ e.dims[3]) & sel(3));
        for i in 2..n {
            diff |= (*base.add(i) ^ e.dims[2 * i]) & sel(2 * i as u32);
            diff |= (*base.add(INLINE + i) ^ e.dims[2 * i + 1]) & sel(2 * i as u32 + 1);
        }
        if diff != 0 {
            return Some(false);
        }
        // No autograd metadata: requires_grad is false (the common case for inputs); a plain
        // `AutogradMeta` (parameters): `requires_grad_ || grad_fn_`. Both inline; views and
        // anything else through `impl_requires_grad`.
        let am = *(imp.add(l.autograd_meta) as *const *const u8);
        if am.is_null() {
            return Some(!e.requires_grad);
        }
        if *(am as *const usize) == l.am_vtable {
            let rg =
                *am.add(l.am_requires_grad) != 0 || *(am.add(l.am_grad_fn) as *const usize) != 0;
            return Some(rg == e.requires_grad);
        }
        impl_requires_grad(imp, l, true).map(|rg| rg == e.requires_grad)
    }
}

/// Sizes and strides of a plain tensor read directly, without its autograd metadata (for
/// symbolic-shape leaves): None unless the layout is verified and `obj` is a tensor whose
/// sizes are stored the plain way (no custom policy, no `non_plain_keys`).
#[inline]
pub fn read_dims<'a>(
    obj: &'a Bound<'_, PyAny>,
    non_plain_keys: u64,
) -> Option<(&'a [i64], &'a [i64])> {
    let l = layout()?;
    let o = obj.as_ptr();
    if !is_tensor_fast(o, l) {
        return None;
    }
    // SAFETY: as in `read_tensor_with`: `o` is a THPVariable, the offsets are verified and lie
    // inside its TensorImpl (or the out-of-line sizes array it owns).
    unsafe {
        let imp = tensor_impl(o, l)?;
        let (policy, keys) = policy_and_keys(imp, l);
        if policy != 0 || keys & non_plain_keys != 0 {
            return None;
        }
        sizes_and_strides(imp, l)
    }
}
