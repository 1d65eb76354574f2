//! ZooKeeper's four-letter-word admin commands over a plain TCP connection.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// Sends `cmd` (e.g. `ruok`, `srvr`, `mntr`) to the server on `127.0.0.1:port` and returns its answer.
pub(crate) fn four_letter(port: u16, cmd: &str, timeout: Duration) -> io::Result<String> {
    if cmd.len() != 4 || !cmd.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a four-letter word: {cmd:?}"),
        ));
    }
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    stream.write_all(cmd.as_bytes())?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

/// The `Mode:` of a `srvr` answer: `standalone`, `leader`, `follower` or `observer`.
pub(crate) fn mode_of(srvr: &str) -> Option<&str> {
    srvr.lines()
        .find_map(|l| l.strip_prefix("Mode:"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_mode() {
        let srvr = "Zookeeper version: 3.8.0\nLatency min/avg/max: 0/0.0/0\nMode: follower\nNode count: 5\n";
        assert_eq!(mode_of(srvr), Some("follower"));
        assert_eq!(
            mode_of("This ZooKeeper instance is not currently serving requests\n"),
            None
        );
    }

    #[test]
    fn rejects_bad_words() {
        let err = four_letter(1, "ruok\n", Duration::from_millis(10)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    }
}
