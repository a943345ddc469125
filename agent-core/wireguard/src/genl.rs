//! A blocking generic-netlink socket (netlink-sys) for the kernel WireGuard backend:
//! resolving a family's ID through `nlctrl`, and request → replies-until-ACK exchanges.

use std::fmt::Debug;
use std::io;
use std::time::Duration;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_REQUEST, NetlinkDeserializable, NetlinkMessage, NetlinkPayload,
    NetlinkSerializable,
};
use netlink_packet_generic::GenlMessage;
use netlink_packet_generic::ctrl::nlas::GenlCtrlAttrs;
use netlink_packet_generic::ctrl::{GenlCtrl, GenlCtrlCmd};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_GENERIC};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

/// How long one reply may take (the kernel answers at once; this only bounds a stuck call).
pub const RECV_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a generic-netlink exchange failed.
#[derive(Debug, thiserror::Error)]
pub enum GenlError {
    /// The kernel does not know the family (for `wireguard`: no module).
    #[error(
        "the kernel has no generic netlink family {family:?} (for \"wireguard\": the WireGuard \
         kernel module is not loaded or built in)"
    )]
    FamilyNotFound {
        /// The family asked for.
        family: String,
    },
    /// The kernel answered with an error.
    #[error("the kernel refused the request: {error}")]
    Kernel {
        /// Its errno, as an I/O error.
        error: io::Error,
        /// The errno (negative, as netlink sends it).
        errno: i32,
    },
    /// Socket trouble (including the receive timeout).
    #[error("netlink socket: {0}")]
    Io(io::Error),
    /// An answer that does not parse.
    #[error("unreadable netlink answer: {0}")]
    Decode(String),
}

// The cause is in the message: converting does not also make it the error's source, so no
// chain prints it twice.
impl From<io::Error> for GenlError {
    fn from(error: io::Error) -> Self {
        Self::Io(error)
    }
}

/// One `NETLINK_GENERIC` socket; requests are numbered so stale replies are skipped.
pub struct GenlSocket {
    socket: Socket,
    seq: u32,
}

impl GenlSocket {
    /// Opens and binds a socket with a receive timeout of [`RECV_TIMEOUT`].
    pub fn open() -> Result<Self, GenlError> {
        let mut socket = Socket::new(NETLINK_GENERIC)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        let timeout = TimeVal::new(i64::try_from(RECV_TIMEOUT.as_secs()).unwrap_or(i64::MAX), 0);
        setsockopt(&socket, sockopt::ReceiveTimeout, &timeout).map_err(io::Error::from)?;
        Ok(Self { socket, seq: 0 })
    }

    /// The ID of the generic-netlink family `name` (`CTRL_CMD_GETFAMILY`).
    pub fn resolve_family(&mut self, name: &str) -> Result<u16, GenlError> {
        let request = GenlMessage::from_payload(GenlCtrl {
            cmd: GenlCtrlCmd::GetFamily,
            nlas: vec![GenlCtrlAttrs::FamilyName(name.to_owned())],
        });
        let replies = match self.request(request, 0) {
            Err(GenlError::Kernel { errno, .. }) if errno == -libc::ENOENT => {
                return Err(GenlError::FamilyNotFound {
                    family: name.to_owned(),
                });
            }
            other => other?,
        };
        replies
            .iter()
            .flat_map(|reply| &reply.payload.nlas)
            .find_map(|nla| match nla {
                GenlCtrlAttrs::FamilyId(id) => Some(*id),
                _ => None,
            })
            .ok_or_else(|| GenlError::Decode(format!("no family ID for {name:?} in {replies:?}")))
    }

    /// Sends `message` with `NLM_F_REQUEST | NLM_F_ACK | extra_flags` and collects the
    /// replies until the ACK (or, for dumps, `NLMSG_DONE`).
    pub fn request<F>(
        &mut self,
        message: GenlMessage<F>,
        extra_flags: u16,
    ) -> Result<Vec<GenlMessage<F>>, GenlError>
    where
        F: Debug,
        GenlMessage<F>: NetlinkSerializable + NetlinkDeserializable + Debug,
    {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut netlink = NetlinkMessage::from(message);
        netlink.header.flags = NLM_F_REQUEST | NLM_F_ACK | extra_flags;
        netlink.header.sequence_number = seq;
        netlink.finalize();
        let mut buffer = vec![0; netlink.buffer_len()];
        netlink.serialize(&mut buffer);
        self.socket.send(&buffer, 0)?;

        let mut replies = Vec::new();
        loop {
            let (datagram, _) = self.socket.recv_from_full()?;
            let mut offset = 0;
            while offset < datagram.len() {
                let reply = NetlinkMessage::<GenlMessage<F>>::deserialize(&datagram[offset..])
                    .map_err(|err| GenlError::Decode(err.to_string()))?;
                let length = usize::try_from(reply.header.length).unwrap_or(usize::MAX);
                if length == 0 {
                    return Err(GenlError::Decode("a zero-length message".to_owned()));
                }
                // Messages are 4-byte aligned within a datagram.
                offset = offset.saturating_add((length + 3) & !3);
                if reply.header.sequence_number != seq {
                    continue; // a late reply to an earlier, abandoned request
                }
                match reply.payload {
                    NetlinkPayload::InnerMessage(inner) => replies.push(inner),
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::Error(error) => match error.code {
                        None => return Ok(replies), // the ACK
                        Some(code) => {
                            return Err(GenlError::Kernel {
                                error: error.to_io(),
                                errno: code.get(),
                            });
                        }
                    },
                    _ => {} // Noop, Overrun: nothing for the caller
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nlctrl_resolves_itself_and_an_unknown_family_is_reported_clearly() {
        let mut socket = GenlSocket::open().unwrap();
        // nlctrl is always there, with the fixed ID GENL_ID_CTRL. (Family names are < 16 bytes.)
        assert_eq!(socket.resolve_family("nlctrl").unwrap(), 0x10);
        let err = socket.resolve_family("mw_no_family").unwrap_err();
        assert!(
            matches!(&err, GenlError::FamilyNotFound { family } if family == "mw_no_family"),
            "{err:?}"
        );
        // The socket still works after an error reply.
        assert_eq!(socket.resolve_family("nlctrl").unwrap(), 0x10);
    }
}
