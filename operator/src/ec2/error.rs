//! Errors of EC2 calls, with the EC2 error code kept for decisions (index conflicts, subnet
//! exhaustion) and for the `response_code` metric label.

use aws_sdk_ec2::error::{ProvideErrorMetadata, SdkError};

/// An EC2 call that failed, after the SDK's own retries.
#[derive(Debug, thiserror::Error)]
pub enum Ec2Error {
    /// EC2 answered with an error code.
    #[error("EC2 {operation} failed: {code}: {message}")]
    Api {
        /// The EC2 action, e.g. `AttachNetworkInterface`.
        operation: &'static str,
        /// EC2's error code, e.g. `InsufficientFreeAddressesInSubnet`.
        code: String,
        /// EC2's error message.
        message: String,
    },
    /// No usable answer: timeout, connection failure, unparsable response.
    #[error("EC2 {operation} failed ({kind}): {detail}")]
    Transport {
        /// The EC2 action.
        operation: &'static str,
        /// The SDK's failure kind, used as the metric's `response_code`.
        kind: &'static str,
        /// What the SDK said.
        detail: String,
    },
    /// EC2 answered without a field the operator needs.
    #[error("EC2 {operation} answered without {field}")]
    MissingField {
        /// The EC2 action.
        operation: &'static str,
        /// The missing field.
        field: &'static str,
    },
}

impl Ec2Error {
    /// Converts an SDK error, keeping EC2's error code when there is one.
    pub(crate) fn from_sdk<E, R>(operation: &'static str, err: &SdkError<E, R>) -> Self
    where
        E: ProvideErrorMetadata + std::error::Error + 'static,
        R: std::fmt::Debug,
    {
        if let Some(code) = err.code() {
            return Self::Api {
                operation,
                code: code.to_owned(),
                message: err.message().unwrap_or_default().to_owned(),
            };
        }
        let kind = match err {
            SdkError::ConstructionFailure(_) => "ConstructionFailure",
            SdkError::TimeoutError(_) => "Timeout",
            SdkError::DispatchFailure(_) => "DispatchFailure",
            SdkError::ResponseError(_) => "ResponseError",
            _ => "ServiceError",
        };
        Self::Transport {
            operation,
            kind,
            detail: format!("{}", aws_sdk_ec2::error::DisplayErrorContext(err)),
        }
    }

    /// The EC2 error code, if EC2 answered with one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Api { code, .. } => Some(code),
            _ => None,
        }
    }

    /// EC2's error message, if EC2 answered with one.
    pub fn message(&self) -> Option<&str> {
        match self {
            Self::Api { message, .. } => Some(message),
            _ => None,
        }
    }

    /// The `response_code` label of the duration metric.
    pub fn response_code(&self) -> &str {
        match self {
            Self::Api { code, .. } => code,
            Self::Transport { kind, .. } => kind,
            Self::MissingField { .. } => "MissingField",
        }
    }

    /// The device index asked for is taken (our view of the instance was stale): Cilium
    /// retries the attachment at the next free index instead of deleting the ENI.
    pub fn is_attachment_index_conflict(&self) -> bool {
        self.code() == Some("InvalidParameterValue")
            && self
                .message()
                .is_some_and(|m| m.contains("interface attached at device"))
    }

    /// The subnet has no free address for the request.
    pub fn is_subnet_exhausted(&self) -> bool {
        self.code() == Some("InsufficientFreeAddressesInSubnet")
    }

    /// The subnet has no free aligned /28 for a prefix (prefix delegation falls back to /32s).
    pub fn is_subnet_out_of_prefixes(&self) -> bool {
        match self.code() {
            Some("InsufficientCidrBlocks" | "InsufficientPrefixesInSubnet") => true,
            Some("InvalidParameterValue") => self.message().is_some_and(|m| {
                m.contains("There aren't sufficient free Ipv4 addresses or prefixes")
            }),
            _ => false,
        }
    }

    /// The instance is not running (terminated while its node object still exists).
    pub fn is_instance_not_running(&self) -> bool {
        self.to_string().contains("is not 'running'")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: &str, message: &str) -> Ec2Error {
        Ec2Error::Api {
            operation: "AttachNetworkInterface",
            code: code.to_owned(),
            message: message.to_owned(),
        }
    }

    #[test]
    fn recognises_an_attachment_index_conflict() {
        let conflict = api(
            "InvalidParameterValue",
            "Instance 'i-1' already has an interface attached at device index '1'.",
        );
        assert!(conflict.is_attachment_index_conflict());
        assert!(!api("InvalidParameterValue", "something else").is_attachment_index_conflict());
        assert!(
            !api(
                "InvalidNetworkInterface.InUse",
                "interface attached at device"
            )
            .is_attachment_index_conflict()
        );
    }

    #[test]
    fn response_code_is_the_ec2_code() {
        assert_eq!(
            api("RequestLimitExceeded", "slow down").response_code(),
            "RequestLimitExceeded"
        );
    }
}
