//! The few bpf(2) commands aya 0.14 lacks: batched updates (and the single-element calls the
//! benchmark's floor and the batch fallback use), on a map aya opened.
//!
//! `BPF_MAP_UPDATE_BATCH` works on any map the kernel gives generic batch ops; where a kernel
//! refuses it for a map type (EINVAL/ENOTSUPP/EOPNOTSUPP), [`update_batch`] answers
//! [`BatchError::Unsupported`] and the caller falls back to one call per entry.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// `flags` of an update: create or overwrite.
const BPF_ANY: u64 = 0;

#[repr(C)]
#[derive(Default)]
struct ElemAttr {
    map_fd: u32,
    pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// A batched update that stopped early.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// The kernel has no batch update for this map type.
    #[error("the kernel does not batch updates of this map: {0}")]
    Unsupported(io::Error),
    /// Entry `done` failed; those before it are written.
    #[error("batched update stopped after {done} entries: {error}")]
    Failed {
        /// Entries written.
        done: usize,
        /// Why entry `done` failed (ENOSPC: the map is full).
        error: io::Error,
    },
}

fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<()> {
    // SAFETY: `attr` is a live repr(C) prefix of `union bpf_attr` for `cmd`, its pointers point
    // at live buffers of the sizes the map was created with (the callers' contract), and the
    // kernel reads at most size_of::<T>() bytes of it.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            std::ptr::from_mut(attr).cast::<libc::c_void>(),
            size_of::<T>(),
        )
    };
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `key` → `value` (create or overwrite). `K` and `V` must be the map's key and value
/// types (aya's [`aya::Pod`] marks them plain data).
pub fn update<K: aya::Pod, V: aya::Pod>(map: BorrowedFd<'_>, key: &K, value: &V) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: fd_u32(map),
        key: std::ptr::from_ref(key) as u64,
        value: std::ptr::from_ref(value) as u64,
        flags: BPF_ANY,
        ..ElemAttr::default()
    };
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr)
}

/// Deletes `key`; a missing key is not an error.
pub fn delete<K: aya::Pod>(map: BorrowedFd<'_>, key: &K) -> io::Result<()> {
    let mut attr = ElemAttr {
        map_fd: fd_u32(map),
        key: std::ptr::from_ref(key) as u64,
        ..ElemAttr::default()
    };
    match bpf(BPF_MAP_DELETE_ELEM, &mut attr) {
        Err(err) if err.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Writes `keys[i]` → `values[i]` in one call.
pub fn update_batch<K: aya::Pod, V: aya::Pod>(
    map: BorrowedFd<'_>,
    keys: &[K],
    values: &[V],
) -> Result<(), BatchError> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    if keys.is_empty() {
        return Ok(());
    }
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: u32::try_from(keys.len()).unwrap_or(u32::MAX),
        map_fd: fd_u32(map),
        elem_flags: BPF_ANY,
        ..BatchAttr::default()
    };
    let requested = attr.count;
    match bpf(BPF_MAP_UPDATE_BATCH, &mut attr) {
        Ok(()) => Ok(()),
        // The kernel reports how many it wrote in `count`; none at all with these errnos
        // means the command itself is refused for this map type.
        Err(error)
            if attr.count == 0
                && matches!(
                    error.raw_os_error(),
                    Some(libc::EINVAL | libc::ENOTSUP | 524 /* ENOTSUPP */)
                )
                && requested > 0 =>
        {
            Err(BatchError::Unsupported(error))
        }
        Err(error) => Err(BatchError::Failed {
            done: attr.count as usize,
            error,
        }),
    }
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}
