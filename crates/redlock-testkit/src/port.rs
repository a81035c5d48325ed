//! Free loopback ports.
//!
//! The OS hands out a free port when binding `127.0.0.1:0`; the listener is dropped right
//! away so redis-server can bind the port itself. Between the two another process may grab
//! it: the caller detects that (redis-server exits with "Address already in use", or a
//! foreign server answers) and asks for another port. Within this process, ports of live
//! nodes are additionally reserved so two nodes started concurrently never get the same one.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};

use crate::HarnessError;

/// Ports held by live nodes of this process.
static RESERVED: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());

/// How many times the OS is asked before giving up on finding an unreserved port.
const PROBES: usize = 64;

/// A port reserved for one node; released when dropped.
#[derive(Debug)]
pub(crate) struct PortReservation {
    port: u16,
}

impl PortReservation {
    /// The reserved port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for PortReservation {
    fn drop(&mut self) {
        RESERVED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.port);
    }
}

/// Asks the OS for a free loopback port that no live node of this process uses.
pub(crate) fn reserve_free_port() -> Result<PortReservation, HarnessError> {
    for _ in 0..PROBES {
        let port = {
            let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
                .map_err(|e| HarnessError::io("bind 127.0.0.1:0 to find a free port", e))?;
            listener
                .local_addr()
                .map_err(|e| HarnessError::io("read the address of a probe listener", e))?
                .port()
        };
        if RESERVED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(port)
        {
            return Ok(PortReservation { port });
        }
    }
    Err(HarnessError::io(
        "find a free loopback port",
        std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            "the OS kept returning ports already used by live nodes",
        ),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_unique_and_released() {
        let a = reserve_free_port().unwrap();
        let b = reserve_free_port().unwrap();
        assert_ne!(a.port(), b.port());
        let port = a.port();
        assert!(RESERVED.lock().unwrap().contains(&port));
        drop(a);
        assert!(!RESERVED.lock().unwrap().contains(&port));
    }
}
