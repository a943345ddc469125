//! The CNI error: the spec's codes, the plugin's own (100+), and the JSON the runtime reads.

use std::fmt;

use serde::Serialize;

/// A CNI error code: the spec's well-known codes (1–11) and this plugin's (100+).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    /// 1: the network config's `cniVersion` is not one this plugin speaks, or the command
    /// does not exist in that version (CHECK before 0.4.0).
    IncompatibleVersion,
    /// 2: a field of the network config this plugin cannot honour (the message names it).
    UnsupportedField,
    /// 3: the container's network namespace does not exist; nothing was done.
    UnknownContainer,
    /// 4: a CNI_* variable is missing or malformed (including an unknown CNI_COMMAND).
    InvalidEnvironment,
    /// 5: reading the network config failed.
    Io,
    /// 6: the network config is not JSON.
    Decode,
    /// 7: the network config is JSON but not a valid config for this plugin.
    InvalidConfig,
    /// 11: try again later: the agent is unreachable, busy or out of IPs.
    TryAgainLater,
    /// 100: the agent refused a request (its gRPC status is in the message and details).
    AgentRefused,
    /// 101: the kernel refused a change of links, addresses, routes or neighbours.
    Netlink,
    /// 102: CHECK found the container's network or its endpoint not as ADD left it.
    CheckFailed,
    /// 103: the agent's answer cannot be used (an unparsable IP or gateway, IPv6).
    AgentAnswer,
}

impl ErrorCode {
    /// The number the runtime sees.
    pub fn code(self) -> u32 {
        match self {
            Self::IncompatibleVersion => 1,
            Self::UnsupportedField => 2,
            Self::UnknownContainer => 3,
            Self::InvalidEnvironment => 4,
            Self::Io => 5,
            Self::Decode => 6,
            Self::InvalidConfig => 7,
            Self::TryAgainLater => 11,
            Self::AgentRefused => 100,
            Self::Netlink => 101,
            Self::CheckFailed => 102,
            Self::AgentAnswer => 103,
        }
    }
}

/// A failed command, as the runtime gets it: `{cniVersion, code, msg, details}` on stdout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct CniError {
    /// What kind of failure.
    pub code: ErrorCode,
    /// One line saying what failed.
    pub msg: String,
    /// More about it (the underlying error, what an undo did); may be empty.
    pub details: String,
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (code {})", self.msg, self.code.code())?;
        if !self.details.is_empty() {
            write!(f, ": {}", self.details)?;
        }
        Ok(())
    }
}

impl CniError {
    /// An error without details.
    pub fn new(code: ErrorCode, msg: impl Into<String>) -> Self {
        Self {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The same error with `details`.
    #[must_use]
    pub fn with_details(mut self, details: impl Into<String>) -> Self {
        self.details = details.into();
        self
    }

    /// Appends a sentence to the details (what an undo did or failed to do).
    pub fn add_detail(&mut self, more: &str) {
        if !self.details.is_empty() {
            self.details.push_str("; ");
        }
        self.details.push_str(more);
    }

    /// The error as the CNI spec's JSON object, for a config of version `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> String {
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct Wire<'a> {
            cni_version: &'a str,
            code: u32,
            msg: &'a str,
            #[serde(skip_serializing_if = "str::is_empty")]
            details: &'a str,
        }
        let wire = Wire {
            cni_version,
            code: self.code.code(),
            msg: &self.msg,
            details: &self.details,
        };
        // Serializing strings and a number into JSON cannot fail.
        serde_json::to_string(&wire).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_json_has_the_spec_fields_and_omits_empty_details() {
        let err = CniError::new(ErrorCode::TryAgainLater, "agent unreachable");
        assert_eq!(
            err.to_json("1.0.0"),
            r#"{"cniVersion":"1.0.0","code":11,"msg":"agent unreachable"}"#
        );
        let mut err = err.with_details("no such file");
        err.add_detail("released 10.0.0.1");
        let json: serde_json::Value = serde_json::from_str(&err.to_json("0.4.0")).unwrap();
        assert_eq!(json["cniVersion"], "0.4.0");
        assert_eq!(json["details"], "no such file; released 10.0.0.1");
        assert_eq!(
            err.to_string(),
            "agent unreachable (code 11): no such file; released 10.0.0.1"
        );
    }
}
