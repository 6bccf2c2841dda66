//! Whose a failure is: the rule that decides what an endpoint is charged with.

/// Who caused a timeout while waiting for an upstream's answer. The rule: a failure is charged
/// to the endpoint (outlier detection, its last failure in `/endpoints`) only when the
/// endpoint caused it. The client's own deadline (`grpc-timeout` shorter than the Backend's
/// timeout), the client's slowness (its request body still arriving when the timer ran out)
/// and the client's reset or early close (`client_closed`, an origin of its own) never are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Blame {
    /// The endpoint did not answer in time.
    Endpoint,
    /// The deadline was the client's own (`grpc-timeout`), shorter than the Backend's.
    ClientDeadline,
    /// egressd was still waiting for the client's request body.
    ClientBody,
}

impl Blame {
    /// Said after the error's text.
    pub(super) fn explain(self) -> &'static str {
        match self {
            Blame::Endpoint => "",
            Blame::ClientDeadline => " (the client's own deadline)",
            Blame::ClientBody => " (the client's request body was still arriving)",
        }
    }
}
