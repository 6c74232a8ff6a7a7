//! TLS for listeners and inter-broker connections, configured from Kafka's
//! own `ssl.*` keys so a user's `server.properties` carries over.
//!
//! [`TlsSettings::from_config`] reads the keys; [`server_config`] and
//! [`client_config`] read the stores and build rustls configurations;
//! [`ReloadingAcceptor`] rebuilds the listener's configuration when the
//! keystore or truststore files change (Kafka re-reads them on a dynamic
//! config change; we do it when their contents change) or on SIGHUP;
//! [`peer_principal`] turns a client certificate into Kafka's principal name
//! through `ssl.principal.mapping.rules`.
//!
//! Invariant: this module opens no sockets. The accept loop owns the
//! connections; this module only decides how they are secured and who the
//! peer is.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, PoisonError, RwLock};
use std::time::Duration;

use regex::Regex;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{self, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CipherSuite, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig,
    ServerConnection, SignatureScheme, SupportedProtocolVersion,
};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Keystore and truststore files larger than this are refused: a real store
/// is kilobytes, and a mistyped path (a device, a log file) must not be read
/// into memory without end.
pub const STORE_FILE_BYTES_MAX: u64 = 16 * 1024 * 1024;

const KEYSTORE_TYPE: &str = "ssl.keystore.type";
const KEYSTORE_LOCATION: &str = "ssl.keystore.location";
const KEYSTORE_PASSWORD: &str = "ssl.keystore.password";
const KEY_PASSWORD: &str = "ssl.key.password";
const KEYSTORE_CERTIFICATE_CHAIN: &str = "ssl.keystore.certificate.chain";
const KEYSTORE_KEY: &str = "ssl.keystore.key";
const TRUSTSTORE_TYPE: &str = "ssl.truststore.type";
const TRUSTSTORE_LOCATION: &str = "ssl.truststore.location";
const TRUSTSTORE_PASSWORD: &str = "ssl.truststore.password";
const TRUSTSTORE_CERTIFICATES: &str = "ssl.truststore.certificates";
const CLIENT_AUTH: &str = "ssl.client.auth";
const ENABLED_PROTOCOLS: &str = "ssl.enabled.protocols";
const PROTOCOL: &str = "ssl.protocol";
const CIPHER_SUITES: &str = "ssl.cipher.suites";
const PRINCIPAL_MAPPING_RULES: &str = "ssl.principal.mapping.rules";
const ENDPOINT_IDENTIFICATION: &str = "ssl.endpoint.identification.algorithm";

/// A TLS configuration that cannot be used. Its `Display` is one line naming
/// the Kafka key (and the file, where there is one), so the broker can print
/// it and exit at start.
#[derive(Debug, thiserror::Error)]
pub enum TlsConfigError {
    /// A key's value is malformed, or contradicts another key.
    #[error("{key}: {reason}")]
    Invalid { key: &'static str, reason: String },
    /// A store file could not be read.
    #[error("{key}: cannot read {}: {source}", path.display())]
    Read {
        key: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A store was read but its contents cannot be used.
    #[error("{key} ({origin}): {reason}")]
    Store {
        key: &'static str,
        /// The file's path, or "inline value" for the PEM keys.
        origin: String,
        reason: String,
    },
}

fn invalid(key: &'static str, reason: impl Into<String>) -> TlsConfigError {
    TlsConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// A secret from the configuration. Its `Debug` hides the value so settings
/// can be logged.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[hidden]")
    }
}

/// `ssl.keystore.type` / `ssl.truststore.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreType {
    Pem,
    Pkcs12,
    /// Kafka's default. A file of this type is read as PKCS12 when it is one
    /// (Java's JKS type reads PKCS12 files too, so such configurations work in
    /// Kafka); a real JKS file is refused with the keytool command that
    /// converts it, since no maintained Rust crate reads JKS.
    Jks,
}

impl StoreType {
    fn parse(key: &'static str, value: Option<String>) -> Result<Self, TlsConfigError> {
        let Some(value) = value else {
            return Ok(StoreType::Jks);
        };
        match value.to_ascii_uppercase().as_str() {
            "PEM" => Ok(StoreType::Pem),
            "PKCS12" => Ok(StoreType::Pkcs12),
            "JKS" => Ok(StoreType::Jks),
            _ => Err(invalid(
                key,
                format!("unsupported store type `{value}` (PEM, PKCS12 or JKS)"),
            )),
        }
    }
}

/// Where the broker's own certificate and key come from.
#[derive(Debug, Clone)]
pub enum KeystoreSource {
    /// `ssl.keystore.location`: a PEM file holding the key and the chain, or
    /// a PKCS12 file.
    File {
        store_type: StoreType,
        path: PathBuf,
    },
    /// `ssl.keystore.certificate.chain` and `ssl.keystore.key`: PEM text in
    /// the configuration itself.
    InlinePem {
        certificate_chain: String,
        key: Password,
    },
}

/// `ssl.keystore.*`.
#[derive(Debug, Clone)]
pub struct Keystore {
    pub source: KeystoreSource,
    /// `ssl.keystore.password`: the PKCS12 file's password (PKCS12 has one
    /// password for the file and its keys, as keytool also insists).
    pub password: Option<Password>,
    /// `ssl.key.password`: decrypts an encrypted PKCS#8 key in a PEM keystore.
    pub key_password: Option<Password>,
}

/// Where the certificates that authenticate peers come from.
#[derive(Debug, Clone)]
pub enum TruststoreSource {
    /// `ssl.truststore.location`.
    File {
        store_type: StoreType,
        path: PathBuf,
    },
    /// `ssl.truststore.certificates`: PEM text in the configuration itself.
    InlinePem { certificates: String },
}

/// `ssl.truststore.*`.
#[derive(Debug, Clone)]
pub struct Truststore {
    pub source: TruststoreSource,
    /// `ssl.truststore.password`; optional for PKCS12, as in Kafka.
    pub password: Option<Password>,
}

/// `ssl.client.auth`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client must present a certificate the truststore vouches for.
    Required,
    /// A client may present one; if it does, it must verify.
    Requested,
    None,
}

/// A protocol version of `ssl.enabled.protocols` that rustls speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

impl TlsVersion {
    fn rustls(self) -> &'static SupportedProtocolVersion {
        match self {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        }
    }
}

/// Kafka's (JSSE's) cipher suite names for the suites rustls's ring provider
/// implements. The TLS 1.3 names differ from rustls's (`TLS13_` prefix), so
/// the table is explicit rather than derived from rustls's names.
const CIPHER_SUITE_NAMES: &[(&str, CipherSuite)] = &[
    (
        "TLS_AES_128_GCM_SHA256",
        CipherSuite::TLS13_AES_128_GCM_SHA256,
    ),
    (
        "TLS_AES_256_GCM_SHA384",
        CipherSuite::TLS13_AES_256_GCM_SHA384,
    ),
    (
        "TLS_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS13_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Everything a TLS listener or an inter-broker TLS client needs, from
/// Kafka's `ssl.*` keys. Stores are named here, read by [`server_config`] and
/// [`client_config`] (and re-read by [`ReloadingAcceptor`]).
#[derive(Debug, Clone)]
pub struct TlsSettings {
    pub keystore: Option<Keystore>,
    pub truststore: Option<Truststore>,
    pub client_auth: ClientAuth,
    /// `ssl.enabled.protocols`, in the order given.
    pub protocol_versions: Vec<TlsVersion>,
    /// `ssl.cipher.suites`, in the order given; empty means rustls's defaults.
    pub cipher_suites: Vec<CipherSuite>,
    /// `ssl.protocol`: accepted for compatibility; `ssl.enabled.protocols`
    /// decides what is spoken.
    pub protocol: String,
    pub principal_mapper: PrincipalMapper,
    /// `ssl.endpoint.identification.algorithm`: whether the client side checks
    /// that the server's certificate names the host it dialled.
    pub endpoint_identification: bool,
}

/// A key's value, trimmed; unset and blank are the same, as they are for
/// Kafka's optional keys.
fn value(get: &dyn Fn(&str) -> Option<String>, key: &str) -> Option<String> {
    get(key)
        .map(|v| v.trim().to_owned())
        .filter(|v| !v.is_empty())
}

/// A password's value, untrimmed (spaces may be part of it); empty is unset.
fn password(get: &dyn Fn(&str) -> Option<String>, key: &str) -> Option<Password> {
    get(key).filter(|v| !v.is_empty()).map(Password)
}

impl TlsSettings {
    /// Reads Kafka's `ssl.*` keys through `get`, which returns a key's
    /// effective value (the caller resolves `listener.name.<l>.ssl.*`
    /// overrides). Checks the keys against each other as Kafka does; the
    /// stores themselves are read by [`server_config`] / [`client_config`].
    pub fn from_config(get: &dyn Fn(&str) -> Option<String>) -> Result<Self, TlsConfigError> {
        let keystore = Self::keystore(get)?;
        let truststore = Self::truststore(get)?;

        let client_auth = match value(get, CLIENT_AUTH).map(|v| v.to_ascii_lowercase()) {
            None => ClientAuth::None,
            Some(v) => match v.as_str() {
                "required" => ClientAuth::Required,
                "requested" => ClientAuth::Requested,
                "none" => ClientAuth::None,
                // Kafka falls back to `none` with a warning; a typo that
                // silently turns off client authentication is refused here.
                _ => {
                    return Err(invalid(
                        CLIENT_AUTH,
                        format!("`{v}` is not one of required, requested, none"),
                    ))
                }
            },
        };

        let protocol_versions = match value(get, ENABLED_PROTOCOLS) {
            None => vec![TlsVersion::Tls12, TlsVersion::Tls13],
            Some(list) => parse_protocols(&list)?,
        };

        let cipher_suites = match value(get, CIPHER_SUITES) {
            None => Vec::new(),
            Some(list) => parse_cipher_suites(&list)?,
        };

        let principal_mapper = match get(PRINCIPAL_MAPPING_RULES) {
            None => PrincipalMapper::default(),
            Some(rules) => PrincipalMapper::parse(&rules)?,
        };

        // Unlike the other keys, an empty value here is meaningful: Kafka's
        // documented way to turn hostname verification off.
        let endpoint_identification = match get(ENDPOINT_IDENTIFICATION) {
            None => true,
            Some(v) => match v.trim().to_ascii_lowercase().as_str() {
                "" => false,
                "https" | "ldaps" => true,
                other => {
                    return Err(invalid(
                        ENDPOINT_IDENTIFICATION,
                        format!("`{other}` is not supported (https, or empty to disable)"),
                    ))
                }
            },
        };

        Ok(TlsSettings {
            keystore,
            truststore,
            client_auth,
            protocol_versions,
            cipher_suites,
            protocol: value(get, PROTOCOL).unwrap_or_else(|| "TLSv1.3".to_owned()),
            principal_mapper,
            endpoint_identification,
        })
    }

    /// Kafka's `DefaultSslEngineFactory.createKeystore` rules.
    fn keystore(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Keystore>, TlsConfigError> {
        let store_type = StoreType::parse(KEYSTORE_TYPE, value(get, KEYSTORE_TYPE))?;
        let location = value(get, KEYSTORE_LOCATION);
        let store_password = password(get, KEYSTORE_PASSWORD);
        let key_password = password(get, KEY_PASSWORD);
        let key = password(get, KEYSTORE_KEY).filter(|k| !k.0.trim().is_empty());
        let chain = value(get, KEYSTORE_CERTIFICATE_CHAIN);

        let source = match (key, chain) {
            (Some(key), Some(certificate_chain)) => {
                if store_type != StoreType::Pem {
                    return Err(invalid(
                        KEYSTORE_KEY,
                        "an inline key needs ssl.keystore.type=PEM",
                    ));
                }
                if location.is_some() {
                    return Err(invalid(
                        KEYSTORE_KEY,
                        "set either ssl.keystore.location or the inline key and chain, not both",
                    ));
                }
                KeystoreSource::InlinePem {
                    certificate_chain,
                    key,
                }
            }
            (Some(_), None) => {
                return Err(invalid(
                    KEYSTORE_CERTIFICATE_CHAIN,
                    "ssl.keystore.key is set but the certificate chain is not",
                ))
            }
            (None, Some(_)) => {
                return Err(invalid(
                    KEYSTORE_KEY,
                    "ssl.keystore.certificate.chain is set but the key is not",
                ))
            }
            (None, None) => match location {
                Some(path) => KeystoreSource::File {
                    store_type,
                    path: PathBuf::from(path),
                },
                None if store_password.is_some() => {
                    return Err(invalid(
                        KEYSTORE_PASSWORD,
                        "set, but ssl.keystore.location is not",
                    ))
                }
                None => return Ok(None),
            },
        };

        if store_type == StoreType::Pem {
            if store_password.is_some() {
                return Err(invalid(
                    KEYSTORE_PASSWORD,
                    "a PEM keystore has no store password; an encrypted key's password goes in ssl.key.password",
                ));
            }
        } else if store_password.is_none() {
            return Err(invalid(
                KEYSTORE_PASSWORD,
                "ssl.keystore.location is set but its password is not",
            ));
        }

        Ok(Some(Keystore {
            source,
            password: store_password,
            key_password,
        }))
    }

    /// Kafka's `DefaultSslEngineFactory.createTruststore` rules.
    fn truststore(
        get: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Truststore>, TlsConfigError> {
        let store_type = StoreType::parse(TRUSTSTORE_TYPE, value(get, TRUSTSTORE_TYPE))?;
        let location = value(get, TRUSTSTORE_LOCATION);
        let store_password = password(get, TRUSTSTORE_PASSWORD);
        let certificates = value(get, TRUSTSTORE_CERTIFICATES);

        if store_type == StoreType::Pem && store_password.is_some() {
            return Err(invalid(
                TRUSTSTORE_PASSWORD,
                "a PEM truststore has no password",
            ));
        }
        let source = match (certificates, location) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    TRUSTSTORE_CERTIFICATES,
                    "set either ssl.truststore.location or the inline certificates, not both",
                ))
            }
            (Some(certificates), None) => {
                if store_type != StoreType::Pem {
                    return Err(invalid(
                        TRUSTSTORE_CERTIFICATES,
                        "inline certificates need ssl.truststore.type=PEM",
                    ));
                }
                TruststoreSource::InlinePem { certificates }
            }
            (None, Some(path)) => TruststoreSource::File {
                store_type,
                path: PathBuf::from(path),
            },
            (None, None) if store_password.is_some() => {
                return Err(invalid(
                    TRUSTSTORE_PASSWORD,
                    "set, but ssl.truststore.location is not",
                ))
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(Truststore {
            source,
            password: store_password,
        }))
    }

    fn rustls_versions(&self) -> Vec<&'static SupportedProtocolVersion> {
        self.protocol_versions.iter().map(|v| v.rustls()).collect()
    }

    /// The ring provider, narrowed to `ssl.cipher.suites` when it is set.
    fn crypto_provider(&self) -> Arc<CryptoProvider> {
        // rustls deprecates ring's provider for lacking post-quantum key
        // exchange; the broker uses ring anyway to avoid aws-lc's C build.
        #[allow(deprecated)]
        let mut provider = crypto::ring::default_provider();
        if !self.cipher_suites.is_empty() {
            let available = std::mem::take(&mut provider.cipher_suites);
            provider.cipher_suites = self
                .cipher_suites
                .iter()
                .filter_map(|wanted| available.iter().find(|s| s.suite() == *wanted).copied())
                .collect();
        }
        Arc::new(provider)
    }
}

/// `ssl.enabled.protocols`: JSSE names to rustls versions. TLSv1 and TLSv1.1
/// (and SSL) are not implemented by rustls: dropped with a warning when a
/// newer version remains, refused when nothing would.
fn parse_protocols(list: &str) -> Result<Vec<TlsVersion>, TlsConfigError> {
    let mut versions = Vec::new();
    let mut dropped = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match name {
            "TLSv1.3" => versions.push(TlsVersion::Tls13),
            "TLSv1.2" => versions.push(TlsVersion::Tls12),
            "TLSv1.1" | "TLSv1" | "SSLv3" | "SSLv2Hello" => dropped.push(name),
            _ => {
                return Err(invalid(
                    ENABLED_PROTOCOLS,
                    format!("unknown protocol `{name}` (TLSv1.2, TLSv1.3)"),
                ))
            }
        }
    }
    versions.dedup();
    if versions.is_empty() {
        return Err(invalid(
            ENABLED_PROTOCOLS,
            format!("`{list}` leaves nothing this broker speaks (TLSv1.2, TLSv1.3)"),
        ));
    }
    if !dropped.is_empty() {
        tracing::warn!(
            "{ENABLED_PROTOCOLS}: ignoring {} (not supported; TLSv1.2 and TLSv1.3 are)",
            dropped.join(", ")
        );
    }
    Ok(versions)
}

/// `ssl.cipher.suites`: JSSE names to rustls suites. Names this broker does
/// not implement are dropped with a warning, as long as one remains.
fn parse_cipher_suites(list: &str) -> Result<Vec<CipherSuite>, TlsConfigError> {
    let mut suites = Vec::new();
    let mut unknown = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match CIPHER_SUITE_NAMES
            .iter()
            .find(|(java, _)| java.eq_ignore_ascii_case(name))
        {
            Some((_, suite)) if !suites.contains(suite) => suites.push(*suite),
            Some(_) => {}
            None => unknown.push(name),
        }
    }
    if suites.is_empty() {
        let known: Vec<&str> = CIPHER_SUITE_NAMES.iter().map(|(n, _)| *n).collect();
        return Err(invalid(
            CIPHER_SUITES,
            format!(
                "none of `{list}` is supported (supported: {})",
                known.join(", ")
            ),
        ));
    }
    if !unknown.is_empty() {
        tracing::warn!(
            "{CIPHER_SUITES}: ignoring unsupported suites {}",
            unknown.join(", ")
        );
    }
    Ok(suites)
}

// ---------------------------------------------------------------------------
// Reading stores
// ---------------------------------------------------------------------------

/// The bytes of the store files, read once so that a reload builds from
/// exactly the bytes it compared.
struct StoreFiles {
    keystore: Option<Vec<u8>>,
    truststore: Option<Vec<u8>>,
}

impl StoreFiles {
    fn read(settings: &TlsSettings) -> Result<Self, TlsConfigError> {
        let keystore = match &settings.keystore {
            Some(Keystore {
                source: KeystoreSource::File { path, .. },
                ..
            }) => Some(read_file(KEYSTORE_LOCATION, path)?),
            _ => None,
        };
        let truststore = match &settings.truststore {
            Some(Truststore {
                source: TruststoreSource::File { path, .. },
                ..
            }) => Some(read_file(TRUSTSTORE_LOCATION, path)?),
            _ => None,
        };
        Ok(StoreFiles {
            keystore,
            truststore,
        })
    }

    /// A digest of the contents, so the reloader keeps no copy of the key.
    fn digest(&self) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new();
        for file in [&self.keystore, &self.truststore] {
            match file {
                Some(bytes) => {
                    hasher.update(&[1]);
                    hasher.update(&(bytes.len() as u64).to_le_bytes());
                    hasher.update(bytes);
                }
                None => {
                    hasher.update(&[0]);
                }
            }
        }
        hasher.finalize()
    }
}

fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsConfigError> {
    let read_error = |source| TlsConfigError::Read {
        key,
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(STORE_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > STORE_FILE_BYTES_MAX {
        return Err(store_error(
            key,
            &path.display().to_string(),
            format!("larger than {STORE_FILE_BYTES_MAX} bytes; not a keystore"),
        ));
    }
    Ok(bytes)
}

fn store_error(key: &'static str, origin: &str, reason: impl fmt::Display) -> TlsConfigError {
    TlsConfigError::Store {
        key,
        origin: origin.to_owned(),
        reason: reason.to_string(),
    }
}

const INLINE: &str = "inline value";

/// Java keystores (JKS and JCEKS) begin with these magic numbers.
const JKS_MAGIC: [u8; 4] = [0xFE, 0xED, 0xFE, 0xED];
const JCEKS_MAGIC: [u8; 4] = [0xCE, 0xCE, 0xCE, 0xCE];

/// Opens a PKCS12 file, refusing a Java keystore with the command that
/// converts it.
fn open_pkcs12(
    key: &'static str,
    path: &Path,
    bytes: &[u8],
    password: Option<&Password>,
) -> Result<p12_keystore::KeyStore, TlsConfigError> {
    let origin = path.display().to_string();
    if bytes.starts_with(&JKS_MAGIC) || bytes.starts_with(&JCEKS_MAGIC) {
        return Err(store_error(
            key,
            &origin,
            format!(
                "JKS keystores are not supported; convert it with `keytool -importkeystore -srckeystore {origin} -destkeystore {origin}.p12 -deststoretype PKCS12` and set the store type to PKCS12"
            ),
        ));
    }
    if bytes.trim_ascii_start().starts_with(b"-----BEGIN") {
        let type_key = if key == KEYSTORE_LOCATION {
            KEYSTORE_TYPE
        } else {
            TRUSTSTORE_TYPE
        };
        return Err(store_error(
            key,
            &origin,
            format!("this is a PEM file; set {type_key}=PEM"),
        ));
    }
    let password = password.map(Password::expose).unwrap_or_default();
    p12_keystore::KeyStore::from_pkcs12(bytes, password).map_err(|e| {
        store_error(
            key,
            &origin,
            format!("cannot open PKCS12 store (wrong password?): {e}"),
        )
    })
}

/// The broker's certificate chain (leaf first) and private key.
type Identity = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

fn load_identity(keystore: &Keystore, file: Option<&[u8]>) -> Result<Identity, TlsConfigError> {
    let (chain, key) = read_identity(keystore, file)?;
    let key = match chain
        .first()
        .and_then(|leaf| with_ec_public_key(&key, leaf))
    {
        Some(completed) => completed,
        None => key,
    };
    Ok((chain, key))
}

fn read_identity(keystore: &Keystore, file: Option<&[u8]>) -> Result<Identity, TlsConfigError> {
    match &keystore.source {
        KeystoreSource::InlinePem {
            certificate_chain,
            key,
        } => {
            let certs = pem_certificates(
                KEYSTORE_CERTIFICATE_CHAIN,
                INLINE,
                certificate_chain.as_bytes(),
            )?;
            let key = pem_private_key(
                KEYSTORE_KEY,
                INLINE,
                key.expose().as_bytes(),
                keystore.key_password.as_ref(),
            )?;
            Ok((certs, key))
        }
        KeystoreSource::File { store_type, path } => {
            let bytes = file.unwrap_or_default();
            let origin = path.display().to_string();
            match store_type {
                StoreType::Pem => {
                    let certs = pem_certificates(KEYSTORE_LOCATION, &origin, bytes)?;
                    let key = pem_private_key(
                        KEYSTORE_LOCATION,
                        &origin,
                        bytes,
                        keystore.key_password.as_ref(),
                    )?;
                    Ok((certs, key))
                }
                StoreType::Pkcs12 | StoreType::Jks => {
                    let store =
                        open_pkcs12(KEYSTORE_LOCATION, path, bytes, keystore.password.as_ref())?;
                    let Some((alias, chain)) = store.private_key_chain() else {
                        return Err(store_error(
                            KEYSTORE_LOCATION,
                            &origin,
                            "holds no private key entry",
                        ));
                    };
                    tracing::debug!("{KEYSTORE_LOCATION}: using key entry `{alias}` of {origin}");
                    let certs = chain
                        .chain()
                        .iter()
                        .map(|c| CertificateDer::from(c.as_der().to_vec()))
                        .collect();
                    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(chain.key().to_vec()));
                    Ok((certs, key))
                }
            }
        }
    }
}

fn load_roots(
    truststore: &Truststore,
    file: Option<&[u8]>,
) -> Result<RootCertStore, TlsConfigError> {
    let (key, origin, certs) = match &truststore.source {
        TruststoreSource::InlinePem { certificates } => (
            TRUSTSTORE_CERTIFICATES,
            INLINE.to_owned(),
            pem_certificates(TRUSTSTORE_CERTIFICATES, INLINE, certificates.as_bytes())?,
        ),
        TruststoreSource::File { store_type, path } => {
            let bytes = file.unwrap_or_default();
            let origin = path.display().to_string();
            let certs = match store_type {
                StoreType::Pem => pem_certificates(TRUSTSTORE_LOCATION, &origin, bytes)?,
                StoreType::Pkcs12 | StoreType::Jks => {
                    let store = open_pkcs12(
                        TRUSTSTORE_LOCATION,
                        path,
                        bytes,
                        truststore.password.as_ref(),
                    )?;
                    store
                        .entries()
                        .filter_map(|(_, entry)| match entry {
                            p12_keystore::KeyStoreEntry::Certificate(c) => {
                                Some(CertificateDer::from(c.as_der().to_vec()))
                            }
                            _ => None,
                        })
                        .collect()
                }
            };
            (TRUSTSTORE_LOCATION, origin, certs)
        }
    };
    if certs.is_empty() {
        return Err(store_error(key, &origin, "holds no trusted certificate"));
    }
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| store_error(key, &origin, format!("unusable certificate: {e}")))?;
    }
    Ok(roots)
}

fn pem_certificates(
    key: &'static str,
    origin: &str,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| store_error(key, origin, format!("bad PEM: {e}")))?;
    if certs.is_empty() {
        return Err(store_error(key, origin, "no CERTIFICATE in PEM"));
    }
    Ok(certs)
}

const ENCRYPTED_KEY_LABEL: &str = "ENCRYPTED PRIVATE KEY";

/// The one private key of a PEM keystore: PKCS#8 (as Kafka reads), PKCS#1 or
/// SEC1 in the clear, or encrypted PKCS#8 decrypted with `ssl.key.password`.
fn pem_private_key(
    key: &'static str,
    origin: &str,
    pem: &[u8],
    key_password: Option<&Password>,
) -> Result<PrivateKeyDer<'static>, TlsConfigError> {
    let mut keys = PrivateKeyDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| store_error(key, origin, format!("bad PEM: {e}")))?;
    let encrypted =
        pem_blocks(pem, ENCRYPTED_KEY_LABEL).map_err(|reason| store_error(key, origin, reason))?;
    for der in encrypted {
        let Some(password) = key_password else {
            return Err(store_error(
                key,
                origin,
                "the private key is encrypted; set ssl.key.password",
            ));
        };
        let plain = decrypt_pkcs8(&der, password.expose()).map_err(|reason| {
            store_error(
                key,
                origin,
                format!("cannot decrypt the private key: {reason}"),
            )
        })?;
        keys.push(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(plain)));
    }
    match keys.len() {
        1 => Ok(keys.remove(0)),
        0 => Err(store_error(key, origin, "no PRIVATE KEY in PEM")),
        n => Err(store_error(
            key,
            origin,
            format!("expected one private key, found {n}"),
        )),
    }
}

/// The decoded contents of every `-----BEGIN <label>-----` block. Needed for
/// encrypted keys, which the rustls PEM reader skips as an unknown label.
fn pem_blocks(pem: &[u8], label: &str) -> Result<Vec<Vec<u8>>, String> {
    use base64::Engine as _;
    let text = String::from_utf8_lossy(pem);
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let mut blocks = Vec::new();
    let mut rest = text.as_ref();
    while let Some(start) = rest.find(&begin) {
        let body = &rest[start + begin.len()..];
        let Some(stop) = body.find(&end) else {
            return Err(format!("`{begin}` without `{end}`"));
        };
        let base64: String = body[..stop]
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(base64)
            .map_err(|e| format!("bad base64 in {label}: {e}"))?;
        blocks.push(der);
        rest = &body[stop + end.len()..];
    }
    Ok(blocks)
}

/// Decrypts a PKCS#8 `EncryptedPrivateKeyInfo` (PBES2, as `openssl pkcs8
/// -topk8` and Kafka's documentation produce).
fn decrypt_pkcs8(der: &[u8], password: &str) -> Result<Vec<u8>, String> {
    const MALFORMED: &str = "malformed EncryptedPrivateKeyInfo";
    // EncryptedPrivateKeyInfo ::= SEQUENCE {
    //     encryptionAlgorithm AlgorithmIdentifier, encryptedData OCTET STRING }
    let (info, _) = der::expect(der, der::SEQUENCE).ok_or(MALFORMED)?;
    let (algorithm, rest) = der::expect(info.content, der::SEQUENCE).ok_or(MALFORMED)?;
    let (data, _) = der::expect(rest, der::OCTET_STRING).ok_or(MALFORMED)?;
    let scheme = pkcs5::EncryptionScheme::try_from(algorithm.whole)
        .map_err(|e| format!("unsupported encryption: {e}"))?;
    scheme
        .decrypt(password, data.content)
        .map_err(|_| "wrong ssl.key.password, or an unsupported cipher".to_owned())
}

/// id-ecPublicKey, 1.2.840.10045.2.1.
const EC_PUBLIC_KEY_OID: &[u8] = &[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01];

/// Java (keytool, and so most Kafka keystores) writes EC private keys
/// without the optional public key, which ring requires. The leaf
/// certificate carries that public key, so it is put back into the key's
/// encoding; ring then checks that the two belong together. Returns `None`
/// (use the key as it is) for anything but such a key.
fn with_ec_public_key(
    key: &PrivateKeyDer<'_>,
    leaf: &CertificateDer<'_>,
) -> Option<PrivateKeyDer<'static>> {
    let PrivateKeyDer::Pkcs8(pkcs8) = key else {
        return None;
    };
    // PrivateKeyInfo ::= SEQUENCE { version, AlgorithmIdentifier, OCTET STRING }
    let (info, _) = der::expect(pkcs8.secret_pkcs8_der(), der::SEQUENCE)?;
    let (version, rest) = der::expect(info.content, der::INTEGER)?;
    let (algorithm, rest) = der::expect(rest, der::SEQUENCE)?;
    let (oid, _) = der::expect(algorithm.content, der::OID)?;
    if oid.content != EC_PUBLIC_KEY_OID {
        return None;
    }
    let (private, _) = der::expect(rest, der::OCTET_STRING)?;
    // ECPrivateKey ::= SEQUENCE { version, privateKey OCTET STRING,
    //     parameters [0] OPTIONAL, publicKey [1] BIT STRING OPTIONAL }
    let (ec, _) = der::expect(private.content, der::SEQUENCE)?;
    let (ec_version, rest) = der::expect(ec.content, der::INTEGER)?;
    let (scalar, rest) = der::expect(rest, der::OCTET_STRING)?;
    let (parameters, rest) = match der::expect(rest, der::CONTEXT_0) {
        Some((parameters, rest)) => (parameters.whole, rest),
        None => (&[][..], rest),
    };
    if !rest.is_empty() {
        return None;
    }
    // SubjectPublicKeyInfo ::= SEQUENCE { AlgorithmIdentifier, BIT STRING }
    let (_, public_key_info) = subject_and_public_key(leaf)?;
    let (_, rest) = der::expect(public_key_info.content, der::SEQUENCE)?;
    let (point, _) = der::expect(rest, der::BIT_STRING)?;

    let ec = der::encode(
        der::SEQUENCE,
        &[
            ec_version.whole,
            scalar.whole,
            parameters,
            &der::encode(der::CONTEXT_1, point.whole),
        ]
        .concat(),
    );
    let info = der::encode(
        der::SEQUENCE,
        &[
            version.whole,
            algorithm.whole,
            &der::encode(der::OCTET_STRING, &ec),
        ]
        .concat(),
    );
    Some(PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(info)))
}

// ---------------------------------------------------------------------------
// Building rustls configurations
// ---------------------------------------------------------------------------

/// The listener's configuration: the keystore as the server certificate, the
/// truststore verifying clients per `ssl.client.auth`, no ALPN.
pub fn server_config(settings: &TlsSettings) -> Result<Arc<ServerConfig>, TlsConfigError> {
    build_server(settings, &StoreFiles::read(settings)?)
}

fn build_server(
    settings: &TlsSettings,
    files: &StoreFiles,
) -> Result<Arc<ServerConfig>, TlsConfigError> {
    let Some(keystore) = &settings.keystore else {
        return Err(invalid(
            KEYSTORE_LOCATION,
            "a TLS listener needs a keystore (ssl.keystore.location, or ssl.keystore.key with ssl.keystore.certificate.chain)",
        ));
    };
    let (chain, key) = load_identity(keystore, files.keystore.as_deref())?;
    let provider = settings.crypto_provider();
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&settings.rustls_versions())
        .map_err(|e| suites_error(settings, e))?;

    let builder = match settings.client_auth {
        ClientAuth::None => builder.with_no_client_auth(),
        auth => {
            let Some(truststore) = &settings.truststore else {
                return Err(invalid(
                    TRUSTSTORE_LOCATION,
                    "ssl.client.auth needs a truststore to verify client certificates",
                ));
            };
            let roots = load_roots(truststore, files.truststore.as_deref())?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let verifier = match auth {
                ClientAuth::Requested => verifier.allow_unauthenticated(),
                ClientAuth::Required | ClientAuth::None => verifier,
            };
            let verifier = verifier
                .build()
                .map_err(|e| invalid(TRUSTSTORE_LOCATION, format!("{e}")))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let config = builder
        .with_single_cert(chain, key)
        .map_err(|e| keystore_error(keystore, e))?;
    Ok(Arc::new(config))
}

/// The inter-broker client's configuration: the truststore verifying brokers
/// (their host names too, per `ssl.endpoint.identification.algorithm`), and
/// the keystore, when there is one, as the client certificate for mTLS.
pub fn client_config(settings: &TlsSettings) -> Result<Arc<ClientConfig>, TlsConfigError> {
    build_client(settings, &StoreFiles::read(settings)?)
}

fn build_client(
    settings: &TlsSettings,
    files: &StoreFiles,
) -> Result<Arc<ClientConfig>, TlsConfigError> {
    let Some(truststore) = &settings.truststore else {
        return Err(invalid(
            TRUSTSTORE_LOCATION,
            "a TLS client needs a truststore (no system CA roots are built in)",
        ));
    };
    let roots = Arc::new(load_roots(truststore, files.truststore.as_deref())?);
    let provider = settings.crypto_provider();
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(&settings.rustls_versions())
        .map_err(|e| suites_error(settings, e))?;
    let builder = if settings.endpoint_identification {
        builder.with_root_certificates(roots)
    } else {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(ChainOnlyVerifier { roots, provider }))
    };
    let config = match &settings.keystore {
        Some(keystore) => {
            let (chain, key) = load_identity(keystore, files.keystore.as_deref())?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| keystore_error(keystore, e))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(config))
}

fn suites_error(settings: &TlsSettings, e: rustls::Error) -> TlsConfigError {
    invalid(
        CIPHER_SUITES,
        format!(
            "no suite usable with ssl.enabled.protocols {:?}: {e}",
            settings.protocol_versions
        ),
    )
}

fn keystore_error(keystore: &Keystore, e: rustls::Error) -> TlsConfigError {
    let (key, origin) = match &keystore.source {
        KeystoreSource::File { path, .. } => (KEYSTORE_LOCATION, path.display().to_string()),
        KeystoreSource::InlinePem { .. } => (KEYSTORE_KEY, INLINE.to_owned()),
    };
    store_error(key, &origin, format!("unusable certificate or key: {e}"))
}

/// Verifies the server's chain against the truststore but not its name: what
/// Kafka does with `ssl.endpoint.identification.algorithm` empty (brokers
/// dialled by IP, or certificates without the right SANs).
#[derive(Debug)]
struct ChainOnlyVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainOnlyVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

// ---------------------------------------------------------------------------
// Reloading
// ---------------------------------------------------------------------------

/// The listener's TLS configuration, rebuilt when the store files change.
///
/// Connections take the current configuration when they are accepted; a
/// reload affects new handshakes only, as in Kafka.
pub struct ReloadingAcceptor {
    settings: TlsSettings,
    active: RwLock<Active>,
}

struct Active {
    config: Arc<ServerConfig>,
    /// Digest of the store files `config` was built from.
    digest: blake3::Hash,
}

impl ReloadingAcceptor {
    /// Reads the stores and builds the first configuration; an error here is
    /// a configuration the broker cannot start with.
    pub fn new(settings: TlsSettings) -> Result<Self, TlsConfigError> {
        let files = StoreFiles::read(&settings)?;
        let config = build_server(&settings, &files)?;
        Ok(ReloadingAcceptor {
            active: RwLock::new(Active {
                config,
                digest: files.digest(),
            }),
            settings,
        })
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config())
    }

    /// The current configuration.
    pub fn config(&self) -> Arc<ServerConfig> {
        // A panic elsewhere cannot leave `Active` half-written (it is replaced
        // whole), so a poisoned lock still holds a usable configuration.
        let active = self.active.read().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(&active.config)
    }

    /// Re-reads the store files. Returns `Ok(true)` if their contents changed
    /// and the new configuration replaced the old one, `Ok(false)` if nothing
    /// changed. A new file that does not build keeps the old configuration and
    /// returns the error. Blocking file I/O: call from a blocking context.
    pub fn reload(&self) -> Result<bool, TlsConfigError> {
        let files = StoreFiles::read(&self.settings)?;
        let digest = files.digest();
        if self
            .active
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .digest
            == digest
        {
            return Ok(false);
        }
        let config = build_server(&self.settings, &files)?;
        *self.active.write().unwrap_or_else(PoisonError::into_inner) = Active { config, digest };
        tracing::info!("TLS keystore/truststore changed; new connections use the new certificates");
        Ok(true)
    }

    /// Polls the store files every `every` and reloads when they change, until
    /// `shutdown` turns true. A failing new file is logged once per distinct
    /// error (not every poll) and the old configuration stays. Call from
    /// within a Tokio runtime.
    pub fn spawn_watch(
        self: Arc<Self>,
        every: Duration,
        mut shutdown: watch::Receiver<bool>,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            // `interval` panics on zero.
            let mut ticks = tokio::time::interval(every.max(Duration::from_millis(1)));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // The first tick is immediate, and the configuration is fresh.
            ticks.tick().await;
            let mut last_error: Option<String> = None;
            loop {
                if *shutdown.borrow() {
                    return;
                }
                tokio::select! {
                    _ = ticks.tick() => {}
                    changed = shutdown.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
                match Arc::clone(&self).reload_blocking().await {
                    Ok(_) => last_error = None,
                    Err(e) => {
                        if last_error.as_deref() != Some(e.as_str()) {
                            tracing::warn!(
                                "TLS reload failed, keeping the current certificates: {e}"
                            );
                            last_error = Some(e);
                        }
                    }
                }
            }
        })
    }

    /// Reloads on every SIGHUP until `shutdown` turns true. Registers the
    /// signal handler before returning, so a SIGHUP sent after this returns is
    /// never lost (nor fatal to the process). Call from within a Tokio runtime.
    pub fn spawn_sighup(
        self: Arc<Self>,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<JoinHandle<()>> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut hangups = signal(SignalKind::hangup())?;
        Ok(tokio::spawn(async move {
            loop {
                if *shutdown.borrow() {
                    return;
                }
                tokio::select! {
                    got = hangups.recv() => {
                        if got.is_none() {
                            return;
                        }
                    }
                    changed = shutdown.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        continue;
                    }
                }
                match Arc::clone(&self).reload_blocking().await {
                    Ok(true) => {}
                    Ok(false) => tracing::info!("SIGHUP: TLS stores unchanged"),
                    Err(e) => tracing::warn!(
                        "SIGHUP: TLS reload failed, keeping the current certificates: {e}"
                    ),
                }
            }
        }))
    }

    /// `reload` off the async workers (it reads files and may run PBKDF2).
    async fn reload_blocking(self: Arc<Self>) -> Result<bool, String> {
        match tokio::task::spawn_blocking(move || self.reload()).await {
            Ok(result) => result.map_err(|e| e.to_string()),
            Err(join) => Err(format!("reload task failed: {join}")),
        }
    }
}

// ---------------------------------------------------------------------------
// Principals
// ---------------------------------------------------------------------------

/// Why a client certificate yields no principal. Kafka fails authentication
/// in both cases; the connection should be closed, not treated as anonymous.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrincipalError {
    #[error("cannot read the subject of the client certificate")]
    UnreadableSubject,
    #[error("no ssl.principal.mapping.rules rule applies to `{dn}`")]
    NoMatchingRule { dn: String },
}

/// Kafka's principal name for the peer of a finished handshake (the caller
/// prefixes `User:`): the client certificate's subject as Java's
/// `X500Principal.getName()` prints it, mapped by `ssl.principal.mapping.rules`.
/// `Ok(None)` when the client sent no certificate (Kafka's `ANONYMOUS`).
///
/// This returns a `Result` rather than an `Option` so that a certificate no
/// rule maps cannot be mistaken for no certificate at all.
pub fn peer_principal(
    conn: &ServerConnection,
    mapper: &PrincipalMapper,
) -> Result<Option<String>, PrincipalError> {
    let Some(leaf) = conn.peer_certificates().and_then(|certs| certs.first()) else {
        return Ok(None);
    };
    let dn = subject_dn(leaf).ok_or(PrincipalError::UnreadableSubject)?;
    match mapper.map(&dn) {
        Some(name) => Ok(Some(name)),
        None => Err(PrincipalError::NoMatchingRule { dn }),
    }
}

/// The subject of a DER certificate in RFC 2253 form, as Java's
/// `X500Principal.getName()` prints it (what Kafka's mapping rules are written
/// against): RDNs last to first, the keywords Java knows for RFC 2253, other
/// attributes as `dotted.oid=#hex-of-DER`, RFC 2253 escaping. `None` if the
/// bytes are not a certificate this can read; never panics on any input.
pub fn subject_dn(cert_der: &[u8]) -> Option<String> {
    format_name(subject_name(cert_der)?)
}

/// tbsCertificate's subject Name (the contents of its SEQUENCE).
fn subject_name(cert: &[u8]) -> Option<&[u8]> {
    Some(subject_and_public_key(cert)?.0.content)
}

/// tbsCertificate's subject and subjectPublicKeyInfo.
fn subject_and_public_key(cert: &[u8]) -> Option<(der::Tlv<'_>, der::Tlv<'_>)> {
    let (cert, _) = der::expect(cert, der::SEQUENCE)?;
    let (tbs, _) = der::expect(cert.content, der::SEQUENCE)?;
    let (first, mut rest) = der::read(tbs.content)?;
    // [0] EXPLICIT version, absent in v1 certificates, then serialNumber.
    if first.tag == der::CONTEXT_0 {
        (_, rest) = der::expect(rest, der::INTEGER)?;
    } else if first.tag != der::INTEGER {
        return None;
    }
    let (_signature, rest) = der::expect(rest, der::SEQUENCE)?;
    let (_issuer, rest) = der::expect(rest, der::SEQUENCE)?;
    let (_validity, rest) = der::expect(rest, der::SEQUENCE)?;
    let (subject, rest) = der::expect(rest, der::SEQUENCE)?;
    let (public_key, _) = der::expect(rest, der::SEQUENCE)?;
    Some((subject, public_key))
}

/// RDNSequence → `CN=alice,OU=eng,...`: last RDN first; the attributes of a
/// multi-valued RDN joined by `+` in their encoded order, as Java does.
fn format_name(mut rdns: &[u8]) -> Option<String> {
    let mut formatted = Vec::new();
    while !rdns.is_empty() {
        let (rdn, rest) = der::expect(rdns, der::SET)?;
        rdns = rest;
        let mut avas = rdn.content;
        let mut parts = Vec::new();
        while !avas.is_empty() {
            let (ava, rest) = der::expect(avas, der::SEQUENCE)?;
            avas = rest;
            let (oid, value) = der::expect(ava.content, der::OID)?;
            let (value, trailing) = der::read(value)?;
            if !trailing.is_empty() {
                return None;
            }
            parts.push(format_ava(oid.content, &value)?);
        }
        if parts.is_empty() {
            return None;
        }
        formatted.push(parts.join("+"));
    }
    formatted.reverse();
    Some(formatted.join(","))
}

/// Java's `AVA.toRFC2253String`.
fn format_ava(oid: &[u8], value: &der::Tlv<'_>) -> Option<String> {
    let dotted = oid_to_dotted(oid)?;
    let keyword = match dotted.as_str() {
        "2.5.4.3" => Some("CN"),
        "2.5.4.6" => Some("C"),
        "2.5.4.7" => Some("L"),
        "2.5.4.8" => Some("ST"),
        "2.5.4.9" => Some("STREET"),
        "2.5.4.10" => Some("O"),
        "2.5.4.11" => Some("OU"),
        "0.9.2342.19200300.100.1.25" => Some("DC"),
        "0.9.2342.19200300.100.1.1" => Some("UID"),
        _ => None,
    };
    match keyword {
        // Java decodes every string type's bytes as UTF-8, BMPString included.
        Some(keyword) if der::is_string(value.tag) => Some(format!(
            "{keyword}={}",
            escape_rfc2253(&String::from_utf8_lossy(value.content))
        )),
        _ => {
            let mut out = format!("{}=#", keyword.unwrap_or(&dotted));
            for byte in value.whole {
                out.push_str(&format!("{byte:02x}"));
            }
            Some(out)
        }
    }
}

/// Java's RFC 2253 value escaping: a backslash before `,=+<>#;"\` anywhere,
/// `\00` for NUL, and a backslash before leading and trailing spaces and CRs.
fn escape_rfc2253(value: &str) -> String {
    const ESCAPEES: &str = ",=+<>#;\"\\";
    let mut chars = Vec::with_capacity(value.len());
    for c in value.chars() {
        if ESCAPEES.contains(c) {
            chars.push('\\');
            chars.push(c);
        } else if c == '\0' {
            chars.extend(['\\', '0', '0']);
        } else {
            chars.push(c);
        }
    }
    let blank = |c: &char| *c == ' ' || *c == '\r';
    let lead = chars.iter().take_while(|c| blank(c)).count();
    let trail = chars.len() - chars.iter().rev().take_while(|c| blank(c)).count();
    let mut out = String::with_capacity(chars.len() + 2);
    for (i, c) in chars.into_iter().enumerate() {
        if i < lead || i >= trail {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

fn oid_to_dotted(oid: &[u8]) -> Option<String> {
    let mut arcs = Vec::new();
    let mut arc: u64 = 0;
    let mut in_arc = false;
    for &byte in oid {
        // A leading 0x80 pads an arc, which DER forbids.
        if !in_arc && byte == 0x80 {
            return None;
        }
        arc = arc.checked_mul(128)?.checked_add(u64::from(byte & 0x7f))?;
        in_arc = byte & 0x80 != 0;
        if !in_arc {
            arcs.push(arc);
            arc = 0;
        }
    }
    let (&first, rest) = arcs.split_first()?;
    if in_arc {
        return None;
    }
    let (a, b) = match first {
        0..=39 => (0, first),
        40..=79 => (1, first - 40),
        _ => (2, first - 80),
    };
    let mut dotted = format!("{a}.{b}");
    for arc in rest {
        dotted.push_str(&format!(".{arc}"));
    }
    Some(dotted)
}

/// Just enough DER to reach a certificate's subject and public key, and the
/// parts of private keys. Every read is bounds-checked: hostile bytes give
/// `None`.
mod der {
    pub(super) const INTEGER: u8 = 0x02;
    pub(super) const BIT_STRING: u8 = 0x03;
    pub(super) const OCTET_STRING: u8 = 0x04;
    pub(super) const OID: u8 = 0x06;
    pub(super) const SEQUENCE: u8 = 0x30;
    pub(super) const SET: u8 = 0x31;
    pub(super) const CONTEXT_0: u8 = 0xA0;
    pub(super) const CONTEXT_1: u8 = 0xA1;

    /// One tag-length-value.
    pub(super) struct Tlv<'a> {
        pub(super) tag: u8,
        pub(super) content: &'a [u8],
        /// Tag, length and content: what Java hex-prints for unknown types.
        pub(super) whole: &'a [u8],
    }

    /// The first TLV of `input`, and what follows it.
    pub(super) fn read(input: &[u8]) -> Option<(Tlv<'_>, &[u8])> {
        let (&tag, rest) = input.split_first()?;
        // Multi-byte tags occur nowhere this module reads.
        if tag & 0x1f == 0x1f {
            return None;
        }
        let (&first, mut rest) = rest.split_first()?;
        let len = if first < 0x80 {
            usize::from(first)
        } else {
            // 0x80 is BER's indefinite length; more than 4 length bytes would
            // describe more than any certificate holds.
            let count = usize::from(first & 0x7f);
            if count == 0 || count > 4 {
                return None;
            }
            let (bytes, after) = rest.split_at_checked(count)?;
            rest = after;
            bytes.iter().try_fold(0usize, |len, &b| {
                len.checked_mul(256)?.checked_add(usize::from(b))
            })?
        };
        let (content, after) = rest.split_at_checked(len)?;
        let whole = input.get(..input.len() - after.len())?;
        Some((
            Tlv {
                tag,
                content,
                whole,
            },
            after,
        ))
    }

    /// The first TLV of `input` if it has `tag`.
    pub(super) fn expect(input: &[u8], tag: u8) -> Option<(Tlv<'_>, &[u8])> {
        read(input).filter(|(tlv, _)| tlv.tag == tag)
    }

    /// Encodes one TLV (definite length, as DER requires).
    pub(super) fn encode(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        let len = content.len();
        if len < 0x80 {
            out.push(len as u8);
        } else {
            let bytes: Vec<u8> = len
                .to_be_bytes()
                .into_iter()
                .skip_while(|b| *b == 0)
                .collect();
            out.push(0x80 | bytes.len() as u8);
            out.extend(bytes);
        }
        out.extend_from_slice(content);
        out
    }

    /// The string types Java prints as text (`AVA.isDerString`, non-canonical):
    /// UTF8String, PrintableString, T61String, IA5String, GeneralString,
    /// BMPString.
    pub(super) fn is_string(tag: u8) -> bool {
        matches!(tag, 0x0c | 0x13 | 0x14 | 0x16 | 0x1b | 0x1e)
    }
}

// ---------------------------------------------------------------------------
// ssl.principal.mapping.rules
// ---------------------------------------------------------------------------

/// Kafka's `SslPrincipalMapper.RULE_PATTERN`, unchanged: the rules are parsed
/// by the same regular expression, so they split the same way.
const RULE_PATTERN: &str = r"(DEFAULT)|RULE:((\\.|[^\\/])*)/((\\.|[^\\/])*)/([LU]?).*?|(.*?)";

static RULE_SPLITTER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(&format!(r"\s*({RULE_PATTERN})\s*(,\s*|$)")).expect("constant regex")
});
static RULE_PARSER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(&format!("^(?:{RULE_PATTERN})")).expect("constant regex"));

/// `ssl.principal.mapping.rules`, as Kafka's `SslPrincipalMapper`: rules
/// `RULE:pattern/replacement/` (optionally `L` or `U` to lower- or upper-case
/// the result) and `DEFAULT` (the DN unchanged), separated by commas; the
/// first rule whose pattern matches the whole DN decides.
///
/// Differences from Kafka, each failing earlier or more loudly: a malformed
/// replacement (`$x`, a trailing `\`, `$1` in a pattern without groups) is
/// refused when the rules are parsed rather than when a client connects; a
/// newline between rules separates them like a comma (Kafka would silently
/// skip the rule before it); patterns are Rust regular expressions (no
/// look-around or back-references, and `\w` is Unicode-aware).
#[derive(Debug, Clone)]
pub struct PrincipalMapper {
    rules: Vec<MappingRule>,
}

impl Default for PrincipalMapper {
    /// Kafka's default, `DEFAULT`.
    fn default() -> Self {
        PrincipalMapper {
            rules: vec![MappingRule::Default],
        }
    }
}

#[derive(Debug, Clone)]
enum MappingRule {
    Default,
    Rule {
        /// The pattern as written, for `Display`.
        source: String,
        /// Finds the matches to replace, as Java's `replaceAll`.
        pattern: Regex,
        /// The pattern anchored at both ends, as Java's `matches()`.
        whole: Regex,
        replacement_source: String,
        replacement: Vec<ReplacementPart>,
        case: Case,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ReplacementPart {
    Literal(String),
    Group(usize),
    Named(String),
}

impl PrincipalMapper {
    pub fn parse(rules: &str) -> Result<Self, TlsConfigError> {
        let err = |reason: String| invalid(PRINCIPAL_MAPPING_RULES, reason);
        let joined;
        let rules = if rules.contains('\n') {
            joined = join_lines(rules);
            joined.as_str()
        } else {
            rules
        };
        let mut parsed = Vec::new();
        for found in RULE_SPLITTER.captures_iter(rules.trim()) {
            let rule = found.get(1).map_or("", |m| m.as_str());
            let Some(parts) = RULE_PARSER.captures(rule) else {
                return Err(err(format!("invalid rule `{rule}`")));
            };
            let end = parts.get(0).map_or(0, |m| m.end());
            if end != rule.len() {
                return Err(err(format!(
                    "invalid rule `{rule}`, unmatched `{}`",
                    rule.get(end..).unwrap_or_default()
                )));
            }
            if parts.get(1).is_some() {
                parsed.push(MappingRule::Default);
            } else if let Some(source) = parts.get(2) {
                let source = source.as_str();
                let replacement_source = parts.get(4).map_or("", |m| m.as_str());
                let case = match parts.get(6).map(|m| m.as_str()) {
                    Some("L") => Case::Lower,
                    Some("U") => Case::Upper,
                    _ => Case::Keep,
                };
                let pattern =
                    Regex::new(source).map_err(|e| err(format!("bad pattern `{source}`: {e}")))?;
                let whole = Regex::new(&format!(r"\A(?:{source})\z"))
                    .map_err(|e| err(format!("bad pattern `{source}`: {e}")))?;
                let replacement = parse_replacement(replacement_source, &pattern)
                    .map_err(|reason| err(format!("rule `{rule}`: {reason}")))?;
                parsed.push(MappingRule::Rule {
                    source: source.to_owned(),
                    pattern,
                    whole,
                    replacement_source: replacement_source.to_owned(),
                    replacement,
                    case,
                });
            }
            // Anything else is an empty rule, which Kafka ignores.
        }
        Ok(PrincipalMapper { rules: parsed })
    }

    /// The short name for `dn`: the first rule that applies, `None` if none
    /// does (Kafka then fails authentication).
    pub fn map(&self, dn: &str) -> Option<String> {
        self.rules.iter().find_map(|rule| rule.apply(dn))
    }
}

/// Rules one per line become rules separated by commas.
fn join_lines(rules: &str) -> String {
    let mut joined = String::new();
    for line in rules.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if !joined.is_empty() && !joined.ends_with(',') {
            joined.push(',');
        }
        joined.push_str(line);
    }
    joined
}

/// A replacement as Java's `Matcher.appendReplacement` reads it (`\x` is a
/// literal x, `$n` and `${name}` are groups, the longest `$nn` that names a
/// group), with Kafka's rule that `$n` beyond the pattern's groups is literal
/// text.
fn parse_replacement(text: &str, pattern: &Regex) -> Result<Vec<ReplacementPart>, String> {
    let groups = pattern.captures_len().saturating_sub(1);
    let chars: Vec<char> = text.chars().collect();
    let mut parts = Vec::new();
    let mut literal = String::new();
    let mut i = 0;
    while let Some(&c) = chars.get(i) {
        match c {
            '\\' => {
                let escaped = chars.get(i + 1).ok_or("a trailing `\\` escapes nothing")?;
                literal.push(*escaped);
                i += 2;
            }
            '$' => match chars.get(i + 1) {
                None => return Err("a trailing `$` names no group".to_owned()),
                Some('{') => {
                    let name: String = chars
                        .get(i + 2..)
                        .unwrap_or_default()
                        .iter()
                        .take_while(|c| **c != '}')
                        .collect();
                    let close = i + 2 + name.chars().count();
                    if chars.get(close) != Some(&'}') || name.is_empty() {
                        return Err("`${` without a group name and `}`".to_owned());
                    }
                    if !pattern.capture_names().any(|n| n == Some(name.as_str())) {
                        return Err(format!("no group named `{name}`"));
                    }
                    parts.push(ReplacementPart::Literal(std::mem::take(&mut literal)));
                    parts.push(ReplacementPart::Named(name));
                    i = close + 1;
                }
                Some(d) => {
                    let Some(first) = d.to_digit(10) else {
                        return Err(format!("`${d}` is not a group reference"));
                    };
                    let mut number = first as usize;
                    let mut next = i + 2;
                    while let Some(digit) = chars.get(next).and_then(|c| c.to_digit(10)) {
                        let longer = number.saturating_mul(10).saturating_add(digit as usize);
                        if longer > groups {
                            break;
                        }
                        number = longer;
                        next += 1;
                    }
                    if number <= groups {
                        parts.push(ReplacementPart::Literal(std::mem::take(&mut literal)));
                        parts.push(ReplacementPart::Group(number));
                        i = next;
                    } else if groups == 0 {
                        return Err(format!("`${number}` but the pattern has no groups"));
                    } else {
                        // Kafka escapes a reference to a group the pattern
                        // lacks; the digits that follow stay as text.
                        literal.push('$');
                        i += 1;
                    }
                }
            },
            _ => {
                literal.push(c);
                i += 1;
            }
        }
    }
    parts.push(ReplacementPart::Literal(literal));
    parts.retain(|p| *p != ReplacementPart::Literal(String::new()));
    Ok(parts)
}

impl MappingRule {
    fn apply(&self, dn: &str) -> Option<String> {
        let MappingRule::Rule {
            pattern,
            whole,
            replacement,
            case,
            ..
        } = self
        else {
            return Some(dn.to_owned());
        };
        if !whole.is_match(dn) {
            return None;
        }
        // Java's `replaceAll`: every match replaced, text between kept.
        let mut out = String::new();
        let mut last = 0;
        for found in pattern.captures_iter(dn) {
            let m = found.get(0)?;
            out.push_str(dn.get(last..m.start())?);
            for part in replacement {
                match part {
                    ReplacementPart::Literal(text) => out.push_str(text),
                    ReplacementPart::Group(n) => {
                        out.push_str(found.get(*n).map_or("", |g| g.as_str()))
                    }
                    ReplacementPart::Named(name) => {
                        out.push_str(found.name(name).map_or("", |g| g.as_str()))
                    }
                }
            }
            last = m.end();
        }
        out.push_str(dn.get(last..)?);
        Some(match case {
            Case::Keep => out,
            Case::Lower => out.to_lowercase(),
            Case::Upper => out.to_uppercase(),
        })
    }
}

/// Kafka's `Rule.toString`, so the rules can be logged (and compared with
/// Kafka's own tests).
impl fmt::Display for MappingRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MappingRule::Default => f.write_str("DEFAULT"),
            MappingRule::Rule {
                source,
                replacement_source,
                case,
                ..
            } => {
                write!(f, "RULE:{source}/{replacement_source}")?;
                match case {
                    Case::Keep => Ok(()),
                    Case::Lower => f.write_str("/L"),
                    Case::Upper => f.write_str("/U"),
                }
            }
        }
    }
}

/// The rules as Kafka lists them: `[RULE:..., DEFAULT]`.
impl fmt::Display for PrincipalMapper {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, rule) in self.rules.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{rule}")?;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::io;

    use proptest::prelude::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, DnValue, ExtendedKeyUsagePurpose, IsCa,
        KeyPair, KeyUsagePurpose,
    };
    use tokio::io::DuplexStream;
    use tokio_rustls::{TlsAcceptor, TlsConnector};

    use super::*;

    // -- test PKI -----------------------------------------------------------

    struct Ca {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    struct Leaf {
        cert: rcgen::Certificate,
        key: KeyPair,
    }

    impl Ca {
        fn new(name: &str) -> Ca {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("ca params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
            params.distinguished_name.push(DnType::CommonName, name);
            let key = KeyPair::generate().expect("ca key");
            let cert = params.self_signed(&key).expect("ca cert");
            Ca { cert, key }
        }

        fn issue(
            &self,
            dn: &[(DnType, &str)],
            sans: &[&str],
            usage: ExtendedKeyUsagePurpose,
        ) -> Leaf {
            let dn = dn
                .iter()
                .map(|(ty, v)| (ty.clone(), DnValue::from(*v)))
                .collect();
            self.issue_with(dn, sans, usage)
        }

        fn issue_with(
            &self,
            dn: Vec<(DnType, DnValue)>,
            sans: &[&str],
            usage: ExtendedKeyUsagePurpose,
        ) -> Leaf {
            let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
            let mut params = CertificateParams::new(sans).expect("leaf params");
            // Not rcgen's default DN, whose CN would stay first.
            params.distinguished_name = rcgen::DistinguishedName::new();
            for (ty, value) in dn {
                params.distinguished_name.push(ty, value);
            }
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().expect("leaf key");
            let cert = params
                .signed_by(&key, &self.cert, &self.key)
                .expect("leaf cert");
            Leaf { cert, key }
        }
    }

    impl Leaf {
        /// A Kafka PEM keystore file: the key, then the chain.
        fn keystore_pem(&self, ca: &Ca) -> String {
            format!(
                "{}{}{}",
                self.key.serialize_pem(),
                self.cert.pem(),
                ca.cert.pem()
            )
        }
    }

    /// A CA, a broker certificate for `localhost` and a client certificate
    /// for alice, as PEM files in a temporary directory.
    struct Fixture {
        dir: tempfile::TempDir,
        ca: Ca,
        server: Leaf,
        client: Leaf,
    }

    const ALICE_DN: &str = "CN=alice,OU=eng,O=Example,L=Here,ST=There,C=US";

    impl Fixture {
        fn new() -> Fixture {
            let dir = tempfile::tempdir().expect("tempdir");
            let ca = Ca::new("Test CA");
            let server = Self::server_cert(&ca);
            let client = ca.issue(
                &[
                    (DnType::CountryName, "US"),
                    (DnType::StateOrProvinceName, "There"),
                    (DnType::LocalityName, "Here"),
                    (DnType::OrganizationName, "Example"),
                    (DnType::OrganizationalUnitName, "eng"),
                    (DnType::CommonName, "alice"),
                ],
                &[],
                ExtendedKeyUsagePurpose::ClientAuth,
            );
            let fx = Fixture {
                dir,
                ca,
                server,
                client,
            };
            fx.write("ca.pem", fx.ca.cert.pem().as_bytes());
            fx.write("server.pem", fx.server.keystore_pem(&fx.ca).as_bytes());
            fx.write("client.pem", fx.client.keystore_pem(&fx.ca).as_bytes());
            fx
        }

        fn server_cert(ca: &Ca) -> Leaf {
            ca.issue(
                &[(DnType::CommonName, "broker")],
                &["localhost"],
                ExtendedKeyUsagePurpose::ServerAuth,
            )
        }

        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }

        /// Writes through a rename, as a certificate rotation should, so a
        /// poll never reads half a file.
        fn write(&self, name: &str, contents: &[u8]) {
            let tmp = self.dir.path().join(format!("{name}.tmp"));
            std::fs::write(&tmp, contents).expect("write store");
            std::fs::rename(&tmp, self.dir.path().join(name)).expect("rename store");
        }

        fn server_settings(&self, client_auth: &str, extra: &[(&str, &str)]) -> TlsSettings {
            let mut pairs = vec![
                ("ssl.keystore.type", "PEM".to_owned()),
                ("ssl.keystore.location", self.path("server.pem")),
                ("ssl.truststore.type", "PEM".to_owned()),
                ("ssl.truststore.location", self.path("ca.pem")),
                ("ssl.client.auth", client_auth.to_owned()),
            ];
            pairs.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            settings(&pairs).expect("server settings")
        }

        /// An inter-broker client trusting the CA; presenting alice's
        /// certificate if `with_cert`.
        fn client(&self, with_cert: bool, extra: &[(&str, &str)]) -> Arc<ClientConfig> {
            let mut pairs = vec![
                ("ssl.truststore.type", "PEM".to_owned()),
                ("ssl.truststore.location", self.path("ca.pem")),
            ];
            if with_cert {
                pairs.push(("ssl.keystore.type", "PEM".to_owned()));
                pairs.push(("ssl.keystore.location", self.path("client.pem")));
            }
            pairs.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            client_config(&settings(&pairs).expect("client settings")).expect("client config")
        }
    }

    fn settings(pairs: &[(&str, String)]) -> Result<TlsSettings, TlsConfigError> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        TlsSettings::from_config(&|key| map.get(key).cloned())
    }

    fn settings_str(pairs: &[(&str, &str)]) -> Result<TlsSettings, TlsConfigError> {
        let owned: Vec<(&str, String)> = pairs.iter().map(|(k, v)| (*k, v.to_string())).collect();
        settings(&owned)
    }

    // -- handshakes over an in-memory pipe ----------------------------------

    struct Outcome {
        server: io::Result<tokio_rustls::server::TlsStream<DuplexStream>>,
        client: io::Result<tokio_rustls::client::TlsStream<DuplexStream>>,
    }

    impl Outcome {
        /// The certificate the server presented, as the client saw it.
        fn served_cert(&self) -> CertificateDer<'static> {
            let client = self.client.as_ref().expect("client handshake");
            client
                .get_ref()
                .1
                .peer_certificates()
                .expect("server certificate")[0]
                .clone()
        }

        fn principal(&self, mapper: &PrincipalMapper) -> Result<Option<String>, PrincipalError> {
            let server = self.server.as_ref().expect("server handshake");
            peer_principal(server.get_ref().1, mapper)
        }
    }

    async fn handshake_as(acceptor: TlsAcceptor, client: Arc<ClientConfig>, name: &str) -> Outcome {
        let (client_io, server_io) = tokio::io::duplex(64 * 1024);
        let connector = TlsConnector::from(client);
        let name = ServerName::try_from(name.to_owned()).expect("server name");
        let (server, client) = tokio::join!(
            acceptor.accept(server_io),
            connector.connect(name, client_io)
        );
        Outcome { server, client }
    }

    async fn handshake(acceptor: TlsAcceptor, client: Arc<ClientConfig>) -> Outcome {
        handshake_as(acceptor, client, "localhost").await
    }

    fn acceptor(settings: &TlsSettings) -> TlsAcceptor {
        TlsAcceptor::from(server_config(settings).expect("server config"))
    }

    // -- settings -----------------------------------------------------------

    #[test]
    fn defaults_are_kafkas() {
        let s = settings(&[]).expect("empty config");
        assert!(s.keystore.is_none());
        assert!(s.truststore.is_none());
        assert_eq!(s.client_auth, ClientAuth::None);
        assert_eq!(
            s.protocol_versions,
            vec![TlsVersion::Tls12, TlsVersion::Tls13]
        );
        assert!(s.cipher_suites.is_empty());
        assert_eq!(s.protocol, "TLSv1.3");
        assert!(s.endpoint_identification);
        assert_eq!(s.principal_mapper.to_string(), "[DEFAULT]");
        assert_eq!(s.principal_mapper.map(ALICE_DN).as_deref(), Some(ALICE_DN));
    }

    #[test]
    fn enabled_protocols_map_to_rustls_versions() {
        let s =
            settings_str(&[("ssl.enabled.protocols", "TLSv1, TLSv1.1,TLSv1.3")]).expect("mixed");
        assert_eq!(s.protocol_versions, vec![TlsVersion::Tls13]);
        let s = settings_str(&[("ssl.enabled.protocols", "TLSv1.2")]).expect("1.2");
        assert_eq!(s.protocol_versions, vec![TlsVersion::Tls12]);

        let err = settings_str(&[("ssl.enabled.protocols", "TLSv1,TLSv1.1")]).unwrap_err();
        assert!(
            err.to_string().starts_with("ssl.enabled.protocols: "),
            "{err}"
        );
        let err = settings_str(&[("ssl.enabled.protocols", "TLSv1.2,TLSv9")]).unwrap_err();
        assert!(err.to_string().contains("TLSv9"), "{err}");
    }

    #[test]
    fn cipher_suites_map_java_names_and_drop_unknown_ones() {
        let s = settings_str(&[(
            "ssl.cipher.suites",
            "TLS_RSA_WITH_AES_128_CBC_SHA, TLS_AES_256_GCM_SHA384,TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        )])
        .expect("some known");
        assert_eq!(
            s.cipher_suites,
            vec![
                CipherSuite::TLS13_AES_256_GCM_SHA384,
                CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256
            ]
        );
        let err =
            settings_str(&[("ssl.cipher.suites", "TLS_RSA_WITH_AES_128_CBC_SHA")]).unwrap_err();
        assert!(err.to_string().starts_with("ssl.cipher.suites: "), "{err}");
    }

    #[test]
    fn client_auth_and_endpoint_identification_values() {
        for (value, expected) in [
            ("required", ClientAuth::Required),
            ("REQUESTED", ClientAuth::Requested),
            ("none", ClientAuth::None),
        ] {
            let s = settings_str(&[("ssl.client.auth", value)]).expect("client auth");
            assert_eq!(s.client_auth, expected);
        }
        let err = settings_str(&[("ssl.client.auth", "requierd")]).unwrap_err();
        assert!(err.to_string().starts_with("ssl.client.auth: "), "{err}");

        let s = settings_str(&[("ssl.endpoint.identification.algorithm", "")]).expect("empty");
        assert!(!s.endpoint_identification);
        let s = settings_str(&[("ssl.endpoint.identification.algorithm", "HTTPS")]).expect("https");
        assert!(s.endpoint_identification);
    }

    #[test]
    fn store_keys_are_checked_against_each_other_as_kafka_does() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[
                    ("ssl.keystore.type", "PEM"),
                    ("ssl.keystore.location", "/k.pem"),
                    ("ssl.keystore.password", "x"),
                ],
                "ssl.keystore.password",
            ),
            (
                &[
                    ("ssl.keystore.type", "PKCS12"),
                    ("ssl.keystore.location", "/k.p12"),
                ],
                "ssl.keystore.password",
            ),
            (&[("ssl.keystore.password", "x")], "ssl.keystore.password"),
            (
                &[("ssl.keystore.type", "PEM"), ("ssl.keystore.key", "k")],
                "ssl.keystore.certificate.chain",
            ),
            (
                &[
                    ("ssl.keystore.type", "PEM"),
                    ("ssl.keystore.certificate.chain", "c"),
                ],
                "ssl.keystore.key",
            ),
            (
                &[
                    ("ssl.keystore.key", "k"),
                    ("ssl.keystore.certificate.chain", "c"),
                ],
                "ssl.keystore.key",
            ),
            (
                &[
                    ("ssl.keystore.type", "PEM"),
                    ("ssl.keystore.key", "k"),
                    ("ssl.keystore.certificate.chain", "c"),
                    ("ssl.keystore.location", "/k.pem"),
                ],
                "ssl.keystore.key",
            ),
            (&[("ssl.keystore.type", "BKS")], "ssl.keystore.type"),
            (
                &[("ssl.truststore.certificates", "c")],
                "ssl.truststore.certificates",
            ),
            (
                &[
                    ("ssl.truststore.type", "PEM"),
                    ("ssl.truststore.location", "/t.pem"),
                    ("ssl.truststore.password", "x"),
                ],
                "ssl.truststore.password",
            ),
            (
                &[("ssl.truststore.password", "x")],
                "ssl.truststore.password",
            ),
        ];
        for (pairs, key) in cases {
            let err = settings_str(pairs).unwrap_err();
            assert!(
                err.to_string().starts_with(&format!("{key}: ")),
                "{pairs:?}: {err}"
            );
        }
    }

    #[test]
    fn errors_are_one_line_naming_the_key_and_the_file() {
        let s = settings_str(&[
            ("ssl.keystore.type", "PEM"),
            ("ssl.keystore.location", "/nonexistent/server.pem"),
        ])
        .expect("settings");
        let err = server_config(&s).unwrap_err().to_string();
        assert!(
            err.starts_with("ssl.keystore.location: cannot read /nonexistent/server.pem: "),
            "{err}"
        );
        assert!(!err.contains('\n'));

        let fx = Fixture::new();
        fx.write("empty.pem", b"");
        let s = settings(&[
            ("ssl.keystore.type", "PEM".to_owned()),
            ("ssl.keystore.location", fx.path("empty.pem")),
        ])
        .expect("settings");
        let err = server_config(&s).unwrap_err().to_string();
        assert_eq!(
            err,
            format!(
                "ssl.keystore.location ({}): no CERTIFICATE in PEM",
                fx.path("empty.pem")
            )
        );

        let s = settings_str(&[]).expect("settings");
        let err = server_config(&s).unwrap_err().to_string();
        assert!(err.starts_with("ssl.keystore.location: "), "{err}");
    }

    #[test]
    fn passwords_are_hidden_from_debug() {
        let fx = Fixture::new();
        let s = settings(&[
            ("ssl.keystore.type", "PEM".to_owned()),
            ("ssl.keystore.key", fx.server.key.serialize_pem()),
            ("ssl.keystore.certificate.chain", fx.server.cert.pem()),
            ("ssl.key.password", "hunter2".to_owned()),
        ])
        .expect("settings");
        let debug = format!("{s:?}");
        assert!(!debug.contains("hunter2"), "{debug}");
        assert!(!debug.contains("PRIVATE KEY"), "{debug}");
    }

    #[test]
    fn a_jks_file_is_refused_with_the_conversion_command() {
        let fx = Fixture::new();
        fx.write("server.jks", &[0xFE, 0xED, 0xFE, 0xED, 0, 0, 0, 2]);
        // JKS is Kafka's default type, so no ssl.keystore.type here.
        let s = settings(&[
            ("ssl.keystore.location", fx.path("server.jks")),
            ("ssl.keystore.password", "secret".to_owned()),
        ])
        .expect("settings");
        let err = server_config(&s).unwrap_err().to_string();
        assert!(err.starts_with("ssl.keystore.location ("), "{err}");
        assert!(err.contains("keytool -importkeystore"), "{err}");
        assert!(err.contains(&fx.path("server.jks")), "{err}");

        // A PEM file under the default type gets a hint, not a PKCS12 error.
        let s = settings(&[("ssl.truststore.location", fx.path("ca.pem"))]).expect("settings");
        let err = client_config(&s).unwrap_err().to_string();
        assert!(
            err.ends_with("this is a PEM file; set ssl.truststore.type=PEM"),
            "{err}"
        );
    }

    // -- stores -------------------------------------------------------------

    #[tokio::test]
    async fn inline_pem_keystore_and_truststore() {
        let fx = Fixture::new();
        let server = settings(&[
            ("ssl.keystore.type", "PEM".to_owned()),
            ("ssl.keystore.key", fx.server.key.serialize_pem()),
            (
                "ssl.keystore.certificate.chain",
                format!("{}{}", fx.server.cert.pem(), fx.ca.cert.pem()),
            ),
            ("ssl.truststore.type", "PEM".to_owned()),
            ("ssl.truststore.certificates", fx.ca.cert.pem()),
            ("ssl.client.auth", "required".to_owned()),
        ])
        .expect("server settings");
        let client = settings(&[
            ("ssl.truststore.type", "PEM".to_owned()),
            ("ssl.truststore.certificates", fx.ca.cert.pem()),
            ("ssl.keystore.type", "PEM".to_owned()),
            ("ssl.keystore.key", fx.client.key.serialize_pem()),
            ("ssl.keystore.certificate.chain", fx.client.cert.pem()),
        ])
        .expect("client settings");
        let out = handshake(acceptor(&server), client_config(&client).expect("client")).await;
        assert_eq!(out.served_cert(), *fx.server.cert.der());
        assert_eq!(
            out.principal(&PrincipalMapper::default()),
            Ok(Some(ALICE_DN.to_owned()))
        );
    }

    fn pkcs12(entries: Vec<(&str, p12_keystore::KeyStoreEntry)>, password: &str) -> Vec<u8> {
        let mut store = p12_keystore::KeyStore::new();
        for (alias, entry) in entries {
            store.add_entry(alias, entry);
        }
        store.writer(password).write().expect("write PKCS12")
    }

    fn p12_cert(der: &[u8]) -> p12_keystore::Certificate {
        p12_keystore::Certificate::from_der(der).expect("p12 certificate")
    }

    #[tokio::test]
    async fn pkcs12_keystore_and_truststore() {
        let fx = Fixture::new();
        let chain = p12_keystore::PrivateKeyChain::new(
            fx.server.key.serialize_der(),
            [1u8; 20],
            [p12_cert(fx.server.cert.der()), p12_cert(fx.ca.cert.der())],
        );
        fx.write(
            "server.p12",
            &pkcs12(
                vec![(
                    "broker",
                    p12_keystore::KeyStoreEntry::PrivateKeyChain(chain),
                )],
                "store-secret",
            ),
        );
        fx.write(
            "trust.p12",
            &pkcs12(
                vec![(
                    "ca",
                    p12_keystore::KeyStoreEntry::Certificate(p12_cert(fx.ca.cert.der())),
                )],
                "trust-secret",
            ),
        );
        let server = settings(&[
            ("ssl.keystore.type", "PKCS12".to_owned()),
            ("ssl.keystore.location", fx.path("server.p12")),
            ("ssl.keystore.password", "store-secret".to_owned()),
            ("ssl.truststore.type", "PKCS12".to_owned()),
            ("ssl.truststore.location", fx.path("trust.p12")),
            ("ssl.truststore.password", "trust-secret".to_owned()),
            ("ssl.client.auth", "required".to_owned()),
        ])
        .expect("server settings");
        let out = handshake(acceptor(&server), fx.client(true, &[])).await;
        assert_eq!(out.served_cert(), *fx.server.cert.der());
        assert_eq!(
            out.principal(&PrincipalMapper::default()),
            Ok(Some(ALICE_DN.to_owned()))
        );

        // Kafka's default type (JKS) reads a PKCS12 file, as Java does.
        let default_type = settings(&[
            ("ssl.keystore.location", fx.path("server.p12")),
            ("ssl.keystore.password", "store-secret".to_owned()),
        ])
        .expect("settings");
        assert!(server_config(&default_type).is_ok());

        let wrong = settings(&[
            ("ssl.keystore.type", "PKCS12".to_owned()),
            ("ssl.keystore.location", fx.path("server.p12")),
            ("ssl.keystore.password", "wrong".to_owned()),
        ])
        .expect("settings");
        let err = server_config(&wrong).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!(
                "ssl.keystore.location ({}): ",
                fx.path("server.p12")
            )),
            "{err}"
        );
    }

    /// `key` as Java (keytool) encodes EC keys: PKCS#8 whose ECPrivateKey
    /// has neither the curve nor the public key.
    fn java_style_ec_key(key: &KeyPair) -> Vec<u8> {
        let pkcs8 = key.serialize_der();
        let (info, _) = der::expect(&pkcs8, der::SEQUENCE).expect("PrivateKeyInfo");
        let (version, rest) = der::expect(info.content, der::INTEGER).expect("version");
        let (algorithm, rest) = der::expect(rest, der::SEQUENCE).expect("algorithm");
        let (private, _) = der::expect(rest, der::OCTET_STRING).expect("privateKey");
        let (ec, _) = der::expect(private.content, der::SEQUENCE).expect("ECPrivateKey");
        let (ec_version, rest) = der::expect(ec.content, der::INTEGER).expect("ec version");
        let (scalar, _) = der::expect(rest, der::OCTET_STRING).expect("scalar");
        let ec = tlv(der::SEQUENCE, &[ec_version.whole, scalar.whole].concat());
        tlv(
            der::SEQUENCE,
            &[version.whole, algorithm.whole, &tlv(der::OCTET_STRING, &ec)].concat(),
        )
    }

    #[tokio::test]
    async fn ec_keys_written_by_java_get_their_public_key_from_the_certificate() {
        let fx = Fixture::new();
        let java_key = java_style_ec_key(&fx.server.key);
        // ring alone refuses such a key: the test exercises the completion.
        assert!(
            rustls::crypto::ring::sign::any_supported_type(&PrivateKeyDer::Pkcs8(
                java_key.clone().into()
            ))
            .is_err()
        );

        let keystore = |key: Vec<u8>| {
            let chain = p12_keystore::PrivateKeyChain::new(
                key,
                [1u8; 20],
                [p12_cert(fx.server.cert.der()), p12_cert(fx.ca.cert.der())],
            );
            pkcs12(
                vec![(
                    "broker",
                    p12_keystore::KeyStoreEntry::PrivateKeyChain(chain),
                )],
                "store-secret",
            )
        };
        fx.write("java.p12", &keystore(java_key));
        let s = settings(&[
            ("ssl.keystore.type", "PKCS12".to_owned()),
            ("ssl.keystore.location", fx.path("java.p12")),
            ("ssl.keystore.password", "store-secret".to_owned()),
        ])
        .expect("settings");
        let out = handshake(acceptor(&s), fx.client(false, &[])).await;
        assert_eq!(out.served_cert(), *fx.server.cert.der());

        // Another key with this certificate is still refused.
        fx.write("java.p12", &keystore(java_style_ec_key(&fx.client.key)));
        let err = server_config(&s).unwrap_err().to_string();
        assert!(err.starts_with("ssl.keystore.location ("), "{err}");
    }

    /// A PKCS#8 `EncryptedPrivateKeyInfo` in PEM, PBES2 with AES-256-CBC, as
    /// `openssl pkcs8 -topk8` writes by default.
    fn encrypted_key_pem(key: &KeyPair, password: &str) -> String {
        use base64::Engine as _;
        use pkcs5::der::Encode as _;
        let salt = [7u8; 16];
        let iv = [9u8; 16];
        let params = pkcs5::pbes2::Parameters::pbkdf2_sha256_aes256cbc(2048, &salt, &iv)
            .expect("pbes2 params");
        let scheme = pkcs5::EncryptionScheme::from(params);
        let ciphertext = scheme
            .encrypt(password, &key.serialize_der())
            .expect("encrypt");
        let algorithm = scheme.to_der().expect("algorithm DER");
        let info = tlv(0x30, &[algorithm, tlv(0x04, &ciphertext)].concat());
        let base64 = base64::engine::general_purpose::STANDARD.encode(info);
        let lines: Vec<&str> = base64
            .as_bytes()
            .chunks(64)
            .map(|c| std::str::from_utf8(c).expect("base64 is ASCII"))
            .collect();
        format!(
            "-----BEGIN ENCRYPTED PRIVATE KEY-----\n{}\n-----END ENCRYPTED PRIVATE KEY-----\n",
            lines.join("\n")
        )
    }

    #[tokio::test]
    async fn encrypted_pem_key_needs_ssl_key_password() {
        let fx = Fixture::new();
        let pem = format!(
            "{}{}{}",
            encrypted_key_pem(&fx.server.key, "key-secret"),
            fx.server.cert.pem(),
            fx.ca.cert.pem()
        );
        fx.write("encrypted.pem", pem.as_bytes());
        let with = |password: Option<&str>| {
            let mut pairs = vec![
                ("ssl.keystore.type", "PEM".to_owned()),
                ("ssl.keystore.location", fx.path("encrypted.pem")),
            ];
            if let Some(p) = password {
                pairs.push(("ssl.key.password", p.to_owned()));
            }
            settings(&pairs).expect("settings")
        };

        let out = handshake(acceptor(&with(Some("key-secret"))), fx.client(false, &[])).await;
        assert_eq!(out.served_cert(), *fx.server.cert.der());

        let err = server_config(&with(None)).unwrap_err().to_string();
        assert!(err.contains("set ssl.key.password"), "{err}");
        assert!(err.starts_with("ssl.keystore.location ("), "{err}");
        let err = server_config(&with(Some("wrong"))).unwrap_err().to_string();
        assert!(err.contains("cannot decrypt the private key"), "{err}");
    }

    // -- client authentication and principals -------------------------------

    #[tokio::test]
    async fn client_auth_none_takes_no_certificate() {
        let fx = Fixture::new();
        let server = acceptor(&fx.server_settings("none", &[]));
        let out = handshake(server.clone(), fx.client(false, &[])).await;
        assert_eq!(out.served_cert(), *fx.server.cert.der());
        assert_eq!(out.principal(&PrincipalMapper::default()), Ok(None));
        // A client with a certificate is not asked for it.
        let out = handshake(server, fx.client(true, &[])).await;
        assert_eq!(out.principal(&PrincipalMapper::default()), Ok(None));
    }

    #[tokio::test]
    async fn client_auth_requested_accepts_clients_with_and_without_certificates() {
        let fx = Fixture::new();
        let server = acceptor(&fx.server_settings("requested", &[]));
        let out = handshake(server.clone(), fx.client(false, &[])).await;
        assert_eq!(out.principal(&PrincipalMapper::default()), Ok(None));
        let out = handshake(server, fx.client(true, &[])).await;
        assert_eq!(
            out.principal(&PrincipalMapper::default()),
            Ok(Some(ALICE_DN.to_owned()))
        );
    }

    #[tokio::test]
    async fn client_auth_required_refuses_clients_without_a_trusted_certificate() {
        let fx = Fixture::new();
        let server = acceptor(&fx.server_settings("required", &[]));
        let out = handshake(server.clone(), fx.client(false, &[])).await;
        assert!(out.server.is_err(), "a client without a certificate got in");

        // A certificate from another CA is refused too.
        let other = Ca::new("Other CA");
        let mallory = other.issue(
            &[(DnType::CommonName, "alice")],
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        fx.write("mallory.pem", mallory.keystore_pem(&other).as_bytes());
        let client = client_config(
            &settings(&[
                ("ssl.truststore.type", "PEM".to_owned()),
                ("ssl.truststore.location", fx.path("ca.pem")),
                ("ssl.keystore.type", "PEM".to_owned()),
                ("ssl.keystore.location", fx.path("mallory.pem")),
            ])
            .expect("settings"),
        )
        .expect("client config");
        let out = handshake(server, client).await;
        assert!(
            out.server.is_err(),
            "a certificate from an untrusted CA got in"
        );
    }

    #[tokio::test]
    async fn principal_is_the_mapped_subject_of_the_client_certificate() {
        let fx = Fixture::new();
        let rules = "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/U, DEFAULT";
        let server_settings =
            fx.server_settings("required", &[("ssl.principal.mapping.rules", rules)]);
        let out = handshake(acceptor(&server_settings), fx.client(true, &[])).await;
        assert_eq!(
            out.principal(&server_settings.principal_mapper),
            Ok(Some("ALICE@ENG".to_owned()))
        );
        assert_eq!(
            out.principal(&PrincipalMapper::default()),
            Ok(Some(ALICE_DN.to_owned()))
        );
        let strict = PrincipalMapper::parse("RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/").expect("rule");
        assert_eq!(
            out.principal(&strict),
            Err(PrincipalError::NoMatchingRule {
                dn: ALICE_DN.to_owned()
            })
        );
    }

    // -- protocol versions and the client side -----------------------------

    #[tokio::test]
    async fn a_tls13_only_listener_refuses_a_tls12_only_client() {
        let fx = Fixture::new();
        let server = acceptor(&fx.server_settings("none", &[("ssl.enabled.protocols", "TLSv1.3")]));
        let out = handshake(
            server.clone(),
            fx.client(false, &[("ssl.enabled.protocols", "TLSv1.2")]),
        )
        .await;
        assert!(out.server.is_err());
        assert!(out.client.is_err());

        let out = handshake(server, fx.client(false, &[])).await;
        let server = out.server.expect("default client");
        assert_eq!(
            server.get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_3)
        );

        // And the reverse pin: a TLS 1.2 listener speaks 1.2 to a default client.
        let server = acceptor(&fx.server_settings("none", &[("ssl.enabled.protocols", "TLSv1.2")]));
        let out = handshake(server, fx.client(false, &[])).await;
        assert_eq!(
            out.server.expect("1.2").get_ref().1.protocol_version(),
            Some(rustls::ProtocolVersion::TLSv1_2)
        );
    }

    #[tokio::test]
    async fn cipher_suites_pin_what_is_negotiated() {
        let fx = Fixture::new();
        let server = acceptor(&fx.server_settings(
            "none",
            &[("ssl.cipher.suites", "TLS_CHACHA20_POLY1305_SHA256")],
        ));
        let out = handshake(server, fx.client(false, &[])).await;
        let suite = out
            .server
            .expect("handshake")
            .get_ref()
            .1
            .negotiated_cipher_suite()
            .map(|s| s.suite());
        assert_eq!(suite, Some(CipherSuite::TLS13_CHACHA20_POLY1305_SHA256));
    }

    #[tokio::test]
    async fn endpoint_identification_checks_the_host_name_unless_disabled() {
        let fx = Fixture::new();
        let server = acceptor(&fx.server_settings("none", &[]));
        let out = handshake_as(server.clone(), fx.client(false, &[]), "broker-7.example").await;
        assert!(
            out.client.is_err(),
            "a certificate for localhost passed as broker-7.example"
        );

        let lax = fx.client(false, &[("ssl.endpoint.identification.algorithm", "")]);
        let out = handshake_as(server, lax.clone(), "broker-7.example").await;
        assert_eq!(out.served_cert(), *fx.server.cert.der());

        // The chain is still checked.
        let other = Ca::new("Other CA");
        let impostor = Fixture::server_cert(&other);
        fx.write("impostor.pem", impostor.keystore_pem(&other).as_bytes());
        let impostor = settings(&[
            ("ssl.keystore.type", "PEM".to_owned()),
            ("ssl.keystore.location", fx.path("impostor.pem")),
        ])
        .expect("settings");
        let out = handshake_as(acceptor(&impostor), lax, "broker-7.example").await;
        assert!(
            out.client.is_err(),
            "an untrusted chain passed without hostname checks"
        );
    }

    #[test]
    fn a_client_needs_a_truststore() {
        let err = client_config(&settings(&[]).expect("settings")).unwrap_err();
        assert!(
            err.to_string().starts_with("ssl.truststore.location: "),
            "{err}"
        );
    }

    // -- reload -------------------------------------------------------------

    #[tokio::test]
    async fn reload_swaps_the_certificate_and_keeps_the_old_one_on_a_broken_file() {
        let fx = Fixture::new();
        let reloading = ReloadingAcceptor::new(fx.server_settings("none", &[])).expect("acceptor");
        assert!(!reloading.reload().expect("unchanged"));

        let rotated = Fixture::server_cert(&fx.ca);
        fx.write("server.pem", rotated.keystore_pem(&fx.ca).as_bytes());
        assert!(reloading.reload().expect("rotated"));
        let out = handshake(reloading.acceptor(), fx.client(false, &[])).await;
        assert_eq!(out.served_cert(), *rotated.cert.der());
        assert!(!reloading.reload().expect("unchanged again"));

        // Half a rotation: the new certificate with the old key.
        let next = Fixture::server_cert(&fx.ca);
        let mismatched = format!("{}{}", rotated.key.serialize_pem(), next.cert.pem());
        fx.write("server.pem", mismatched.as_bytes());
        let err = reloading.reload().unwrap_err().to_string();
        assert!(err.starts_with("ssl.keystore.location ("), "{err}");

        fx.write("server.pem", b"not a keystore");
        assert!(reloading.reload().is_err());
        let out = handshake(reloading.acceptor(), fx.client(false, &[])).await;
        assert_eq!(
            out.served_cert(),
            *rotated.cert.der(),
            "a broken file replaced the config"
        );

        std::fs::remove_file(fx.dir.path().join("server.pem")).expect("remove");
        assert!(matches!(
            reloading.reload(),
            Err(TlsConfigError::Read { .. })
        ));
        let out = handshake(reloading.acceptor(), fx.client(false, &[])).await;
        assert_eq!(out.served_cert(), *rotated.cert.der());
    }

    /// Handshakes until the listener serves `expected`, for up to 10 s.
    async fn wait_for_cert(
        reloading: &ReloadingAcceptor,
        fx: &Fixture,
        expected: &CertificateDer<'_>,
    ) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let out = handshake(reloading.acceptor(), fx.client(false, &[])).await;
            if out.served_cert() == *expected {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the new certificate was never served"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn the_watcher_reloads_when_the_files_change_and_stops_on_shutdown() {
        let fx = Fixture::new();
        let reloading =
            Arc::new(ReloadingAcceptor::new(fx.server_settings("none", &[])).expect("acceptor"));
        let (stop, shutdown) = watch::channel(false);
        let task = Arc::clone(&reloading).spawn_watch(Duration::from_millis(10), shutdown);

        let rotated = Fixture::server_cert(&fx.ca);
        fx.write("server.pem", rotated.keystore_pem(&fx.ca).as_bytes());
        wait_for_cert(&reloading, &fx, rotated.cert.der()).await;

        // A CA added to the truststore is picked up as well.
        let other = Ca::new("Other CA");
        fx.write(
            "ca.pem",
            format!("{}{}", fx.ca.cert.pem(), other.cert.pem()).as_bytes(),
        );
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while reloading.reload().expect("reload") {
            assert!(tokio::time::Instant::now() < deadline);
        }

        stop.send(true).expect("send shutdown");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("watcher stopped")
            .expect("watcher did not panic");
    }

    #[tokio::test]
    async fn sighup_reloads() {
        let fx = Fixture::new();
        let reloading =
            Arc::new(ReloadingAcceptor::new(fx.server_settings("none", &[])).expect("acceptor"));
        let (stop, shutdown) = watch::channel(false);
        let task = Arc::clone(&reloading)
            .spawn_sighup(shutdown)
            .expect("SIGHUP handler");

        let rotated = Fixture::server_cert(&fx.ca);
        fx.write("server.pem", rotated.keystore_pem(&fx.ca).as_bytes());
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("kill -HUP {}", std::process::id()))
            .status()
            .expect("run kill");
        assert!(status.success());
        wait_for_cert(&reloading, &fx, rotated.cert.der()).await;

        stop.send(true).expect("send shutdown");
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .expect("handler stopped")
            .expect("handler did not panic");
    }

    // -- subject DN ---------------------------------------------------------

    use super::der::encode as tlv;

    const CN: &[u8] = &[0x55, 0x04, 0x03];
    const OU: &[u8] = &[0x55, 0x04, 0x0b];
    const STREET: &[u8] = &[0x55, 0x04, 0x09];
    const DC: &[u8] = &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x19];
    const UID: &[u8] = &[0x09, 0x92, 0x26, 0x89, 0x93, 0xf2, 0x2c, 0x64, 0x01, 0x01];
    const EMAIL: &[u8] = &[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x09, 0x01];
    const UTF8: u8 = 0x0c;
    const PRINTABLE: u8 = 0x13;
    const IA5: u8 = 0x16;

    fn ava(oid: &[u8], tag: u8, value: &[u8]) -> Vec<u8> {
        tlv(0x30, &[tlv(0x06, oid), tlv(tag, value)].concat())
    }

    fn rdn(avas: &[Vec<u8>]) -> Vec<u8> {
        tlv(0x31, &avas.concat())
    }

    fn name(rdns: &[Vec<u8>]) -> Option<String> {
        format_name(&rdns.concat())
    }

    #[test]
    fn subject_of_a_real_certificate_in_rfc2253_order() {
        let fx = Fixture::new();
        assert_eq!(subject_dn(fx.client.cert.der()).as_deref(), Some(ALICE_DN));
        assert_eq!(
            subject_dn(fx.server.cert.der()).as_deref(),
            Some("CN=broker")
        );
    }

    #[test]
    fn subject_attributes_java_has_no_keyword_for_are_hex() {
        let ca = Ca::new("Test CA");
        let leaf = ca.issue(
            &[
                (
                    DnType::CustomDnType(vec![1, 2, 840, 113549, 1, 9, 1]),
                    "a@b",
                ),
                (DnType::CommonName, "svc"),
            ],
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        assert_eq!(
            subject_dn(leaf.cert.der()).as_deref(),
            Some("CN=svc,1.2.840.113549.1.9.1=#0c03614062")
        );
        let leaf = ca.issue_with(
            vec![(
                DnType::CommonName,
                DnValue::Ia5String("x".try_into().expect("ia5")),
            )],
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        assert_eq!(subject_dn(leaf.cert.der()).as_deref(), Some("CN=x"));
    }

    #[test]
    fn values_are_escaped_as_java_escapes_them() {
        let value = " #a,b+c=d<e>f;g\"h\\i ";
        assert_eq!(
            name(&[rdn(&[ava(CN, UTF8, value.as_bytes())])]).as_deref(),
            Some(r#"CN=\ \#a\,b\+c\=d\<e\>f\;g\"h\\i\ "#)
        );
        assert_eq!(
            name(&[rdn(&[ava(CN, UTF8, b"a\0b")])]).as_deref(),
            Some(r"CN=a\00b")
        );
        assert_eq!(
            name(&[rdn(&[ava(CN, UTF8, b"  ")])]).as_deref(),
            Some(r"CN=\ \ ")
        );
        assert_eq!(
            name(&[rdn(&[ava(CN, UTF8, b"\r x\r")])]).as_deref(),
            Some("CN=\\\r\\ x\\\r")
        );
        assert_eq!(
            name(&[rdn(&[ava(CN, UTF8, "Zoë".as_bytes())])]).as_deref(),
            Some("CN=Zoë")
        );
    }

    #[test]
    fn keywords_multi_valued_rdns_and_non_string_values() {
        let dn = name(&[
            rdn(&[ava(DC, IA5, b"com")]),
            rdn(&[ava(DC, IA5, b"example")]),
            rdn(&[ava(STREET, UTF8, b"1 Main St")]),
            rdn(&[ava(OU, PRINTABLE, b"eng"), ava(UID, UTF8, b"42")]),
            rdn(&[ava(EMAIL, IA5, b"a@b")]),
            // A keyword Java knows, with a value that is not a string.
            rdn(&[ava(CN, 0x02, &[5])]),
        ]);
        assert_eq!(
            dn.as_deref(),
            Some("CN=#020105,1.2.840.113549.1.9.1=#1603614062,OU=eng+UID=42,STREET=1 Main St,DC=example,DC=com")
        );
        assert_eq!(name(&[]).as_deref(), Some(""));
        // An empty RDN or an AVA with trailing bytes is not a valid name.
        assert_eq!(name(&[rdn(&[])]), None);
        let trailing = tlv(0x30, &[tlv(0x06, CN), tlv(UTF8, b"a"), vec![0]].concat());
        assert_eq!(name(&[rdn(&[trailing])]), None);
    }

    #[test]
    fn oids_print_as_java_prints_them() {
        assert_eq!(oid_to_dotted(CN).as_deref(), Some("2.5.4.3"));
        assert_eq!(
            oid_to_dotted(DC).as_deref(),
            Some("0.9.2342.19200300.100.1.25")
        );
        assert_eq!(
            oid_to_dotted(EMAIL).as_deref(),
            Some("1.2.840.113549.1.9.1")
        );
        assert_eq!(oid_to_dotted(&[0x88, 0x37]).as_deref(), Some("2.999"));
        assert_eq!(oid_to_dotted(&[]), None);
        assert_eq!(oid_to_dotted(&[0x55, 0x84]), None, "unterminated arc");
        assert_eq!(oid_to_dotted(&[0x55, 0x80, 0x01]), None, "padded arc");
        assert_eq!(
            oid_to_dotted(&[0x55, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f]),
            None
        );
    }

    #[test]
    fn subject_dn_survives_every_truncation_and_byte_flip_of_a_certificate() {
        let fx = Fixture::new();
        let der = fx.client.cert.der().to_vec();
        for len in 0..der.len() {
            let _ = subject_dn(&der[..len]);
        }
        for i in 0..der.len() {
            for flip in [0x01, 0x80, 0xff] {
                let mut mutated = der.clone();
                mutated[i] ^= flip;
                let _ = subject_dn(&mutated);
            }
        }
        // Lengths that point past the end, indefinite and oversized lengths.
        for bytes in [
            &[0x30, 0x84, 0xff, 0xff, 0xff, 0xff][..],
            &[0x30, 0x80, 0x00, 0x00],
            &[0x30, 0x89, 1, 2, 3, 4, 5, 6, 7, 8, 9],
            &[0x30, 0x82, 0x01],
            &[0x1f, 0x00],
            &[0x30],
        ] {
            assert_eq!(subject_dn(bytes), None);
        }
    }

    proptest! {
        #[test]
        fn subject_dn_never_panics_on_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = subject_dn(&bytes);
            let _ = format_name(&bytes);
        }

        #[test]
        fn subject_dn_never_panics_on_certificate_like_bytes(
            tail in proptest::collection::vec(any::<u8>(), 0..300),
            len in any::<u8>(),
        ) {
            // A valid-looking header makes the walk go deeper than random bytes do.
            let mut bytes = vec![0x30, 0x82, 0x01, len, 0x30, 0x82, 0x01, len, 0xa0, 0x03, 0x02, 0x01, 0x02];
            bytes.extend(tail);
            let _ = subject_dn(&bytes);
        }
    }

    // -- ssl.principal.mapping.rules: Kafka's SslPrincipalMapperTest --------

    #[test]
    fn kafka_valid_rules() {
        for rules in [
            "DEFAULT",
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
            "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
            "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
            "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
            "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
            "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
        ] {
            if let Err(e) = PrincipalMapper::parse(rules) {
                panic!("{rules}: {e}");
            }
        }
    }

    #[test]
    fn kafka_invalid_rules() {
        for rules in [
            "default",
            "DEFAUL",
            "DEFAULT/L",
            "DEFAULT/U",
            "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
            "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
        ] {
            let err = PrincipalMapper::parse(rules).expect_err(rules);
            assert!(
                err.to_string().starts_with("ssl.principal.mapping.rules: "),
                "{err}"
            );
        }
    }

    #[test]
    fn kafka_ssl_principal_mapper() {
        let rules = [
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
            "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
            "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
            "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
            "DEFAULT",
        ]
        .join(", ");
        let mapper = PrincipalMapper::parse(&rules).expect("rules");
        for (dn, expected) in [
            ("CN=Duke,OU=ServiceUsers,O=Org,C=US", "duke"),
            ("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US", "duke@sme"),
            ("cn=duke,ou=sme,dc=mycp,dc=com", "DUKE@SME"),
            ("cN=duke,OU=JavaSoft,O=Sun Microsystems", "DUKE"),
            (
                "OU=JavaSoft,O=Sun Microsystems,C=US",
                "OU=JavaSoft,O=Sun Microsystems,C=US",
            ),
        ] {
            assert_eq!(mapper.map(dn).as_deref(), Some(expected), "{dn}");
        }
    }

    #[test]
    fn kafka_rules_splitting() {
        for (expected, rules) in [
            ("[]", ""),
            ("[DEFAULT]", "DEFAULT"),
            ("[RULE:/]", "RULE://"),
            ("[RULE:/.*]", "RULE:/.*/"),
            ("[RULE:/.*/L]", "RULE:/.*/L"),
            ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
            ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
            (
                "[RULE:   /     , DEFAULT]",
                "  RULE:   /     / ,  DEFAULT  ",
            ),
            (
                "[RULE:  /     /U, DEFAULT]",
                "  RULE:  /     /U   ,DEFAULT  ",
            ),
            (
                "[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]",
                "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  ",
            ),
            // Empty rules are ignored.
            ("[]", ",   , , ,      , , ,   "),
            ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
            (
                "[RULE: /   , DEFAULT]",
                ",  , RULE: /   /    ,,,   DEFAULT, ,   ",
            ),
            (
                "[RULE:   /  /U, DEFAULT]",
                "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,",
            ),
            // Escape sequences.
            (r"[RULE:\/\\\(\)\n\t/\/\/]", r"RULE:\/\\\(\)\n\t/\/\//"),
            (
                r"[RULE:\**\/+/*/L, RULE:\/*\**/**]",
                r"RULE:\**\/+/*/L,RULE:\/*\**/**/",
            ),
            // Rules rule.
            (
                r"[RULE:,RULE:,/,RULE:,\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
                r"RULE:,RULE:,/,RULE:,\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT",
            ),
        ] {
            let mapper = PrincipalMapper::parse(rules).unwrap_or_else(|e| panic!("{rules}: {e}"));
            assert_eq!(mapper.to_string(), expected, "{rules}");
        }
    }

    #[test]
    fn kafka_comma_with_whitespace() {
        let mapper =
            PrincipalMapper::parse(r"RULE:^CN=((\\, *|\w)+)(,.*|$)/$1/,DEFAULT").expect("rules");
        assert_eq!(
            mapper
                .map(r"CN=Tkac\, Adam,OU=ITZ,DC=geodis,DC=cz")
                .as_deref(),
            Some(r"Tkac\, Adam")
        );
    }

    #[test]
    fn rules_on_separate_lines_are_separate_rules() {
        let mapper = PrincipalMapper::parse(
            "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/\r\n  RULE:^CN=(.*?),.*$/$1/U,\n\nDEFAULT\n",
        )
        .expect("rules");
        assert_eq!(
            mapper.to_string(),
            "[RULE:^CN=(.*?),OU=ServiceUsers.*$/$1, RULE:^CN=(.*?),.*$/$1/U, DEFAULT]"
        );
        assert_eq!(mapper.map(ALICE_DN).as_deref(), Some("ALICE"));
    }

    #[test]
    fn replacements_follow_java_and_kafka() {
        let map = |rules: &str, dn: &str| PrincipalMapper::parse(rules).expect(rules).map(dn);
        // Kafka treats a reference past the last group as literal text.
        assert_eq!(
            map("RULE:^CN=(.*?),.*$/$1@$4/", ALICE_DN).as_deref(),
            Some("alice@$4")
        );
        // Java takes the longest `$nn` that names a group: `$12` is `$1` then "2".
        assert_eq!(
            map("RULE:^CN=(.*?),.*$/$12/", ALICE_DN).as_deref(),
            Some("alice2")
        );
        assert_eq!(
            map("RULE:^CN=(.*?),.*$/[$0]/", "CN=a,O=b").as_deref(),
            Some("[CN=a,O=b]")
        );
        assert_eq!(
            map(r"RULE:^CN=(.*?),.*$/\$1/", ALICE_DN).as_deref(),
            Some("$1")
        );
        assert_eq!(
            map("RULE:^CN=(?P<user>[^,]*),.*$/${user}!/", ALICE_DN).as_deref(),
            Some("alice!")
        );
        // Every match is replaced, as `replaceAll` does.
        assert_eq!(map("RULE:a/b/", "a").as_deref(), Some("b"));
        assert_eq!(map("RULE:[0-9]/#/", "7").as_deref(), Some("#"));
        // A rule that does not match the whole DN does not apply.
        assert_eq!(map("RULE:alice/bob/", ALICE_DN), None);

        for rules in [
            r"RULE:^(.*)$/a\/",
            "RULE:^(.*)$/$x/",
            "RULE:^.*$/$1/",
            "RULE:^(.*)$/${nope}/",
            "RULE:^(.*)$/${/",
            "RULE:(/x/",
        ] {
            let err = PrincipalMapper::parse(rules).expect_err(rules);
            assert!(
                err.to_string().starts_with("ssl.principal.mapping.rules: "),
                "{err}"
            );
        }
    }
}
