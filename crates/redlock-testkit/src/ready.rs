//! Readiness probe over a raw TCP connection: `PING` until `+PONG`, then `INFO server` to make
//! sure the answering server is *our* process (another process may have grabbed the port
//! between the free-port probe and redis-server's bind). On a node with a password, `AUTH`
//! goes first.

use std::io;
use std::net::Ipv4Addr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// Deadline for one probe (connect + PING + INFO).
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What one probe saw.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Probe {
    /// A server answered PONG; its process id.
    Pong {
        /// `process_id` from `INFO server`.
        pid: u32,
    },
    /// Nothing listening yet, still loading, or no answer in time.
    NotYet,
}

/// Probes the server on `127.0.0.1:port` once, authenticating as `default` with `password`
/// if given.
pub(crate) async fn probe(port: u16, password: Option<&str>) -> Probe {
    match tokio::time::timeout(PROBE_TIMEOUT, ping_and_pid(port, password)).await {
        Ok(Ok(Some(pid))) => Probe::Pong { pid },
        _ => Probe::NotYet,
    }
}

async fn ping_and_pid(port: u16, password: Option<&str>) -> io::Result<Option<u32>> {
    let stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await?;
    let mut conn = BufReader::new(stream);
    if let Some(password) = password {
        conn.get_mut()
            .write_all(&command(&["AUTH", password]))
            .await?;
        // The reply is not checked: a foreign server on the port (no password, or another
        // one) still answers the PING or refuses it, and INFO's pid tells it apart from ours.
        read_line(&mut conn).await?;
    }
    conn.get_mut().write_all(b"PING\r\n").await?;
    if read_line(&mut conn).await? != "+PONG" {
        // e.g. `-LOADING ...` while an AOF is replayed.
        return Ok(None);
    }
    conn.get_mut().write_all(b"INFO server\r\n").await?;
    let header = read_line(&mut conn).await?;
    let Some(len) = header
        .strip_prefix('$')
        .and_then(|n| n.parse::<usize>().ok())
    else {
        return Ok(None);
    };
    let mut body = vec![0; len + 2];
    conn.read_exact(&mut body).await?;
    Ok(parse_process_id(&String::from_utf8_lossy(&body)))
}

/// A command as a RESP array of bulk strings, so any byte of the password goes through
/// (an inline command would split it at spaces).
fn command(words: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", words.len()).into_bytes();
    for word in words {
        out.extend(format!("${}\r\n", word.len()).bytes());
        out.extend(word.bytes());
        out.extend(b"\r\n");
    }
    out
}

async fn read_line(conn: &mut BufReader<TcpStream>) -> io::Result<String> {
    let mut line = String::new();
    if conn.read_line(&mut line).await? == 0 {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(line.trim_end().to_owned())
}

/// Extracts `process_id:N` from an `INFO server` reply.
fn parse_process_id(info: &str) -> Option<u32> {
    info.lines()
        .find_map(|l| l.trim_end().strip_prefix("process_id:"))
        .and_then(|pid| pid.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_process_id() {
        let info = "# Server\r\nredis_version:7.0.15\r\nprocess_id:4242\r\ntcp_port:7000\r\n";
        assert_eq!(parse_process_id(info), Some(4242));
        assert_eq!(parse_process_id("# Server\r\n"), None);
    }

    #[test]
    fn commands_are_resp_arrays() {
        assert_eq!(
            command(&["AUTH", "p w"]),
            b"*2\r\n$4\r\nAUTH\r\n$3\r\np w\r\n".to_vec()
        );
    }

    #[tokio::test]
    async fn closed_port_is_not_ready() {
        let port = crate::port::reserve_free_port().unwrap();
        assert_eq!(probe(port.port(), None).await, Probe::NotYet);
        assert_eq!(probe(port.port(), Some("pw")).await, Probe::NotYet);
    }
}
