//! The one bpf(2) command aya 0.14 lacks: `BPF_MAP_UPDATE_BATCH` (aya#1124), on a map aya
//! has opened and typed. Single-element updates and deletes go through aya.
//!
//! The call takes the typed [`LpmTrie`], whose key and value sizes aya checked against the
//! map's own when it typed it (`LpmTrie::try_from`), so the buffers handed to the kernel are
//! exactly what it reads. Where a kernel refuses the batch for a map type
//! (EINVAL/ENOTSUPP/EOPNOTSUPP with nothing written), the answer is
//! [`BatchError::Unsupported`] and the caller falls back to one call per entry.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsFd as _, AsRawFd as _};

use aya::Pod;
use aya::maps::lpm_trie::Key;
use aya::maps::{IterableMap as _, LpmTrie, MapData};

const BPF_MAP_UPDATE_BATCH: libc::c_long = 26;
/// `flags` of an update: create or overwrite.
const BPF_ANY: u64 = 0;

/// `union bpf_attr` as `BPF_MAP_*_BATCH` reads it.
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

/// Writes `keys[i]` → `values[i]` (create or overwrite) in one call.
pub(crate) fn update_batch<K: Pod, V: Pod>(
    map: &mut LpmTrie<MapData, K, V>,
    keys: &[Key<K>],
    values: &[V],
) -> Result<(), BatchError> {
    assert_eq!(keys.len(), values.len(), "one value per key");
    if keys.is_empty() {
        return Ok(());
    }
    let fd = map.map().fd().as_fd().as_raw_fd();
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: u32::try_from(keys.len()).unwrap_or(u32::MAX),
        map_fd: u32::try_from(fd).unwrap_or(u32::MAX),
        elem_flags: BPF_ANY,
        ..BatchAttr::default()
    };
    let requested = attr.count;
    // SAFETY: `attr` is a live repr(C) prefix of `union bpf_attr` for BPF_MAP_UPDATE_BATCH;
    // `keys` and `values` are live slices of `count` elements whose types aya checked against
    // the map's key and value sizes when it typed `map` (the `LpmTrie` key is `Key<K>`), so
    // the kernel reads exactly `count` keys and values from them; it writes only `attr.count`.
    // `map` borrowed mutably keeps the fd open and the map unshared for the call.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_MAP_UPDATE_BATCH,
            std::ptr::from_mut(&mut attr).cast::<libc::c_void>(),
            size_of::<BatchAttr>(),
        )
    };
    if ret >= 0 {
        return Ok(());
    }
    let error = io::Error::last_os_error();
    // The kernel reports how many it wrote in `count`; none at all with these errnos means
    // the command itself is refused for this map type.
    let refused = matches!(
        error.raw_os_error(),
        Some(libc::EINVAL | libc::ENOTSUP | 524 /* ENOTSUPP */)
    );
    if attr.count == 0 && requested > 0 && refused {
        Err(BatchError::Unsupported(error))
    } else {
        Err(BatchError::Failed {
            done: attr.count as usize,
            error,
        })
    }
}
