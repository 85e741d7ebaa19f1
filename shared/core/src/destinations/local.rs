//! The local secret store: destinations' secrets where there is no Secrets Manager (`relay dev`,
//! or `relay serve` and `relay worker` with `RELAY_SECRETS_DIR`). One file per secret under the
//! store's folder, `<tenant id>/<destination>.secret` (`.signing.secret` for the signing
//! secret), holding a random nonce and the value sealed with AES-256-GCM under the store's key
//! (`secrets.key` beside them, 32 random bytes, readable by its owner only), the secret's name
//! (`destinations::Secret::id`) as associated data: a file copied under another tenant's or
//! destination's name does not open. The same write-only API as Secrets Manager: written by
//! `PUT /v1/destinations/{name}/secret` (or `/signing-secret`), read by `http.request` and
//! `webhook.send`, deleted with the destination, never returned.
//!
//! Any number of processes may open one store at once (`relay serve`, `relay worker`, the sweep,
//! started together): the first key is written to a file of its own and linked into place, which
//! fails for every process but one; the others read the key that won.

use std::io::Write;
use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use super::{Secret, SecretError};
use crate::job::TenantId;

/// The key file's name in the store's folder.
pub const KEY_FILE: &str = "secrets.key";
const KEY_LEN: usize = 32;

/// A local store, its key loaded.
pub struct LocalSecrets {
    dir: PathBuf,
    key: LessSafeKey,
    rng: SystemRandom,
}

impl std::fmt::Debug for LocalSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalSecrets").field("dir", &self.dir).finish_non_exhaustive()
    }
}

/// Why the store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("{path}: {error}")]
    Io { path: PathBuf, error: std::io::Error },
    #[error("{0}: not a key of {KEY_LEN} bytes (remove it to start a new store; its secrets are then lost)")]
    BadKey(PathBuf),
    #[error("no random numbers for a new key")]
    Random,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |error| OpenError::Io { path: path.to_owned(), error }
}

/// A name beside `path` no other writer uses at the same time: 64 random bits in it.
fn temporary(path: &Path) -> PathBuf {
    let name = path.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{:016x}.tmp", rand::random::<u64>()))
}

/// Write `bytes` to a new file of the owner's only beside `path`, synced; returns its path.
fn write_temporary(path: &Path, bytes: &[u8]) -> std::io::Result<PathBuf> {
    let tmp = temporary(path);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let written = options.open(&tmp).and_then(|mut file| {
        file.write_all(bytes)?;
        file.sync_all()
    });
    match written {
        Ok(()) => Ok(tmp),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

/// Write `bytes` to `path` through a file of the owner's only, renamed into place (replacing
/// what was there: a secret's new value).
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = write_temporary(path, bytes)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Write `bytes` to `path` unless it exists, whole or not at all: through a file of the owner's
/// only, linked into place (a link never replaces a file). False when `path` existed already.
fn create_private(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let tmp = write_temporary(path, bytes)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

fn create_dir_private(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    std::os::unix::fs::DirBuilderExt::mode(&mut builder, 0o700);
    builder.create(dir)
}

impl LocalSecrets {
    /// Open the store in `dir`, creating the folder and its key the first time.
    pub fn open(dir: &Path) -> Result<LocalSecrets, OpenError> {
        create_dir_private(dir).map_err(io(dir))?;
        let rng = SystemRandom::new();
        let key_path = dir.join(KEY_FILE);
        let bytes = match std::fs::read(&key_path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut b = vec![0u8; KEY_LEN];
                rng.fill(&mut b).map_err(|_| OpenError::Random)?;
                if create_private(&key_path, &b).map_err(io(&key_path))? {
                    b
                } else {
                    // Another process made the key first: use its key, whole (it was linked
                    // into place only once written).
                    std::fs::read(&key_path).map_err(io(&key_path))?
                }
            }
            Err(e) => return Err(OpenError::Io { path: key_path, error: e }),
        };
        let unbound = UnboundKey::new(&AES_256_GCM, &bytes).map_err(|_| OpenError::BadKey(key_path))?;
        Ok(LocalSecrets { dir: dir.to_owned(), key: LessSafeKey::new(unbound), rng })
    }

    /// The file of a destination's secret (names are checked by `destinations::check_name`,
    /// so they never leave the tenant's folder).
    fn path(&self, tenant: TenantId, name: &str, which: Secret) -> PathBuf {
        let file = match which {
            Secret::Auth => format!("{name}.secret"),
            Secret::Signing => format!("{name}.signing.secret"),
            Secret::ClientSecret => format!("{name}.client-secret.secret"),
            Secret::RefreshToken => format!("{name}.refresh-token.secret"),
        };
        self.dir.join(tenant.to_string()).join(file)
    }

    /// Seal and store the value, replacing any earlier one.
    pub fn write(&self, tenant: TenantId, name: &str, which: Secret, value: &str) -> Result<(), SecretError> {
        super::check_name(name).map_err(|m| SecretError::Service(format!("{name:?}: {m}")))?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| SecretError::Service("no random numbers for a nonce".into()))?;
        let mut sealed = value.as_bytes().to_vec();
        let aad = which.id(tenant, name);
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::from(aad.as_bytes()), &mut sealed)
            .map_err(|_| SecretError::Service("could not seal the value".into()))?;
        let path = self.path(tenant, name, which);
        let fail = |e: std::io::Error| SecretError::Service(format!("{}: {e}", path.display()));
        create_dir_private(path.parent().unwrap_or(&self.dir)).map_err(fail)?;
        let mut file = nonce.to_vec();
        file.extend_from_slice(&sealed);
        write_private(&path, &file).map_err(fail)
    }

    /// Delete a destination's secrets (any may be absent).
    pub fn delete(&self, tenant: TenantId, name: &str) -> Result<(), SecretError> {
        if super::check_name(name).is_err() {
            return Ok(());
        }
        for which in Secret::ALL {
            let path = self.path(tenant, name, which);
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(SecretError::Service(format!("{}: {e}", path.display()))),
            }
        }
        Ok(())
    }

    /// Open a destination's secret.
    pub fn read(&self, tenant: TenantId, name: &str, which: Secret) -> Result<String, SecretError> {
        let id = which.id(tenant, name);
        super::check_name(name).map_err(|_| SecretError::Missing(id.clone()))?;
        let path = self.path(tenant, name, which);
        let mut bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(SecretError::Missing(id)),
            Err(e) => return Err(SecretError::Service(format!("{}: {e}", path.display()))),
        };
        if bytes.len() < NONCE_LEN {
            return Err(SecretError::Service(format!("{}: too short to be a sealed secret", path.display())));
        }
        let mut sealed = bytes.split_off(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(&bytes)
            .map_err(|_| SecretError::Service(format!("{}: bad nonce", path.display())))?;
        let opened = self.key.open_in_place(nonce, Aad::from(id.as_bytes()), &mut sealed).map_err(|_| {
            SecretError::Service(format!("{}: does not open under this store's key and name", path.display()))
        })?;
        String::from_utf8(opened.to_vec()).map_err(|_| SecretError::NotAString(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp() -> PathBuf {
        let dir = std::env::temp_dir().join(format!("relay-secrets-{}", TenantId::new()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    #[test]
    fn a_value_is_sealed_at_rest_and_opens_only_as_its_own_name() {
        let dir = temp();
        let store = LocalSecrets::open(&dir).unwrap();
        let (a, b) = (TenantId::new(), TenantId::new());
        store.write(a, "crm", Secret::Auth, "Bearer sk-local-7").unwrap();
        assert_eq!(store.read(a, "crm", Secret::Auth).unwrap(), "Bearer sk-local-7");
        let file = std::fs::read(store.path(a, "crm", Secret::Auth)).unwrap();
        assert!(!file.windows(8).any(|w| w == b"sk-local"), "the value is not stored in the clear");
        assert!(matches!(store.read(b, "crm", Secret::Auth), Err(SecretError::Missing(_))));
        // A file copied under another tenant's name does not open.
        std::fs::create_dir_all(store.path(b, "crm", Secret::Auth).parent().unwrap()).unwrap();
        std::fs::copy(store.path(a, "crm", Secret::Auth), store.path(b, "crm", Secret::Auth)).unwrap();
        assert!(matches!(store.read(b, "crm", Secret::Auth), Err(SecretError::Service(_))));
        // The signing secret is another file under another name: neither opens as the other.
        store.write(a, "crm", Secret::Signing, "whsec_x").unwrap();
        assert_eq!(store.read(a, "crm", Secret::Signing).unwrap(), "whsec_x");
        assert_eq!(store.read(a, "crm", Secret::Auth).unwrap(), "Bearer sk-local-7");
        std::fs::copy(store.path(a, "crm", Secret::Auth), store.path(a, "crm", Secret::Signing)).unwrap();
        assert!(matches!(store.read(a, "crm", Secret::Signing), Err(SecretError::Service(_))));
        // A new value replaces the old; the store reopens with the same key.
        store.write(a, "crm", Secret::Auth, "Bearer sk-local-8").unwrap();
        assert_eq!(LocalSecrets::open(&dir).unwrap().read(a, "crm", Secret::Auth).unwrap(), "Bearer sk-local-8");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(KEY_FILE)).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "the key is its owner's only");
        }
        // Names that would leave the folder are refused.
        assert!(store.write(a, "../x", Secret::Auth, "v").is_err());
        assert!(matches!(store.read(a, "../x", Secret::Auth), Err(SecretError::Missing(_))));
        std::fs::write(dir.join(KEY_FILE), b"short").unwrap();
        assert!(matches!(LocalSecrets::open(&dir), Err(OpenError::BadKey(_))));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
