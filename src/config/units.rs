//! Value types for configuration quantities with units: Gateway API durations and Kubernetes
//! byte quantities.
//!
//! Both follow the grammars of the APIs our configuration imitates, so that users can copy
//! values between Gateway API / Kubernetes manifests and egressd without translation.

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The Gateway API `Duration` grammar (GEP-2257).
const DURATION_PATTERN: &str = "^([0-9]{1,5}(h|m|s|ms)){1,4}$";
const DURATION_HINT: &str = r#"expected e.g. "10s", "500ms", "1h30m" (units h, m, s, ms)"#;

/// Integers, optionally with a fraction, and an optional Kubernetes suffix.
const QUANTITY_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$";
const QUANTITY_HINT: &str =
    r#"expected e.g. 1048576, "32Ki", "1Mi", "64k" (suffixes Ki Mi Gi Ti Pi Ei, k M G T P E)"#;

/// Binary suffixes, smallest first.
const BINARY_SUFFIXES: [(&str, u64); 6] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
];

const DECIMAL_SUFFIXES: [(&str, u64); 6] = [
    ("k", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
];

/// Why a [`GwDuration`] or [`Quantity`] string was rejected. The message quotes the input and
/// includes a hint at the accepted syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ParseUnitError {
    message: String,
}

impl ParseUnitError {
    fn duration(input: impl fmt::Display) -> Self {
        Self {
            message: format!("invalid duration {input}: {DURATION_HINT}"),
        }
    }

    fn quantity(input: impl fmt::Display, reason: &str) -> Self {
        Self {
            message: format!("invalid quantity {input}: {reason}; {QUANTITY_HINT}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// GwDuration
// ---------------------------------------------------------------------------------------------

/// A duration in the Gateway API grammar: one to four `<number><unit>` groups, number 1–5 digits,
/// unit h|m|s|ms, e.g. "1h30m", "500ms", "10s", "0s". Deserializes only from a string.
///
/// Displays (and serializes) in the canonical shortest form, e.g. 90s as "1m30s". Precision
/// below a millisecond is not representable in the grammar and is dropped when displaying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub(crate) struct GwDuration(pub(crate) std::time::Duration);

impl GwDuration {
    /// A duration of whole seconds, usable in `const` defaults.
    #[must_use]
    #[cfg(test)]
    pub(crate) const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    /// A duration of whole milliseconds, usable in `const` defaults.
    #[must_use]
    pub(crate) const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }
}

impl From<GwDuration> for Duration {
    fn from(d: GwDuration) -> Self {
        d.0
    }
}

impl From<Duration> for GwDuration {
    fn from(d: Duration) -> Self {
        Self(d)
    }
}

impl FromStr for GwDuration {
    type Err = ParseUnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_duration_millis(s)
            .map(Self::from_millis)
            .ok_or_else(|| ParseUnitError::duration(format_args!("{s:?}")))
    }
}

/// A duration of the command line (`--reload-timeout 90s`), in the config's grammar.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    s.parse::<GwDuration>()
        .map(Duration::from)
        .map_err(|e| e.to_string())
}

/// Parses the Gateway API grammar by hand (no regex dependency), returning milliseconds.
fn parse_duration_millis(s: &str) -> Option<u64> {
    let bytes = s.as_bytes();
    let mut i = 0;
    let mut groups = 0;
    let mut total: u64 = 0;
    while i < bytes.len() {
        let start = i;
        while bytes.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        if !(1..=5).contains(&(i - start)) {
            return None;
        }
        // At most five ASCII digits: always parses, and cannot overflow below.
        let n: u64 = s[start..i].parse().ok()?;
        // "ms" must win over "m": after the unit a new group needs a digit, so an `s` right
        // after `m` can only belong to "ms".
        let unit_ms = match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'h'), _) => 3_600_000,
            (Some(b'm'), Some(b's')) => 1,
            (Some(b'm'), _) => 60_000,
            (Some(b's'), _) => 1_000,
            _ => return None,
        };
        i += if unit_ms == 1 { 2 } else { 1 };
        groups += 1;
        if groups > 4 {
            return None;
        }
        // Bounded by 4 × 99999 h ≈ 1.4e12 ms.
        total += n * unit_ms;
    }
    (groups > 0).then_some(total)
}

impl fmt::Display for GwDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.0.as_millis();
        if total == 0 {
            return f.write_str("0s");
        }
        let parts = [
            (total / 3_600_000, "h"),
            (total / 60_000 % 60, "m"),
            (total / 1_000 % 60, "s"),
            (total % 1_000, "ms"),
        ];
        for (n, unit) in parts {
            if n > 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for GwDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GwDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct DurationVisitor;

        impl Visitor<'_> for DurationVisitor {
            type Value = GwDuration;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a duration string; {DURATION_HINT}")
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<GwDuration, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(DurationVisitor)
    }
}

impl JsonSchema for GwDuration {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "GwDuration".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "description": "A duration as in the Gateway API: one to four <number><unit> groups with 1-5 digit numbers and units h, m, s or ms, e.g. \"10s\", \"500ms\", \"1h30m\".",
        })
    }
}

// ---------------------------------------------------------------------------------------------
// Quantity
// ---------------------------------------------------------------------------------------------

/// A byte size as a Kubernetes quantity: an integer, or an integer with a binary suffix
/// Ki Mi Gi Ti Pi Ei or decimal k M G T P E (e.g. "32Ki", "1Mi", "64k", 1048576).
///
/// Accepts a YAML/JSON integer or a string. Must fit `u64`; fractions like "1.5Mi" are accepted
/// only when the result is a whole number of bytes. Displays (and serializes, as a string) with
/// the largest binary suffix that divides the value exactly, else as plain bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Quantity(pub(crate) u64);

impl From<Quantity> for u64 {
    fn from(q: Quantity) -> Self {
        q.0
    }
}

impl FromStr for Quantity {
    type Err = ParseUnitError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_quantity(s)
            .map(Self)
            .map_err(|reason| ParseUnitError::quantity(format_args!("{s:?}"), reason))
    }
}

/// Parses a quantity string, returning a short reason on failure.
fn parse_quantity(s: &str) -> Result<u64, &'static str> {
    if s.starts_with('-') {
        return Err("must not be negative");
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(split);
    let multiplier = if suffix.is_empty() {
        1
    } else {
        BINARY_SUFFIXES
            .iter()
            .chain(&DECIMAL_SUFFIXES)
            .find(|(name, _)| *name == suffix)
            .map(|&(_, m)| m)
            .ok_or("unknown suffix")?
    };

    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    if !all_digits(int) || (number.contains('.') && !all_digits(frac)) {
        return Err("malformed number");
    }
    // Trailing zeros add nothing but would make the scale below overflow sooner.
    let frac = frac.trim_end_matches('0');

    // Exact arithmetic: value = (int * 10^k + frac) * multiplier / 10^k.
    let too_large = "too large for 64 bits";
    let scale = u32::try_from(frac.len())
        .ok()
        .and_then(|k| 10u128.checked_pow(k))
        .ok_or("too many decimal places")?;
    let int: u128 = int.parse().map_err(|_| too_large)?;
    let frac: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| "too many decimal places")?
    };
    let bytes = int
        .checked_mul(scale)
        .and_then(|n| n.checked_add(frac))
        .and_then(|n| n.checked_mul(u128::from(multiplier)))
        .ok_or(too_large)?;
    if !bytes.is_multiple_of(scale) {
        return Err("not a whole number of bytes");
    }
    u64::try_from(bytes / scale).map_err(|_| too_large)
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 != 0 {
            for (suffix, m) in BINARY_SUFFIXES.iter().rev() {
                if self.0.is_multiple_of(*m) {
                    return write!(f, "{}{suffix}", self.0 / m);
                }
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct QuantityVisitor;

        impl Visitor<'_> for QuantityVisitor {
            type Value = Quantity;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "a byte quantity; {QUANTITY_HINT}")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
                Ok(Quantity(v))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
                u64::try_from(v)
                    .map(Quantity)
                    .map_err(|_| E::custom(ParseUnitError::quantity(v, "must not be negative")))
            }

            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
                Err(E::custom(ParseUnitError::quantity(
                    v,
                    "write fractions as a string with a suffix, like \"1.5Mi\"",
                )))
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
                v.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_any(QuantityVisitor)
    }
}

impl JsonSchema for Quantity {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> Cow<'static, str> {
        "Quantity".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "A byte size: an integer, or a string with an optional Kubernetes suffix (binary Ki Mi Gi Ti Pi Ei, decimal k M G T P E), e.g. 1048576, \"32Ki\", \"1.5Mi\", \"64k\". Must be a whole number of bytes.",
            "oneOf": [
                { "type": "integer", "minimum": 0 },
                { "type": "string", "pattern": QUANTITY_PATTERN },
            ],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    // `super::super` rather than `crate::` so the tests work wherever the config module lives.
    use super::super::yaml::{from_node, parse_documents, DeError, Pos};

    fn dur(s: &str) -> Duration {
        s.parse::<GwDuration>().unwrap().0
    }

    #[test]
    fn durations_parse() {
        assert_eq!(dur("1h30m"), Duration::from_mins(90));
        assert_eq!(dur("500ms"), Duration::from_millis(500));
        assert_eq!(dur("10s"), Duration::from_secs(10));
        assert_eq!(dur("0s"), Duration::ZERO);
        assert_eq!(dur("5m"), Duration::from_mins(5));
        assert_eq!(dur("5ms"), Duration::from_millis(5));
        assert_eq!(dur("1m5s"), Duration::from_secs(65));
        assert_eq!(dur("1h1m1s1ms"), Duration::from_millis(3_661_001));
        assert_eq!(dur("99999h"), Duration::from_hours(99_999));
        assert_eq!(dur("00010s"), Duration::from_secs(10));
        // The grammar allows repeated and unordered units.
        assert_eq!(dur("1s1s"), Duration::from_secs(2));
        assert_eq!(dur("1s1h"), Duration::from_secs(3601));
    }

    #[test]
    fn invalid_durations_have_a_hint() {
        for bad in [
            "",
            "10",
            "1d",
            "123456s",
            "1s1s1s1s1s",
            "1.5s",
            "-1s",
            "1 s",
            " 1s",
            "ms",
            "1sm",
            "1S",
            "h",
            "1hh",
        ] {
            let err = bad.parse::<GwDuration>().unwrap_err();
            assert_eq!(
                err.to_string(),
                format!(
                    r#"invalid duration {bad:?}: expected e.g. "10s", "500ms", "1h30m" (units h, m, s, ms)"#
                ),
            );
        }
    }

    #[test]
    fn durations_display_canonically() {
        let show = |ms: u64| GwDuration::from_millis(ms).to_string();
        assert_eq!(show(90_000), "1m30s");
        assert_eq!(show(1_500), "1s500ms");
        assert_eq!(show(0), "0s");
        assert_eq!(show(3_600_000), "1h");
        assert_eq!(show(3_600_001), "1h1ms");
        assert_eq!(show(90 * 60_000), "1h30m");
        assert_eq!(GwDuration(Duration::from_micros(1500)).to_string(), "1ms");
        for s in ["1h30m", "500ms", "1h1m1s1ms", "0s", "59m59s999ms"] {
            assert_eq!(s.parse::<GwDuration>().unwrap().to_string(), s);
        }
        assert_eq!("60s".parse::<GwDuration>().unwrap().to_string(), "1m");
    }

    #[test]
    fn duration_conversions_and_consts() {
        const DEFAULT: GwDuration = GwDuration::from_secs(30);
        assert_eq!(Duration::from(DEFAULT), Duration::from_secs(30));
        assert_eq!(
            GwDuration::from(Duration::from_millis(7)),
            GwDuration::from_millis(7)
        );
        assert_eq!(GwDuration::default().to_string(), "0s");
        assert!(GwDuration::from_millis(999) < GwDuration::from_secs(1));
    }

    #[test]
    fn durations_through_serde_json() {
        let d: GwDuration = serde_json::from_str(r#""1h30m""#).unwrap();
        assert_eq!(d, GwDuration::from_secs(5400));
        assert_eq!(serde_json::to_string(&d).unwrap(), r#""1h30m""#);
        let err = serde_json::from_str::<GwDuration>("10")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a duration string"), "{err}");
        let err = serde_json::from_str::<GwDuration>(r#""10""#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(r#"invalid duration "10": expected e.g."#),
            "{err}"
        );
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    struct Limits {
        #[serde(default)]
        timeout: Option<GwDuration>,
        #[serde(default)]
        max_body: Option<Quantity>,
    }

    fn limits(text: &str) -> Result<Limits, DeError> {
        from_node(&parse_documents(text).unwrap()[0])
    }

    #[test]
    fn durations_through_yaml() {
        let l = limits("timeout: 1h30m\n").unwrap();
        assert_eq!(l.timeout, Some(GwDuration::from_secs(5400)));
        let l = limits("timeout: \"500ms\"\n").unwrap();
        assert_eq!(l.timeout, Some(GwDuration::from_millis(500)));
        let err = limits("maxBody: 1Ki\ntimeout: 10\n").unwrap_err();
        assert_eq!((err.pos, err.path.as_str()), (Pos::new(2, 10), "timeout"));
        assert_eq!(
            err.message,
            r#"invalid duration "10": expected e.g. "10s", "500ms", "1h30m" (units h, m, s, ms)"#
        );
        let err = limits("timeout: [1s]\n").unwrap_err();
        assert_eq!(err.pos, Pos::new(1, 10));
    }

    #[test]
    fn duration_schema() {
        let schema = schemars::schema_for!(GwDuration);
        assert_eq!(schema.get("type").unwrap(), "string");
        assert_eq!(schema.get("pattern").unwrap(), DURATION_PATTERN);
        assert!(schema.get("description").is_some());
    }

    fn qty(s: &str) -> u64 {
        s.parse::<Quantity>().unwrap().0
    }

    #[test]
    fn quantities_parse() {
        assert_eq!(qty("32Ki"), 32 * 1024);
        assert_eq!(qty("1Mi"), 1 << 20);
        assert_eq!(qty("64k"), 64_000);
        assert_eq!(qty("1048576"), 1 << 20);
        assert_eq!(qty("0"), 0);
        assert_eq!(qty("1.5Mi"), 3 << 19);
        assert_eq!(qty("1.50Mi"), 3 << 19);
        assert_eq!(qty("0.5Ki"), 512);
        assert_eq!(qty("2.5k"), 2_500);
        assert_eq!(qty("1.0"), 1);
        assert_eq!(qty("15Ei"), 15 << 60);
        assert_eq!(qty("18E"), 18_000_000_000_000_000_000);
        assert_eq!(qty("18446744073709551615"), u64::MAX);
        assert_eq!(qty("3G"), 3_000_000_000);
        assert_eq!(qty("1Ti"), 1 << 40);
        assert_eq!(qty("1Pi"), 1 << 50);
        assert_eq!(qty("1T"), 1_000_000_000_000);
        assert_eq!(qty("1P"), 1_000_000_000_000_000);
        assert_eq!(qty("1Gi"), 1 << 30);
    }

    #[test]
    fn invalid_quantities_say_why() {
        let cases = [
            ("1.3Mi", "not a whole number of bytes"),
            ("0.5", "not a whole number of bytes"),
            ("16Ei", "too large for 64 bits"),
            ("18446744073709551616", "too large for 64 bits"),
            ("-1Ki", "must not be negative"),
            ("1KB", "unknown suffix"),
            ("1e3", "unknown suffix"),
            ("1Ki ", "unknown suffix"),
            ("", "malformed number"),
            (".5Ki", "malformed number"),
            ("1.Ki", "malformed number"),
            ("1.2.3", "malformed number"),
            ("Ki", "malformed number"),
        ];
        for (bad, reason) in cases {
            let err = bad.parse::<Quantity>().unwrap_err().to_string();
            assert_eq!(
                err,
                format!(
                    r#"invalid quantity {bad:?}: {reason}; expected e.g. 1048576, "32Ki", "1Mi", "64k" (suffixes Ki Mi Gi Ti Pi Ei, k M G T P E)"#
                )
            );
        }
        let long = format!("1.{}1Ki", "0".repeat(50));
        let err = long.parse::<Quantity>().unwrap_err().to_string();
        assert!(err.contains("too many decimal places"), "{err}");
        // Trailing zeros are harmless however many there are.
        assert_eq!(qty(&format!("1.{}Ki", "0".repeat(50))), 1024);
    }

    #[test]
    fn quantities_display_with_the_largest_exact_binary_suffix() {
        let show = |n: u64| Quantity(n).to_string();
        assert_eq!(show(1 << 20), "1Mi");
        assert_eq!(show(1024), "1Ki");
        assert_eq!(show(1536), "1536");
        assert_eq!(show(3 << 19), "1536Ki");
        assert_eq!(show(64_000), "64000");
        assert_eq!(show(0), "0");
        assert_eq!(show(3 << 60), "3Ei");
        assert_eq!(show(u64::MAX), "18446744073709551615");
        for s in ["32Ki", "1Mi", "1000", "7Gi"] {
            assert_eq!(s.parse::<Quantity>().unwrap().to_string(), s);
        }
        assert_eq!(u64::from(Quantity(5)), 5);
    }

    #[test]
    fn quantities_through_serde_json() {
        let q: Quantity = serde_json::from_str("1048576").unwrap();
        assert_eq!(q, Quantity(1 << 20));
        assert_eq!(serde_json::to_string(&q).unwrap(), r#""1Mi""#);
        let q: Quantity = serde_json::from_str(r#""32Ki""#).unwrap();
        assert_eq!(q.0, 32 * 1024);
        let err = serde_json::from_str::<Quantity>("-1")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid quantity -1: must not be negative"),
            "{err}"
        );
        let err = serde_json::from_str::<Quantity>("1.5")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("invalid quantity 1.5: write fractions"),
            "{err}"
        );
        let err = serde_json::from_str::<Quantity>("true")
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a byte quantity"), "{err}");
        // What we write, we read back.
        let back: Quantity =
            serde_json::from_str(&serde_json::to_string(&Quantity(1536)).unwrap()).unwrap();
        assert_eq!(back, Quantity(1536));
    }

    #[test]
    fn quantities_through_yaml() {
        let q = |text: &str| limits(text).map(|l| l.max_body.unwrap().0);
        assert_eq!(q("maxBody: 32Ki\n").unwrap(), 32 * 1024);
        assert_eq!(q("maxBody: 1048576\n").unwrap(), 1 << 20);
        assert_eq!(q("maxBody: '64k'\n").unwrap(), 64_000);
        assert_eq!(q("maxBody: 1.5Mi\n").unwrap(), 3 << 19);
        assert_eq!(q("maxBody: 18446744073709551615\n").unwrap(), u64::MAX);
        let err = q("timeout: 1s\nmaxBody: -5\n").unwrap_err();
        assert_eq!((err.pos, err.path.as_str()), (Pos::new(2, 10), "maxBody"));
        assert!(err
            .message
            .starts_with("invalid quantity -5: must not be negative; expected e.g."));
        let err = q("maxBody:   1.3Mi\n").unwrap_err();
        assert_eq!((err.pos, err.path.as_str()), (Pos::new(1, 12), "maxBody"));
        assert!(
            err.message
                .contains("\"1.3Mi\": not a whole number of bytes"),
            "{}",
            err.message
        );
        let err = q("maxBody: 1.5\n").unwrap_err();
        assert_eq!(err.pos, Pos::new(1, 10));
        let err = q("maxBody: {a: 1}\n").unwrap_err();
        assert_eq!(err.pos, Pos::new(1, 10));
        assert!(
            err.message.contains("expected a byte quantity"),
            "{}",
            err.message
        );
    }

    #[test]
    fn quantity_schema() {
        let schema = schemars::schema_for!(Quantity);
        let one_of = schema.get("oneOf").unwrap();
        assert_eq!(
            one_of[0],
            serde_json::json!({"type": "integer", "minimum": 0})
        );
        assert_eq!(
            one_of[1],
            serde_json::json!({"type": "string", "pattern": QUANTITY_PATTERN})
        );
        assert!(schema.get("description").is_some());
    }

    #[test]
    fn unit_types_inline_into_parent_schemas() {
        #[derive(JsonSchema)]
        #[allow(dead_code)]
        struct Parent {
            timeout: GwDuration,
            size: Quantity,
        }
        let schema = schemars::schema_for!(Parent);
        assert!(schema.get("$defs").is_none());
        let props = schema.get("properties").unwrap();
        assert_eq!(props["timeout"]["pattern"], DURATION_PATTERN);
        assert!(props["size"]["oneOf"].is_array());
    }
}
