//! The pinned maps under `<bpf-root>/tc/globals/`, created from the endpoint object's own map
//! definitions so the agent, the programs and `meshctl` agree on every map's shape.

use std::io;
use std::path::{Path, PathBuf};

use aya::maps::lpm_trie::Key;
use aya::maps::{LpmTrie, Map, MapData, MapError, PerCpuArray};
use aya::{Ebpf, EbpfLoader};

use super::bpf_sys::{self, BatchError};
use super::ipcache_map::{IpCacheKey, IpCacheValue};

/// The endpoint program's object file, built from `bpf/endpoint.c` by the build script.
pub static ENDPOINT_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/endpoint.o"));

/// The ipcache map's name (and pin file name).
pub const IPCACHE_MAP: &str = "cilium_ipcache";
/// The drop counters' map name.
pub const DROPS_MAP: &str = "meshwork_drops";
/// The per-endpoint policy map's name inside the endpoint object.
pub const POLICY_MAP: &str = "meshwork_policy";

/// Why the datapath's maps could not be set up or read.
#[derive(Debug, thiserror::Error)]
pub enum MapsError {
    /// A filesystem step on bpffs failed.
    #[error("{what} {path}: {error}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// The error.
        error: io::Error,
    },
    /// aya could not load the object or create a map.
    #[error("loading the BPF object: {0}")]
    Load(aya::EbpfError),
    /// aya could not open or use a map.
    #[error("map {name}: {error}")]
    Map {
        /// The map.
        name: &'static str,
        /// The error.
        error: MapError,
    },
}

// The cause is in the message: converting does not also make it the error's source, so no
// chain prints it twice.
impl From<aya::EbpfError> for MapsError {
    fn from(error: aya::EbpfError) -> Self {
        Self::Load(error)
    }
}

/// Where the datapath pins its maps: `<root>/tc/globals`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PinDir(PathBuf);

impl PinDir {
    /// The pin directory under the bpffs root `root` (Cilium's `--bpf-root`).
    pub fn under(root: &Path) -> Self {
        Self(root.join("tc").join("globals"))
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// A map's pin path.
    pub fn map(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// Creates the directory if needed.
    pub fn ensure(&self) -> Result<(), MapsError> {
        std::fs::create_dir_all(&self.0).map_err(|source| MapsError::Io {
            what: "creating",
            path: self.0.clone(),
            error: source,
        })
    }

    /// Loads the endpoint object against this directory: maps pinned by name are reused when
    /// pinned, else created and pinned. Programs are not loaded into the kernel yet.
    pub fn load_object(&self) -> Result<Ebpf, MapsError> {
        self.ensure()?;
        Ok(EbpfLoader::new()
            .default_map_pin_directory(&self.0)
            .load(ENDPOINT_OBJECT)?)
    }

    /// Unpins the ipcache and pins a new, empty one (§5: on every agent start). Programs
    /// already attached keep the old map, so established connections keep flowing until their
    /// endpoint is regenerated.
    pub fn recreate_ipcache(&self) -> Result<IpCacheMap, MapsError> {
        self.recreate_ipcache_sized(super::ipcache_map::MAX_ENTRIES)
    }

    /// [`Self::recreate_ipcache`] with another capacity (tests fill a small map).
    pub fn recreate_ipcache_sized(&self, max_entries: u32) -> Result<IpCacheMap, MapsError> {
        let pin = self.map(IPCACHE_MAP);
        match std::fs::remove_file(&pin) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(MapsError::Io {
                    what: "unpinning",
                    path: pin,
                    error: source,
                });
            }
        }
        // Loading the object creates and pins every missing by-name map, the ipcache included.
        self.ensure()?;
        drop(
            EbpfLoader::new()
                .default_map_pin_directory(&self.0)
                .map_max_entries(IPCACHE_MAP, max_entries)
                .load(ENDPOINT_OBJECT)?,
        );
        self.open_ipcache()
    }

    /// Opens the pinned ipcache.
    pub fn open_ipcache(&self) -> Result<IpCacheMap, MapsError> {
        let map = open_pinned(&self.map(IPCACHE_MAP), IPCACHE_MAP)?;
        let map = LpmTrie::try_from(map).map_err(|source| MapsError::Map {
            name: IPCACHE_MAP,
            error: source,
        })?;
        Ok(IpCacheMap(map))
    }

    /// Opens the pinned drop counters.
    pub fn open_drops(&self) -> Result<PerCpuArray<MapData, u64>, MapsError> {
        self.open_counters(DROPS_MAP)
    }

    /// Opens `name`, a pinned per-CPU array of `u64` counters (the drops, the socket-LB
    /// counters).
    pub fn open_counters(
        &self,
        name: &'static str,
    ) -> Result<PerCpuArray<MapData, u64>, MapsError> {
        let map = open_pinned(&self.map(name), name)?;
        PerCpuArray::try_from(map).map_err(|source| MapsError::Map {
            name,
            error: source,
        })
    }
}

/// Counter `index` of `map` (named `name`), summed over CPUs: each CPU counts on its own, so
/// the programs need no atomics.
pub(crate) fn counter_sum(
    map: &PerCpuArray<MapData, u64>,
    name: &'static str,
    index: u32,
) -> Result<u64, MapsError> {
    let per_cpu = map.get(&index, 0).map_err(|source| MapsError::Map {
        name,
        error: source,
    })?;
    Ok(per_cpu.iter().sum())
}

fn open_pinned(path: &Path, name: &'static str) -> Result<Map, MapsError> {
    let data = MapData::from_pin(path).map_err(|source| MapsError::Map {
        name,
        error: source,
    })?;
    Map::from_map_data(data).map_err(|source| MapsError::Map {
        name,
        error: source,
    })
}

/// The ipcache LPM trie, opened through aya (which checked its key and value sizes).
pub struct IpCacheMap(LpmTrie<MapData, IpCacheKeyData, IpCacheValue>);

/// aya's LPM key carries the prefix length itself; this is the rest of Cilium's key.
pub type IpCacheKeyData = [u8; 20];

impl IpCacheMap {
    /// Every entry, in the kernel's iteration order.
    pub fn entries(&self) -> Result<Vec<(IpCacheKey, IpCacheValue)>, MapsError> {
        let mut out = Vec::new();
        for item in self.0.iter() {
            let (key, value) = item.map_err(|error| MapsError::Map {
                name: IPCACHE_MAP,
                error,
            })?;
            out.push((from_aya_key(key.prefix_len(), key.data()), value));
        }
        Ok(out)
    }

    /// Writes `key` → `value` (create or overwrite).
    pub fn insert(&mut self, key: &IpCacheKey, value: &IpCacheValue) -> Result<(), MapError> {
        self.0.insert(&key.to_aya(), value, 0)
    }

    /// Deletes `key`; a missing key is not an error.
    pub fn remove(&mut self, key: &IpCacheKey) -> Result<(), MapError> {
        match self.0.remove(&key.to_aya()) {
            Err(MapError::SyscallError(err)) if err.io_error.kind() == io::ErrorKind::NotFound => {
                Ok(())
            }
            other => other,
        }
    }

    /// Writes every `keys[i]` → `values[i]` in one batched call (`BPF_MAP_UPDATE_BATCH`).
    pub fn update_batch(
        &mut self,
        keys: &[IpCacheKey],
        values: &[IpCacheValue],
    ) -> Result<(), BatchError> {
        let keys: Vec<Key<IpCacheKeyData>> = keys.iter().map(IpCacheKey::to_aya).collect();
        bpf_sys::update_batch(&mut self.0, &keys, values)
    }
}

fn from_aya_key(prefixlen: u32, data: IpCacheKeyData) -> IpCacheKey {
    let mut ip = [0u8; 16];
    ip.copy_from_slice(&data[4..]);
    IpCacheKey {
        prefixlen,
        pad1: u16::from_ne_bytes([data[0], data[1]]),
        cluster_id: data[2],
        family: data[3],
        ip,
    }
}
