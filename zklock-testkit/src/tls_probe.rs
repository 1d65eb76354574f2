//! The kit's own TLS connections to the servers it starts in TLS mode, for its readiness probes
//! (Redis's `PING`, etcd's `/health`): rustls on aws-lc-rs, presenting the kit's client
//! certificate, and taking whatever certificate the server presents (a server started with the
//! wrong name's or the expired certificate must still be seen ready; the tests check
//! verification with real clients).

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{aws_lc_rs, verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};

use crate::certs::Certs;

/// A TLS stream to a server on loopback.
pub(crate) type TlsStream = StreamOwned<ClientConnection, TcpStream>;

/// The kit's client configuration for the servers using one [`Certs`]; its `Debug` says no more
/// than its name (a server's `Debug` holds it).
#[derive(Clone)]
pub(crate) struct Probe(Arc<ClientConfig>);

impl std::fmt::Debug for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Probe")
    }
}

/// The kit's client configuration for servers using `certs`.
pub(crate) fn client_config(certs: &Certs) -> io::Result<Probe> {
    let provider = Arc::new(aws_lc_rs::default_provider());
    let kit = certs.kit_identity();
    let config = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(io::Error::other)?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
        .with_client_auth_cert(
            vec![CertificateDer::from(kit.cert_der.clone())],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(kit.key_der.clone())),
        )
        .map_err(io::Error::other)?;
    Ok(Probe(Arc::new(config)))
}

/// Connects to 127.0.0.1:`port` and completes the TLS handshake, each step within `timeout`.
pub(crate) fn connect(probe: &Probe, port: u16, timeout: Duration) -> io::Result<TlsStream> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let tcp = TcpStream::connect_timeout(&addr, timeout)?;
    tcp.set_read_timeout(Some(timeout))?;
    tcp.set_write_timeout(Some(timeout))?;
    let name = ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
    let conn = ClientConnection::new(probe.0.clone(), name).map_err(io::Error::other)?;
    let mut stream = StreamOwned::new(conn, tcp);
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// Takes any server certificate; checks only that the server holds its key.
#[derive(Debug)]
struct AnyServer(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyServer {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
