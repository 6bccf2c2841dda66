//! String enums of the config, with the aliases docs/configuration.md accepts.
//!
//! Every enum takes its canonical PascalCase (or upstream SCREAMING) value, plus listed aliases;
//! SCREAMING_CASE forms also match case-insensitively. Using an alias works but is reported as a
//! warning so configs converge on one spelling.

use std::cell::RefCell;

use crate::config::yaml::Pos;

/// One use of an alias: as written, the canonical spelling, and where it was written
/// (`Pos::default()` when the deserializer does not track positions).
pub(crate) type AliasUse = (String, &'static str, Pos);

thread_local! {
    /// Aliases used while deserializing the current document.
    static ALIAS_USES: RefCell<Vec<AliasUse>> = const { RefCell::new(Vec::new()) };
}

/// Records that `written` (at `pos`) was accepted as an alias of `canonical`.
pub(crate) fn record_alias(written: &str, canonical: &'static str, pos: Pos) {
    ALIAS_USES.with(|uses| uses.borrow_mut().push((written.to_owned(), canonical, pos)));
}

/// Takes the aliases recorded on this thread since the last call.
pub(crate) fn take_alias_uses() -> Vec<AliasUse> {
    ALIAS_USES.with(|uses| std::mem::take(&mut *uses.borrow_mut()))
}

/// `INSECURE_DISABLE`, `HTTP2`: forms that people also write in lower case.
pub(crate) fn is_screaming(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Declares a config enum with canonical names and aliases.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $canon:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $name { $( $(#[$vmeta])* $variant ),+ }

        impl $name {
            /// The canonical spelling of every value.
            pub(crate) const CANONICAL: &'static [&'static str] = &[$($canon),+];

            /// The canonical spelling of this value.
            pub(crate) fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $canon),+ }
            }

            /// Parses a canonical value or an alias; the flag says whether an alias was used.
            pub(crate) fn parse(s: &str) -> Option<(Self, bool)> {
                $( if s == $canon { return Some((Self::$variant, false)); } )+
                $(
                    if $crate::config::wire::enums::is_screaming($canon) && s.eq_ignore_ascii_case($canon) {
                        return Some((Self::$variant, true));
                    }
                    $(
                        if s == $alias
                            || ($crate::config::wire::enums::is_screaming($alias) && s.eq_ignore_ascii_case($alias))
                        {
                            return Some((Self::$variant, true));
                        }
                    )*
                )+
                None
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                // Read with its position, so an alias warning can point at the value itself.
                let spanned = <$crate::config::yaml::Spanned<String> as serde::Deserialize>::deserialize(d)?;
                let (pos, written) = (spanned.pos, spanned.value);
                match Self::parse(&written) {
                    Some((value, alias)) => {
                        if alias {
                            $crate::config::wire::enums::record_alias(&written, value.as_str(), pos);
                        }
                        Ok(value)
                    }
                    None => Err(serde::de::Error::custom(format!(
                        "unknown value `{}`, expected one of: {}",
                        written,
                        Self::CANONICAL.join(", ")
                    ))),
                }
            }
        }

        impl schemars::JsonSchema for $name {
            fn schema_name() -> std::borrow::Cow<'static, str> {
                stringify!($name).into()
            }
            // The canonical values only: an editor offers what a config should say, and
            // flags an alias (accepted by egressd with a warning naming the canonical value).
            fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
                let values: Vec<&'static str> = Self::CANONICAL.to_vec();
                schemars::json_schema!({ "type": "string", "enum": values })
            }
        }
    };
}

wire_enum! {
    /// What a Gateway listener speaks.
    pub(crate) enum ListenerProtocol {
        Http = "HTTP",
        Https = "HTTPS",
        Tls = "TLS",
        Tcp = "TCP",
    }
}

wire_enum! {
    /// How a listener handles TLS.
    pub(crate) enum ListenerTlsMode {
        Terminate = "Terminate",
        Passthrough = "Passthrough",
    }
}

wire_enum! {
    /// Which namespaces may attach routes to a listener.
    pub(crate) enum FromNamespaces {
        All = "All",
        Same = "Same",
        Selector = "Selector",
    }
}

wire_enum! {
    /// HTTPRoute path match kinds.
    pub(crate) enum PathMatchType {
        Exact = "Exact",
        PathPrefix = "PathPrefix",
        RegularExpression = "RegularExpression",
    }
}

wire_enum! {
    /// HTTPRoute header and query parameter match kinds.
    pub(crate) enum ValueMatchType {
        Exact = "Exact",
        RegularExpression = "RegularExpression",
    }
}

wire_enum! {
    /// HTTP methods an HTTPRoute can match.
    pub(crate) enum HttpMethod {
        Get = "GET",
        Head = "HEAD",
        Post = "POST",
        Put = "PUT",
        Delete = "DELETE",
        Connect = "CONNECT",
        Options = "OPTIONS",
        Trace = "TRACE",
        Patch = "PATCH",
    }
}

wire_enum! {
    /// HTTPRoute filter kinds.
    pub(crate) enum FilterType {
        RequestHeaderModifier = "RequestHeaderModifier",
        ResponseHeaderModifier = "ResponseHeaderModifier",
        UrlRewrite = "URLRewrite",
        RequestRedirect = "RequestRedirect",
        RequestMirror = "RequestMirror",
        ExtensionRef = "ExtensionRef",
        Cors = "CORS",
    }
}

wire_enum! {
    /// URLRewrite path modifier kinds.
    pub(crate) enum PathModifierType {
        ReplaceFullPath = "ReplaceFullPath",
        ReplacePrefixMatch = "ReplacePrefixMatch",
    }
}

wire_enum! {
    /// How a Backend's destination is given.
    pub(crate) enum DestinationType {
        Fqdn = "FQDN" | "Fqdn" | "ExternalHostname",
        Ip = "IP" | "Ip",
    }
}

wire_enum! {
    /// The application protocol egressd speaks to a Backend.
    pub(crate) enum Protocol {
        Http = "HTTP",
        Http11 = "HTTP11",
        Http2 = "HTTP2",
        H2c = "H2C",
        Grpc = "GRPC",
        Mcp = "MCP",
        Tcp = "TCP",
    }
}

wire_enum! {
    /// How egressd connects to a Backend (see docs/configuration.md, TLS modes).
    pub(crate) enum TlsMode {
        Simple = "Simple" | "SIMPLE" | "ServerOnly",
        Mutual = "Mutual" | "MUTUAL" | "ClientAndServer",
        Passthrough = "Passthrough" | "PASSTHROUGH",
        InsecureDisable = "InsecureDisable" | "INSECURE_DISABLE" | "None",
        PlatformProvided = "PlatformProvided" | "PLATFORM_PROVIDED",
    }
}

wire_enum! {
    /// TLS protocol versions.
    pub(crate) enum TlsVersion {
        V1_2 = "1.2" | "TLSv1_2" | "TLSV1_2",
        V1_3 = "1.3" | "TLSv1_3" | "TLSV1_3",
    }
}

wire_enum! {
    /// Trust store names.
    pub(crate) enum WellKnownCa {
        System = "System",
    }
}

wire_enum! {
    /// Subject alternative name kinds to verify.
    pub(crate) enum SanType {
        Hostname = "Hostname",
        Uri = "URI",
    }
}

wire_enum! {
    /// Load balancing algorithms.
    pub(crate) enum LoadBalancerType {
        LeastRequest = "LeastRequest" | "LEAST_REQUEST",
        RoundRobin = "RoundRobin" | "ROUND_ROBIN",
        Random = "Random" | "RANDOM",
        ConsistentHash = "ConsistentHash" | "CONSISTENT_HASH",
    }
}

wire_enum! {
    /// What an active health check sends (`healthCheck.active.type`).
    pub(crate) enum HealthCheckType {
        Http = "HTTP",
        Tcp = "TCP",
        Mcp = "MCP",
    }
}

wire_enum! {
    /// What consistent hashing hashes.
    pub(crate) enum ConsistentHashType {
        Header = "Header" | "HEADER",
        Cookie = "Cookie" | "COOKIE",
        SourceIp = "SourceIP" | "SOURCE_IP",
    }
}

wire_enum! {
    /// Address families to resolve.
    pub(crate) enum LookupFamily {
        IPv4Only = "IPv4Only" | "V4_ONLY",
        IPv6Only = "IPv6Only" | "V6_ONLY",
        IPv4Preferred = "IPv4Preferred" | "V4_PREFERRED",
        IPv6Preferred = "IPv6Preferred",
        All = "All" | "ALL",
    }
}

wire_enum! {
    /// What happens to requests for undeclared destinations.
    pub(crate) enum OutboundPolicy {
        RegistryOnly = "RegistryOnly" | "REGISTRY_ONLY",
        AllowAny = "AllowAny" | "ALLOW_ANY",
        AuditOnly = "AuditOnly" | "AUDIT_ONLY",
    }
}

wire_enum! {
    /// Access log line formats.
    pub(crate) enum AccessLogFormat {
        Json = "JSON" | "Json",
        Text = "Text" | "TEXT",
    }
}

wire_enum! {
    /// Whether an `EgressPolicy` refuses the clients it does not list, or only records them.
    pub(crate) enum EgressPolicyMode {
        Enforce = "Enforce" | "ENFORCE",
        Report = "Report" | "REPORT",
    }
}

wire_enum! {
    /// What clients may reach destinations no `EgressPolicy` names.
    pub(crate) enum ClientPolicyDefault {
        Allow = "Allow" | "ALLOW",
        Deny = "Deny" | "DENY",
    }
}

wire_enum! {
    /// `ports[].interception`: whether a `CONNECT` to this port is intercepted when
    /// `ProxyConfig.spec.tlsInterception` is set.
    pub(crate) enum InterceptionMode {
        Enabled = "Enabled" | "ENABLED",
        Disabled = "Disabled" | "DISABLED",
    }
}

wire_enum! {
    /// Whether an HTTPS listener's clients must present a certificate.
    pub(crate) enum FrontendValidationMode {
        Require = "Require" | "REQUIRE",
        AllowMissing = "AllowMissing" | "ALLOW_MISSING",
    }
}

wire_enum! {
    /// `XBackend.spec.type` (Gateway API, GEP-4894).
    pub(crate) enum XBackendType {
        ExternalHostname = "ExternalHostname",
        EndpointSelector = "EndpointSelector",
    }
}

wire_enum! {
    /// `XBackend.spec.protocol`: Gateway API's spelling of a backend protocol.
    pub(crate) enum XBackendProtocol {
        Tcp = "TCP",
        Http = "HTTP",
        Http2 = "HTTP2",
        Http11 = "HTTP11",
        H2c = "H2C",
        Mcp = "MCP",
        Grpc = "GRPC",
        Wss = "WSS",
    }
}

wire_enum! {
    /// `XBackend.spec.tls.mode`.
    pub(crate) enum XBackendTlsMode {
        None = "None",
        ServerOnly = "ServerOnly",
        ClientAndServer = "ClientAndServer",
    }
}

wire_enum! {
    /// What `downstream.paths.escapedSlashes` does with `%2F`, `%5C` and `\` in a request path
    /// (Envoy's `path_with_escaped_slashes_action`, whose spellings are aliases).
    pub(crate) enum EscapedSlashesAction {
        KeepUnchanged = "KeepUnchanged" | "KEEP_UNCHANGED",
        RejectRequest = "RejectRequest" | "REJECT_REQUEST",
        UnescapeAndForward = "UnescapeAndForward" | "UNESCAPE_AND_FORWARD",
    }
}

wire_enum! {
    /// Which section of `rateLimit` applies (Envoy Gateway's `type`).
    pub(crate) enum RateLimitType {
        Local = "Local" | "LOCAL",
        Global = "Global" | "GLOBAL",
    }
}

wire_enum! {
    /// The unit of a rate limit.
    pub(crate) enum RateLimitUnit {
        Second = "Second" | "SECOND",
        Minute = "Minute" | "MINUTE",
        Hour = "Hour" | "HOUR",
        Day = "Day" | "DAY",
    }
}

wire_enum! {
    /// How a rate limit rule matches a header.
    pub(crate) enum RateLimitHeaderType {
        Exact = "Exact" | "EXACT",
        RegularExpression = "RegularExpression" | "REGULAR_EXPRESSION",
        Distinct = "Distinct" | "DISTINCT",
    }
}

wire_enum! {
    /// How a rate limit rule matches the path.
    pub(crate) enum RateLimitPathType {
        PathPrefix = "PathPrefix" | "PATH_PREFIX",
        Exact = "Exact" | "EXACT",
        RegularExpression = "RegularExpression" | "REGULAR_EXPRESSION",
    }
}

wire_enum! {
    /// One counter for every match (`Exact`) or one per distinct address or identity.
    pub(crate) enum RateLimitSourceType {
        Exact = "Exact" | "EXACT",
        Distinct = "Distinct" | "DISTINCT",
    }
}

wire_enum! {
    /// What a request gets when Redis cannot decide on it.
    pub(crate) enum RateLimitFailureMode {
        Open = "Open" | "OPEN",
        Closed = "Closed" | "CLOSED",
    }
}
