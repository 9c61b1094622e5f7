//! The TLS client of a `sslmode=verify-full` or `verify-ca` location,
//! trusting exactly the CA file's certificates.

use super::location::TlsMode;
use airlock_proto::{Code, Error};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The TLS side of a location: its mode, the CA file and the connector
/// made from it (at parse time: the file is read once, at start).
#[derive(Clone)]
pub(super) struct Tls {
    pub(super) mode: TlsMode,
    pub(super) ca_file: PathBuf,
    pub(super) connector: tokio_postgres_rustls::MakeRustlsConnect,
}

/// Reads the CA certificates of `path` (PEM) into a root store.
fn load_roots(path: &Path) -> Result<rustls::RootCertStore, Error> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let invalid = |why: String| {
        Error::with(
            Code::CONFIG_INVALID,
            format!("supervisor.database_ca_file {}: {why}", path.display()),
        )
    };
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| invalid(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| invalid(e.to_string()))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(invalid(format!(
            "no usable CA certificate in it ({ignored} unparsable); it must hold PEM \"BEGIN CERTIFICATE\" blocks"
        )));
    }
    Ok(roots)
}

/// A verifier that checks the chain to the CA file and the signatures,
/// but not the server's name (`sslmode=verify-ca`). webpki checks the
/// chain before the name, so a name mismatch is reported only for a chain
/// that verified.
#[derive(Debug)]
struct ChainOnly(Arc<rustls::client::WebPkiServerVerifier>);

impl rustls::client::danger::ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        intermediates: &[rustls::pki_types::CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        use rustls::CertificateError;
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(rustls::client::danger::ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// The TLS client for `mode`, trusting exactly the CAs of `ca_file`.
pub(super) fn tls_client(mode: TlsMode, ca_file: &Path) -> Result<Tls, Error> {
    let roots = load_roots(ca_file)?;
    let internal = |e: rustls::Error| Error::with(Code::INTERNAL, format!("TLS set-up: {e}"));
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(internal)?;
    let config = match mode {
        TlsMode::VerifyCa => {
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .map_err(|e| Error::with(Code::INTERNAL, format!("TLS set-up: {e}")))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(ChainOnly(inner)))
                .with_no_client_auth()
        }
        _ => builder.with_root_certificates(roots).with_no_client_auth(),
    };
    Ok(Tls {
        mode,
        ca_file: ca_file.to_owned(),
        connector: tokio_postgres_rustls::MakeRustlsConnect::new(config),
    })
}
