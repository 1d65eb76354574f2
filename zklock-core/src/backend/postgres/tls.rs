//! TLS to PostgreSQL: libpq's `sslmode`, `sslrootcert`, `sslcert` and `sslkey` read off the
//! URL (tokio-postgres knows only the first, and not its verifying modes), and the connector
//! tokio-postgres calls for each connection it opens, on rustls ([`Tls`]).
//!
//! The server's certificate is always verified: `require` verifies as `verify-full` does (libpq
//! skips it, which no lock should), `verify-ca` checks the chain but not the name. Without
//! `sslmode` (or with `disable`, `allow`, `prefer`) no TLS is used, as before: a manager asks for
//! TLS explicitly, and then never falls back to plaintext.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

use crate::types::error::{Error, Result};
use crate::types::tls::{Check, Tls};

/// The TLS a manager's connections use: none, or [`Tls`] checked as `verify` says.
#[derive(Clone, Debug, Default)]
pub(super) struct PgTls(Option<(Tls, Check)>);

/// The URL without its TLS parameters, for tokio-postgres, and the TLS they ask for, merged
/// with `options` (the builder's; the URL's files win where both name one). A builder's TLS
/// with no `sslmode` in the URL asks for `verify-full`.
pub(super) fn split_url(url: &str, options: Option<&Tls>) -> Result<(String, PgTls)> {
    let (rest, params) = split_params(url);
    let mut mode = None;
    let (mut root, mut cert, mut key) = (None, None, None);
    let mut kept = Vec::new();
    for (name, value) in params {
        match name.as_str() {
            "sslmode" => mode = Some(value),
            "sslrootcert" => root = Some(value),
            "sslcert" => cert = Some(value),
            "sslkey" => key = Some(value),
            _ => kept.push((name, value)),
        }
    }
    let check = match mode.as_deref() {
        None if options.is_some() || root.is_some() || cert.is_some() => Some(Check::Full),
        None | Some("disable") | Some("allow") | Some("prefer") => None,
        Some("require") | Some("verify-full") => Some(Check::Full),
        Some("verify-ca") => Some(Check::Chain),
        Some(other) => {
            return Err(Error::Config(format!(
                "the PostgreSQL URL's sslmode={other} is not one zklock knows: give require, \
                 verify-ca or verify-full (TLS, the server's certificate verified) or disable"
            )))
        }
    };
    let tls =
        match check {
            None => PgTls(None),
            Some(check) => {
                let mut tls = options.cloned().unwrap_or_default();
                if let Some(root) = root {
                    tls = tls.ca_file(percent_decode(&root));
                }
                match (cert, key) {
                    (Some(cert), Some(key)) => {
                        tls = tls.client_cert_files(percent_decode(&cert), percent_decode(&key))
                    }
                    (None, None) => {}
                    _ => return Err(Error::Config(
                        "the PostgreSQL URL gives one of sslcert and sslkey without the other: \
                         give both (the client certificate and its key)"
                            .to_string(),
                    )),
                }
                PgTls(Some((tls, check)))
            }
        };
    let mode = if tls.0.is_some() {
        "require"
    } else {
        "disable"
    };
    kept.push(("sslmode".to_string(), mode.to_string()));
    Ok((join_params(&rest, &kept), tls))
}

/// A URL (`postgres://…?a=b&c=d`) or a key-value string (`host=… a=b`), split into the part
/// before its parameters and the parameters.
fn split_params(url: &str) -> (String, Vec<(String, String)>) {
    let trimmed = url.trim();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let (base, query) = trimmed.split_once('?').unwrap_or((trimmed, ""));
        let params = query
            .split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect();
        (base.to_string(), params)
    } else {
        let params = trimmed
            .split_whitespace()
            .filter_map(|p| p.split_once('='))
            .map(|(k, v)| (k.to_string(), v.trim_matches('\'').to_string()))
            .collect();
        (String::new(), params)
    }
}

/// The URL again, from its base and parameters (a key-value string when the base is empty).
fn join_params(base: &str, params: &[(String, String)]) -> String {
    if base.is_empty() {
        params
            .iter()
            .map(|(k, v)| format!("{k}='{}'", v.replace('\\', "\\\\").replace('\'', "\\'")))
            .collect::<Vec<_>>()
            .join(" ")
    } else {
        let query: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{base}?{}", query.join("&"))
    }
}

/// Decodes `%XX` escapes of a URL's parameter.
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why TLS to a PostgreSQL server failed: carried through tokio-postgres's error as its source,
/// and turned into [`Error::Tls`] (see [`tls_failure`]).
#[derive(Debug, Clone)]
pub(super) struct TlsFailure(pub(super) Error);

impl fmt::Display for TlsFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for TlsFailure {}

/// The [`Error::Tls`] a client error carries, if it is a TLS failure: ours, or the server's
/// answer that it speaks no TLS.
pub(super) fn tls_failure(err: &tokio_postgres::Error) -> Option<Error> {
    let mut source = std::error::Error::source(err);
    let mut plaintext = false;
    while let Some(e) = source {
        if let Some(TlsFailure(failure)) = e.downcast_ref::<TlsFailure>() {
            return Some(failure.clone());
        }
        plaintext |= e.to_string().contains("server does not support TLS");
        source = e.source();
    }
    plaintext.then(|| Error::Tls {
        host: "the PostgreSQL server".to_string(),
        reason: "the server does not speak TLS (ssl = off in its postgresql.conf): turn it on \
                 there, or connect without sslmode"
            .to_string(),
    })
}

impl<S> MakeTlsConnect<S> for PgTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type TlsConnect = PgTlsConnect;
    type Error = TlsFailure;

    fn make_tls_connect(&mut self, domain: &str) -> std::result::Result<PgTlsConnect, TlsFailure> {
        match &self.0 {
            Some((tls, check)) => Ok(PgTlsConnect {
                tls: Some((tls.clone(), *check)),
                host: domain.to_string(),
            }),
            None => Ok(PgTlsConnect {
                tls: None,
                host: domain.to_string(),
            }),
        }
    }
}

/// The connector of one connection to `host`.
pub(super) struct PgTlsConnect {
    tls: Option<(Tls, Check)>,
    host: String,
}

impl<S> TlsConnect<S> for PgTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = PgTlsStream<S>;
    type Error = TlsFailure;
    type Future =
        Pin<Box<dyn Future<Output = std::result::Result<PgTlsStream<S>, TlsFailure>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let Some((tls, check)) = self.tls else {
                return Err(TlsFailure(Error::Tls {
                    host: self.host,
                    reason: "TLS was not asked for".to_string(),
                }));
            };
            let stream = tls.handshake(stream, &self.host, 0, check).await;
            stream
                .map(PgTlsStream)
                .map_err(|e| TlsFailure(named(e, &self.host)))
        })
    }
}

/// `err` naming the server by its host alone (tokio-postgres gives the connector no port).
fn named(err: Error, host: &str) -> Error {
    match err {
        Error::Tls { reason, .. } => Error::Tls {
            host: host.to_string(),
            reason,
        },
        other => other,
    }
}

/// A TLS stream to PostgreSQL.
pub(super) struct PgTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for PgTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for PgTlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for PgTlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_parameters_are_taken_off_the_url() {
        let (url, tls) = split_url(
            "postgres://app:pw@db:5432/app?sslmode=verify-ca&sslrootcert=/etc/ca.pem&application_name=x",
            None,
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://app:pw@db:5432/app?application_name=x&sslmode=require"
        );
        assert_eq!(tls.0.as_ref().map(|t| t.1), Some(Check::Chain));
        let (url, tls) =
            split_url("host=db sslmode=require sslcert=/c.pem sslkey=/k.pem", None).unwrap();
        assert_eq!(url, "host='db' sslmode='require'");
        assert_eq!(tls.0.as_ref().map(|t| t.1), Some(Check::Full));
        // No sslmode: plaintext, as before, unless the builder gave TLS settings.
        let (url, tls) = split_url("postgres://db/app", None).unwrap();
        assert_eq!(url, "postgres://db/app?sslmode=disable");
        assert!(tls.0.is_none());
        let (_, tls) = split_url("postgres://db/app", Some(&Tls::new())).unwrap();
        assert_eq!(tls.0.as_ref().map(|t| t.1), Some(Check::Full));
        assert!(split_url("postgres://db/app?sslmode=bogus", None).is_err());
        assert!(split_url("postgres://db/app?sslmode=require&sslcert=/c.pem", None).is_err());
    }
}
