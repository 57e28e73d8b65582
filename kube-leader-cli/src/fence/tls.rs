//! The webhook's TLS: a CA and a serving certificate generated for the names and addresses the
//! API server reaches the webhook by, and the rustls server configuration (ring, as the client).
//!
//! `kube-leader fence certs --out DIR --san NAME...` writes `ca.crt` (the webhooks' `caBundle`),
//! `ca.key`, `tls.crt` and `tls.key` (a Secret of type kubernetes.io/tls holds the last two).

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use tokio_rustls::rustls::{
    self,
    pki_types::{pem::PemObject as _, CertificateDer, PrivateKeyDer},
};

/// How many years a generated certificate is valid, from 1 January of the current year.
const VALID_YEARS: i32 = 10;

/// The files of a generated CA and serving certificate.
#[derive(Debug, Clone)]
pub(crate) struct CertFiles {
    /// The CA certificate (PEM): the webhooks' `caBundle`.
    pub(crate) ca_cert: PathBuf,
    /// The serving certificate (PEM).
    pub(crate) cert: PathBuf,
    /// The serving key (PEM, PKCS#8).
    pub(crate) key: PathBuf,
}

impl CertFiles {
    /// The files in `dir`: `ca.crt`, `tls.crt`, `tls.key`.
    pub(crate) fn in_dir(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            cert: dir.join("tls.crt"),
            key: dir.join("tls.key"),
        }
    }
}

/// A generated CA and serving certificate, PEM.
#[derive(Debug, Clone)]
pub(crate) struct Generated {
    /// The CA certificate.
    pub(crate) ca_cert: String,
    /// The CA key.
    pub(crate) ca_key: String,
    /// The serving certificate.
    pub(crate) cert: String,
    /// The serving key.
    pub(crate) key: String,
}

/// Generates a CA and a serving certificate for `sans` (DNS names or IP addresses) into `dir`
/// (created if missing; the keys are written with mode 0600).
pub(crate) fn generate(dir: &Path, sans: &[String]) -> Result<CertFiles, String> {
    let g = generate_pem(sans)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let files = CertFiles::in_dir(dir);
    write(&files.ca_cert, &g.ca_cert, false)?;
    write(&dir.join("ca.key"), &g.ca_key, true)?;
    write(&files.cert, &g.cert, false)?;
    write(&files.key, &g.key, true)?;
    Ok(files)
}

/// Generates a CA and a serving certificate for `sans`, in memory.
pub(crate) fn generate_pem(sans: &[String]) -> Result<Generated, String> {
    if sans.is_empty() {
        return Err(
            "no --san: give every name and address the API server reaches the webhook \
                    by (a Service: NAME.NAMESPACE.svc; a URL: its host)"
                .into(),
        );
    }
    let fail = |what: &str, e: rcgen::Error| format!("cannot generate the {what}: {e}");
    let year = this_year();
    let (not_before, not_after) = (
        rcgen::date_time_ymd(year, 1, 1),
        rcgen::date_time_ymd(year + VALID_YEARS, 1, 1),
    );

    let ca_key = KeyPair::generate().map_err(|e| fail("CA key", e))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(|e| fail("CA", e))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "kube-leader fence CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca_cert = ca.self_signed(&ca_key).map_err(|e| fail("CA", e))?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(ca, ca_key);

    let key = KeyPair::generate().map_err(|e| fail("serving key", e))?;
    let mut params =
        CertificateParams::new(sans.to_vec()).map_err(|e| format!("invalid --san {sans:?}: {e}"))?;
    params
        .distinguished_name
        .push(DnType::CommonName, sans[0].clone());
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.not_before = not_before;
    params.not_after = not_after;
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|e| fail("serving certificate", e))?;
    Ok(Generated {
        ca_cert: ca_cert.pem(),
        ca_key: ca_key_pem,
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// The current year (by days since 1970: accurate to a day, which 1 January leaves room for).
fn this_year() -> i32 {
    let secs = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    1970 + i32::try_from(secs / 31_556_952).unwrap_or(0)
}

fn write(path: &Path, text: &str, secret: bool) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    if secret {
        options.mode(0o600);
    }
    options
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// The server configuration for the certificate chain at `cert` and the key at `key` (PEM),
/// speaking HTTP/2 and HTTP/1.1.
pub(crate) fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(Iterator::collect)
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read the key {}: {e}", key.display()))?;
    config_for(chain, key, &cert.display().to_string())
}

/// [`server_config`] for a generated certificate.
pub(crate) fn server_config_pem(g: &Generated) -> Result<Arc<rustls::ServerConfig>, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(g.cert.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("the generated certificate: {e}"))?;
    let key =
        PrivateKeyDer::from_pem_slice(g.key.as_bytes()).map_err(|e| format!("the generated key: {e}"))?;
    config_for(chain, key, "the generated certificate")
}

fn config_for(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    what: &str,
) -> Result<Arc<rustls::ServerConfig>, String> {
    let cert = what;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate {cert} and its key: {e}"))?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_certificates_load_into_a_server_config() {
        let dir = std::env::temp_dir().join(format!("kube-leader-fence-tls-{}", std::process::id()));
        let files = generate(&dir, &["127.0.0.1".into(), "fence.app.svc".into()]).unwrap();
        server_config(&files.cert, &files.key).unwrap();
        let ca = std::fs::read_to_string(&files.ca_cert).unwrap();
        assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"), "{ca}");
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
        assert_eq!(mode & 0o077, 0, "the key is private: {mode:o}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_san_is_an_error_that_says_what_to_give() {
        let e = generate(Path::new("/nonexistent"), &[]).unwrap_err();
        assert!(e.contains("--san"), "{e}");
    }
}
