//! WireGuard keys: 32 bytes, base64 in node objects and `wg`, hex on the UAPI socket.

use std::fmt;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// Why a key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Not base64 (or hex) of exactly 32 bytes.
    #[error("malformed WireGuard key {0:?}: want 32 bytes in base64")]
    Malformed(String),
    /// The private key file could not be read or written.
    #[error("private key file {path}: {error}")]
    File {
        /// The file.
        path: String,
        /// The error.
        error: std::io::Error,
    },
}

/// A public (or preshared) key.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(pub [u8; 32]);

impl Key {
    /// Parses base64 (`WireguardPubKey`, `wg`).
    pub fn from_base64(text: &str) -> Result<Self, KeyError> {
        let bytes = STANDARD
            .decode(text.trim())
            .map_err(|_| KeyError::Malformed(text.to_owned()))?;
        let bytes: [u8; 32] = bytes
            .try_into()
            .map_err(|_| KeyError::Malformed(text.to_owned()))?;
        Ok(Self(bytes))
    }

    /// Parses the UAPI's lowercase hex.
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let malformed = || KeyError::Malformed(text.to_owned());
        if text.len() != 64 || !text.is_ascii() {
            return Err(malformed());
        }
        let mut bytes = [0u8; 32];
        for (i, byte) in bytes.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| malformed())?;
        }
        Ok(Self(bytes))
    }

    /// Base64, as published in node objects.
    pub fn to_base64(&self) -> String {
        STANDARD.encode(self.0)
    }

    /// Lowercase hex, as the UAPI wants it.
    pub fn to_hex(&self) -> String {
        use fmt::Write as _;
        self.0.iter().fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({})", self.to_base64())
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_base64())
    }
}

/// The device's private key. Its `Debug` never shows the secret.
#[derive(Clone)]
pub struct PrivateKey(x25519_dalek::StaticSecret);

impl PrivateKey {
    /// A fresh random key.
    pub fn generate() -> Self {
        Self(x25519_dalek::StaticSecret::random())
    }

    /// Reads the base64 key at `path`, or creates it (mode 0600) when absent.
    pub fn load_or_create(path: &Path) -> Result<Self, KeyError> {
        let file_error = |source| KeyError::File {
            path: path.display().to_string(),
            error: source,
        };
        match std::fs::read_to_string(path) {
            Ok(text) => Ok(Self(Key::from_base64(&text)?.0.into())),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                let key = Self::generate();
                // create_new + 0600: the secret is never readable by others, not even briefly.
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .map_err(file_error)?;
                file.write_all(key.to_base64().as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(file_error)?;
                Ok(key)
            }
            Err(err) => Err(file_error(err)),
        }
    }

    /// The public key.
    pub fn public_key(&self) -> Key {
        Key(x25519_dalek::PublicKey::from(&self.0).to_bytes())
    }

    /// The secret bytes (for the device configuration only).
    pub fn secret(&self) -> Key {
        Key(self.0.to_bytes())
    }

    fn to_base64(&self) -> String {
        STANDARD.encode(self.0.as_bytes())
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey(public {})", self.public_key())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn base64_and_hex_round_trip_and_reject_malformed() {
        let key = Key([7; 32]);
        assert_eq!(Key::from_base64(&key.to_base64()).unwrap(), key);
        assert_eq!(Key::from_hex(&key.to_hex()).unwrap(), key);
        assert!(Key::from_base64("not a key").is_err());
        assert!(Key::from_base64(&STANDARD.encode([1u8; 31])).is_err());
        assert!(Key::from_hex(&"zz".repeat(32)).is_err());
    }

    #[test]
    fn private_key_file_is_created_0600_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wg.key");
        let first = PrivateKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let again = PrivateKey::load_or_create(&path).unwrap();
        assert_eq!(first.public_key(), again.public_key());
        assert_ne!(first.public_key(), first.secret());
    }

    #[test]
    fn public_key_matches_rfc7748_vector() {
        // RFC 7748 §6.1: Alice's private and public keys.
        let secret =
            Key::from_hex("77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a")
                .unwrap();
        let key = PrivateKey(secret.0.into());
        assert_eq!(
            key.public_key().to_hex(),
            "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a"
        );
    }
}
