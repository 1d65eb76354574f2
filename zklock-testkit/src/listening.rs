//! What the ZooKeeper [`Proxy`](crate::Proxy) and the protocol-blind [`Relay`](crate::Relay)
//! hold alike: the state their connections share, built around a [`FaultSwitch`], and the
//! loopback address they listen on. Each wraps one [`Listening`] and adds its own look at the
//! traffic.

use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::ops::Deref;
use std::sync::Arc;

use tokio::net::TcpStream;
use tokio::runtime::Runtime;

use crate::fault_switch::{self, FaultSwitch};

/// A proxy's or relay's own handle on what its connections share (`S`, around its fault
/// switch; reached through it as through an [`Arc`]) and on the address it listens on.
/// Dropping it closes the switch: the listener stops and every connection through it is reset.
pub(crate) struct Listening<S: AsRef<FaultSwitch>> {
    shared: Arc<S>,
    addr: SocketAddr,
}

impl<S> Listening<S>
where
    S: AsRef<FaultSwitch> + Send + Sync + 'static,
{
    /// Listens on a free loopback port in front of `upstream` (`"host:port"`), on `runtime`:
    /// every client accepted goes to `serve`, with the state `make` builds around the switch.
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve or no loopback port can be bound.
    pub(crate) fn start<F>(
        upstream: &str,
        runtime: &'static Runtime,
        make: impl FnOnce(FaultSwitch) -> S,
        serve: fn(TcpStream, Arc<S>) -> F,
    ) -> io::Result<Listening<S>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let (shared, addr) = fault_switch::listen(upstream, runtime, make, serve)?;
        Ok(Listening { shared, addr })
    }

    /// The loopback address listened on.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The state its connections share, as they hold it.
    pub(crate) fn arc(&self) -> &Arc<S> {
        &self.shared
    }

    /// The address traffic is forwarded to.
    pub(crate) fn upstream(&self) -> SocketAddr {
        self.switch().upstream()
    }

    /// Writes the `Debug` form of the proxy or relay `name`: where it listens, where it
    /// forwards to, and the faults now in force.
    pub(crate) fn debug(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("listen", &self.addr)
            .field("upstream", &self.upstream())
            .field("faults", &self.switch().now())
            .finish()
    }

    fn switch(&self) -> &FaultSwitch {
        (*self.shared).as_ref()
    }
}

impl<S: AsRef<FaultSwitch>> Deref for Listening<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.shared
    }
}

impl<S: AsRef<FaultSwitch>> Drop for Listening<S> {
    fn drop(&mut self) {
        (*self.shared).as_ref().close();
    }
}
