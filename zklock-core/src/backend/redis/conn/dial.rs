//! How the Redis backend opens every connection ([`Dial`]): TCP or a Unix socket, with TLS over
//! TCP when the URL is `rediss://` (`rediss+sentinel://`, `rediss+cluster://`) or the options
//! give [`Tls`] — to the server, the Sentinels and every Cluster node alike. The redis client's
//! own TLS is not used: every backend shares one TLS stack ([`Tls`]).

use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;

use redis::aio::{MultiplexedConnection, PubSub};
use redis::{AsyncConnectionConfig, Client, ConnectionAddr, RedisError, RedisResult};
use tokio::io::{AsyncRead, AsyncWrite};

use super::super::error::{into_redis, kept_io};
use crate::types::error::Error;
use crate::types::tls::{Check, Tls};

/// A byte stream to a server.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// How connections are opened: in plaintext, or over TLS with these settings.
#[derive(Clone, Debug, Default)]
pub(crate) struct Dial {
    tls: Option<Tls>,
    /// How long a TLS handshake may take: half the connect timeout, so that a server that
    /// never answers it is named as such before the connect gives up.
    handshake_timeout: Duration,
}

/// The TLS schemes, and the plaintext ones the redis client parses in their place.
const TLS_SCHEMES: [(&str, &str); 3] = [
    ("rediss+sentinel://", "redis+sentinel://"),
    ("rediss+cluster://", "redis+cluster://"),
    ("rediss://", "redis://"),
];

impl Dial {
    /// The dial of `url` with the options' `tls`: TLS if either asks for it. Answers the URL with
    /// its scheme in plaintext form, for the parsers.
    pub(crate) fn of(url: &str, tls: Option<&Tls>, connect_timeout: Duration) -> (String, Dial) {
        let handshake_timeout = connect_timeout / 2;
        let trimmed = url.trim();
        let lower = trimmed.to_ascii_lowercase();
        for (tls_scheme, plain) in TLS_SCHEMES {
            if lower.starts_with(tls_scheme) {
                let rest = &trimmed[tls_scheme.len()..];
                return (
                    format!("{plain}{rest}"),
                    Dial {
                        tls: Some(tls.cloned().unwrap_or_default()),
                        handshake_timeout,
                    },
                );
            }
        }
        (
            trimmed.to_string(),
            Dial {
                tls: tls.cloned(),
                handshake_timeout,
            },
        )
    }

    /// Whether connections use TLS.
    #[cfg(test)]
    pub(crate) fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// A stream to the server `client` names, TLS set up if asked for.
    async fn stream(&self, client: &Client) -> RedisResult<Box<dyn Io>> {
        match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => {
                let stream = tokio::net::TcpStream::connect((host.as_str(), *port)).await?;
                stream.set_nodelay(true)?;
                let Some(tls) = &self.tls else {
                    return Ok(Box::new(stream));
                };
                let handshake = tls.handshake(stream, host, *port, Check::Full);
                match tokio::time::timeout(self.handshake_timeout, handshake).await {
                    Ok(Ok(stream)) => Ok(Box::new(stream)),
                    Ok(Err(e)) => Err(into_redis(e)),
                    // A plaintext server reads the greeting as the start of a command and
                    // waits for its end.
                    Err(_) => Err(into_redis(Error::Tls {
                        host: format!("{host}:{port}"),
                        reason: format!(
                            "no answer to the TLS handshake within {:?}: the server may not \
                             speak TLS on this port (a plaintext port?)",
                            self.handshake_timeout
                        ),
                    })),
                }
            }
            #[cfg(unix)]
            ConnectionAddr::Unix(path) => {
                if self.tls.is_some() {
                    return Err(into_redis(Error::Config(
                        "TLS was asked for a Unix socket: give the server's TCP address".into(),
                    )));
                }
                Ok(Box::new(tokio::net::UnixStream::connect(path).await?))
            }
            other => Err(into_redis(Error::Config(format!(
                "the Redis address {other} is not one zklock can open"
            )))),
        }
    }

    /// A multiplexed connection to the server `client` names, and the future that drives it
    /// (its end is the connection's).
    pub(crate) async fn multiplexed(
        &self,
        client: &Client,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<(MultiplexedConnection, BoxFuture<'static, ()>)> {
        let stream = self.stream(client).await?;
        let info = client.get_connection_info();
        let opened = async {
            let (mut connection, driver) = MultiplexedConnection::new_with_config(
                info.redis_settings(),
                stream,
                config.clone(),
            )
            .await?;
            let driver = tokio::spawn(driver);
            if self.tls.is_some() {
                // Under TLS 1.3 a server refuses a client certificate after the handshake, in
                // its first answer: ask for one here, so that the refusal is this dial's.
                let pinged = redis::cmd("PING").query_async::<()>(&mut connection).await;
                if let Err(e) = pinged {
                    driver.abort();
                    return Err(e);
                }
            }
            let driver = async move {
                let _ = driver.await;
            };
            Ok((connection, driver.boxed()))
        };
        opened.await.map_err(|e| self.refused(e, client))
    }

    /// A multiplexed connection driven by a task of its own on the current runtime (for a
    /// request or two: a scan, `CLUSTER SLOTS`, a Sentinel's answer).
    pub(crate) async fn connection(
        &self,
        client: &Client,
        config: &AsyncConnectionConfig,
    ) -> RedisResult<MultiplexedConnection> {
        let (connection, driver) = self.multiplexed(client, config).await?;
        tokio::spawn(driver);
        Ok(connection)
    }

    /// A pub/sub connection to the server `client` names.
    pub(crate) async fn pubsub(&self, client: &Client) -> RedisResult<PubSub> {
        let stream = self.stream(client).await?;
        let opened = async {
            let mut pubsub =
                PubSub::new(client.get_connection_info().redis_settings(), stream).await?;
            if self.tls.is_some() {
                // As in `multiplexed`: a refused client certificate shows in the first answer.
                pubsub.ping::<()>().await?;
            }
            Ok(pubsub)
        };
        opened.await.map_err(|e| self.refused(e, client))
    }

    /// `err`, or the TLS refusal inside it (an alert the server sent after the handshake) as
    /// [`Error::Tls`] naming the server.
    fn refused(&self, err: RedisError, client: &Client) -> RedisError {
        let Some(tls) = &self.tls else {
            return err;
        };
        let Some(io) = kept_io(&err) else {
            return err;
        };
        let alert = io
            .get_ref()
            .is_some_and(|e| e.downcast_ref::<rustls::Error>().is_some());
        // Or the connection closed as the first request went out (TLS 1.3's late refusal).
        let closed = matches!(
            io.kind(),
            std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::ConnectionAborted
                | std::io::ErrorKind::UnexpectedEof
        );
        let reason = match (alert, closed) {
            (true, _) => crate::types::tls::handshake_failure(io, tls),
            (false, true) => crate::types::tls::closed_after_handshake(tls),
            (false, false) => return err,
        };
        let host = match client.get_connection_info().addr() {
            ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
            other => other.to_string(),
        };
        into_redis(Error::Tls { host, reason })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tls_schemes_ask_for_tls() {
        let (url, dial) = Dial::of("rediss://h:6380/0", None, Duration::from_secs(4));
        assert_eq!(url, "redis://h:6380/0");
        assert!(dial.is_tls());
        let (url, dial) = Dial::of("REDISS+CLUSTER://a:1,b:2", None, Duration::from_secs(4));
        assert_eq!(url, "redis+cluster://a:1,b:2");
        assert!(dial.is_tls());
        let (url, dial) = Dial::of("rediss+sentinel://s:26379/m", None, Duration::from_secs(4));
        assert_eq!(url, "redis+sentinel://s:26379/m");
        assert!(dial.is_tls());
        let (_, dial) = Dial::of("redis://h", None, Duration::from_secs(4));
        assert!(!dial.is_tls());
        let (_, dial) = Dial::of(
            "redis+sentinel://s/m",
            Some(&Tls::new()),
            Duration::from_secs(4),
        );
        assert!(dial.is_tls(), "the options' TLS asks for it too");
    }
}
